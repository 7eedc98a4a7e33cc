"""serve.py's API under hostile clients, over real sockets (uvicorn on loopback in a thread,
with serve.py's connections: connections.connection_protocol): a request head or a body sent too
slowly, more connections than allowed, a client that leaves mid-batch (whole or streamed
answers) or half-closes, while others are served. The engine's translate is replaced by a
gated fake so that the tests decide when a batch ends; the rest (tokenizers, settings) is the
tiny model's."""

import contextlib
import copy
import dataclasses
import http.client
import json
import socket
import threading
import time
import urllib.request

import pytest
import uvicorn

from transformer_nmt.inference.engine import Engine
from transformer_nmt.serving.connections import connection_protocol
from transformer_nmt.serving.server import Limits, make_app

LIMITS = Limits(max_chars=300, max_sentences=10, max_body_bytes=4000, timeout_s=2.0,
                max_queue_sentences=64)


class Gated:
  """An engine's translate that upper-cases and records each batch, each batch waiting for
  a permit (`let`): the test decides how many batches may end."""

  def __init__(self):
    self.batches: list[list[str]] = []
    self.permits, self.started = threading.Semaphore(0), threading.Event()

  def let(self, batches: int = 1000) -> None:
    self.permits.release(batches)

  def __call__(self, lines, *_, **__):
    self.batches.append(list(lines))
    self.started.set()
    assert self.permits.acquire(timeout=20)
    return [line.upper() for line in lines]


@pytest.fixture(scope='module')
def engine(loaded) -> Engine:
  return Engine(loaded, dataclasses.replace(loaded.decode, beam_size=1, max_len=4))


@contextlib.contextmanager
def serving(engine, header_timeout_s: float = 10, max_connections: int | None = None,
            **options):
  """The app on a free loopback port, its scheduler and the gated fake."""
  gated, patched = Gated(), copy.copy(engine)
  patched.translate = gated
  app = make_app(patched, LIMITS, max_wait_ms=0, tokens_per_batch=1, **options)
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]
  server = uvicorn.Server(uvicorn.Config(
      app, host='127.0.0.1', port=port, log_level='error',
      http=connection_protocol(app, header_timeout_s, max_connections)))
  thread = threading.Thread(target=server.run, daemon=True)
  thread.start()
  deadline = time.monotonic() + 20
  while not server.started and time.monotonic() < deadline:
    time.sleep(0.01)
  assert server.started
  try:
    yield port, app.state.scheduler, gated
  finally:
    gated.let()
    server.should_exit = True
    thread.join(20)


def post(port: int, body: dict, timeout: float = 20) -> tuple[int, bytes]:
  request = urllib.request.Request(f'http://127.0.0.1:{port}/v1/translate', method='POST',
                                   data=json.dumps(body).encode(),
                                   headers={'Content-Type': 'application/json'})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
      return response.status, response.read()
  except urllib.error.HTTPError as e:
    return e.code, e.read()


def raw_request(port: int, body: bytes, length: int | None = None) -> socket.socket:
  """A socket that has sent the headers of a POST /v1/translate and `body` (of a declared
  `length`)."""
  conn = socket.create_connection(('127.0.0.1', port), timeout=20)
  head = (f'POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n'
          f'Content-Length: {len(body) if length is None else length}\r\n\r\n').encode()
  conn.sendall(head + body)
  return conn


def answer(conn: socket.socket) -> tuple[int, http.client.HTTPMessage, bytes]:
  """The status, headers and body of the answer read from `conn`, interim (1xx) answers
  skipped as clients do."""
  response = http.client.HTTPResponse(conn)
  response.begin()
  return response.status, response.msg, response.read()


def metric(port: int, name: str) -> float:
  text = urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=20).read().decode()
  found = [line for line in text.splitlines() if line.startswith(name)]
  return float(found[0].split()[-1]) if found else 0.0


def wait_for(condition, seconds: float = 10) -> bool:
  deadline = time.monotonic() + seconds
  while not condition() and time.monotonic() < deadline:
    time.sleep(0.02)
  return condition()


def test_a_slow_body_gets_408_while_others_are_served(engine):
  with serving(engine) as (port, _, gated):
    gated.let()
    slow = raw_request(port, b'{"text": ["a', length=40)  # 28 bytes never come
    t0 = time.monotonic()
    status, body = post(port, {'text': ['quick one']})
    assert status == 200 and json.loads(body)['translations'] == [{'text': 'QUICK ONE'}]
    assert time.monotonic() - t0 < LIMITS.timeout_s  # not held up by the slow body
    answer = slow.recv(4096).decode()
    slow.close()
    assert answer.startswith('HTTP/1.1 408'), answer
    assert 'timeout_s=2' in answer.split('\r\n\r\n', 1)[1]
    assert metric(port, 'nmt_errors_total{kind="slow_body"}') == 1


def test_a_client_that_leaves_mid_batch_has_its_work_dropped(engine):
  with serving(engine) as (port, scheduler, gated):
    conn = raw_request(port, json.dumps({'text': ['one', 'two', 'three']}).encode())
    assert gated.started.wait(10)  # 'one' runs (one sentence a batch), 'two', 'three' wait
    conn.close()
    assert wait_for(lambda: scheduler.stats.cancelled == 1)
    gated.let()
    status, body = post(port, {'text': ['after']})
    assert status == 200 and json.loads(body)['translations'] == [{'text': 'AFTER'}]
    assert gated.batches == [['one'], ['after']]  # 'two' and 'three' never ran
    assert scheduler.queue_depth == 0
    assert metric(port, 'nmt_errors_total{kind="disconnected"}') == 1


def test_a_streamed_answer_abandoned_midway_drops_the_rest(engine):
  with serving(engine) as (port, scheduler, gated):
    gated.let(1)  # 'a' ends; 'b' is held; 'c' and 'd' wait (one sentence a batch)
    conn = raw_request(port, json.dumps({'text': ['a', 'b', 'c', 'd'],
                                         'stream': True}).encode())
    reader = conn.makefile('rb')
    while reader.readline() not in (b'\r\n', b''):  # the headers
      pass
    reader.readline()  # the chunk's size
    assert json.loads(reader.readline()) == {'index': 0, 'text': 'A'}
    reader.close()  # the socket closes with its last file
    conn.close()
    assert wait_for(lambda: scheduler.stats.cancelled == 1)
    gated.let()
    assert wait_for(lambda: scheduler.queue_depth == 0)
    assert gated.batches == [['a'], ['b']]  # 'c' and 'd' never ran
    status, body = post(port, {'text': ['still here']})
    assert status == 200 and json.loads(body)['translations'] == [{'text': 'STILL HERE'}]


def test_without_batching_across_requests_each_batch_is_one_request(engine):
  with serving(engine, mix_requests=False) as (port, scheduler, gated):
    scheduler.tokens_per_batch = 100  # room for both requests in one batch, were they mixed
    held = raw_request(port, json.dumps({'text': ['first']}).encode())
    assert gated.started.wait(10)
    results = []
    threads = [threading.Thread(target=lambda t=t: results.append(post(port, {'text': t})))
               for t in (['a1', 'a2'], ['b1'])]
    for t in threads:
      t.start()
    assert wait_for(lambda: scheduler.queue_depth == 3)
    gated.let()
    for t in threads:
      t.join(20)
    held.close()
    assert sorted(status for status, _ in results) == [200, 200]
    assert sorted(gated.batches[1:]) == [['a1', 'a2'], ['b1']]


def test_a_streamed_answer_past_its_deadline_ends_with_an_error_line(engine):
  with serving(engine) as (port, scheduler, gated):
    gated.let(1)  # 'a' ends, 'b' is held past the deadline
    status, body = post(port, {'text': ['a', 'b'], 'stream': True})
    lines = [json.loads(line) for line in body.decode().splitlines()]
    assert status == 200 and lines[0] == {'index': 0, 'text': 'A'}
    assert lines[-1] == {'error': 'not answered within timeout_s=2 seconds', 'status': 504}
    assert len(lines) == 2
    assert metric(port, 'nmt_errors_total{kind="deadline"}') == 1


def test_a_request_head_not_received_in_time_gets_408_and_the_connection_closes(engine):
  """A head must arrive within header_timeout_s of the connection's start, or on a kept-alive
  connection of the next request's first byte; a connection that sends nothing is closed
  without a word; others are served meanwhile."""
  with serving(engine, header_timeout_s=0.3) as (port, _, gated):
    gated.let()
    partial = socket.create_connection(('127.0.0.1', port), timeout=20)
    partial.sendall(b'POST /v1/translate HTTP/1.1\r\nHost: x\r\n')  # never ends
    silent = socket.create_connection(('127.0.0.1', port), timeout=20)
    kept = socket.create_connection(('127.0.0.1', port), timeout=20)
    kept.sendall(b'GET /health HTTP/1.1\r\nHost: x\r\n\r\n')
    assert answer(kept)[0] == 200
    kept.sendall(b'GET /hea')  # the next request's head, never ended
    t0 = time.monotonic()
    status, body = post(port, {'text': ['served']})
    assert status == 200 and json.loads(body)['translations'] == [{'text': 'SERVED'}]
    for conn in (partial, kept):
      status, headers, body = answer(conn)
      assert status == 408 and headers['Connection'] == 'close'
      assert json.loads(body) == {'error': 'the request head did not arrive within '
                                           'header_timeout_s=0.3 seconds'}
      assert conn.recv(1) == b''  # closed
      conn.close()
    assert silent.recv(1) == b''
    silent.close()
    assert time.monotonic() - t0 < 5
    assert metric(port, 'nmt_errors_total{kind="slow_head"}') == 2
    assert metric(port, 'nmt_errors_total{kind="idle_connection"}') == 1


def test_past_max_connections_a_request_gets_our_json_503(engine):
  """Open connections count (this one too): past max_connections a request gets one JSON
  line, Retry-After and a closed connection, counted in /metrics; served once they close."""
  with serving(engine, max_connections=2) as (port, _, gated):
    gated.let()
    idle = [socket.create_connection(('127.0.0.1', port), timeout=20) for _ in range(2)]
    conn = raw_request(port, json.dumps({'text': ['refused']}).encode())
    status, headers, body = answer(conn)
    conn.close()
    assert status == 503 and headers['Retry-After'] == '1'
    assert headers['Connection'] == 'close'
    assert json.loads(body) == {
        'error': 'busy: over max_connections=2 connections or requests at once'}
    for c in idle:
      c.close()
    refused = 1
    while (answered := post(port, {'text': ['served']}))[0] == 503:  # until they are closed
      refused += 1
    assert answered[0] == 200
    assert json.loads(answered[1])['translations'] == [{'text': 'SERVED'}]
    assert metric(port, 'nmt_errors_total{kind="connection_limit"}') == refused
    assert gated.batches == [['served']]


def test_a_client_that_half_closes_gets_its_answer(engine):
  """A client that shuts its sending side after the request (shutdown(SHUT_WR)) is still
  reading: it gets its whole answer, plain or streamed, while a client that closed is
  dropped (the tests above)."""
  with serving(engine) as (port, _, gated):
    for body, stream in ((['half', 'closed'], False), (['streamed'], True)):
      gated.started.clear()
      conn = raw_request(port, json.dumps({'text': body, 'stream': stream}).encode())
      assert gated.started.wait(10)  # in a batch when the client's end of input comes
      conn.shutdown(socket.SHUT_WR)
      time.sleep(0.1)  # the server sees it while the batch runs
      gated.let()
      status, headers, got = answer(conn)
      conn.close()
      assert status == 200
      if stream:
        lines = [json.loads(line) for line in got.decode().splitlines()]
        assert lines[0] == {'index': 0, 'text': 'STREAMED'} and 'model' in lines[1]
      else:
        assert json.loads(got)['translations'] == [{'text': 'HALF'}, {'text': 'CLOSED'}]
    assert metric(port, 'nmt_errors_total{kind="disconnected"}') == 0


def test_a_client_that_leaves_mid_body_is_not_an_internal_error(engine):
  with serving(engine) as (port, _, gated):
    conn = raw_request(port, b'{"text": ["a', length=40)  # the rest never comes
    time.sleep(0.1)
    conn.close()
    assert wait_for(lambda: metric(port, 'nmt_errors_total{kind="disconnected"}') == 1)
    assert metric(port, 'nmt_errors_total{kind="internal"}') == 0
    gated.let()
    assert post(port, {'text': ['after']})[0] == 200

"""serve.py's API under hostile clients, over real sockets (uvicorn on loopback in a thread):
a body sent too slowly, a client that leaves mid-batch (whole or streamed answers), while
others are served. The engine's translate is replaced by a gated fake so that the tests
decide when a batch ends; the rest (tokenizers, settings) is the tiny model's."""

import contextlib
import copy
import dataclasses
import json
import socket
import threading
import time
import urllib.request

import pytest
import uvicorn

from transformer_nmt.inference.engine import Engine
from transformer_nmt.inference.server import Limits, make_app

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
def serving(engine, **options):
  """The app on a free loopback port, its scheduler and the gated fake."""
  gated, patched = Gated(), copy.copy(engine)
  patched.translate = gated
  app = make_app(patched, LIMITS, max_wait_ms=0, tokens_per_batch=1, **options)
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]
  server = uvicorn.Server(uvicorn.Config(app, host='127.0.0.1', port=port, log_level='error'))
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

"""serve.py's HTTP API (serving/server.py) on the tiny trained model, through FastAPI's
TestClient; one app and engine per module, since every compile costs seconds."""

import concurrent.futures
import copy
import dataclasses
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import jax
import numpy as np
import pytest
from conftest import ROOT, shared_compile_cache
from fastapi.testclient import TestClient

from transformer_nmt import plots
from transformer_nmt.errors import ConfigError
from transformer_nmt.inference.engine import Engine
from transformer_nmt.serving.server import Limits, make_app, warm_up

LIMITS = Limits(max_chars=300, max_sentences=10, max_body_bytes=4000, timeout_s=60,
                max_queue_sentences=64)


@pytest.fixture(scope='module')
def engine(noisy_engine) -> Engine:
  return noisy_engine  # conftest.py: shared with test_page.py


@pytest.fixture(scope='module')
def client(engine):
  with TestClient(make_app(engine, LIMITS, max_wait_ms=20)) as c:
    yield c


@pytest.fixture(scope='module')
def expected(engine, lines) -> dict[str, str]:
  return dict(zip(lines, engine.translate(lines)))


def error(response, status: int) -> str:
  assert response.status_code == status, (response.status_code, response.text)
  body = response.json()
  assert set(body) == {'error'} and '\n' not in body['error']
  return body['error']


@pytest.mark.slow
def test_translate_equals_the_engine(client, engine, lines, expected):
  response = client.post('/v1/translate', json={'text': lines + ['']})
  assert response.status_code == 200, response.text
  body = response.json()
  assert [t['text'] for t in body['translations']] == [expected[x] for x in lines] + ['']
  assert body['model']['steps'] == list(engine.model.steps)
  assert body['model']['settings']['beam_size'] == 2
  assert body['model']['dtype'] == engine.model.cfg.dtype
  assert len(set(expected.values())) > 4  # not one answer for all: the comparison means something


@pytest.mark.slow
def test_concurrent_requests_get_their_own_lines_in_order(client, lines, expected):
  def ask(k: int) -> bool:
    mine = [lines[(k + i) % len(lines)] for i in range(k % 4 + 1)]
    got = client.post('/v1/translate', json={'text': mine}).json()['translations']
    return [t['text'] for t in got] == [expected[x] for x in mine]
  before = client.app.state.scheduler.stats.batches
  with concurrent.futures.ThreadPoolExecutor(6) as pool:
    assert all(pool.map(ask, range(12)))
  assert client.app.state.scheduler.stats.batches - before < 12  # requests shared batches


def test_n_best_and_scores(client, engine, lines, expected):
  body = client.post('/v1/translate', json={'text': lines[:3], 'n_best': 2}).json()
  for line, t in zip(lines, body['translations']):
    assert t['text'] == expected[line]
    assert 1 <= len(t['hypotheses']) <= 2
    best = t['hypotheses'][0]
    assert best['text'] == t['text'] and best['logprob'] <= 0
    assert set(best) == {'text', 'score', 'logprob', 'tokens', 'token_logprobs'}
    assert best['tokens'][-1] == engine.model.tgt_tok.pieces([engine.model.tgt_tok.eos_id])[0]
  one = client.post('/v1/translate', json={'text': lines[:1], 'return_scores': True,
                                           'return_alignment': True}).json()['translations'][0]
  assert len(one['hypotheses']) == 1 and 'alignment' in one['hypotheses'][0]
  assert one['source_tokens']
  assert 'n_best=2' in error(client.post('/v1/translate', json={'text': ['a'], 'n_best': 3}),
                             422)


@pytest.mark.slow
def test_prefix(client, engine, lines):
  prefixes = ['', 'ein', '']
  want = engine.translate(lines[:3], prefixes=prefixes)
  body = client.post('/v1/translate', json={'text': lines[:3], 'prefix': prefixes}).json()
  assert [t['text'] for t in body['translations']] == want
  assert want[1].startswith('ein')
  scored = client.post('/v1/translate', json={'text': lines[1:2], 'prefix': ['ein'],
                                              'return_scores': True}).json()
  assert scored['translations'][0]['text'] == want[1]
  assert 'one per sentence' in error(client.post('/v1/translate', json={
      'text': lines[:2], 'prefix': ['ein']}), 422)
  assert 'prefix[0]' in error(client.post('/v1/translate', json={
      'text': ['a'], 'prefix': ['x' * 301]}), 422)


def test_streamed_answers_one_line_per_sentence(client, lines, expected):
  response = client.post('/v1/translate', json={'text': lines[:5], 'stream': True})
  assert response.status_code == 200
  assert response.headers['content-type'].startswith('application/x-ndjson')
  answers = [json.loads(line) for line in response.text.splitlines()]
  assert answers[-1]['model']['settings']['beam_size'] == 2
  assert sorted(a['index'] for a in answers[:-1]) == list(range(5))
  assert all(a['text'] == expected[lines[a['index']]] for a in answers[:-1])
  scored = client.post('/v1/translate', json={'text': lines[:2], 'stream': True,
                                              'n_best': 2}).text.splitlines()
  assert all('hypotheses' in json.loads(line) for line in scored[:-1])


def metric(client, series: str) -> float:
  """The value of one series (name and labels) in /metrics."""
  return float(next(line for line in client.get('/metrics').text.splitlines()
                    if line.startswith(series + ' ')).split()[-1])


def test_programs_compiled_counts_compiles(client):
  before = metric(client, 'nmt_programs_compiled')
  jax.jit(lambda x: x * 3 + 1)(np.ones(7, np.float32))  # a program never compiled before
  assert metric(client, 'nmt_programs_compiled') == before + 1


def test_gc_seconds_sum_the_collections(client):
  before = metric(client, 'nmt_gc_seconds{generation="2"}')
  gc.collect()  # a full collection: generation 2
  assert metric(client, 'nmt_gc_seconds{generation="2"}') > before


def test_warm_up_leaves_what_it_left_alive_out_of_garbage_collection():
  """After warm-up the objects alive are frozen (gc.freeze): full collections no longer walk
  the millions that compiling leaves; with freeze=False nothing is frozen."""
  alive = [[]]
  alive[0].append(alive)  # a cycle: tracked by the collector
  tracked = lambda: any(x is alive for x in gc.get_objects())
  try:
    warm_up(lambda: None, threading.Event(), pytest.fail, freeze=False)
    assert gc.get_freeze_count() == 0 and tracked()
    warm_up(lambda: None, threading.Event(), pytest.fail)
    assert gc.get_freeze_count() > 0 and not tracked()
  finally:
    gc.unfreeze()  # the rest of the tests collect as usual


def test_attention_is_plot_attentions_and_gives_the_alignment(client, engine, lines, expected):
  """return_attention: per hypothesis the numbers plots.cross_attention (decode.py
  --plot_attention) computes for it, [tokens][source_tokens]; the alignment is their argmax."""
  body = client.post('/v1/translate', json={'text': lines[:2], 'n_best': 2,
                                            'return_attention': True,
                                            'return_alignment': True}).json()
  model = engine.model
  ids = [{p: i for i, p in enumerate(tok.pieces(range(tok.vocab_size)))}
         for tok in (model.src_tok, model.tgt_tok)]
  compared = []
  for i, (line, t) in enumerate(zip(lines, body['translations'])):
    assert t['text'] == expected[line]
    src = [ids[0][p] for p in t['source_tokens']]
    assert src == model.src_tok.encode([line])[0] + [model.src_tok.eos_id]
    for j, h in enumerate(t['hypotheses']):
      got = np.array(h['attention'])
      assert got.shape == (len(h['tokens']), len(src))
      np.testing.assert_allclose(got.sum(axis=1), 1, atol=1e-4)
      rows = np.arange(len(got))
      assert np.all(got[rows, h['alignment']] >= got.max(axis=1) - 1e-6)  # rounding: ties
      if (i, j) in ((0, 0), (1, 1)):  # plots.cross_attention runs eagerly: 2-3 s a shape
        want = plots.cross_attention(model, src, [ids[1][p] for p in h['tokens']])
        # The noise makes attention sharp (large logits), which magnifies the rounding of
        # a padded batch's other shapes: equal to 1e-4, not bit for bit.
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        compared.append((i, j))
  assert compared == [(0, 0), (1, 1)]
  (_, hyps), = engine.hypotheses(lines[:1])
  assert hyps[0].alignment == np.argmax(hyps[0].attention, axis=1).tolist()
  assert 'attention' not in hyps[0].as_json()  # decode.py's n-best lines stay small


def test_score(client, engine, lines, expected):
  targets = [expected[x] for x in lines[:3]]
  body = client.post('/v1/score', json={'source': lines[:3], 'target': targets}).json()
  want = engine.score(lines[:3], targets)
  assert [s['logprob'] for s in body['scores']] == pytest.approx(
      [h.logprob for _, h in want], abs=1e-4)
  assert 'target' in error(client.post('/v1/score', json={'source': ['a'], 'target': []}), 422)
  assert 'pair up' in error(client.post('/v1/score', json={'source': ['a', 'b'],
                                                           'target': ['c']}), 422)


@pytest.mark.slow
def test_health_page_and_metrics(client, engine):
  client.post('/v1/translate', json={'text': ['one more']})
  # no warm-up planned a set: the programs counted are those the requests made
  programs = {'ready': engine.programs_ready, 'planned': None}
  assert programs['ready'] > 0
  assert client.get('/health').json() == {'status': 'ok', 'ready': True, 'programs': programs}
  assert 'fetch(' in client.get('/').text
  text = client.get('/metrics').text
  for needle in ('nmt_requests_total{endpoint="translate",status="200"}', 'nmt_sentences_total',
                 'nmt_batches_total', 'nmt_batch_fill_bucket', 'nmt_queue_sentences',
                 'nmt_request_seconds_bucket', 'nmt_target_tokens_total', 'nmt_errors_total'):
    assert needle in text, needle
  sentences = [line for line in text.splitlines() if line.startswith('nmt_sentences_total')]
  assert float(sentences[0].split()[-1]) >= 1
  assert client.get('/openapi.json').json()['paths']['/v1/translate']['post']['requestBody']
  assert '/openapi.json' not in client.get('/openapi.json').json()['paths']
  page = client.get('/').text
  assert 'http://' not in page and 'https://' not in page  # nothing fetched from elsewhere


@pytest.mark.parametrize('body,status,needle', [
    ({'text': ['x' * 301]}, 422, 'max_chars=300'),
    ({'text': ['a'] * 11}, 422, 'max_sentences=10'),
    ({'text': ['a'], 'padding': 'x' * 4000}, 413, 'max_body_bytes=4000'),  # checked first
    ({'text': []}, 422, 'text'),
    ({'text': 'a sentence'}, 422, 'text'),
    ({'text': [1, 2]}, 422, 'text.0'),
    ({'text': ['a'], 'n_best': 0}, 422, 'n_best'),
    ({'text': ['a'], 'n_best': '2'}, 422, 'n_best'),
    ({'text': ['a'], 'file': '/etc/passwd'}, 422, 'file'),
    ({}, 422, 'text'),
    (['a'], 422, 'body'),
])
def test_limits_and_malformed_input(client, body, status, needle):
  assert needle in error(client.post('/v1/translate', json=body), status)


@pytest.mark.parametrize('raw,needle', [
    (b'{"text": [', 'not JSON'),
    (b'{"text": ["\xff\xfe"]}', 'UTF-8'),
    (b'', 'not JSON'),
    (b'{"text": ["\\ud800"]}', 'lone surrogate'),
    ('{"text": ["a"]}'.encode('utf-16'), 'UTF-16'),  # json.loads(bytes) would read them
    ('{"text": ["a"]}'.encode('utf-16-le'), 'not JSON in UTF-8'),  # no byte order mark
    ('{"text": ["a"]}'.encode('utf-32'), 'UTF-32'),
    # past json.loads' recursion limit (about 1,000): refused before parsing
    (b'{"text": ' + b'[' * 1900 + b']' * 1900 + b'}', 'deeper than 32 levels'),
    (b'{"text": ' + b'[' * 32 + b']' * 32 + b'}', 'deeper than 32 levels'),  # 33 levels
], ids=['cut', 'not_utf8', 'empty', 'surrogate', 'utf16', 'utf16_no_bom', 'utf32', 'nested_1900',
        'nested_33'])
def test_bad_json_and_encoding(client, raw, needle):
  response = client.post('/v1/translate', content=raw,
                         headers={'Content-Type': 'application/json'})
  assert needle in error(response, 400)


def test_json_within_the_depth_limit_is_parsed(client):
  """32 levels pass the depth check, brackets in strings do not count, a UTF-8 byte order
  mark is skipped: each fails validation after (422), so it was parsed."""
  for raw in (b'{"text": ' + b'[' * 31 + b']' * 31 + b'}',
              b'{"text": ["' + b'[{' * 100 + b'\\"]"], "n_best": 0}',
              b'\xef\xbb\xbf{"text": ["a"], "n_best": 0}'):
    response = client.post('/v1/translate', content=raw,
                           headers={'Content-Type': 'application/json'})
    error(response, 422)


@pytest.mark.parametrize('content_type', [None, 'text/plain', 'application/x-www-form-urlencoded',
                                          'multipart/form-data; boundary=x', 'application/json5',
                                          'application/json; charset=utf-16'])
def test_only_json_bodies_are_accepted(client, content_type):
  """Types a web page's form or script may send without a CORS preflight are refused (415),
  so that no page can post to a server on its visitor's machine."""
  headers = {} if content_type is None else {'Content-Type': content_type}
  message = error(client.post('/v1/translate', content=b'{"text": ["a"]}', headers=headers),
                  415)
  assert 'application/json' in message
  assert (content_type or 'without a Content-Type') in message


@pytest.mark.parametrize('content_type', ['application/json', 'Application/JSON; Charset=UTF-8',
                                          'application/json;charset="utf-8"'])
def test_json_content_types(client, content_type):
  error(client.post('/v1/translate', content=b'{"text": []}',
                    headers={'Content-Type': content_type}), 422)  # past the type: validated


def test_errors_quote_only_a_short_prefix_of_a_value(client):
  """A client's huge value (a 3,900-digit n_best, a long field name or type) is not sent
  back whole: 40 characters of it and '...'."""
  messages = [error(client.post('/v1/translate', json={'text': ['a'], **extra}), 422)
              for extra in ({'n_best': int('9' * 3900)}, {'x' * 3900: 1})]
  messages.append(error(client.post('/v1/translate', content=b'{}', headers={
      'Content-Type': 'text/' + 'y' * 4000}), 415))
  for message, shown in zip(messages, ('n_best=' + '9' * 40, 'x' * 40, 'text/' + 'y' * 35)):
    assert shown + '...' in message and len(message) < 200, message


def test_a_streamed_body_over_the_limit(client):
  chunks = iter([b'{"text": ["', b'a' * 3000, b'a' * 3000, b'"]}'])  # no Content-Length
  assert 'max_body_bytes' in error(client.post('/v1/translate', content=chunks,
                                               headers={'Content-Type': 'application/json'}),
                                   413)


def test_unknown_paths_and_methods_answer_json(client):
  error(client.get('/nowhere'), 404)
  error(client.get('/v1/translate'), 405)


def test_errors_are_counted_by_kind(client):
  client.post('/v1/translate', json={'text': []})
  assert 'nmt_errors_total{kind="invalid"}' in client.get('/metrics').text


def test_api_key(engine, lines, expected):
  with TestClient(make_app(engine, LIMITS, api_key='s3cret')) as c:
    assert c.get('/health').status_code == 200
    page = c.get('/')  # a browser opens it without the key: the page has a field for it
    assert page.status_code == 200 and '<input id="key" type="password">' in page.text
    assert "headers['Authorization'] = 'Bearer ' + key" in page.text
    error(c.get('/openapi.json'), 401)
    keyed = {'Authorization': 'Bearer s3cret'}
    assert '/v1/translate' in c.get('/openapi.json', headers=keyed).json()['paths']
    for path in ('/docs', '/redoc'):  # off: they load their scripts from a CDN
      error(c.get(path, headers=keyed), 404)
    error(c.post('/v1/translate', json={'text': lines[:1]}), 401)
    error(c.get('/metrics'), 401)
    error(c.post('/v1/translate', json={'text': lines[:1]},
                 headers={'Authorization': 'Bearer wrong'}), 401)
    ok = c.post('/v1/translate', json={'text': lines[:1]},
                headers={'Authorization': 'Bearer s3cret'})
    assert ok.json()['translations'][0]['text'] == expected[lines[0]]


def test_queue_full_and_deadline(engine):
  blocked, gate, started = copy.copy(engine), threading.Event(), threading.Event()

  def held(lines, *_, **__):
    started.set()
    gate.wait(20)
    return ['held'] * len(lines)
  blocked.translate = held
  limits = dataclasses.replace(LIMITS, max_sentences=1, max_queue_sentences=1, timeout_s=1.5)
  with TestClient(make_app(blocked, limits, max_wait_ms=0)) as c:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      running = pool.submit(c.post, '/v1/translate', json={'text': ['a']})
      assert started.wait(10)  # 'a' is in the running batch
      queued = pool.submit(c.post, '/v1/translate', json={'text': ['b']})
      deadline = time.monotonic() + 10
      while c.app.state.scheduler.queue_depth < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
      full = c.post('/v1/translate', json={'text': ['c']})
      assert 'max_queue_sentences=1' in error(full, 503)
      assert full.headers['Retry-After'] == '1'
      assert 'timeout_s=1.5' in error(queued.result(10), 504)
      assert 'timeout_s=1.5' in error(running.result(10), 504)
    assert c.app.state.scheduler.queue_depth == 0  # the queued sentence was dropped
    gate.set()
    text = c.get('/metrics').text
    assert 'nmt_errors_total{kind="queue_full"} 1.0' in text
    assert 'nmt_errors_total{kind="deadline"} 2.0' in text


def test_not_ready_until_warm(engine):
  """Ready once warm, and what was alive then is frozen out of garbage collection."""
  warmed = threading.Event()
  try:
    with TestClient(make_app(engine, LIMITS, warm=lambda: warmed.wait(20))) as c:
      health = c.get('/health')
      assert health.status_code == 503 and health.json()['ready'] is False
      assert 'warming up' in error(c.post('/v1/translate', json={'text': ['a']}), 503)
      assert gc.get_freeze_count() == 0
      warmed.set()
      deadline = time.monotonic() + 10
      while c.get('/health').status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.01)
      assert c.get('/health').json()['ready'] is True
      assert gc.get_freeze_count() > 0
  finally:
    gc.unfreeze()


def test_limits_that_cannot_work_are_refused(engine):
  with pytest.raises(ValueError, match='max_queue_sentences'):
    make_app(engine, Limits(max_sentences=10, max_queue_sentences=5))
  with pytest.raises(ValueError, match='max_chars'):
    make_app(engine, Limits(max_chars=0))


@pytest.mark.slow
def test_serve_help_and_bad_flags():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, 'serve.py', '--help'], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env=env).stdout
  for flag in ('--workdir', '--port', '--beam_size', '--max_wait_ms', '--api_key_file',
               '--header_timeout_s', '--max_connections'):
    assert f'  {flag}:' in out, flag
  for bad, needle in (('--port=-1', '--port'), ('--max_wait_ms=-1', '--max_wait_ms')):
    result = subprocess.run([sys.executable, 'serve.py', '--workdir', 'x', bad], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=env)
    last = result.stderr.rstrip('\n').splitlines()[-1]
    assert result.returncode == 2 and last.startswith('error: ') and needle in last, (
        result.stderr[-2000:])
    assert 'Traceback' not in result.stderr


@pytest.mark.slow
def test_serve_answers_then_stops_on_sigterm_with_exit_0(tiny_workdir):
  """The real program under uvicorn: not ready, then ready; SIGTERM with six requests in
  flight: each is answered and the exit code is 0."""
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]
  url = f'http://127.0.0.1:{port}'
  server = subprocess.Popen(
      [sys.executable, 'serve.py', '--workdir', str(tiny_workdir), '--port', str(port),
       '--beam_size', '2', '--noprograms', '--precompile_rows', '8', '--precompile_length',
       '8'], cwd=ROOT, env=shared_compile_cache(dict(os.environ, JAX_PLATFORMS='cpu')),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline, status = time.monotonic() + 120, None
    while status != 200 and time.monotonic() < deadline and server.poll() is None:
      try:
        status = urllib.request.urlopen(f'{url}/health', timeout=5).status
      except (urllib.error.URLError, ConnectionError):
        time.sleep(0.2)
    assert status == 200, server.stderr.read() if server.poll() is not None else 'no health'
    request = urllib.request.Request(f'{url}/v1/translate', method='POST',
                                     data=b'{"text": ["A man sings.", "Two dogs play."]}',
                                     headers={'Content-Type': 'application/json'})
    with concurrent.futures.ThreadPoolExecutor(6) as pool:  # under load: six in flight
      answers = [pool.submit(lambda: urllib.request.urlopen(request, timeout=60).read())
                 for _ in range(6)]
      time.sleep(0.3)  # connected by then (usually still translating: not asserted)
      server.send_signal(signal.SIGTERM)
      for answer in answers:
        assert len(json.loads(answer.result(60))['translations']) == 2
    assert server.wait(60) == 0
    assert 'Traceback' not in server.stderr.read()
  finally:
    if server.poll() is None:
      server.kill()
      server.wait()


def test_a_failed_warm_up_ends_the_server(capsys):
  """warm_up: ready once warm returns; a UserError (e.g. too many memory maps) ends the
  process with one line and code 2, a bug with its traceback and code 1, never ready."""
  ends, ready = [], threading.Event()
  warm_up(lambda: None, ready, ends.append, freeze=False)
  assert ready.is_set() and ends == []

  def too_many():
    raise ConfigError('901 memory maps in use')
  ready.clear()
  warm_up(too_many, ready, ends.append)
  assert ends == [2] and not ready.is_set()
  assert capsys.readouterr().err == 'error: warm-up stopped: 901 memory maps in use\n'

  def bug():
    raise RuntimeError('a bug')
  warm_up(bug, ready, ends.append)
  assert ends == [2, 1] and not ready.is_set()
  assert 'Traceback' in capsys.readouterr().err

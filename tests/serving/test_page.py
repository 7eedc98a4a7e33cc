"""serve.py's web page (serving/page.py) in a real headless browser: Debian's chromium
driven by Playwright, against the real server (uvicorn in a thread) on the noised tiny
model of test_server.py (conftest.noisy_engine, whose compiled programs it shares)."""

import contextlib
import json
import os
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from transformer_nmt.serving.connections import connection_protocol
from transformer_nmt.serving.server import Limits, make_app

CHROMIUM = '/usr/bin/chromium'
if not os.access(CHROMIUM, os.X_OK):
  pytest.skip(f'no browser at {CHROMIUM} (Debian packages chromium, chromium-driver)',
              allow_module_level=True)
sync_api = pytest.importorskip('playwright.sync_api',
                               reason='playwright is not installed (requirements-dev.txt)')

# Chromium on its own: no sandbox (containers, root), nothing fetched from the network.
BROWSER_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
                '--no-first-run', '--disable-background-networking',
                '--disable-component-update', '--disable-sync']
MAX_CHARS = 80  # low, so that a typed sentence can break it
WAIT_MS = 120_000  # the first translation may compile programs


@contextlib.contextmanager
def serving(engine, **options):
  """The base URL of the API and page (make_app(engine, **options)) served by uvicorn, as
  serve.py runs it, on a free local port."""
  import uvicorn
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    port = probe.getsockname()[1]
  app = make_app(engine, Limits(max_chars=MAX_CHARS), max_wait_ms=20, **options)
  server = uvicorn.Server(uvicorn.Config(app, host='127.0.0.1', port=port, log_level='warning',
                                         http=connection_protocol(app)))
  thread = threading.Thread(target=server.run, name='uvicorn', daemon=True)
  thread.start()
  deadline = time.monotonic() + 30
  while not server.started and thread.is_alive() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert server.started, 'uvicorn did not start'
  try:
    yield f'http://127.0.0.1:{port}'
  finally:
    server.should_exit = True
    thread.join(30)


@pytest.fixture(scope='module')
def url(noisy_engine):
  with serving(noisy_engine) as base:
    yield base


@pytest.fixture(scope='module')
def browser():
  """A fresh headless chromium (its own profile)."""
  with tempfile.TemporaryDirectory(prefix='chromium_profile_') as profile, \
       sync_api.sync_playwright() as playwright:
    context = playwright.chromium.launch_persistent_context(
        profile, executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
    try:
      yield context
    finally:
      context.close()


@pytest.fixture(scope='module')
def page(browser, url):
  """A page opened at /."""
  tab = browser.new_page()
  tab.goto(url + '/')
  yield tab
  tab.close()


def api(url: str, body: dict) -> tuple[int, dict]:
  """What the server answers to POST /v1/translate with `body`: (status, JSON)."""
  request = urllib.request.Request(url + '/v1/translate', data=json.dumps(body).encode(),
                                   headers={'Content-Type': 'application/json'})
  try:
    with urllib.request.urlopen(request, timeout=60) as response:
      return response.status, json.load(response)
  except urllib.error.HTTPError as e:
    return e.code, json.load(e)


def translate(page, text: str, n_best: int = 1, scores: bool = False) -> None:
  page.fill('#text', text)
  page.fill('#n_best', str(n_best))
  page.set_checked('#scores', scores)
  page.click('#go')


@pytest.mark.slow
def test_translations_n_best_and_attention(page, url, noisy_engine, lines):
  expect = sync_api.expect
  two = lines[:2]
  assert all(len(line) <= MAX_CHARS for line in two)
  translate(page, '\n'.join(two))
  best = page.locator('#out .best')
  expect(best).to_have_count(2, timeout=WAIT_MS)
  assert best.all_text_contents() == noisy_engine.translate(two)
  assert page.locator('#out .hyp').count() == 0  # n-best 1 without scores: the texts alone
  assert page.locator('#attention').count() == 0  # until a sentence is chosen

  translate(page, '\n'.join(two), n_best=2, scores=True)
  expect(page.locator('#out .sentence .hyp').first).to_be_visible(timeout=WAIT_MS)
  _, answer = api(url, {'text': two, 'n_best': 2, 'return_scores': True,
                        'return_attention': True})
  for i, (sentence, (_, hyps)) in enumerate(zip(answer['translations'],
                                                noisy_engine.hypotheses(two))):
    shown = page.locator('#out .sentence').nth(i)
    assert shown.locator('.best').text_content() == sentence['text']
    assert shown.locator('.hyp .pick').all_text_contents() == [h.text for h in hyps]
    assert shown.locator('.hyp .score').all_text_contents() == [
        f'score {h["score"]:.3f}, logprob {h["logprob"]:.3f}' for h in sentence['hypotheses']]

  # the second sentence's second hypothesis: its attention, tokens down, source across
  sentence = answer['translations'][1]
  assert len(sentence['hypotheses']) == 2
  chosen = sentence['hypotheses'][1]
  page.locator('#out .sentence').nth(1).locator('.hyp .pick').last.click()
  table = page.locator('#attention')
  expect(table).to_be_visible()
  assert table.locator('th.src').all_text_contents() == sentence['source_tokens']
  assert table.locator('th.tgt').all_text_contents() == chosen['tokens']
  cells = table.locator('td')
  assert cells.count() == len(chosen['tokens']) * len(sentence['source_tokens'])
  titles = iter(cells.evaluate_all('cells => cells.map(c => c.title)'))
  for t, row in enumerate(chosen['attention']):
    for s, weight in enumerate(row):
      pair, value = next(titles).rsplit(': ', 1)
      assert pair == f'{chosen["tokens"][t]} / {sentence["source_tokens"][s]}'
      assert float(value) == pytest.approx(weight, abs=5e-4)
  assert page.locator('#out .chosen').text_content() == chosen['text']


def test_an_error_shows_the_servers_message(page, url):
  too_long = 'x' * (MAX_CHARS + 1)
  status, answer = api(url, {'text': ['fine', too_long], 'return_attention': True})
  assert status == 422 and f'max_chars={MAX_CHARS}' in answer['error']
  translate(page, 'fine\n' + too_long)
  error = page.locator('#out .error')
  sync_api.expect(error).to_have_count(1, timeout=WAIT_MS)
  assert error.text_content() == answer['error']
  assert page.locator('#out .best').count() == 0


@pytest.mark.slow
def test_with_an_api_key_the_page_opens_and_sends_the_key_from_its_field(browser, noisy_engine,
                                                                        lines):
  """The page needs no key to open; its requests carry the one typed in its field."""
  with serving(noisy_engine, api_key='s3cret') as base:
    tab = browser.new_page()
    try:
      assert tab.goto(base + '/').status == 200
      translate(tab, lines[0])  # no key typed yet: the server's 401 is shown
      error = tab.locator('#out .error')
      sync_api.expect(error).to_have_count(1, timeout=WAIT_MS)
      assert 'API key' in error.text_content()
      tab.fill('#key', 's3cret')
      translate(tab, lines[0])
      best = tab.locator('#out .best')
      sync_api.expect(best).to_have_count(1, timeout=WAIT_MS)
      assert best.all_text_contents() == noisy_engine.translate(lines[:1])
    finally:
      tab.close()

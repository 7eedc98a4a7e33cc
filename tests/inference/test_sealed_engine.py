"""A sealed engine (serve.py's, once warm) compiles nothing: requests of every shape, with and
without prefixes, n-best, scores and long lines, run on what precompile made, and what cannot
is answered 422 naming the limit (issue: prefixes of new shapes compiled at request time until
the process passed the kernel's limit on memory maps and died)."""

import dataclasses

import jax
import pytest
from fastapi.testclient import TestClient

from transformer_nmt.inference.engine import Engine
from transformer_nmt.runtime.programs import Unprepared
from transformer_nmt.serving.server import make_app

WORDS = 'He played with twenty-one yellow apples and'


class _Compiles:
  def __init__(self):
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self.heard)

  def heard(self, event: str, *_, **__) -> None:
    self.count += event == '/jax/core/compile/backend_compile_duration'


COMPILES = _Compiles()


@pytest.fixture(scope='module')
def sealed(loaded) -> tuple[Engine, Engine]:
  """The tiny model prepared for 8 rows of 16 subwords and sealed; and the same settings
  without a seal."""
  settings = dataclasses.replace(loaded.decode, beam_size=2, max_extra_len=4,
                                 tokens_per_batch=64)
  engine = Engine(loaded, settings, n_best=2)
  with pytest.raises(ValueError, match='precompile'):
    engine.seal()
  engine.precompile(8, 16, scoring=True, kept_only=False)
  engine.seal()
  return engine, Engine(loaded, settings, n_best=2)


@pytest.mark.slow
def test_no_request_compiles_once_sealed(sealed):
  engine, _ = sealed
  client = TestClient(make_app(engine, max_wait_ms=0))
  before = COMPILES.count
  for words in (1, 2, 3, 5, 8, 12):
    for rows in (1, 2, 5, 12):
      text = [' '.join([WORDS] * words)] * rows
      for extra in ({}, {'prefix': ['Er'] * rows}, {'prefix': ['Er spielte mit'] * rows},
                    {'n_best': 2, 'return_scores': True, 'prefix': ['Er'] * rows}):
        response = client.post('/v1/translate', json={'text': text, **extra})
        assert response.status_code == 200, response.text
        assert len(response.json()['translations']) == rows
  response = client.post('/v1/score', json={'source': ['He played.'], 'target': ['Er']})
  assert response.status_code == 200, response.text
  assert COMPILES.count == before
  # 2 batch shapes (1 and 4 rows of 16 subwords) with outputs of 20 steps: caches of 12 and
  # 24, a start and an advance program each; and scoring's
  made = engine.prepared.programs
  assert made == 2 * 2 + len(engine.prepared.score_shapes)
  programs = client.get('/health').json()['programs']
  assert programs == {'ready': made, 'planned': made}
  assert engine.lines_split > 0 and engine.sentences_cut > 0  # 12 x 7 words, no sentence end
  metrics = client.get('/metrics').text
  assert f'nmt_sentences_cut {float(engine.sentences_cut)}' in metrics
  assert 'nmt_memory_maps{of="used"}' in metrics and 'nmt_memory_maps{of="limit"}' in metrics


def test_what_was_not_prepared_is_a_422_naming_the_limit(sealed):
  engine, _ = sealed
  client = TestClient(make_app(engine, max_wait_ms=0))
  before = COMPILES.count
  long = ' '.join([WORDS] * 6)
  response = client.post('/v1/translate', json={'text': ['Hallo'], 'prefix': [long]})
  assert response.status_code == 422 and '--precompile_length' in response.json()['error']
  response = client.post('/v1/score', json={'source': [long], 'target': ['Er']})
  assert response.status_code == 422 and 'score' in response.json()['error']
  with pytest.raises(Unprepared):
    engine.score([long], ['Er'])
  assert COMPILES.count == before


@pytest.mark.slow
def test_a_sealed_engine_translates_as_an_unsealed_one(sealed, lines):
  engine, plain = sealed
  assert engine.translate(lines) == plain.translate(lines)
  prefixes = ['Er'] * len(lines)
  assert engine.translate(lines, prefixes=prefixes) == plain.translate(lines, prefixes=prefixes)

"""bench/continuous_batching.py on the tiny model with noisy weights (sentences of many
lengths): its recorder counts every sentence once and leaves the engine as it was."""

import dataclasses
import sys

from conftest import ROOT

from transformer_nmt.config import DecodeConfig
from transformer_nmt.inference.engine import Engine

sys.path.insert(0, str(ROOT / 'bench'))
import continuous_batching  # noqa: E402


def test_recorder_counts_each_sentence_once_and_restores_the_engine(noisy_engine, tiny_workdir,
                                                                    capsys):
  settings = dataclasses.replace(noisy_engine.decode, max_len=20, chunk=2)
  engine = Engine(noisy_engine.model, DecodeConfig.validate(settings))
  lines = (tiny_workdir / 'demo_data' / 'test.en').read_text().splitlines()[:30]
  start, advance = engine._translate._start, engine._translate.decoder._advance
  expected = engine.translate(lines)

  recorder, wall = continuous_batching.decode_calls(engine, lines, per_call=10)

  assert engine._translate._start is start and engine._translate.decoder._advance is advance
  assert engine.translate(lines) == expected
  starts = [c for c in recorder.calls if not c.cache]
  chunks = [c for c in recorder.calls if c.cache]
  assert sum(c.before for c in starts) == len(lines)  # padding rows are no sentences
  assert chunks, 'the noisy sentences outlive the first cache stage'
  assert all(0 <= c.after <= c.before <= c.rows for c in recorder.calls)
  assert len(recorder.steps_taken) == len(lines)  # each finished once
  assert max(recorder.steps_taken) <= 20 + 2  # the output limit, in whole chunks
  assert min(recorder.steps_taken) >= 4  # the first cache stage: two chunks

  continuous_batching.print_calls(recorder, wall, engine.concurrent_batches, len(lines))
  lengths = continuous_batching.with_wide_length(recorder, 4, [8])
  seconds = continuous_batching.chunk_seconds(engine, lines, 4, lengths, repeats=1)
  continuous_batching.print_bound(recorder, wall, engine.concurrent_batches, 4, seconds)
  out = capsys.readouterr().out
  assert f'{len(lines)} sentences)' in out
  assert 8 in lengths and set(seconds) == set(lengths) and all(s > 0 for s in seconds.values())
  assert out.count('x |') == len(lengths) + 1  # a bound for each cache length, one simulated


def test_refilled_windows_follow_the_oldest_row():
  # every sentence lives 30 steps, joining after the start program's 12: the rows age
  # together through 18, 24 and 30 steps, then all are replaced
  windows = continuous_batching.refilled_windows([12, 30, 30], rows=8, first=12, chunk=6,
                                                 lengths=[24, 48], chunks=300)
  assert windows == {24: 200 / 300, 48: 100 / 300}
  assert continuous_batching.refilled_windows([12], 8, 12, 6, [24, 48]) == {24: 1.0}

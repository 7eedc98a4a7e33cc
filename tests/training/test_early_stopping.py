"""train.patience (early stopping on validation BLEU) and train.profile_steps."""

import json
import logging
import multiprocessing

import pytest

from transformer_nmt.config import default_config
from transformer_nmt.errors import ConfigError
from transformer_nmt.training.early_stopping import EarlyStopping
from transformer_nmt.typed_config import validate_config


def test_stops_after_patience_evaluations_without_a_better_bleu():
  early = EarlyStopping(patience=2)
  scripted = [(1, 1.0), (2, 2.0), (3, 2.0), (4, 1.5), (5, 3.0), (6, 2.0), (7, 2.9)]
  stops = [early.update(step, bleu) for step, bleu in scripted]
  assert stops == [False, False, False, True, False, False, True]
  assert (early.best, early.best_step, early.since) == (3.0, 5, 2)
  assert not any(EarlyStopping(patience=0).update(s, 0.0) for s in range(10))


def test_history_replays_the_logged_evaluations_up_to_the_checkpoint():
  rows = [{'step': 1, 'eval_bleu': 5.0}, {'step': 2, 'train_loss': 1.0},
          {'step': 2, 'eval_bleu': 4.0}, {'step': 3, 'eval_bleu': 1.0},
          {'step': 3, 'eval_bleu': 6.0},  # step 3 again after a resume: its last row counts
          {'step': 4, 'eval_bleu': 0.0}]
  state = EarlyStopping.from_history(2, rows, up_to_step=3)
  assert (state.best, state.best_step, state.since, state.stopped) == (6.0, 3, 0, False)
  assert EarlyStopping.from_history(1, rows, up_to_step=4).stopped


@pytest.mark.parametrize('option,value', [('patience', -1), ('cooldown_steps', -1),
                                          ('cooldown_steps', 11), ('profile_steps', (0, 2)),
                                          ('profile_steps', (3,)), ('profile_steps', (9, 5))])
def test_bad_values_are_refused(option, value):
  config = default_config()
  config.train.num_steps = 10
  config.train[option] = value
  with pytest.raises(ConfigError, match=f'train.{option}='):
    validate_config(config)


def _stop_early_with_a_profile(workdir: str) -> tuple[str, str]:
  """Two runs of the loop with scripted validation BLEU (the evaluation is replaced) and step
  2 profiled: the log of each. Runs in a fresh process: jax.profiler.start_trace has crashed
  (a segfault) late in a long test process, never in a process of its own such as train.py."""
  from configs import tiny
  from transformer_nmt.training import loop

  messages: list[str] = []
  handler = logging.Handler()
  handler.emit = lambda record: messages.append(record.getMessage())
  logging.getLogger().addHandler(handler)
  logging.getLogger().setLevel(logging.INFO)
  scripted = {1: 1.0, 2: 3.0, 3: 2.0, 4: 2.5, 5: 9.0}
  loop.evaluate = lambda exp, params, config, step, final=False: {
      'eval_loss': 1.0, 'eval_bleu': scripted[step]}
  config = tiny.get_config()
  config.data.update(demo_sizes=(200, 10, 10), spm_alpha=0.2)  # the loop with sampled epochs
  config.train.update(num_steps=8, eval_every=1, log_every=1, checkpoint_every=100,
                      patience=2, profile_steps=(2, 1))
  logs = []
  for _ in range(2):
    loop.train_and_evaluate(validate_config(config), workdir)
    logs.append('\n'.join(messages))
    messages.clear()
  return logs[0], logs[1]


@pytest.mark.slow
def test_a_run_stops_early_and_a_profile_is_written(tmp_path):
  """With patience 2 the run stops at the second evaluation without a better score, saving
  that step; a rerun trains no more. Step 2 is profiled into WORKDIR/profile."""
  workdir = tmp_path / 'run'
  with multiprocessing.get_context('spawn').Pool(1) as pool:
    first, second = pool.apply(_stop_early_with_a_profile, (str(workdir),))
  assert 'Stopped early at step 4: no better validation BLEU in 2 evaluations (best 3.00 at ' \
         'step 2)' in first
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert max(r['step'] for r in rows) == 4
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit()) == ['4']
  assert (workdir / 'best' / '2').is_dir()
  traces = list((workdir / 'profile').rglob('*.xplane.pb'))
  assert traces and any(b'train_step' in t.read_bytes() for t in traces)
  assert 'Profiled steps 2-2' in first
  assert 'Stopped early before' in second
  assert len((workdir / 'metrics.jsonl').read_text().splitlines()) == len(rows)

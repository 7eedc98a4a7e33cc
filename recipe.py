"""Train, choose on validation, score the test sets, and add a row to docs/RESULTS.md.

    python recipe.py --config configs/multi30k_1h.py:en-de --workdir runs/m30k_1h_en_de

1. Trains with train.py's loop (resuming; skipped when the workdir has reached train.num_steps).
2. On the validation set only: picks the checkpoint (latest, average of the last N, best by
   validation BLEU) with greedy search, then alpha for beam search on it, then (--mbr)
   whether a minimum Bayes risk choice among the beam's hypotheses does better.
3. Decodes data.test_* and data.extra_test_* with the chosen settings: sacreBLEU (cased,
   detokenised) with its signature, and chrF.
4. Writes learning curves and attention heatmaps under --plots_dir and appends a row that
   links them to --results.

With --sweep (comparing candidates on validation) step 3 is left out, and text test sets are
not scored during training either; rerun without --sweep on the chosen workdir to decode them.
"""

import dataclasses
import logging
import math
import os
import pathlib
import time

from absl import app, flags
from ml_collections import config_flags

from transformer_nmt.cli import config_flag_parser, fail, main_running
from transformer_nmt.decoding.settings import DECODE, MBR_UTILITIES, DecodeConfig
from transformer_nmt.inference import options

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/multi30k_1h.py', 'Config file.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Training workdir.', required=True)
_RESULTS = flags.DEFINE_string('results', 'docs/RESULTS.md', 'Markdown file to append a row to.')
_PLOTS = flags.DEFINE_string('plots_dir', 'docs/plots', 'PNGs go to PLOTS_DIR/<workdir name>/.')
# The search of the alpha trials and of the test sets (decode.py's flags of the same names)
SEARCH_FLAGS = ('beam_size', 'batch_tokens')
options.define_decode_flags(SEARCH_FLAGS)
# Beyond 1.0 too, with one value past the usual best so that a choice at 1.5 is bracketed:
# Multi30k de->en with alpha 1.0 came out 2.4% short of the reference length on validation.
# Steps of 0.25 around the best (2026-11-26): both Multi30k recipes choose 1.25 or 1.5, 0.2-0.3
# BLEU above 1.0 and 1.0-1.2 above 1.75 on validation (docs/RESULTS.md).
_ALPHAS = flags.DEFINE_list('alphas', [str(DECODE.alpha), '1.0', '1.25', '1.5', '1.75', '2.0'],
                            'Length penalties tried on validation.')
_MBR = flags.DEFINE_list('mbr', list(MBR_UTILITIES), 'Minimum Bayes risk utilities (decode.mbr: '
                         'bleu, chrf) tried on validation at the best length penalty; empty: '
                         'none.')
_AVERAGE = flags.DEFINE_integer('average_last', 5, 'Candidate: mean of the last N checkpoints.')
_ATTENTION = flags.DEFINE_integer('attention_sentences', 3, 'Test sentences to plot.')
_SWEEP = flags.DEFINE_bool('sweep', False, 'A sweep run: validation only. The test sets are '
                           'not decoded and the row says so; with data.source=text they are not '
                           'scored during training either (a demo or tfds corpus\'s own test '
                           'split still is, by the final evaluation). Rerun without --sweep on '
                           'the chosen workdir to decode them.')



def checked_run() -> None:
  try:
    alphas = [float(a) for a in _ALPHAS.value]
  except ValueError:
    fail(f'--alphas={",".join(_ALPHAS.value)}: expected numbers, e.g. 0.6,1.0')
  if not all(0 <= a < math.inf for a in alphas):  # as DecodeConfig checks, but before training
    fail(f'--alphas={",".join(_ALPHAS.value)}: each must be a finite number, 0 or more')
  if not set(_MBR.value) <= set(MBR_UTILITIES):
    fail(f'--mbr={",".join(_MBR.value)}: expected utilities among {",".join(MBR_UTILITIES)}')
  if _AVERAGE.value < 0:
    fail(f'--average_last={_AVERAGE.value} must be 0 or positive')
  options.with_overrides(DECODE, options.decode_overrides(SEARCH_FLAGS))  # before training
  run(alphas)


def run(alphas: list[float]) -> None:
  from transformer_nmt import plots
  from transformer_nmt.checkpoint import Checkpointer
  from transformer_nmt.files import write_atomically
  from transformer_nmt.metrics import read_metrics
  from transformer_nmt.training import loop as trainer
  from transformer_nmt.training import selection as report
  from transformer_nmt.typed_config import validate_config
  from transformer_nmt.workdir import Workdir
  config, workdir = validate_config(_CONFIG.value), pathlib.Path(_WORKDIR.value)
  if _SWEEP.value:  # choosing among runs must not look at the test sets
    config = dataclasses.replace(config, data=dataclasses.replace(
        config.data, test_src='', test_tgt='', extra_test_src=(), extra_test_tgt=()))
  valid, tests = report.eval_sets(config.data, workdir)  # before hours of training: fail early
  tests = [] if _SWEEP.value else tests  # a demo or tfds corpus brings its own test split
  steps_dir = Workdir(workdir).checkpoints
  done = Checkpointer(steps_dir, read_only=True).latest_step() if steps_dir.exists() else None
  if (done or 0) < config.train.num_steps:
    trainer.train_and_evaluate(config, str(workdir))
  else:
    logging.info('%s has reached step %d: not training', workdir, config.train.num_steps)
  rows = read_metrics(Workdir(workdir).metrics)
  wall = max((r['wall_s'] for r in rows if isinstance(r.get('wall_s'), (int, float))),
             default=None)

  t0 = time.time()
  selection, engine = _select(config.decode, workdir, valid, alphas)
  scored = report.score_tests(engine, workdir, tests)
  logging.info('selection and decoding took %.0f s', time.time() - t0)
  # The choice is written at once, before the plots and the row, so that nothing after it
  # (a damaged metrics file, a plotting error) can lose the hour of work behind it.
  Workdir(workdir).selection.parent.mkdir(exist_ok=True)
  write_atomically(Workdir(workdir).selection, report.selection_json(selection, scored))

  plot_dir = pathlib.Path(_PLOTS.value) / workdir.name
  try:
    paths = [plots.plot_learning_curves(rows, plot_dir / 'curves.png', title=workdir.name)]
    if tests:
      paths += plots.plot_cross_attention(selection.model, tests[0][1][0],
                                          scored[0][1].hypotheses, plot_dir, _ATTENTION.value)
  except (OSError, ValueError, TypeError, KeyError) as e:
    logging.warning('No plots in %s (%s: %s); the results row goes without them', plot_dir,
                    type(e).__name__, e)
    paths = []
  results = pathlib.Path(_RESULTS.value)
  links = [os.path.relpath(p, results.parent) for p in paths]
  row = report.results_row(config=_config_arg(), direction=report.direction(config.data),
                           steps=config.train.num_steps, train_seconds=wall,
                           selection=selection, tests=scored, plots=links)
  report.append_row(results, row)
  logging.info('appended to %s: %s', results, row.strip())


def _select(decode: DecodeConfig, workdir: pathlib.Path, valid: tuple,
            alphas: list[float]) -> tuple:
  """results.select with the config's search settings and this command's flags."""
  from transformer_nmt.training import selection as report
  from transformer_nmt.workdir import Workdir
  decode = options.with_overrides(decode, options.decode_overrides(SEARCH_FLAGS))
  # decode.py searches with the workdir's own section: programs of other settings (flags
  # here, defaults changed since training) would only take disk space
  own = decode == Workdir(workdir).read_sections().decode
  return report.select(workdir, *valid, decode=decode, alphas=alphas,
                       average_last=_AVERAGE.value, log=logging.info, mbr=_MBR.value,
                       programs=Workdir(workdir).programs if own else None)


def _config_arg() -> str:
  """The config file as given (with its argument), plus any --config.* overrides."""
  holder = flags.FLAGS['config']
  overrides = config_flags.get_override_values(holder)
  return ' '.join([config_flags.get_config_filename(holder)] +
                  [f'{k}={v}' for k, v in sorted(overrides.items())])


if __name__ == '__main__':
  app.run(main_running(checked_run, resumes=True), flags_parser=config_flag_parser(_CONFIG))

"""Plots for a training workdir: learning curves from metrics.jsonl and, with --input,
encoder-decoder attention heatmaps of its first sentences.

    python plot.py --workdir runs/m30k_1h_en_de --out_dir plots \
        --input ../shared/data/multi30k/test2016.en --sentences 3
"""

import pathlib
import sys

from absl import app, flags

from transformer_nmt.cli import flag_parser, main_running
from transformer_nmt.inference import options

_WORKDIR = flags.DEFINE_string('workdir', None, 'Training workdir.', required=True)
_OUT = flags.DEFINE_string('out_dir', None, 'Where the PNGs go (default: WORKDIR/plots).')
_INPUT = flags.DEFINE_string('input', None, 'Source sentences for attention heatmaps.')
_SENTENCES = flags.DEFINE_integer('sentences', 3, 'How many sentences to plot.')
options.define_decode_flags(('beam_size',))  # of the translations plotted


def run() -> None:
  from transformer_nmt import plots
  from transformer_nmt.data import batching as data_lib
  from transformer_nmt.errors import DataError
  from transformer_nmt.metrics import read_metrics
  from transformer_nmt.workdir import Workdir
  workdir = pathlib.Path(_WORKDIR.value)
  rows = read_metrics(Workdir(workdir).metrics)
  if not rows:
    raise DataError(f'{Workdir(workdir).metrics} is missing or empty: is {workdir} a workdir?')
  out = pathlib.Path(_OUT.value) if _OUT.value else Workdir(workdir).plots
  paths = [plots.plot_learning_curves(rows, out / 'curves.png', title=workdir.name)]
  if _INPUT.value:
    from transformer_nmt.inference import Engine, load_workdir
    model = load_workdir(workdir)
    lines = [line for line in data_lib.read_lines(_INPUT.value) if line][:_SENTENCES.value]
    decode = options.with_overrides(model.decode, options.decode_overrides(('beam_size',)))
    hyps = Engine(model, decode).translate(lines)
    paths += plots.plot_cross_attention(model, lines, hyps, out, _SENTENCES.value)
  for path in paths:
    print(f'wrote {path}', file=sys.stderr)


if __name__ == '__main__':
  app.run(main_running(run), flags_parser=flag_parser)

"""Export a workdir's model as a Marian (OPUS-MT) checkpoint in Hugging Face's layout.

    python export_marian.py --workdir runs/opus_tuned --out opus-mt-tuned
    python -c "from transformers import MarianMTModel, MarianTokenizer
    tok = MarianTokenizer.from_pretrained('opus-mt-tuned')
    model = MarianMTModel.from_pretrained('opus-mt-tuned')
    print(tok.batch_decode(model.generate(**tok(['Hello.'], return_tensors='pt')),
                           skip_special_tokens=True))"

The mirror of import_marian.py: an imported model fine-tuned here (configs/finetune.py) goes
back to transformers, as may a model trained here with Marian's options (post-LN, positions
'halves', LayerNorm epsilon 1e-5). A model with options Marian cannot hold is refused in one
line (exit code 2) and nothing is written (src/transformer_nmt/interop/marian_export.py). Ctrl-C and
SIGTERM end it in one line with exit code 130, the partial directory removed.
"""

import sys
from typing import NoReturn


def _interrupted(line: str = 'interrupted') -> NoReturn:
  print(f'error: {line}', file=sys.stderr)
  sys.exit(130)


try:  # the imports take seconds, in which a Ctrl-C is likeliest: one line, not a traceback
  from absl import app, flags

  from transformer_nmt.cli import flag_parser, main_running
  from transformer_nmt.inference.options import checkpoint_choice, define_checkpoint_flags
except KeyboardInterrupt:
  _interrupted()

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained (or imported) workdir.', required=True)
_OUT = flags.DEFINE_string('out', None, 'New directory for the Marian checkpoint (must not '
                           'exist or be empty).', required=True)
define_checkpoint_flags()  # --checkpoint, --best, --ema, --average_last


def run() -> None:
  import signal
  try:
    from transformer_nmt.inference import load_workdir
    from transformer_nmt.interop.marian_export import check_exportable, export_model
    from transformer_nmt.interop.staging import Stopped
    from transformer_nmt.workdir import Workdir
    check_exportable(Workdir(_WORKDIR.value).read_model_config())  # before loading weights
    model = load_workdir(_WORKDIR.value, checkpoint_choice())
    export_model(model.cfg, model.params, model.src_tok, model.tgt_tok, model.decode,
                 _OUT.value)
  except KeyboardInterrupt as stop:  # main_running would exit without a word
    if not isinstance(stop, Stopped):
      _interrupted()
    _interrupted(f'{"terminated (SIGTERM)" if stop.signum == signal.SIGTERM else "interrupted"}'
                 f'; nothing was written to --out={_OUT.value}')
  print(f'wrote the Marian checkpoint of step(s) {model.steps} to {_OUT.value}',
        file=sys.stderr)


if __name__ == '__main__':
  try:  # flag parsing and the setup of main_running, which exits 130 silently, are outside
    app.run(main_running(run), flags_parser=flag_parser)
  except KeyboardInterrupt:
    _interrupted()

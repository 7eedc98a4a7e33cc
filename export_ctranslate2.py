"""Export a trained workdir to a CTranslate2 model directory for deployment.

    python export_ctranslate2.py --workdir runs/m30k_1h_en_de --out m30k_ct2 --average_last 5

Then translate with CTranslate2 (see src/transformer_nmt/interop/ctranslate2.py for the token
convention): SentencePiece pieces of each source line followed by '</s>'.
"""

import sys

from absl import app, flags

from transformer_nmt.cli import fail, flag_parser, main_running
from transformer_nmt.inference.options import checkpoint_choice, define_checkpoint_flags
from transformer_nmt.interop.ctranslate2 import QUANTIZATIONS

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained workdir.', required=True)
_OUT = flags.DEFINE_string('out', None, 'Output directory for the CTranslate2 model.',
                           required=True)
define_checkpoint_flags()  # --checkpoint, --best, --ema, --average_last
_QUANTIZATION = flags.DEFINE_enum('quantization', None, list(QUANTIZATIONS),
                                  'Weight type in the export (default: float32); bfloat16 '
                                  'needs torch.')


def run() -> None:
  try:
    import ctranslate2  # noqa: F401
  except ImportError:
    fail('ctranslate2 is not installed: pip install "ctranslate2>=4.8,<5"')
  import pathlib

  from transformer_nmt.inference import load_workdir
  from transformer_nmt.interop.ctranslate2 import check_quantization, export
  check_quantization(_QUANTIZATION.value)  # before the model loads
  out = pathlib.Path(_OUT.value)
  if out.exists() and any(out.iterdir()):
    fail(f'--out={out} exists and is not empty; choose a new directory')
  model = load_workdir(_WORKDIR.value, checkpoint_choice())
  export(model.cfg, model.params, model.src_tok, model.tgt_tok, out, _QUANTIZATION.value)
  print(f'wrote CTranslate2 model of checkpoint step(s) {model.steps} to {out}', file=sys.stderr)


if __name__ == '__main__':
  app.run(main_running(run), flags_parser=flag_parser)

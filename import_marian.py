"""Import a Marian (OPUS-MT) checkpoint in Hugging Face's layout as a workdir of ours.

    hf download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de
    python import_marian.py --from opus-mt-en-de --workdir runs/opus_en_de
    python decode.py --workdir runs/opus_en_de --input test.en --output test.de

The counterpart of export_ctranslate2.py: a model comes in rather than goes out. Nothing is
downloaded; the directory is the user's. What the checkpoint uses and this model lacks is
refused in one line (exit code 2) and nothing is written (src/transformer_nmt/interop/marian.py).
Ctrl-C and SIGTERM end it in one line with exit code 130, the partial workdir removed.
"""

import sys
from typing import NoReturn


def _interrupted(line: str = 'interrupted') -> NoReturn:
  print(f'error: {line}', file=sys.stderr)
  sys.exit(130)


try:  # the imports take seconds, in which a Ctrl-C is likeliest: one line, not a traceback
  from absl import app, flags

  from transformer_nmt.cli import flag_parser, main_running
except KeyboardInterrupt:
  _interrupted()

_FROM = flags.DEFINE_string('from', None, 'Directory of the Marian checkpoint (config.json, '
                            'model.safetensors or pytorch_model.bin, source.spm, target.spm, '
                            'vocab.json).', required=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'New workdir to write (must not exist or be '
                               'empty).', required=True)


def run() -> None:
  import signal
  try:
    from transformer_nmt.interop.marian import Stopped, import_checkpoint
    cfg = import_checkpoint(_FROM.value, _WORKDIR.value)
  except KeyboardInterrupt as stop:  # main_running would exit without a word
    if not isinstance(stop, Stopped):  # a second Ctrl-C, not waiting for a clean stop
      _interrupted()
    _interrupted(f'{"terminated (SIGTERM)" if stop.signum == signal.SIGTERM else "interrupted"}'
                 f'; nothing was written to --workdir={_WORKDIR.value}')
  print(f'imported {_FROM.value} ({cfg.encoder_depth}+{cfg.decoder_depth} layers, d_model '
        f'{cfg.d_model}, vocabulary {cfg.vocab_size}) into {_WORKDIR.value}', file=sys.stderr)


if __name__ == '__main__':
  try:  # flag parsing and the setup of main_running, which exits 130 silently, are outside
    app.run(main_running(run), flags_parser=flag_parser)
  except KeyboardInterrupt:
    _interrupted()

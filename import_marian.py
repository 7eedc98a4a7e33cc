"""Import a Marian (OPUS-MT) checkpoint in Hugging Face's layout as a workdir of ours.

    huggingface-cli download Helsinki-NLP/opus-mt-en-de --local-dir opus-mt-en-de
    python import_marian.py --from opus-mt-en-de --workdir runs/opus_en_de
    python decode.py --workdir runs/opus_en_de --input test.en --output test.de

The counterpart of export_ctranslate2.py: a model comes in rather than goes out. Nothing is
downloaded; the directory is the user's. What the checkpoint uses and this model lacks is
refused in one line (exit code 2) and nothing is written (src/transformer_nmt/marian.py).
"""

import sys

from absl import app, flags

from transformer_nmt.cli import flag_parser, main_running

_FROM = flags.DEFINE_string('from', None, 'Directory of the Marian checkpoint (config.json, '
                            'model.safetensors or pytorch_model.bin, source.spm, target.spm, '
                            'vocab.json).', required=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'New workdir to write (must not exist or be '
                               'empty).', required=True)


def run() -> None:
  from transformer_nmt.marian import import_checkpoint
  cfg = import_checkpoint(_FROM.value, _WORKDIR.value)
  print(f'imported {_FROM.value} ({cfg.encoder_depth}+{cfg.decoder_depth} layers, d_model '
        f'{cfg.d_model}, vocabulary {cfg.vocab_size}) into {_WORKDIR.value}', file=sys.stderr)


if __name__ == '__main__':
  app.run(main_running(run), flags_parser=flag_parser)

"""Fine-tuning through the Marian import, measured: a random Marian model whose source and
target SentencePiece models are trained on the training text, built with transformers and
saved as Hugging Face does, imported with import_marian.py, then trained with
`train.py --config configs/finetune.py:W`; validation BLEU (decode.py --reference, greedy) of
the import and of the fine-tuned run. Nothing is downloaded.

  python bench/finetune_marian.py --data ../shared/data/multi30k --out /tmp/marian_ft

Needs torch and transformers (requirements-dev.txt).
"""

import json
import pathlib
import re
import shutil
import subprocess
import sys
import time

from absl import app, flags

from import_marian import save_random_marian  # bench/import_marian.py, beside this file

_DATA = flags.DEFINE_string('data', '../shared/data/multi30k', 'Folder with train.en/de and '
                            'valid.en/de.')
_OUT = flags.DEFINE_string('out', '/tmp/marian_ft', 'Scratch directory (emptied first).')
_STEPS = flags.DEFINE_integer('steps', 600, 'Fine-tuning steps.')
_VOCAB = flags.DEFINE_integer('vocab', 4000, 'Pieces of each SentencePiece model.')
_WIDTH = flags.DEFINE_integer('d_model', 128, 'Model width (2+2 layers, 4 heads, FFN 4x).')
_VALID = flags.DEFINE_integer('valid_lines', 300, 'Validation lines scored.')
ROOT = pathlib.Path(__file__).resolve().parents[1]


def make_checkpoint(out: pathlib.Path, data: pathlib.Path) -> int:
  """A random Marian directory with SentencePiece models of the training text; returns its
  parameter count."""
  import sentencepiece as spm
  pieces = []
  for name, side in (('source.spm', 'en'), ('target.spm', 'de')):
    spm.SentencePieceTrainer.train(input=str(data / f'train.{side}'),
                                   model_prefix=str(out / name), vocab_size=_VOCAB.value,
                                   eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, minloglevel=2)
    (out / f'{name}.model').rename(out / name)
    sp = spm.SentencePieceProcessor(model_file=str(out / name))
    pieces += [sp.id_to_piece(i) for i in range(2, sp.get_piece_size())]
  table = ['</s>', '<unk>'] + sorted(set(pieces)) + ['<pad>']
  (out / 'vocab.json').write_text(json.dumps({p: i for i, p in enumerate(table)}))
  return save_random_marian(out, len(table), _WIDTH.value, layers=2, heads=4)


def run(command: list[str]) -> str:
  """What the command printed (stdout, then stderr); exits on failure."""
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  if result.returncode:
    sys.exit(f'{command} failed: {result.stderr[-3000:]}')
  return result.stdout + result.stderr


def bleu(workdir: pathlib.Path, source: pathlib.Path, reference: pathlib.Path) -> str:
  said = run([sys.executable, 'decode.py', '--workdir', str(workdir), '--input', str(source),
              '--reference', str(reference), '--output', str(workdir / 'valid.hyp'),
              '--beam_size', '1', '--noprograms'])
  found = re.search(r'sacreBLEU [0-9.]+', said)
  return found.group(0) if found else said.strip().splitlines()[-1]


def main(argv: list[str]) -> None:
  del argv
  data, scratch = pathlib.Path(_DATA.value).resolve(), pathlib.Path(_OUT.value)
  shutil.rmtree(scratch, ignore_errors=True)
  checkpoint, imported, tuned = scratch / 'hf', scratch / 'imported', scratch / 'tuned'
  checkpoint.mkdir(parents=True)
  valid = {}
  for side in ('en', 'de'):
    valid[side] = scratch / f'valid.{side}'
    lines = (data / f'valid.{side}').read_text(encoding='utf-8').splitlines()
    valid[side].write_text('\n'.join(lines[:_VALID.value]) + '\n', encoding='utf-8')
  count = make_checkpoint(checkpoint, data)
  print(f'random Marian model: {count / 1e6:.2f}M parameters', flush=True)
  run([sys.executable, 'import_marian.py', '--from', str(checkpoint), '--workdir',
       str(imported)])
  print(f'imported, validation: {bleu(imported, valid["en"], valid["de"])}', flush=True)
  steps = _STEPS.value
  t0 = time.perf_counter()
  run([sys.executable, 'train.py', '--config', f'configs/finetune.py:{imported}', '--workdir',
       str(tuned), f'--config.data.train_src={data / "train.en"}',
       f'--config.data.train_tgt={data / "train.de"}',
       f'--config.data.valid_src={valid["en"]}', f'--config.data.valid_tgt={valid["de"]}',
       f'--config.train.num_steps={steps}', f'--config.train.warmup_steps={steps // 4}',
       f'--config.train.cooldown_steps={steps // 4}',
       '--config.train.learning_rate_multiplier=1.0', f'--config.train.eval_every={steps}',
       f'--config.train.checkpoint_every={steps}', '--config.data.tokens_per_batch=2048',
       '--config.decode.beam_size=1'])
  print(f'fine-tuned {steps} steps in {time.perf_counter() - t0:.0f} s, validation: '
        f'{bleu(tuned, valid["en"], valid["de"])}', flush=True)


if __name__ == '__main__':
  app.run(main)

"""import_marian.py, a first translation and export_marian.py on an OPUS-MT-sized model:
d_model 512, 6+6 layers, 8 heads, d_ff 2048, vocabulary 58101 (about 75M parameters,
Helsinki-NLP/opus-mt-en-de's shape), built at random with transformers and saved with
save_pretrained; nothing is downloaded. Prints the wall time of the import, of two decode.py
runs of one line (the second calls the programs the first stored in WORKDIR/programs) and of
export_marian.py.

  python bench/import_marian.py --dir /tmp/opus_bench [--markdown bench/RESULTS.md]

Needs torch and transformers (requirements-dev.txt).
"""

import io
import json
import pathlib
import shutil
import subprocess
import sys
import time

import common
from absl import app, flags

_DIR = flags.DEFINE_string('dir', '/tmp/opus_bench', 'Scratch directory (emptied first).')
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the table into this file, '
                                'replacing its bench/import_marian.py section.')
ROOT = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 58101


def make_checkpoint(out: pathlib.Path) -> int:
  """A random opus-mt-en-de-shaped Marian directory; returns its parameter count."""
  import sentencepiece as spm
  lines = [f'the {n} cats see {n + 1} dogs in the house number {n * 7}' for n in range(200)]
  pieces = []
  for name in ('source.spm', 'target.spm'):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                   vocab_size=200, eos_id=0, unk_id=1, bos_id=-1, pad_id=-1,
                                   hard_vocab_limit=False, minloglevel=2)
    (out / name).write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=str(out / name))
    pieces += [sp.id_to_piece(i) for i in range(2, sp.get_piece_size())]
  table = ['</s>', '<unk>'] + sorted(set(pieces))
  table += [f'▁filler{i}' for i in range(VOCAB - 1 - len(table))] + ['<pad>']
  (out / 'vocab.json').write_text(json.dumps({p: i for i, p in enumerate(table)}))
  return save_random_marian(out, VOCAB, d_model=512, layers=6, heads=8)


def save_random_marian(out: pathlib.Path, vocab: int, d_model: int, layers: int,
                       heads: int) -> int:
  """A random MarianMTModel as OPUS-MT's are made (swish, scaled embeddings, eos 0, pad and
  decoder start last, FFN 4 x d_model), saved into `out`; returns its parameter count."""
  import torch
  import transformers
  config = transformers.MarianConfig(
      vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
      encoder_attention_heads=heads, decoder_attention_heads=heads,
      encoder_ffn_dim=4 * d_model, decoder_ffn_dim=4 * d_model, max_position_embeddings=512,
      pad_token_id=vocab - 1, decoder_start_token_id=vocab - 1, eos_token_id=0,
      forced_eos_token_id=0, activation_function='swish', scale_embedding=True)
  torch.manual_seed(0)
  model = transformers.MarianMTModel(config)
  model.save_pretrained(out)
  return sum(p.numel() for p in model.parameters())


def timed(command: list[str]) -> float:
  start = time.perf_counter()
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if result.returncode:
    sys.exit(f'{command} failed: {result.stderr[-2000:]}')
  return seconds


def main(argv: list[str]) -> None:
  del argv
  scratch = pathlib.Path(_DIR.value)
  shutil.rmtree(scratch, ignore_errors=True)
  checkpoint, workdir = scratch / 'opus-mt-random', scratch / 'run'
  checkpoint.mkdir(parents=True)
  count = make_checkpoint(checkpoint)
  size = (checkpoint / 'model.safetensors').stat().st_size
  rows = [('import_marian.py', timed([sys.executable, 'import_marian.py', '--from',
                                      str(checkpoint), '--workdir', str(workdir)]))]
  source = scratch / 'one.en'
  source.write_text('the 3 cats see 4 dogs in the house number 21\n')
  decode = [sys.executable, 'decode.py', '--workdir', str(workdir), '--input', str(source),
            '--output', str(scratch / 'one.de')]
  rows.append(('decode.py, one line, first run (compiles and stores its programs)',
               timed(decode)))
  rows.append(('decode.py, the same line again (stored programs)', timed(decode)))
  rows.append(('export_marian.py (back to a transformers directory)',
               timed([sys.executable, 'export_marian.py', '--workdir', str(workdir), '--out',
                      str(scratch / 'exported')])))
  text = (f'{common.stamp()}\n\nA random MarianMTModel of opus-mt-en-de\'s shape: '
          f'{count / 1e6:.1f}M parameters, model.safetensors {size / 2**20:.0f} MiB.\n\n'
          '| step | wall s |\n| --- | ---: |\n'
          + ''.join(f'| {name} | {seconds:.1f} |\n' for name, seconds in rows))
  print(text)
  if _MARKDOWN.value:
    common.write_section(_MARKDOWN.value, 'bench/import_marian.py', text)


if __name__ == '__main__':
  app.run(main)

"""Decoding speed, side by side in one run: greedy and beam 4, with and without the KV cache
and cross-attention K/V reuse, and chunked early stopping against a full-length scan.

  python bench/decode.py --workdir runs/small --input ../shared/data/multi30k/test2016.en

Each variant is first compiled by translating one sentence per length bucket (batch shapes
depend only on the bucket), then timed on all sentences; outputs of all variants with the same
beam are checked to agree.
"""

import sys
import time

import numpy as np
from absl import app, flags

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_MAX_SENTENCES = flags.DEFINE_integer('max_sentences', 1000, 'Use the first N sentences.')
_BATCH_TOKENS = flags.DEFINE_integer('batch_tokens', 4096, 'Padded source tokens per batch.')
_MAX_EXTRA = flags.DEFINE_integer('max_extra_len', 50, 'Output limit = input length + this.')
_BEAMS = flags.DEFINE_list('beams', ['1', '4'], 'Beam sizes to measure.')

VARIANTS = [  # (name, cache_mode, chunk); chunk 0 = one scan over the full output length
    ('cached', 'cached', 8),
    ('cached, full-length scan', 'cached', 0),
    ('no cross-K/V reuse', 'no_cross_reuse', 8),
    ('uncached (prefix recomputed)', 'uncached', 8),
]


def one_per_bucket(rows):
  """The longest row plus one row of every other length bucket: same batch shapes as `rows`."""
  from transformer_nmt import data as data_lib
  lengths = np.array([len(r) for r in rows])
  bounds = data_lib.bucket_boundaries(int(lengths.max()))
  buckets = np.searchsorted(np.asarray(bounds), lengths)
  picks = {int(b): i for i, b in enumerate(buckets)}
  picks[int(buckets[lengths.argmax()])] = int(lengths.argmax())
  return [rows[i] for i in sorted(picks.values())]


def measure(model, rows, beam, cache_mode, chunk):
  """(compile seconds, timed seconds, output id rows) for one variant."""
  from transformer_nmt.inference import Translator
  chunk = chunk or 10**6  # longer than any output: the loop becomes a single scan
  translator = Translator(model.cfg, model.src_tok, model.tgt_tok, beam_size=beam,
                          max_extra_len=_MAX_EXTRA.value, tokens_per_batch=_BATCH_TOKENS.value,
                          chunk=chunk, cache_mode=cache_mode)
  t0 = time.perf_counter()
  translator.translate_ids(model.params, one_per_bucket(rows))  # compiles each bucket shape
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  outputs = translator.translate_ids(model.params, rows)
  return first, time.perf_counter() - t0, outputs


def main(argv):
  del argv
  from transformer_nmt import data as data_lib
  from transformer_nmt.inference import load_workdir
  model = load_workdir(_WORKDIR.value)
  lines = [l for l in data_lib.read_lines(_INPUT.value) if l][:_MAX_SENTENCES.value]
  rows = [np.array(ids + [model.src_tok.eos_id], np.int32) for ids in model.src_tok.encode(lines)]
  print(f'{len(rows)} sentences from {_INPUT.value}; model {model.cfg.num_layers} layers, '
        f'd_model {model.cfg.d_model}; steps {model.steps}', flush=True)
  print(f'{"variant":32s} {"beam":>4s} {"sent/s":>8s} {"tok/s":>8s} {"timed s":>8s} '
        f'{"compile s":>10s}')
  results = {}
  for beam in [int(b) for b in _BEAMS.value]:
    reference = None
    for name, mode, chunk in VARIANTS:
      first, seconds, outputs = measure(model, rows, beam, mode, chunk)
      tokens = sum(len(o) + 1 for o in outputs)  # generated subwords incl. EOS
      results[(name, beam)] = seconds
      same = '' if reference is None else (
          '' if all(np.array_equal(a, b) for a, b in zip(outputs, reference)) else
          '  (outputs differ from cached!)')
      reference = outputs if reference is None else reference
      print(f'{name:32s} {beam:4d} {len(rows) / seconds:8.1f} {tokens / seconds:8.0f} '
            f'{seconds:8.2f} {first:10.2f}{same}', flush=True)
  for beam in [int(b) for b in _BEAMS.value]:
    base = results[('cached', beam)]
    print(f'beam {beam}: cached is {results[("uncached (prefix recomputed)", beam)] / base:.2f}x '
          f'uncached, {results[("no cross-K/V reuse", beam)] / base:.2f}x without cross-K/V '
          f'reuse, {results[("cached, full-length scan", beam)] / base:.2f}x the full-length scan')


if __name__ == '__main__':
  sys.path.insert(0, '.')
  app.run(main)

"""Decoding speed, side by side in one run: greedy and beam 4, with and without the KV cache
and cross-attention K/V reuse, finished sentences dropped between chunks against the whole
batch run in one jitted loop, a cache that grows in stages against one of the full length
limit, the paper's beam stopping rule against CTranslate2's (k_finished), chunked early stopping
against a full-length scan, and the same weights exported to CTranslate2 (--ctranslate2;
pip install -r bench/requirements.txt).

  python bench/decode.py --workdir runs/small --input ../shared/data/multi30k/test2016.en

Each variant translates all sentences twice: the first pass compiles every batch shape, the
second is timed. Outputs of all variants with the same beam are compared with ours (cached).
"""

import shlex
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
_VARIANT_NAMES = flags.DEFINE_list('variants', ['cached', 'cached (stop at K finished)',
                                                'cached (one loop, no row dropping)',
                                                'cached (full-length cache)',
                                                'cached (one full-length scan)',
                                                'no cross-K/V reuse',
                                                'uncached (prefix recomputed)'],
                                   'Our decoder variants to run.')
_CT2 = flags.DEFINE_bool('ctranslate2', False, 'Also run the model exported to CTranslate2.')
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the table into this file, '
                                'replacing its bench/decode.py section.')

VARIANTS = [  # (name, cache_mode, chunk, grow_cache, beam_stop, compact); chunk 0: one scan
    ('cached', 'cached', 8, True, 'bound', True),
    ('cached (stop at K finished)', 'cached', 8, True, 'k_finished', True),
    ('cached (one loop, no row dropping)', 'cached', 8, True, 'bound', False),
    ('cached (full-length cache)', 'cached', 8, False, 'bound', False),
    ('cached (one full-length scan)', 'cached', 0, False, 'bound', False),
    ('no cross-K/V reuse', 'no_cross_reuse', 8, True, 'bound', False),
    ('uncached (prefix recomputed)', 'uncached', 8, False, 'bound', False),
]


def measure(model, rows, beam, cache_mode, chunk, grow_cache, beam_stop, compact):
  """(first-pass seconds incl. compilation, timed seconds, output id rows) for one variant."""
  from transformer_nmt.inference import Translator
  chunk = chunk or 10**6  # longer than any output: the loop becomes a single scan
  translator = Translator(model.cfg, model.src_tok, model.tgt_tok, beam_size=beam,
                          max_extra_len=_MAX_EXTRA.value, tokens_per_batch=_BATCH_TOKENS.value,
                          chunk=chunk, cache_mode=cache_mode, grow_cache=grow_cache,
                          beam_stop=beam_stop, compact=compact)
  t0 = time.perf_counter()
  translator.translate_ids(model.params, rows)  # a first pass compiles every batch shape
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  outputs = translator.translate_ids(model.params, rows)
  return first, time.perf_counter() - t0, outputs


def measure_ctranslate2(model, rows, beam, directory):
  """(warm-up seconds, timed seconds, output id rows) for CTranslate2 on the same rows."""
  import os

  import ctranslate2
  translator = ctranslate2.Translator(str(directory), device='cpu', inter_threads=1,
                                      intra_threads=os.cpu_count() or 1)
  pieces = [model.src_tok.pieces(r) for r in rows]  # rows end in EOS: '</s>'
  options = dict(beam_size=beam, length_penalty=0.6, max_batch_size=_BATCH_TOKENS.value,
                 batch_type='tokens', max_decoding_length=max(map(len, rows)) + _MAX_EXTRA.value)
  t0 = time.perf_counter()
  translator.translate_batch(pieces[:8], **options)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  results = translator.translate_batch(pieces, **options)
  seconds = time.perf_counter() - t0
  vocab = {p: i for i, p in enumerate(model.tgt_tok.pieces(range(model.tgt_tok.vocab_size)))}
  outputs = [np.array([vocab[p] for p in r.hypotheses[0]], np.int32) for r in results]
  return first, seconds, outputs


def main(argv):
  del argv
  import tempfile

  from transformer_nmt import data as data_lib
  from transformer_nmt.inference import load_workdir
  model = load_workdir(_WORKDIR.value)
  lines = [l for l in data_lib.read_lines(_INPUT.value) if l][:_MAX_SENTENCES.value]
  rows = [np.array(ids + [model.src_tok.eos_id], np.int32) for ids in model.src_tok.encode(lines)]
  header = (f'{len(rows)} sentences from `{_INPUT.value}`; model {model.cfg.num_layers}+'
            f'{model.cfg.num_layers} layers, d_model {model.cfg.d_model}, checkpoint steps '
            f'{model.steps}; batches of {_BATCH_TOKENS.value} padded source tokens.')
  print(header, flush=True)
  variants = [v for v in VARIANTS if v[0] in _VARIANT_NAMES.value]
  ct2_dir = None
  if _CT2.value:
    from transformer_nmt.ctranslate2_export import export
    ct2_dir = tempfile.mkdtemp(prefix='bench_ct2_')
    export(model.cfg, model.params, model.src_tok, model.tgt_tok, ct2_dir)
  table, seconds_of = [], {}
  for beam in [int(b) for b in _BEAMS.value]:
    reference = None
    runs = [(v[0], lambda v=v: measure(model, rows, beam, *v[1:])) for v in variants
            if beam > 1 or v[4] == 'bound']  # greedy has no beam stopping rule
    if ct2_dir:
      runs.append(('CTranslate2 (same weights)',
                   lambda: measure_ctranslate2(model, rows, beam, ct2_dir)))
    for name, run in runs:
      first, seconds, outputs = run()
      tokens = sum(len(o) + 1 for o in outputs)  # generated subwords incl. EOS
      seconds_of[(name, beam)] = seconds
      note = ''
      if reference is not None:
        same = sum(np.array_equal(a, b) for a, b in zip(outputs, reference))
        note = f'{same}/{len(rows)} outputs identical to ours (cached)'
      reference = outputs if reference is None else reference
      table.append(f'| {name} | {beam} | {len(rows) / seconds:.1f} | {tokens / seconds:,.0f} | '
                   f'{seconds:.2f} | {first:.2f} | {note} |')
      print(table[-1], flush=True)
  from transformer_nmt.recipe import machine
  text = (f"{time.strftime('%Y-%m-%d')}, {machine()}. Command: `python bench/decode.py "
          f"{shlex.join(sys.argv[1:])}`\n\n{header}\n\n"
          '| variant | beam | sentences/s | target tokens/s | timed s | first pass s | '
          'agreement |\n| --- | ---: | ---: | ---: | ---: | ---: | --- |\n' + '\n'.join(table)
          + '\n\n' + ''.join(f'- {line}\n' for line in ratios(seconds_of)))
  print(text)
  if _MARKDOWN.value:
    import pathlib
    from bench_markdown import write_section
    write_section(pathlib.Path(_MARKDOWN.value), 'bench/decode.py', text)


def ratios(seconds_of):
  """Speed ratios of our cached decoder against the other variants, and of each of our
  variants against CTranslate2, per beam."""
  out = []
  for (name, beam), seconds in seconds_of.items():
    base = seconds_of.get(('cached', beam))
    if base and name != 'cached':
      out.append(f'beam {beam}: cached is {seconds / base:.2f}x as fast as {name}')
  for (name, beam), seconds in seconds_of.items():
    ct2 = seconds_of.get(('CTranslate2 (same weights)', beam))
    if ct2 and name not in ('cached', 'CTranslate2 (same weights)'):
      out.append(f'beam {beam}: {name} is {ct2 / seconds:.2f}x as fast as CTranslate2')
  return out


if __name__ == '__main__':
  sys.path.insert(0, '.')
  app.run(main)

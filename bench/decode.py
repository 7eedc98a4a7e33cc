"""Decoding speed, side by side in one run: greedy and beam 4; finished sentences dropped every
decode.chunk steps ('cached', the default; every 8 for comparison) against each batch run to
its end in one jitted loop ('one loop ...'; the variants without the cache also run that
way), float32 against bfloat16, the paper's beam stopping rule against CTranslate2's
(k_finished), a beam that keeps its 4 best hypotheses (decode.py --n_best 4) against one
that keeps one, a cache that grows in stages against one of the full length limit, chunked
early stopping against a full-length scan, with and without the KV cache and cross-attention
K/V reuse, and the same weights exported to CTranslate2 in float32 and int8 (--ctranslate2;
pip install -r bench/requirements.txt).

  python bench/decode.py --workdir runs/small --input ../shared/data/multi30k/test2016.en

Each of our variants first translates all sentences once (the first pass compiles every
batch shape; CTranslate2 warms up on 8 sentences); then every variant's timed pass runs, and
with --repeats N that round is run N times, the variants alternating, so that a drift of this
machine's speed hits all of them alike. The table gives each variant's median timed pass, and
the ratios are medians of the ratios within a round. Outputs of all variants with the same
beam are compared with ours (cached).
"""

import shlex
import sys
import time

import decoders  # bench/decoders.py, beside this file
import numpy as np
from absl import app, flags

from transformer_nmt.config import DECODE

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_MAX_SENTENCES = flags.DEFINE_integer('max_sentences', 1000, 'Use the first N sentences.')
_BATCH_TOKENS = flags.DEFINE_integer('batch_tokens', DECODE.tokens_per_batch,
                                     'Padded source tokens per batch.')
_MAX_EXTRA = flags.DEFINE_integer('max_extra_len', DECODE.max_extra_len,
                                  'Output limit = input length + this.')
_BEAMS = flags.DEFINE_list('beams', ['1', '4'], 'Beam sizes to measure.')
_VARIANT_NAMES = flags.DEFINE_list('variants', ['cached', 'cached (stop at K finished)',
                                                'cached bfloat16',
                                                'cached bfloat16 (stop at K finished)',
                                                'one loop per batch',
                                                'one loop + full-length cache',
                                                'one full-length scan',
                                                'no cross-K/V reuse',
                                                'uncached (prefix recomputed)'],
                                   'Our decoder variants to run (names in VARIANTS).')
_CT2 = flags.DEFINE_bool('ctranslate2', False, 'Also run the model exported to CTranslate2.')
_CT2_TYPES = flags.DEFINE_list('ct2_compute_types', ['float32', 'int8'],
                               'CTranslate2 compute types to run (float32 = the same arithmetic '
                               'as ours; int8 = its fastest on CPU); TYPE/N runs N batches at '
                               'once (inter_threads), as our engine does on a CPU.')
_CT2_DEVICE = flags.DEFINE_enum('ct2_device', 'cpu', ['cpu', 'cuda', 'auto'],
                                'Where CTranslate2 runs (auto: cuda when it sees a GPU).')
_REPEATS = flags.DEFINE_integer('repeats', 1, 'Rounds of timed passes (variants alternating); '
                                'the table reports medians.')
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the table into this file, '
                                'replacing its bench/decode.py section.')

VARIANTS = {  # name -> options that differ from the default: decode.*, Engine, dtype, decoders
    'cached': {},
    'cached (stop at K finished)': dict(beam_stop='k_finished'),
    'cached (4-best kept)': dict(n_best=4),
    'cached (chunks of 8 steps)': dict(chunk=8),
    'cached (stop at K finished; chunks of 8)': dict(chunk=8, beam_stop='k_finished'),
    'cached (1 batch at a time)': dict(concurrent_batches=1),
    'cached bfloat16': dict(dtype='bfloat16'),
    'cached float32': dict(dtype='float32'),
    'cached bfloat16 (stop at K finished)': dict(dtype='bfloat16', beam_stop='k_finished'),
    'one loop per batch': dict(compact=False, chunk=8),
    'one loop + full-length cache': dict(compact=False, chunk=8, grow_cache=False),
    'one full-length scan': dict(compact=False, grow_cache=False, chunk=10**6),
    'no cross-K/V reuse': dict(compact=False, decoder='no_cross_reuse', chunk=8),
    'uncached (prefix recomputed)': dict(compact=False, decoder='uncached', chunk=8,
                                         grow_cache=False),
}


def measure(model, rows, beam, options):
  """(first-pass seconds incl. compilation, a timed pass: () -> (seconds, output id rows)) for
  one variant: the engine, or for a `decoder` or `grow_cache` variant bench/decoders.py's
  one loop per batch."""
  import dataclasses

  from transformer_nmt.config import DecodeConfig
  from transformer_nmt.decoding import ensemble
  from transformer_nmt.inference import Engine
  options = dict(options)
  cfg = dataclasses.replace(model.cfg, dtype=options.pop('dtype', model.cfg.dtype))
  runtime = {k: options.pop(k) for k in ('n_best', 'concurrent_batches') if k in options}
  variant = {k: options.pop(k) for k in ('decoder', 'grow_cache') if k in options}
  decode = DecodeConfig(beam_size=beam, max_extra_len=_MAX_EXTRA.value,
                        tokens_per_batch=_BATCH_TOKENS.value, **options)
  engine = Engine(dataclasses.replace(model, cfg=cfg), decode, **runtime)
  if variant:
    params = ensemble.kernels_as_computed(cfg, model.params)
    run = lambda: decoders.translate_rows(  # noqa: E731
        cfg, params, engine.spec, rows, pad_id=model.src_tok.pad_id,
        workers=engine.concurrent_batches, **variant)
  else:
    run = lambda: engine.translate_ids(rows)  # noqa: E731
  t0 = time.perf_counter()
  run()  # a first pass compiles every batch shape
  first = time.perf_counter() - t0
  return first, lambda: timed(run)


def timed(run):
  """(seconds, result) of one call of `run`; the engine keeps its cast of the kernels
  (params_as_computed), so a pass after the first converts nothing."""
  t0 = time.perf_counter()
  result = run()
  return time.perf_counter() - t0, result


def ct2_name(compute_type):
  """'float32', 'int8', ...; 'TYPE/N': N batches at once (inter_threads N, one core each)."""
  kind, _, parallel = compute_type.partition('/')
  at_once = f', {parallel} batches at once' if parallel else ''
  if kind == 'float32':
    return f'CTranslate2 (same weights{at_once})'
  return f'CTranslate2, {kind}{at_once}'


class Unsupported(Exception):
  """CTranslate2 refuses the compute type or the device on this machine, or does not load."""


def ct2_device(choice: str) -> str:
  """'cpu' or 'cuda' for --ct2_device (auto: cuda when CTranslate2 sees a GPU)."""
  if choice != 'auto':
    return choice
  import ctranslate2
  return 'cuda' if ctranslate2.get_cuda_device_count() > 0 else 'cpu'


def measure_ctranslate2(model, rows, beam, directory, compute_type):
  """(warm-up seconds, a timed pass: () -> (seconds, output id rows)) for CTranslate2 on the
  same rows."""
  import os
  try:
    import ctranslate2
    device = ct2_device(_CT2_DEVICE.value)
  except (ImportError, OSError, RuntimeError) as e:  # its wheel or CUDA libraries do not load
    raise Unsupported(f'CTranslate2 does not load: {str(e).splitlines()[0]}') from None
  kind, _, parallel = compute_type.partition('/')
  if parallel and not (parallel.isdigit() and int(parallel) > 0):
    raise app.UsageError(f'--ct2_compute_types: {compute_type!r}: expected TYPE or TYPE/N, N > 0')
  inter = int(parallel or 1)
  pieces = [model.src_tok.pieces(r) for r in rows]  # rows end in EOS: '</s>'
  options = dict(beam_size=beam, length_penalty=DECODE.alpha, max_batch_size=_BATCH_TOKENS.value,
                 batch_type='tokens', max_decoding_length=max(map(len, rows)) + _MAX_EXTRA.value)
  try:
    translator = ctranslate2.Translator(str(directory), device=device, inter_threads=inter,
                                        intra_threads=max((os.cpu_count() or 1) // inter, 1),
                                        compute_type=kind)
    first, _ = timed(lambda: translator.translate_batch(pieces[:8], **options))
  except (ValueError, RuntimeError) as e:  # a compute type this CPU cannot run efficiently
    # (bfloat16 here), or a device whose libraries are missing (CUDA 12's cuBLAS)
    raise Unsupported(f'{device}: ' + str(e).replace('|', '/').replace('\n', ' ')) from None
  vocab = {p: i for i, p in enumerate(model.tgt_tok.pieces(range(model.tgt_tok.vocab_size)))}

  def run():
    seconds, results = timed(lambda: translator.translate_batch(pieces, **options))
    return seconds, [np.array([vocab[p] for p in r.hypotheses[0]], np.int32) for r in results]
  return first, run


def main(argv):
  del argv
  import tempfile

  from transformer_nmt.data import batching as data_lib
  from transformer_nmt.inference import load_workdir
  if _REPEATS.value < 1:
    raise app.UsageError(f'--repeats={_REPEATS.value} must be at least 1')
  model = load_workdir(_WORKDIR.value)
  lines = [line for line in data_lib.read_lines(_INPUT.value) if line][:_MAX_SENTENCES.value]
  rows = [np.array(ids + [model.src_tok.eos_id], np.int32) for ids in model.src_tok.encode(lines)]
  header = (f'{len(rows)} sentences from `{_INPUT.value}`; model {model.cfg.encoder_depth}+'
            f'{model.cfg.decoder_depth} layers, d_model {model.cfg.d_model}, checkpoint steps '
            f'{model.steps}; batches of {_BATCH_TOKENS.value} padded source tokens.')
  print(header, flush=True)
  unknown = set(_VARIANT_NAMES.value) - set(VARIANTS)
  if unknown:
    raise app.UsageError(f'--variants: unknown {sorted(unknown)}; known: {list(VARIANTS)}')
  ct2_dir = None
  if _CT2.value:
    from transformer_nmt.export import export
    ct2_dir = tempfile.mkdtemp(prefix='bench_ct2_')
    export(model.cfg, model.params, model.src_tok, model.tgt_tok, ct2_dir)
  table, seconds_of = [], {}
  for beam in [int(b) for b in _BEAMS.value]:
    runs = [(name, lambda o=VARIANTS[name]: measure(model, rows, beam, o))
            for name in _VARIANT_NAMES.value  # greedy has no beam stopping rule:
            if beam > 1 or (VARIANTS[name].get('beam_stop', 'bound') == 'bound'
                            and VARIANTS[name].get('n_best', 1) == 1)]
    if ct2_dir:
      runs += [(ct2_name(t), lambda t=t: measure_ctranslate2(model, rows, beam, ct2_dir, t))
               for t in _CT2_TYPES.value]
    prepared = {}  # name -> (first-pass seconds, timed pass)
    for name, run in runs:
      try:
        prepared[name] = run()
      except Unsupported as e:
        table.append(f'| {name} | {beam} | - | - | - | - | not run: {e} |')
        print(table[-1], flush=True)
    passes = {name: [] for name in prepared}  # name -> [(seconds, outputs)] per round
    for _ in range(_REPEATS.value):
      for name, (_, timed_pass) in prepared.items():
        passes[name].append(timed_pass())
    reference = None
    for name, (first, _) in prepared.items():
      seconds_of[(name, beam)] = [s for s, _ in passes[name]]
      seconds = float(np.median(seconds_of[(name, beam)]))
      outputs = passes[name][0][1]
      tokens = sum(len(o) + 1 for o in outputs)  # generated subwords incl. EOS
      note = ''
      if reference is not None:
        same = sum(np.array_equal(a, b) for a, b in zip(outputs, reference))
        note = f'{same}/{len(rows)} outputs identical to ours (cached)'
      reference = outputs if reference is None else reference
      table.append(f'| {name} | {beam} | {len(rows) / seconds:.1f} | {tokens / seconds:,.0f} | '
                   f'{_spread(seconds_of[(name, beam)])} | {first:.2f} | {note} |')
      print(table[-1], flush=True)
  from transformer_nmt.results import machine
  text = (f"{time.strftime('%Y-%m-%d')}, {machine()}. Command: `python bench/decode.py "
          f"{shlex.join(sys.argv[1:])}`\n\n{header}\n\n"
          f'| variant | beam | sentences/s | target tokens/s | timed s'
          f'{_ROUNDS[_REPEATS.value > 1]} | first pass s | agreement |\n'
          '| --- | ---: | ---: | ---: | ---: | ---: | --- |\n' + '\n'.join(table)
          + '\n\n' + ''.join(f'- {line}\n' for line in ratios(seconds_of)))
  print(text)
  if _MARKDOWN.value:
    import pathlib

    from bench_markdown import write_section
    write_section(pathlib.Path(_MARKDOWN.value), 'bench/decode.py', text)


_ROUNDS = ('', ' (median; each round)')  # the timed column's heading for 1 round, for several


def _spread(seconds):
  """'6.45' for one timed pass; 'median (each round)' for several."""
  if len(seconds) == 1:
    return f'{seconds[0]:.2f}'
  return f'{np.median(seconds):.2f} ({", ".join(f"{s:.2f}" for s in seconds)})'


def _ratio(numerator, denominator):
  """The median over rounds of `numerator` seconds / `denominator` seconds, each round's pair
  measured minutes apart at most."""
  return float(np.median([a / b for a, b in zip(numerator, denominator)]))


def ratios(seconds_of):
  """Speed ratios, per beam (medians of the rounds' ratios): our cached decoder against the
  other variants, each of ours against CTranslate2 in float32 (one batch at a time, and two
  at once), and our bfloat16 ones against its int8. `seconds_of`: (name, beam) -> the timed
  passes' seconds, one per round."""
  out = []
  for (name, beam), seconds in seconds_of.items():
    base = seconds_of.get(('cached', beam))
    if base and name != 'cached' and not name.startswith('CTranslate2'):
      out.append(f'beam {beam}: cached is {_ratio(seconds, base):.2f}x as fast as {name}')
  for ct2, only in [(ct2_name('float32'), ''), (ct2_name('float32/2'), ''),
                    (ct2_name('int8'), 'bfloat16')]:
    for (name, beam), seconds in seconds_of.items():
      theirs = seconds_of.get((ct2, beam))
      if theirs and not name.startswith('CTranslate2') and only in name:
        out.append(f'beam {beam}: {name} is {_ratio(theirs, seconds):.2f}x as fast as {ct2}')
  return out


if __name__ == '__main__':
  sys.path.insert(0, '.')
  app.run(main)

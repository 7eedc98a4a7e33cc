"""Decoding speed and quality, side by side in one run: our engine (what decode.py runs) against
the same weights exported to CTranslate2, in float32 (the same arithmetic as ours) and in int8
(its fastest compute type on a CPU, what its users deploy there), with sacreBLEU of every
variant on the same lines.

  python bench/decode.py --workdir W --input ../shared/data/multi30k/test2016.en \
      --reference ../shared/data/multi30k/test2016.de

Our variants are settings of the public Engine: decode options (`beam_stop`, `chunk`,
`compact`), the compute dtype, hypotheses kept (n-best) and batches decoded at once. The
weights are exported with export_ctranslate2.py. Each variant first translates all sentences
once (the first pass compiles every batch shape; CTranslate2 warms up on 8 sentences); then
every variant's timed pass runs, and with --repeats N that round is run N times, the variants
alternating, so that a drift of this machine's speed hits all of them alike. The table gives
each variant's median timed pass, the BLEU of its output against --reference (the first
pass's output: every pass gives the same), and how many outputs equal ours (cached) with the
same beam; the ratios are medians of the ratios within a round.
"""

import dataclasses
import pathlib
import tempfile
import time

import common
import numpy as np
from absl import app, flags

from transformer_nmt import DecodeConfig, Engine, load_workdir

DEFAULTS = DecodeConfig()

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_REFERENCE = flags.DEFINE_string('reference', None, 'Reference translations of --input, line '
                                 'for line: a BLEU column for every variant.')
_MAX_SENTENCES = flags.DEFINE_integer('max_sentences', 1000, 'Use the first N sentences.')
_BATCH_TOKENS = flags.DEFINE_integer('batch_tokens', DEFAULTS.tokens_per_batch,
                                     'Padded source tokens per batch.')
_MAX_EXTRA = flags.DEFINE_integer('max_extra_len', DEFAULTS.max_extra_len,
                                  'Output limit = input length + this.')
_BEAMS = flags.DEFINE_list('beams', ['1', '4'], 'Beam sizes to measure.')
_VARIANT_NAMES = flags.DEFINE_list('variants', ['cached', 'cached (stop at K finished)',
                                                'cached bfloat16',
                                                'cached bfloat16 (stop at K finished)'],
                                   'Our variants to run (names in VARIANTS).')
_CT2 = flags.DEFINE_bool('ctranslate2', True, 'Also run the model exported to CTranslate2.')
_CT2_TYPES = flags.DEFINE_list('ct2_compute_types', ['float32', 'int8'],
                               'CTranslate2 compute types to run (float32 = the same arithmetic '
                               'as ours; int8 = its fastest on a CPU); TYPE/N runs N batches at '
                               'once (inter_threads), as our engine does on a CPU.')
_CT2_DEVICE = flags.DEFINE_enum('ct2_device', 'cpu', ['cpu', 'cuda', 'auto'],
                                'Where CTranslate2 runs (auto: cuda when it sees a GPU).')
_REPEATS = flags.DEFINE_integer('repeats', 1, 'Rounds of timed passes (variants alternating); '
                                'the table reports medians.', lower_bound=1)
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the table into this file, '
                                'replacing its bench/decode.py section.')

# name -> what differs from the defaults: DecodeConfig fields, the compute dtype, the Engine's
# n_best and concurrent_batches
VARIANTS = {
    'cached': {},
    'cached (stop at K finished)': dict(beam_stop='k_finished'),
    'cached (4-best kept)': dict(n_best=4),
    'cached (chunks of 8 steps)': dict(chunk=8),
    'cached (1 batch at a time)': dict(concurrent_batches=1),
    'cached bfloat16': dict(dtype='bfloat16'),
    'cached float32': dict(dtype='float32'),
    'cached bfloat16 (stop at K finished)': dict(dtype='bfloat16', beam_stop='k_finished'),
    'one loop per batch': dict(compact=False, chunk=8),
}


def timed(run):
  """(seconds, result) of one call of `run`."""
  t0 = time.perf_counter()
  result = run()
  return time.perf_counter() - t0, result


def measure(model, rows, beam, options):
  """(first-pass seconds incl. compilation, a timed pass: () -> (seconds, output id rows)) for
  one of our variants."""
  options = dict(options)
  cfg = dataclasses.replace(model.cfg, dtype=options.pop('dtype', model.cfg.dtype))
  engine_options = {k: options.pop(k) for k in ('n_best', 'concurrent_batches') if k in options}
  decode = DecodeConfig(beam_size=beam, max_extra_len=_MAX_EXTRA.value,
                        tokens_per_batch=_BATCH_TOKENS.value, **options)
  engine = Engine(dataclasses.replace(model, cfg=cfg), decode, **engine_options)
  first, _ = timed(lambda: engine.translate_ids(rows))  # compiles every batch shape
  return first, lambda: timed(lambda: engine.translate_ids(rows))


def ct2_name(compute_type):
  """'float32', 'int8', ...; 'TYPE/N': N batches at once (inter_threads N, one core each)."""
  kind, _, parallel = compute_type.partition('/')
  at_once = f', {parallel} batches at once' if parallel else ''
  return f'CTranslate2 {kind}{at_once}'


class Unsupported(Exception):
  """CTranslate2 refuses the compute type or the device on this machine, or does not load."""


def measure_ctranslate2(model, rows, beam, directory, compute_type):
  """(warm-up seconds, a timed pass: () -> (seconds, output id rows)) for CTranslate2 on the
  same rows, with our beam size, length penalty and length limit."""
  import os
  try:
    import ctranslate2
    device = _CT2_DEVICE.value
    if device == 'auto':
      device = 'cuda' if ctranslate2.get_cuda_device_count() > 0 else 'cpu'
  except (ImportError, OSError, RuntimeError) as e:  # its wheel or CUDA libraries do not load
    raise Unsupported(f'CTranslate2 does not load: {str(e).splitlines()[0]}') from None
  kind, _, parallel = compute_type.partition('/')
  if parallel and not (parallel.isdigit() and int(parallel) > 0):
    raise app.UsageError(f'--ct2_compute_types: {compute_type!r}: expected TYPE or TYPE/N, N > 0')
  inter = int(parallel or 1)
  pieces = [model.src_tok.pieces(r) for r in rows]  # rows end in EOS: '</s>'
  options = dict(beam_size=beam, length_penalty=DEFAULTS.alpha, max_batch_size=_BATCH_TOKENS.value,
                 batch_type='tokens', max_decoding_length=max(map(len, rows)) + _MAX_EXTRA.value)
  try:
    translator = ctranslate2.Translator(str(directory), device=device, inter_threads=inter,
                                        intra_threads=max((os.cpu_count() or 1) // inter, 1),
                                        compute_type=kind)
    first, _ = timed(lambda: translator.translate_batch(pieces[:8], **options))
  except (ValueError, RuntimeError) as e:  # a compute type this CPU cannot run efficiently
    # (bfloat16 without its instructions), or a device whose libraries are missing
    raise Unsupported(f'{device}: ' + str(e).replace('|', '/').replace('\n', ' ')) from None
  vocab = {p: i for i, p in enumerate(model.tgt_tok.pieces(range(model.tgt_tok.vocab_size)))}

  def run():
    seconds, results = timed(lambda: translator.translate_batch(pieces, **options))
    return seconds, [np.array([vocab[p] for p in r.hypotheses[0]], np.int32) for r in results]
  return first, run


def sentences():
  """The first --max_sentences non-empty lines of --input, with their references (or None)."""
  sources = pathlib.Path(_INPUT.value).read_text(encoding='utf-8').splitlines()
  references = None
  if _REFERENCE.value:
    references = pathlib.Path(_REFERENCE.value).read_text(encoding='utf-8').splitlines()
    if len(references) != len(sources):
      raise app.UsageError(f'--reference has {len(references)} lines, --input {len(sources)}')
  keep = [i for i, line in enumerate(sources) if line.strip()][:_MAX_SENTENCES.value]
  return [sources[i] for i in keep], None if references is None else [references[i] for i in keep]


def bleu(model, outputs, references):
  """sacreBLEU (cased, detokenised, 13a) of output id rows against the references."""
  import sacrebleu
  texts = model.tgt_tok.decode([o.tolist() for o in outputs])
  return sacrebleu.corpus_bleu(texts, [references]).score


def main(argv):
  del argv
  model = load_workdir(_WORKDIR.value)
  lines, references = sentences()
  rows = [np.array(ids + [model.src_tok.eos_id], np.int32) for ids in model.src_tok.encode(lines)]
  header = (f'{len(rows)} sentences from `{_INPUT.value}`; model {model.cfg.encoder_depth}+'
            f'{model.cfg.decoder_depth} layers, d_model {model.cfg.d_model}, trained in '
            f'{model.cfg.dtype}, checkpoint steps {model.steps}; batches of '
            f'{_BATCH_TOKENS.value} padded source tokens; length penalty alpha '
            f'{DEFAULTS.alpha} on both sides. BLEU: sacreBLEU against '
            f"`{_REFERENCE.value or '(no --reference)'}`.")
  print(header, flush=True)
  unknown = set(_VARIANT_NAMES.value) - set(VARIANTS)
  if unknown:
    raise app.UsageError(f'--variants: unknown {sorted(unknown)}; known: {list(VARIANTS)}')
  ct2_dir = None
  if _CT2.value:
    ct2_dir = tempfile.mkdtemp(prefix='bench_ct2_')
    common.export_ctranslate2(_WORKDIR.value, ct2_dir)
  table, seconds_of = [], {}
  for beam in [int(b) for b in _BEAMS.value]:
    runs = [(name, lambda o=VARIANTS[name]: measure(model, rows, beam, o))
            for name in _VARIANT_NAMES.value  # greedy has no beam stopping rule and one best:
            if beam > 1 or ('beam_stop' not in VARIANTS[name] and 'n_best' not in VARIANTS[name])]
    if ct2_dir:
      runs += [(ct2_name(t), lambda t=t: measure_ctranslate2(model, rows, beam, ct2_dir, t))
               for t in _CT2_TYPES.value]
    prepared = {}  # name -> (first-pass seconds, timed pass)
    for name, run in runs:
      try:
        prepared[name] = run()
      except Unsupported as e:
        table.append(f'| {name} | {beam} | - | - | - | - | - | not run: {e} |')
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
        note = f'{same}/{len(rows)} outputs as ours (cached)'
      reference = outputs if reference is None else reference
      score = '-' if references is None else f'{bleu(model, outputs, references):.2f}'
      table.append(f'| {name} | {beam} | {len(rows) / seconds:.1f} | {tokens / seconds:,.0f} | '
                   f'{spread(seconds_of[(name, beam)])} | {first:.2f} | {score} | {note} |')
      print(table[-1], flush=True)
  rounds = ' (median; each round)' if _REPEATS.value > 1 else ''
  text = (f'{common.stamp()}\n\n{header}\n\n'
          f'| variant | beam | sentences/s | target tokens/s | timed s{rounds} | first pass s | '
          'BLEU | agreement |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n'
          + '\n'.join(table) + '\n\n' + ''.join(f'- {line}\n' for line in ratios(seconds_of)))
  print(text)
  if _MARKDOWN.value:
    common.write_section(_MARKDOWN.value, 'bench/decode.py', text)


def spread(seconds):
  """'6.45' for one timed pass; 'median (each round)' for several."""
  if len(seconds) == 1:
    return f'{seconds[0]:.2f}'
  return f'{np.median(seconds):.2f} ({", ".join(f"{s:.2f}" for s in seconds)})'


def ratio(numerator, denominator):
  """The median over rounds of `numerator` seconds / `denominator` seconds."""
  return float(np.median([a / b for a, b in zip(numerator, denominator)]))


def ratios(seconds_of):
  """Speed ratios per beam (medians of the rounds' ratios): our cached variant against our
  other variants, and each of ours against each CTranslate2 compute type. `seconds_of`:
  (name, beam) -> the timed passes' seconds, one per round."""
  out = []
  ours = [(name, beam) for name, beam in seconds_of if not name.startswith('CTranslate2')]
  for name, beam in ours:
    base = seconds_of.get(('cached', beam))
    if base and name != 'cached':
      out.append(f'beam {beam}: cached is {ratio(seconds_of[(name, beam)], base):.2f}x as '
                 f'fast as {name}')
  for theirs, beam in [key for key in seconds_of if key[0].startswith('CTranslate2')]:
    for name, own_beam in ours:
      if own_beam == beam:
        out.append(f'beam {beam}: {name} is '
                   f'{ratio(seconds_of[(theirs, beam)], seconds_of[(name, beam)]):.2f}x as fast '
                   f'as {theirs}')
  return out


if __name__ == '__main__':
  app.run(main)

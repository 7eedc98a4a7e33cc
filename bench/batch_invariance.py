"""Does a sentence's translation depend on the batch it shares? And why.

  python bench/batch_invariance.py --workdir W --input ../shared/data/multi30k/test2016.en
  python bench/batch_invariance.py ... --nobatch_invariant   # the default programs
  XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= python bench/batch_invariance.py ...

1. The model's matmul shapes [M, K] x [K, N] (K, N from its d_model, d_ff and vocabulary; in
   its compute dtype, float32 results, compiled as the decoding programs are) on random rows:
   for each row count M (1-64, then the batch ladder's 96, 128, 192, ... up to --max_rows),
   whether every row equals the same row computed in a batch of --max_rows; printed: the row
   counts that differ, where XLA's CPU backend picks another kernel (another order of the
   sums) than for many rows.
2. Engine.translate of the first --lines lines three ways: the whole list at once (decode.py's
   large batches), in consecutive groups of 1-16 lines (seeded; a server without batching
   across requests), and one line at a time; lines that differ between each pair, and the
   wall time of each way.
3. The price of decode.batch_invariant, side by side: all lines of --input at once and its
   groups of 1-16 lines, by an engine with and one without the option on the same loaded
   model, alternating for --rounds rounds (after one to compile); the fastest round of each
   and their ratio, and how many lines the two settings translate differently.
"""

import dataclasses
import time

import jax
import numpy as np
import side_by_side
from absl import app, flags

from transformer_nmt.data.batching import read_lines
from transformer_nmt.decoding.search import compiler_options
from transformer_nmt.inference.engine import Engine

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_LINES = flags.DEFINE_integer('lines', 400, 'First lines of --input to translate.')
_MAX_ROWS = flags.DEFINE_integer('max_rows', 768, 'Largest row count checked.')
_INVARIANT = flags.DEFINE_bool('batch_invariant', True, 'decode.batch_invariant of the engine.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds of part 3 (0: skip it).')


def row_counts(max_rows: int) -> list[int]:
  """1-64, then 96, 128, 192, 256, ... (the compaction ladder) up to max_rows."""
  counts, m = list(range(1, 65)), 64
  while m < max_rows:
    counts += [c for c in (m * 3 // 2, m * 2) if c <= max_rows]
    m *= 2
  return counts


def differing_row_counts(k: int, n: int, max_rows: int, dtype: str,
                         options: dict[str, str]) -> list[int]:
  """The row counts M of row_counts(max_rows) at which some row of [M, k] x [k, n] (in
  `dtype`, float32 results, compiled with XLA `options`) differs from that row computed among
  max_rows rows."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((max_rows, k), np.float32).astype(dtype)
  w = jax.numpy.asarray(rng.standard_normal((k, n), np.float32).astype(dtype))
  matmul = jax.jit(lambda x, w: jax.numpy.matmul(x, w, preferred_element_type=np.float32),
                   compiler_options=options)
  full = np.asarray(matmul(x, w))
  return [m for m in row_counts(max_rows)
          if not np.array_equal(matmul(x[:m], w), full[:m])]


def ranges(values: list[int], counts: list[int]) -> str:
  """Runs of consecutive members of `counts`: [1, 2, 3, 96] -> '1-3, 96'."""
  out, start = [], None
  for i, v in enumerate(values):
    start = v if start is None else start
    if i + 1 == len(values) or counts.index(values[i + 1]) != counts.index(v) + 1:
      out.append(f'{start}' if start == v else f'{start}-{v}')
      start = None
  return ', '.join(out) or 'none'


def price(engine: Engine, lines: list[str], rounds: int) -> None:
  """Part 3: both settings of decode.batch_invariant, alternating; prints a table."""
  engines = {on: Engine(engine.model, dataclasses.replace(engine.decode, batch_invariant=on))
             for on in (True, False)}
  side_by_side.compare({'batch_invariant': engines[True].translate,
                        'without': engines[False].translate}, lines, rounds)


def main(_):
  engine = Engine.load(_WORKDIR.value, settings=lambda d: dataclasses.replace(
      d, batch_invariant=_INVARIANT.value).validate())
  cfg = engine.model.cfg
  options = compiler_options(engine.decode.batch_invariant)
  print(f'model d_model {cfg.d_model}, d_ff {cfg.d_ff}, vocabulary {cfg.vocab_size}, '
        f'{cfg.dtype}; beam {engine.decode.beam_size}; XLA options {options or "none"}')
  print('| matmul [M, K] x [K, N] | M whose rows differ from the same rows among '
        f'{_MAX_ROWS.value} |\n| --- | --- |')
  counts = row_counts(_MAX_ROWS.value)
  for k, n in sorted({(cfg.d_model, cfg.d_model), (cfg.d_model, cfg.d_ff),
                      (cfg.d_ff, cfg.d_model), (cfg.d_model, cfg.vocab_size)}):
    differ = differing_row_counts(k, n, _MAX_ROWS.value, cfg.dtype, options)
    print(f'| K {k}, N {n} | {ranges(differ, counts)} |')

  lines = read_lines(_INPUT.value)[:_LINES.value]
  groups = side_by_side.groups_of_1_to_16(lines)
  ways = {'whole list': lambda: engine.translate(lines),
          'groups of 1-16': lambda: [t for g in groups for t in engine.translate(g)],
          'one at a time': lambda: [engine.translate([line])[0] for line in lines]}
  for way in ways.values():  # compile every shape first
    way()
  outputs, seconds = {}, {}
  for name, way in ways.items():
    start_time = time.perf_counter()
    outputs[name] = way()
    seconds[name] = time.perf_counter() - start_time
  print(f'\n{len(lines)} lines ({len(groups)} groups)\n\n| way | wall s |\n| --- | ---: |')
  for name in ways:
    print(f'| {name} | {seconds[name]:.1f} |')
  print('\n| pair | lines that differ |\n| --- | ---: |')
  names = list(ways)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      print(f'| {a} / {b} | {sum(x != y for x, y in zip(outputs[a], outputs[b]))} |')
  if _ROUNDS.value:
    price(engine, read_lines(_INPUT.value), _ROUNDS.value)


if __name__ == '__main__':
  app.run(main)

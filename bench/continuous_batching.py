"""What continuous batching (refilling the rows that finished sentences leave, CTranslate2
issue 1333) could gain over the compacting decoder on this machine, measured on the engine.

1. Shuffled lines in calls of --calls (a busy server's batches) decoded as now, every program
   call timed: the start programs (encoder and first cache stage), then the chunks of steps
   by batch rows and cache length, with the rows still unfinished; and how many steps each
   sentence took.
2. One chunk at --rows sentences against the self-attention cache length (--lengths), the
   program alone on the machine. A refilled batch holds sentences of every age, so its cache
   spans the positions of its oldest one; a compacting batch is of one age and grows its
   cache in stages (decoding.cache_stages).
3. The bound: the start programs as now, and every chunk of an unfinished sentence at the
   cost per row that batches of at least --rows rows pay now (no filler rows, no narrow
   tails, no idle thread), scaled by table 2 for a cache of each length; last, for the
   lengths a batch of --rows sentences refilled after every chunk would need (simulated from
   the steps each sentence took: `refilled_windows`).

  python bench/continuous_batching.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import collections
import dataclasses
import functools
import random
import threading
import time
from typing import Any, Callable

import jax
import numpy as np
from absl import app, flags

from transformer_nmt.data.batching import read_lines
from transformer_nmt.decoding import compaction
from transformer_nmt.decoding.search import padded_length
from transformer_nmt.inference.engine import Engine

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained or imported workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_LINES = flags.DEFINE_integer('lines', 1000, 'First lines of --input.')
_CALLS = flags.DEFINE_integer('calls', 250, 'Lines per call (shuffled, seeded).')
_ROWS = flags.DEFINE_integer('rows', 128, 'Sentences in the batch of table 2.')
_LENGTHS = flags.DEFINE_list('lengths', ['24', '48', '72', '96'], 'Cache lengths of table 2.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Timed runs of each program (fastest kept).')


@dataclasses.dataclass(frozen=True)
class Call:
  """One timed program call of a decoding thread: rows of its batch, cache length (0: a start
  program), unfinished sentences before and after it, seconds."""

  rows: int
  cache: int
  before: int
  after: int
  seconds: float


class Recorder:
  """Times the engine's start and chunk programs (translate.CompactingTranslate) and follows
  which of each batch's rows hold unfinished sentences (not padding, not compaction's
  filler rows), per decoding thread."""

  def __init__(self, engine: Engine):
    self.calls: list[Call] = []
    self.steps_taken: list[int] = []  # per sentence, at the chunk it finished in
    self._real: dict[int, np.ndarray] = {}  # thread -> [rows] bool, a sentence's row
    self._live: dict[int, int] = {}
    self._steps: dict[int, int] = {}
    self._translator = engine._translate
    self._decoder = self._translator.decoder
    self.chunk = self._decoder.chunk
    self.first_stage = 2 * self.chunk  # steps of the start program (set by each)
    self._kept = (self._translator._start, self._decoder._advance, compaction.take_rows)

  def __enter__(self) -> 'Recorder':
    start, advance, take = self._kept
    self._translator._start = functools.partial(self._start, start)
    self._decoder._advance = functools.partial(self._advance, advance)
    compaction.take_rows = functools.partial(self._take, take)
    return self

  def __exit__(self, *_: Any) -> None:
    self._translator._start, self._decoder._advance, compaction.take_rows = self._kept

  def _start(self, run: Callable, params: Any, src: Any, segments: Any, *rest: Any) -> Any:
    began = time.perf_counter()
    out = run(params, src, segments, *rest)
    done, seconds = np.asarray(out[2]), time.perf_counter() - began
    me, length = threading.get_ident(), rest[-1]
    self._real[me] = np.asarray(segments).any(axis=1)
    self._steps[me] = self.first_stage = self._decoder.cache_lengths(length)[0]
    self._live[me] = int(self._real[me].sum())
    self._finish(me, done, length, 0, len(done), seconds)
    return out

  def _advance(self, run: Callable, params: Any, state: Any, max_lens: Any, length: int) -> Any:
    cache = state.cache.self_attention[0].length
    began = time.perf_counter()
    out = run(params, state, max_lens, length)
    done, seconds = np.asarray(out[1]), time.perf_counter() - began
    me = threading.get_ident()
    self._steps[me] += self._decoder.chunk
    self._finish(me, done, length, cache, len(done), seconds)
    return out

  def _finish(self, me: int, done: np.ndarray, length: int, cache: int, rows: int,
              seconds: float) -> None:
    before = self._live[me]
    after = 0 if self._steps[me] >= length else int((~done & self._real[me]).sum())
    self.steps_taken += [self._steps[me]] * (before - after)
    self._live[me] = after
    self.calls.append(Call(rows, cache, before, after, seconds))

  def _take(self, take: Callable, tree: Any, rows: np.ndarray, batch: int, beams: int) -> Any:
    me = threading.get_ident()
    kept = len(np.unique(rows))  # the live rows, then copies of the first as filler
    self._real[me] = np.concatenate([self._real[me][rows[:kept]],
                                     np.zeros(len(rows) - kept, bool)])
    return take(tree, rows, batch, beams)


def decode_calls(engine: Engine, lines: list[str], per_call: int) -> tuple[Recorder, float]:
  """Table 1: the lines shuffled in calls of `per_call`, decoded once to compile, then
  recorded; (recorder, wall seconds)."""
  shuffled = random.Random(0).sample(lines, len(lines))
  parts = [shuffled[i:i + per_call] for i in range(0, len(lines), per_call)]
  for part in parts:
    engine.translate(part)
  with Recorder(engine) as recorder:
    began = time.perf_counter()
    for part in parts:
      engine.translate(part)
    return recorder, time.perf_counter() - began


def print_calls(recorder: Recorder, wall: float, threads: int, lines: int) -> None:
  """Table 1 (module docstring), grouped by program, batch rows and cache length."""
  groups: dict[tuple[int, int], list[Call]] = collections.defaultdict(list)
  for call in recorder.calls:
    groups[call.rows, call.cache].append(call)
  busy = sum(c.seconds for c in recorder.calls)
  print(f'\n{lines} lines in {wall:.2f} s ({lines / wall:.1f} sentences/s), {threads} '
        f'decoding threads busy {busy / (threads * wall):.0%} of the time\n\n'
        '| program | batch rows | cache length | calls | s | share | ms per row | unfinished '
        'rows per call (mean) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |')
  for (rows, cache), calls in sorted(groups.items(), key=lambda g: (g[0][1] > 0, g[0])):
    seconds = sum(c.seconds for c in calls)
    print(f"| {'chunk' if cache else 'start'} | {rows} | {cache or '-'} | {len(calls)} | "
          f'{seconds:.2f} | {seconds / busy:.0%} | {1000 * seconds / len(calls) / rows:.2f} | '
          f'{np.mean([c.before for c in calls]):.1f} |')
  taken = np.asarray(recorder.steps_taken)
  print(f'\nsteps each sentence took: median {np.median(taken):.0f}, p90 '
        f'{np.percentile(taken, 90):.0f}, p99 {np.percentile(taken, 99):.0f}, max {taken.max()} '
        f'({len(taken)} sentences)')


def chunk_seconds(engine: Engine, lines: list[str], rows: int, lengths: list[int],
                  repeats: int) -> dict[int, float]:
  """Table 2: the fastest of `repeats` runs of one chunk of steps for a batch of the first
  `rows` lines begun by the start program, its cache resized to each length."""
  translator, params = engine._translate, engine.params_as_computed()
  tok = engine.model.src_tok
  ids = [x + [tok.eos_id] for x in tok.encode(lines[:rows])]
  width = -(-max(map(len, ids)) // 8) * 8
  src, segments = np.zeros((rows, width), np.int32), np.zeros((rows, width), np.int32)
  for row, x in enumerate(ids):
    src[row, :len(x)], segments[row, :len(x)] = x, 1
  length = padded_length(max(lengths), engine.decode.chunk)
  begun = translator._start(params, src, segments, None, None, length)[:2]
  kept = jax.tree_util.tree_map(np.array, begun)  # the chunk consumes its state
  seconds = {}
  for cache in lengths:
    times = []
    for _ in range(repeats + 1):  # the first compiles
      state, max_lens = jax.tree_util.tree_map(np.copy, kept)
      state = compaction.resized_on_host(state, functools.partial(compaction._resize, n=cache))
      began = time.perf_counter()
      np.asarray(translator.decoder._advance(params, state, max_lens, length)[1])
      times.append(time.perf_counter() - began)
    seconds[cache] = min(times[1:])
  return seconds


def wide_chunks(chunks: list[Call], rows: int) -> tuple[int, list[Call]]:
  """The chunks of at least `rows` rows (or of the widest batches, if none is that wide) at
  the cache length most of them ran at: (that length, those chunks)."""
  least = min(rows, max(c.rows for c in chunks))
  wide = [c for c in chunks if c.rows >= least]
  at = collections.Counter(c.cache for c in wide).most_common(1)[0][0]
  return at, [c for c in wide if c.cache == at]


def with_wide_length(recorder: Recorder, rows: int, lengths: list[int]) -> list[int]:
  """`lengths` and the cache length of `wide_chunks`, which the bound scales from."""
  return sorted(set(lengths) | {wide_chunks([c for c in recorder.calls if c.cache], rows)[0]})


def refilled_windows(steps_taken: list[int], rows: int, first: int, chunk: int,
                     lengths: list[int], chunks: int = 2000, seed: int = 0) -> dict[int, float]:
  """Which cache length a batch of `rows` sentences refilled after every chunk would need,
  as fractions of its chunks: each row's sentence lives one of `steps_taken` (drawn, seeded,
  from those the start program's `first` steps did not end), joins after those steps, and
  leaves once it has taken them; the cache spans the oldest row's positions, rounded up to
  `lengths` (the largest if none is long enough)."""
  rng = np.random.default_rng(seed)
  lives = np.asarray([n for n in steps_taken if n > first])
  if not len(lives):  # every sentence ended in the start program: no row to refill
    return {min(lengths): 1.0}
  ages, ends = np.full(rows, first), rng.choice(lives, rows)
  counts: collections.Counter = collections.Counter()
  for _ in range(chunks):
    ages += chunk
    counts[next((n for n in lengths if n >= ages.max()), max(lengths))] += 1
    left = ages >= ends
    ages[left], ends[left] = first, rng.choice(lives, int(left.sum()))
  return {n: counts[n] / chunks for n in sorted(counts)}


def print_bound(recorder: Recorder, wall: float, threads: int, rows: int,
                seconds: dict[int, float]) -> None:
  """Table 3 (module docstring): the bound for a refilled batch of `rows` sentences."""
  chunks = [c for c in recorder.calls if c.cache]
  at, wide = wide_chunks(chunks, rows)
  per_row = sum(c.seconds for c in wide) / sum(c.rows for c in wide)
  start = sum(c.seconds for c in recorder.calls if not c.cache)
  needed = sum(c.before for c in chunks)
  print(f'\none chunk at {rows} sentences, alone:\n\n| cache length | ms | ms per row | '
        f'bound for a refilled batch: wall s | gain over now |\n| ---: | ---: | ---: | ---: | '
        '---: |')
  for cache, s in seconds.items():
    bound = (start + needed * per_row * s / seconds[at]) / threads
    print(f'| {cache} | {1000 * s:.1f} | {1000 * s / rows:.3f} | {bound:.2f} | '
          f'{wall / bound:.2f}x |')
  windows = refilled_windows(recorder.steps_taken, rows, recorder.first_stage,
                             recorder.chunk, list(seconds))
  scale = sum(share * seconds[cache] / seconds[at] for cache, share in windows.items())
  bound = (start + needed * per_row * scale) / threads
  shares = ', '.join(f'{cache}: {share:.0%}' for cache, share in windows.items())
  print(f'| refilled, simulated ({shares}) | | | {bound:.2f} | {wall / bound:.2f}x |')
  print(f'\nnow: {len(chunks)} chunks of {sum(c.rows for c in chunks)} rows, of them '
        f'{needed} unfinished; start programs {start:.2f} s; chunks of at least {rows} rows '
        f'at cache {at} ({len(wide)}) {1000 * per_row:.2f} ms per row, the bound\'s cost, '
        f'scaled by the ratio to the row of cache {at} above')


def main(_):
  engine = Engine.load(_WORKDIR.value)
  lines = read_lines(_INPUT.value)[:_LINES.value]
  print(f'beam {engine.decode.beam_size}, beam_stop {engine.decode.beam_stop}, chunk '
        f'{engine.decode.chunk}, tokens_per_batch {engine.decode.tokens_per_batch}')
  recorder, wall = decode_calls(engine, lines, _CALLS.value)
  threads = engine.concurrent_batches
  print_calls(recorder, wall, threads, len(lines))
  lengths = with_wide_length(recorder, _ROWS.value, list(map(int, _LENGTHS.value)))
  seconds = chunk_seconds(engine, lines, _ROWS.value, lengths, _REPEATS.value)
  print_bound(recorder, wall, threads, _ROWS.value, seconds)


if __name__ == '__main__':
  app.run(main)

"""Batches of a job: decoded by a few threads at once, in order, with their prefixes padded."""

from __future__ import annotations

import collections
import concurrent.futures
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from transformer_nmt.data import batching as data_lib

# Compaction never leaves a batch fewer rows than this. Down to one row: a batch's last
# unfinished sentences (beam search's bound keeps a few to their length limit) then decode
# at the cost of their own rows, in the programs that batches of 1 and 4 sentences start
# with (precompiled too), where a floor of 8 rows made them pay for 8.
MIN_ROWS = 1
# A batch starts with as few rows as hold its sentences (1, 4, 16, 24, 32, ...), no fewer than
# this: a lone sentence padded to 8 rows decodes markedly slower than in a row of its own.
START_ROWS = 1
# A job that fits one batch is cut into one batch per decoding thread only where each part
# keeps this many sentences: 4 sentences decoded as 2 + 2 are no faster than as one batch.
SPLIT_SENTENCES = 4


def in_order(fn: Callable[[int], Any], count: int, workers: int) -> Iterator[Any]:
  """fn(0), fn(1), ..., fn(count - 1) in order, up to `workers` of them computed at once by
  threads: XLA releases the GIL while a program runs, so batches overlap on a CPU's cores."""
  if workers <= 1 or count <= 1:
    yield from map(fn, range(count))
    return
  pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix='decode')
  pending: collections.deque = collections.deque()
  try:
    for i in range(count):  # `workers` batches in flight, also while the caller takes one
      pending.append(pool.submit(fn, i))
      if len(pending) == workers:
        yield pending.popleft().result()
    while pending:
      yield pending.popleft().result()
  finally:  # also when the caller stops early: the batches running end, no new one starts
    for future in pending:
      future.cancel()
    pool.shutdown(wait=True)


def split_for_threads(plans: list[data_lib.BatchPlan], lengths: np.ndarray,
                      boundaries: Sequence[int], sizes: Sequence[int],
                      threads: int) -> list[data_lib.BatchPlan]:
  """A job that fits one batch, cut into up to `threads` batches of neighbouring lengths
  (equal counts of at least SPLIT_SENTENCES), so that that many threads decode it at once:
  on a CPU one batch's small matrices leave the other core mostly idle. Each part's rows and
  padded length come from `sizes` and `boundaries`, so its shape is one a larger batch of the
  job's plan could have. A job of several batches already keeps the threads busy and is
  returned as it is."""
  count = min(threads, len(plans[0].examples) // SPLIT_SENTENCES) if len(plans) == 1 else 1
  if count < 2:
    return plans
  parts = np.array_split(plans[0].examples, count)
  return [data_lib.BatchPlan(part, int(sizes[np.searchsorted(sizes, len(part))]),
                             int(boundaries[np.searchsorted(boundaries, lengths[part].max())]))
          for part in parts]


def padded(prefixes: Sequence[np.ndarray], plan: data_lib.BatchPlan, pad_id: int
           ) -> np.ndarray:
  """The plan's rows' prefixes as [rows, plan.length], padded with `pad_id` (as wide as the
  batch's sources: one set of programs with and without prefixes)."""
  width = plan.length
  out = np.full((plan.rows, width), pad_id, np.int32)
  for row, i in enumerate(plan.examples):
    out[row, :len(prefixes[i])] = prefixes[i]
  return out


def strip(ids: np.ndarray, eos_id: int) -> np.ndarray:
  """A hypothesis's ids up to its first EOS."""
  ends = np.flatnonzero(ids == eos_id)
  return ids[:ends[0]] if len(ends) else ids

"""The training split as batches (§5.1): an endless, seeded stream of length-bucketed or packed
batches, the same from any step on (resuming), each process building only its rows.

Packing puts pairs one after another into rows of `data.pack_length` tokens per side, with
segment ids that keep attention inside each pair. This module never imports JAX.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from transformer_nmt.data.batching import (
  Batch,
  BatchPlan,
  ParallelData,
  collate,
  collate_examples,
  plan_batches,
)
from transformer_nmt.data.ragged import token_positions


def pack_rows(data: ParallelData, order: Sequence[int], length: int) -> list[list[int]]:
  """Greedily packs examples, in `order`, into rows of `length` tokens per side.

  A row takes the next example while both its source and its target still fit; examples
  longer than `length` are not packed (raise the length or lower data.max_len).
  """
  order = np.asarray(order, np.int64)
  starts = pack_starts(data, order, length)
  return [order[a:b].tolist() for a, b in zip(starts[:-1], starts[1:])]


def pack_starts(data: ParallelData, order: np.ndarray, length: int) -> np.ndarray:
  """`pack_rows` as [R + 1] positions in `order`: row r holds order[starts[r]:starts[r + 1]]."""
  src_lengths, tgt_lengths = data.src.lengths[order], data.tgt.lengths[order]
  over = np.flatnonzero((src_lengths > length) | (tgt_lengths > length))
  if len(over):
    k = over[0]
    raise ValueError(f'example {order[k]} ({src_lengths[k]}/{tgt_lengths[k]} tokens) is longer '
                     f'than the packing length {length}')
  # The greedy scan without a Python step per pair, which made an epoch's plan at WMT14's
  # size slow:
  # ends[a] is where a row starting at pair a must end (the first pair that no longer fits
  # on either side), and the rows are the chain 0 -> ends[0] -> ..., one step per row.
  sums = [np.concatenate([[0], np.cumsum(n)]) for n in (src_lengths, tgt_lengths)]
  ends = np.minimum(*[np.searchsorted(c, c[:-1] + length, 'right') - 1 for c in sums]).tolist()
  starts, a = [], 0
  while a < len(order):
    starts.append(a)
    a = ends[a]
  return np.array(starts + [len(order)], np.int64)


def collate_packed(data: ParallelData, rows: Sequence[Sequence[int]], num_rows: int,
                   length: int) -> Batch:
  """[num_rows, length] arrays; row r holds the examples rows[r] one after another, with
  segment ids 1, 2, ... and positions restarting at 0 for each (empty rows are padding)."""
  counts = np.fromiter(map(len, rows), np.int64, len(rows))
  examples = np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(counts.sum()))
  return _collate_counts(data, examples, counts, num_rows, length)


def _collate_counts(data: ParallelData, examples: np.ndarray, counts: np.ndarray, num_rows: int,
                    length: int) -> Batch:
  """`collate_packed` of rows given as examples [E] and each row's count of them [R]."""
  row_of, rank = token_positions(counts)  # each example's row, and its place in that row
  return collate_examples(data, examples, row_of, rank + 1, num_rows, length)




@dataclasses.dataclass(frozen=True)
class _PackedBatch:
  """Packed rows of one global batch: row r holds order[starts[r]:starts[r + 1]]."""

  order: np.ndarray  # [N] the epoch's order of every pair
  starts: np.ndarray  # [rows + 1]

  def share(self, first: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(examples [E], count per row) of rows first .. first + rows - 1 (fewer at the end)."""
    bounds = self.starts[first:first + rows + 1]
    if len(bounds) < 2:
      return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return self.order[bounds[0]:bounds[-1]], np.diff(bounds)


def _packed_epoch(data: ParallelData, seed: int, epoch: int, length: int,
                  rows_per_batch: int) -> list[_PackedBatch]:
  order = np.random.default_rng([seed, epoch]).permutation(len(data))
  starts = pack_starts(data, order, length)
  return [_PackedBatch(order, starts[i:i + rows_per_batch + 1])
          for i in range(0, len(starts) - 1, rows_per_batch)]


def train_batches(data: ParallelData, tokens_per_batch: int, seed: int, start_step: int = 0,
                  row_multiple: int = 1, pack_length: int = 0,
                  data_for_epoch: Optional[Callable[[int], ParallelData]] = None,
                  host: tuple[int, int] = (0, 1)) -> Iterator[Batch]:
  """Endless shuffled batches; batch k is the same whenever iteration starts at step k.

  Epoch e is planned with a generator seeded by (seed, e), so resuming at `start_step`
  reproduces exactly the batches an uninterrupted run would have seen. With `pack_length`,
  examples are packed into rows of that many tokens per side instead of length-bucketed.
  `data_for_epoch(e)`, when given, supplies each epoch's pairs in place of `data` (subword
  sampling: it must give the same pairs for the same e).

  `host` = (index, count): the batches are planned whole (every process plans the same global
  batch of R rows), but only rows [index * R / count, (index + 1) * R / count) are built, the
  share of process `index` of `count`; R is a multiple of `row_multiple`, which `count` must
  divide. Stacked in process order, the shares are the batch of host (0, 1).
  """
  index, count = host
  if not 0 <= index < count or row_multiple % count:
    raise ValueError(f'host {index} of {count}: needs 0 <= index < count and count dividing '
                     f'row_multiple={row_multiple}')
  rows = max(row_multiple, tokens_per_batch // max(pack_length, 1) // row_multiple * row_multiple)

  def plan(epoch: int) -> tuple[ParallelData, list]:
    d = data if data_for_epoch is None else data_for_epoch(epoch)
    if pack_length:
      return d, _packed_epoch(d, seed, epoch, pack_length, rows)
    return d, plan_batches(d.lengths, d.boundaries, tokens_per_batch,
                           np.random.default_rng([seed, epoch]), row_multiple)

  def make(d: ParallelData, item: Any) -> Batch:
    if pack_length:
      share = rows // count
      return _collate_counts(d, *item.share(index * share, share), share, pack_length)
    share = item.rows // count
    return collate(d, BatchPlan(item.examples[index * share:(index + 1) * share], share,
                                item.length))

  epoch, offset = 0, start_step
  current, plans = plan(epoch)
  while offset >= len(plans):  # epochs can differ in length: walk to start_step
    offset -= len(plans)
    epoch += 1
    current, plans = plan(epoch)
  while True:
    for item in plans[offset:]:
      yield make(current, item)
    epoch, offset = epoch + 1, 0
    current, plans = plan(epoch)

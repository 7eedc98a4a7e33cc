"""Line-aligned parallel text -> token-budget batches with length bucketing.

Batches are dicts of NumPy int32 arrays of shape [B, L] (see `steps.py`). Every batch of a
bucket has the same shape, so a jitted step compiles once per bucket, not per batch. The
training split's endless stream of them (and packing) is data/training_batches.py's.
This module never imports JAX.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import BinaryIO, Iterator, Optional, Sequence

import numpy as np

from transformer_nmt.data.ragged import Ragged, token_positions
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.errors import DataError

Batch = dict[str, np.ndarray]


@dataclasses.dataclass
class ReadStats:
  """What reading a parallel file pair kept and dropped."""

  lines: int = 0
  kept: int = 0
  empty: int = 0  # pairs with an empty side, skipped
  too_long: int = 0  # pairs over the length limit, skipped (counted after tokenizing)


def read_lines(path: str | os.PathLike) -> list[str]:
  """Reads a UTF-8 text file into stripped lines; errors name the file and line."""
  path = pathlib.Path(path)
  try:
    raw = path.read_bytes()
  except FileNotFoundError:
    raise DataError(f'{path}: no such file') from None
  except OSError as e:
    raise DataError(f'{path}: cannot read ({e.strerror})') from None
  return split_lines(raw, str(path))


def split_lines(raw: bytes, name: str) -> list[str]:
  """UTF-8 bytes -> stripped lines; invalid UTF-8 raises DataError naming `name` and the line."""
  lines = raw.split(b'\n')
  if lines and lines[-1] == b'':
    lines.pop()  # the final newline does not start another line
  return [_decoded(line, name, number) for number, line in enumerate(lines, start=1)]


def line_blocks(stream: BinaryIO, name: str, size: int) -> Iterator[list[str]]:
  """The stripped lines of a UTF-8 byte stream in blocks of `size` (the last one shorter),
  each handed out as soon as it is complete: memory stays bounded by a block, and with
  size 1 a line typed at a terminal is handed out at once. Errors name `name` and the line."""
  block: list[str] = []
  for number, line in enumerate(stream, start=1):
    block.append(_decoded(line, name, number))
    if len(block) == size:
      yield block
      block = []
  if block:
    yield block


def _decoded(line: bytes, name: str, number: int) -> str:
  try:
    return line.decode('utf-8').strip()
  except UnicodeDecodeError as e:
    raise DataError(f'{name}:{number}: invalid UTF-8 at byte {e.start} of the line') from None


def read_parallel(src_path: str | os.PathLike,
                  tgt_path: str | os.PathLike) -> tuple[list[str], list[str], ReadStats]:
  """Reads two line-aligned files; pairs with an empty side are skipped and counted."""
  src, tgt = read_lines(src_path), read_lines(tgt_path)
  if len(src) != len(tgt):
    raise DataError(f'{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}; '
                    'parallel files must be line-aligned')
  stats = ReadStats(lines=len(src))
  keep = [i for i in range(len(src)) if src[i] and tgt[i]]
  stats.empty = len(src) - len(keep)
  stats.kept = len(keep)
  return [src[i] for i in keep], [tgt[i] for i in keep], stats


def bucket_boundaries(max_len: int, min_len: int = 8, growth: float = 1.25,
                      multiple: int = 4) -> list[int]:
  """Geometric bucket lengths up to max_len, rounded up to `multiple` (few shapes, low padding)."""
  bounds, b = [], min_len
  while b < max_len:
    bounds.append(b)
    b = -(-max(b + multiple, int(b * growth)) // multiple) * multiple
  bounds.append(max_len)
  return bounds


# The decoding grid's first length (below, a sentence's source is not what a batch's time
# goes to: the decoder's steps over its output are).
GRID_START = 16


def length_grid(longest: int, at_least: int) -> list[int]:
  """Decoding's and scoring's padded lengths: powers of two from 16 (16, 32, 64, ...) up to
  max(longest, at_least), that bound last. One grid for every input, few lengths: the
  programs compiled for one file serve the next (runtime/programs.py), and a sentence pads to
  less than twice its length (each length multiplies the programs: docs/decoding.md,
  "Compiled programs")."""
  bounds, top = [], max(longest, at_least)
  n = GRID_START
  while n < top:
    bounds.append(n)
    n *= 2
  return bounds + [top]


@dataclasses.dataclass
class ParallelData:
  """Tokenised pairs (with EOS appended) grouped into length buckets.

  src, tgt: per-example ids, each ending in EOS, stored flat (`Ragged`; lists of arrays given
  here are converted); src[i] is example i's [n] ids. index: position in the kept input
  lines, so outputs can be restored to file order.
  """

  src: Ragged
  tgt: Ragged
  index: np.ndarray
  pad_id: int
  bos_id: int
  boundaries: list[int]
  stats: ReadStats

  def __post_init__(self):
    if not isinstance(self.src, Ragged):
      self.src = Ragged.from_rows(self.src)
    if not isinstance(self.tgt, Ragged):
      self.tgt = Ragged.from_rows(self.tgt)

  @property
  def lengths(self) -> np.ndarray:
    """[N] max(src, tgt) length of each pair, the length its bucket is chosen by."""
    return np.maximum(self.src.lengths, self.tgt.lengths)

  def __len__(self) -> int:
    return len(self.src)


def encode_parallel(src_lines: Sequence[str], tgt_lines: Sequence[str], src_tok: Tokenizer,
                    tgt_tok: Tokenizer, *, max_len: Optional[int], stats: ReadStats,
                    boundaries: Optional[Sequence[int]] = None) -> ParallelData:
  """Tokenises pairs, appends EOS, drops (and counts) pairs longer than max_len tokens.

  With max_len None nothing is dropped (evaluation sets) and buckets reach the longest pair.
  """
  return parallel_ids(src_tok.encode(src_lines), tgt_tok.encode(tgt_lines), src_tok, tgt_tok,
                      max_len=max_len, stats=stats, boundaries=boundaries)


def parallel_ids(src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]], src_tok: Tokenizer,
                 tgt_tok: Tokenizer, *, max_len: Optional[int], stats: ReadStats,
                 boundaries: Optional[Sequence[int]] = None) -> ParallelData:
  """`encode_parallel` from subword ids already made (e.g. sampled ones)."""
  src_lengths = np.fromiter(map(len, src_ids), np.int64, len(src_ids)) + 1  # with EOS
  tgt_lengths = np.fromiter(map(len, tgt_ids), np.int64, len(tgt_ids)) + 1
  if max_len is None:
    max_len = int(max(src_lengths.max(initial=0), tgt_lengths.max(initial=0), 1))
  keep = np.flatnonzero((src_lengths <= max_len) & (tgt_lengths <= max_len))
  stats.too_long += len(src_ids) - len(keep)
  stats.kept = len(keep)
  bounds = list(boundaries) if boundaries else bucket_boundaries(max_len)
  return ParallelData(Ragged.from_rows([src_ids[i] for i in keep], end=src_tok.eos_id),
                      Ragged.from_rows([tgt_ids[i] for i in keep], end=tgt_tok.eos_id),
                      keep.astype(np.int64), tgt_tok.pad_id, tgt_tok.bos_id, bounds, stats)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """Which examples form one batch, and its padded shape [rows, length]."""

  examples: np.ndarray
  rows: int
  length: int


def plan_batches(lengths: np.ndarray, boundaries: Sequence[int], tokens_per_batch: int,
                 rng: Optional[np.random.Generator] = None,
                 row_multiple: int = 1) -> list[BatchPlan]:
  """Groups examples by bucket into batches of about `tokens_per_batch` padded tokens per side.

  Args:
    lengths: [N] length of each example (for pairs, the longer side).
    boundaries: increasing bucket lengths; the last must be >= every length.
    tokens_per_batch: padded-token budget; a bucket of length L gets max(1, budget // L) rows,
      and its last batch is filled up with empty rows so shapes stay fixed.
    rng: shuffles examples within buckets and batches across buckets; None keeps the order
      deterministic (evaluation).
    row_multiple: rows per batch are rounded down to a multiple of this (at least one
      multiple), so batches split evenly over devices.
  """
  bucket_of = np.searchsorted(np.asarray(boundaries), lengths)  # first boundary >= length
  plans = []
  for b, length in enumerate(boundaries):
    members = np.flatnonzero(bucket_of == b)
    if rng is not None:
      members = rng.permutation(members)
    rows = max(row_multiple, tokens_per_batch // length // row_multiple * row_multiple)
    plans += [BatchPlan(members[i:i + rows], rows, length) for i in range(0, len(members), rows)]
  if rng is not None:
    plans = [plans[i] for i in rng.permutation(len(plans))]
  return plans


def fill_batches(lengths: np.ndarray, boundaries: Sequence[int], tokens_per_batch: int,
                 row_sizes: Optional[Sequence[int]] = None, min_rows: int = 1) -> list[BatchPlan]:
  """Examples sorted by length and cut greedily into batches of at most `tokens_per_batch`
  padded tokens, each padded to the bucket length of its longest example (a single example
  over the budget is a batch of one). Unlike `plan_batches`, neighbouring buckets share a
  batch while it has room, so a short input is one batch, one compiled shape (decoding: ten
  sentences of Multi30k fell into five buckets, five batches and 41 compiled programs).

  With `row_sizes` (increasing, from 1) every batch's row count is one of them: at most the
  largest that fits the budget, and the smallest that holds its examples and `min_rows`
  (when the budget allows that many), so batch shapes come from a fixed grid."""
  order = np.argsort(lengths, kind='stable')
  bounds = np.asarray(boundaries)
  padded = bounds[np.searchsorted(bounds, np.asarray(lengths)[order])]
  sizes = None if row_sizes is None else np.asarray(row_sizes)
  if sizes is not None and sizes[0] != 1:
    raise ValueError(f'row_sizes must start at 1 (a single example always fits): {row_sizes}')

  def cap(length: int) -> int:  # most rows a batch padded to `length` may have
    limit = max(1, tokens_per_batch // int(length))
    return limit if sizes is None else int(sizes[np.searchsorted(sizes, limit, 'right') - 1])

  plans, start = [], 0
  for i in range(1, len(order) + 1):
    if i == len(order) or i - start + 1 > cap(padded[i]):
      length = int(padded[i - 1])
      rows = cap(length) if sizes is None else int(
          sizes[np.searchsorted(sizes, max(i - start, min(min_rows, cap(length))))])
      plans.append(BatchPlan(order[start:i], rows, length))
      start = i
  return plans


def pad_rows(rows: Sequence[np.ndarray], plan: BatchPlan, pad_id: int) -> tuple[np.ndarray, ...]:
  """(ids, segments, positions), each [plan.rows, plan.length], for the planned examples."""
  shape = (plan.rows, plan.length)
  ids, segments, positions = np.full(shape, pad_id, np.int32), np.zeros(shape, np.int32), \
      np.zeros(shape, np.int32)
  for row, i in enumerate(plan.examples):
    n = len(rows[i])
    ids[row, :n], segments[row, :n], positions[row, :n] = rows[i], 1, np.arange(n)
  return ids, segments, positions


def collate(data: ParallelData, plan: BatchPlan) -> Batch:
  """Pads the planned examples, one per row, into the batch dict of `steps.train_step`."""
  examples = np.asarray(plan.examples, np.int64)
  return collate_examples(data, examples, np.arange(len(examples)),
                          np.ones(len(examples), np.int64), plan.rows, plan.length)


def padding_fraction(batch: Batch) -> float:
  """Share of padded positions over source and target."""
  real = int(np.count_nonzero(batch['src_segments'])) + int(np.count_nonzero(batch['tgt_segments']))
  return 1.0 - real / (batch['src'].size + batch['tgt_out'].size)


def collate_examples(data: ParallelData, examples: np.ndarray, row_of: np.ndarray,
                     segment: np.ndarray, num_rows: int, length: int) -> Batch:
  """The batch dict [num_rows, length] with examples[e] in row row_of[e] as segment
  segment[e] (examples of one row consecutive, in order), built by whole-array gathers and
  scatters rather than a loop over examples: a host feeds its share of a global batch in a
  fraction of a millisecond."""
  batch = {k: np.zeros((num_rows, length), np.int32) for k in
           ('src', 'src_segments', 'src_positions', 'tgt_in', 'tgt_out', 'tgt_segments',
            'tgt_positions')}
  for key in ('src', 'tgt_in', 'tgt_out'):
    batch[key].fill(data.pad_id)
  row_first = np.searchsorted(row_of, row_of)  # index of the first example of each one's row
  for side, ragged in (('src', data.src), ('tgt', data.tgt)):
    starts = ragged.offsets[examples]
    lengths = ragged.offsets[examples + 1] - starts  # not ragged.lengths: O(corpus) per call
    ends = np.cumsum(lengths)
    # first column of each example: tokens before it, less those of earlier rows
    column = (ends - lengths) - (ends - lengths)[row_first]
    example, position = token_positions(lengths)  # [T] each token's example and position
    source = starts[example] + position  # [T] index into ragged.ids
    cell = row_of[example] * length + column[example] + position  # [T] flat index in the batch
    ids = ragged.ids[source]
    batch['src' if side == 'src' else 'tgt_out'].reshape(-1)[cell] = ids
    batch[f'{side}_segments'].reshape(-1)[cell] = segment[example]
    batch[f'{side}_positions'].reshape(-1)[cell] = position
    if side == 'tgt':  # teacher forcing: BOS, then the target shifted right by one
      batch['tgt_in'].reshape(-1)[cell] = np.where(position == 0, data.bos_id,
                                                   ragged.ids[np.maximum(source - 1, 0)])
  return batch

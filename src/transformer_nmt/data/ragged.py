"""Rows of token ids of different lengths, stored flat: one id array and the offsets of its
rows (fairseq's .bin/.idx idea). Millions of small NumPy arrays cost about 100 bytes of header
each and must be built one by one; one flat array can be memory-mapped from a file (see
`data/cache.py`) and gathered from with a few vectorised operations (`batching.collate`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Iterable, Union, overload

import numpy as np


class Ragged(Sequence):
  """N rows of ids; row i is ids[offsets[i]:offsets[i + 1]] (a view, not a copy).

  ids: [total] integer array (int32, or uint16 when read from the cache); offsets: [N + 1]
  int64, increasing (offsets[0] need not be 0: a slice of rows shares its parent's ids).
  """

  def __init__(self, ids: np.ndarray, offsets: np.ndarray):
    self.ids, self.offsets = ids, offsets

  @classmethod
  def from_rows(cls, rows: Iterable[Sequence[int]], end: int | None = None) -> Ragged:
    """Rows of ids (lists or arrays), each followed by the id `end` when given (EOS)."""
    rows = list(rows)
    extra = 0 if end is None else 1
    lengths = np.fromiter((len(r) + extra for r in rows), np.int64, len(rows))
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.empty(int(offsets[-1]), np.int32)
    body = np.ones(len(ids), bool)
    if end is not None:  # each row's last position holds `end`, the others its own ids
      body[offsets[1:] - 1] = False
      ids[~body] = end
    ids[body] = np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(body.sum()))
    return cls(ids, offsets)

  @property
  def lengths(self) -> np.ndarray:
    """[N] int64 length of each row."""
    return np.diff(self.offsets)

  def __len__(self) -> int:
    return len(self.offsets) - 1

  @overload
  def __getitem__(self, i: int) -> np.ndarray: ...

  @overload
  def __getitem__(self, i: slice) -> Ragged: ...

  def __getitem__(self, i: Union[int, slice]) -> Union[np.ndarray, Ragged]:
    if isinstance(i, slice):
      start, stop, step = i.indices(len(self))
      if step != 1:
        return self.take(np.arange(start, stop, step))
      return Ragged(self.ids, self.offsets[start:max(start, stop) + 1])
    n = len(self)
    if not -n <= i < n:
      raise IndexError(f'row {i} of {n}')
    i %= n
    return self.ids[self.offsets[i]:self.offsets[i + 1]]

  def take(self, rows: np.ndarray) -> Ragged:
    """The chosen rows [K], in that order, as a new Ragged with its own ids."""
    lengths = self.lengths[rows]
    row, within = token_positions(lengths)
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Ragged(self.ids[self.offsets[rows][row] + within], offsets)


def token_positions(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """For rows of the given lengths [E], laid end to end: (row of each token [T], its position
  within that row [T]), T = lengths.sum()."""
  total = int(lengths.sum())
  rows = np.repeat(np.arange(len(lengths)), lengths)
  starts = np.cumsum(lengths) - lengths
  return rows, np.arange(total) - starts[rows]


def concatenate(parts: Sequence[Ragged]) -> Ragged:
  """The rows of each part, one part after another."""
  if not parts:
    return Ragged(np.zeros(0, np.int32), np.zeros(1, np.int64))
  ids = np.concatenate([p.ids[p.offsets[0]:p.offsets[-1]] for p in parts])
  lengths = np.concatenate([p.lengths for p in parts])
  offsets = np.zeros(len(lengths) + 1, np.int64)
  np.cumsum(lengths, out=offsets[1:])
  return Ragged(ids, offsets)

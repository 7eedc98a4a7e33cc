"""The compiled programs of an engine: a bounded set, the same for every input.

Every batch is padded into one grid (docs/decoding.md, "Compiled programs"):
- lengths 16, 32, 64, ... up to decode.max_input_len (data.batching.length_grid): a batch's
  sources, and its target prefixes (as wide as the sources, padding where a line has none),
  pad to the first length that holds them;
- rows 1, 4, 16, 24, 32, 48, 64, ... (runtime.compaction.batch_sizes), at most tokens_per_batch /
  length rows: batches start at these sizes and compaction keeps to them.
A batch shape (rows, length) makes one start program (the encoder and the first cache stage's
steps) and one advance program per later cache stage (decoding.search.cache_stages of its
output length), or with `decode.compact` off one program; scoring makes one per shape of
`Scorer.shapes`. On a CPU that is all: rows are gathered and caches grown in numpy
(runtime/compaction.py); other backends add a small program for each gather and growth.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from transformer_nmt.data import batching as data_lib
from transformer_nmt.decoding.scoring import Scorer
from transformer_nmt.decoding.search import cache_stages, padded_length
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.decoding.translate import output_length
from transformer_nmt.runtime.compaction import batch_sizes


@dataclasses.dataclass(frozen=True)
class ProgramSet:
  """The programs that jobs of at most `rows` sentences of at most `length` source subwords
  need: `shapes` (rows, length) of translation batches and their `translate` programs, and
  with scoring the pairs of up to `score_length` subwords a side in `score_shapes`, one
  program each."""

  rows: int
  length: int
  shapes: tuple[tuple[int, int], ...]
  translate: int
  score_length: int = 0
  score_shapes: tuple[tuple[int, int], ...] = ()

  @property
  def programs(self) -> int:
    return self.translate + len(self.score_shapes)


def program_set(d: DecodeConfig, scorer: Scorer, max_rows: int, max_length: int,
                scoring: bool = False) -> ProgramSet:
  """The set for jobs of at most `max_rows` sentences of at most `max_length` source subwords
  (EOS included; rounded up to the grid) under the search settings `d`; with `scoring`, also
  the scoring programs of their hypotheses (pairs as long as the longest translation, EOS
  included)."""
  grid = data_lib.length_grid(1, d.max_input_len)
  lengths = grid[:int(np.searchsorted(grid, max_length)) + 1]  # up to the one that holds it
  sizes = [n for n in batch_sizes(d.tokens_per_batch) if n <= max_rows]
  shapes = tuple((rows, n) for n in lengths for rows in sizes if rows * n <= d.tokens_per_batch)
  if not shapes:
    return ProgramSet(0, 0, (), 0)
  translate = sum(_programs_per_shape(d, n) for _, n in shapes)
  rows, length = max(sizes), lengths[-1]
  if not scoring:
    return ProgramSet(rows, length, shapes, translate)
  longest = max(length, output_length(length, d.max_extra_len, d.max_len, length))
  score_length = int(grid[min(int(np.searchsorted(grid, longest)), len(grid) - 1)])
  return ProgramSet(rows, length, shapes, translate, score_length,
                    tuple(scorer.shapes(max_rows, score_length)))


def _programs_per_shape(d: DecodeConfig, length: int) -> int:
  """Programs of one batch shape with sources (and prefixes) of `length`: the start program
  and an advance program per later cache stage; one loop without compaction."""
  if not d.compact:
    return 1
  steps = output_length(length, d.max_extra_len, d.max_len, length)
  return len(cache_stages(padded_length(steps, d.chunk), d.chunk))

"""What one search does, as one frozen value: made and validated once, passed whole.

The decode section of a run's config (settings.DecodeConfig: beam size, length penalty, length
limits, stopping rule, sampling, output controls) says how to search; the tokenizer says
which ids begin, end and pad an output; the caller says how many hypotheses per sentence it
wants back. A `SearchSpec` holds the three, checked together where it is made, and the search
functions (translate.translate, runtime CompactingTranslate, beam.beam, search.greedy) read
what they need from it. An output control is added to DecodeConfig (its value and check) and
to the search that applies it, nowhere in between.
"""

from __future__ import annotations

import dataclasses

from transformer_nmt.decoding.kernels import REFERENCE, Kernels
from transformer_nmt.decoding.settings import DECODE, DecodeConfig
from transformer_nmt.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class SearchSpec:
  """A search's settings (`decode`), the target tokenizer's special ids, and `n_best`: the
  hypotheses per sentence a beam search returns ([B, N, L] when above 1, see beam.result)."""

  bos_id: int
  eos_id: int
  pad_id: int
  decode: DecodeConfig = DECODE
  n_best: int = 1
  # What the search and its decoder step compute with (kernels.py): the engine chooses it
  # for its backend.
  kernels: Kernels = REFERENCE

  def __post_init__(self) -> None:
    d = self.decode
    if not 1 <= self.n_best <= d.beam_size or (self.n_best > 1 and self.sampling):
      raise ConfigError(f'n_best={self.n_best} must be between 1 and the beam size '
                        f'{d.beam_size} (and 1 when sampling)')

  @property
  def sampling(self) -> bool:
    """Draws tokens (decode.temperature > 0) instead of searching."""
    return self.decode.temperature > 0

  @property
  def beams(self) -> int:
    """Hypotheses kept per sentence while searching: 1 for greedy search and sampling."""
    return 1 if self.sampling else self.decode.beam_size

  def with_n_best(self, n_best: int) -> SearchSpec:
    return dataclasses.replace(self, n_best=n_best)

"""A translation with the model's scores of it, as the engine returns it (n-best lists, serve.py's
answers, decode.py's --n_best lines)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from transformer_nmt.decoding.beam import length_penalty


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One translation with the model's scores of it (forced decoding, scoring.py).

  tokens, token_logprobs, alignment, attention's rows: one entry per target subword and one
  for the final EOS; alignment holds positions in the source's subwords (`source_tokens`,
  EOS last), which are attention's columns."""

  text: str
  score: float  # logprob / GNMT length penalty (decode.alpha), what beam search ranks by
  logprob: float
  tokens: list[str]
  token_logprobs: list[float]
  alignment: list[int]
  # [tokens, source_tokens] float32: the last decoder layer's cross-attention, mean over
  # heads (plots.cross_attention); alignment is its rows' argmax. Not in as_json: decode.py's
  # n-best lines stay small.
  attention: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.float32),
                                            repr=False, compare=False)

  def as_json(self) -> dict[str, Any]:
    """The fields decode.py writes (all but `attention`)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.name != 'attention'}


def joined(first: Hypothesis, then: Hypothesis, offset: int, alpha: float) -> Hypothesis:
  """Two pieces' translations of one line as one hypothesis; `then`'s alignment shifted by
  the `offset` source subwords before its piece, and its attention placed beside them (each
  piece attends to its own source only: the matrix is block-diagonal)."""
  logprob = first.logprob + then.logprob
  tokens = first.tokens + then.tokens
  attention = np.zeros((len(tokens), offset + then.attention.shape[1]), np.float32)
  attention[:len(first.tokens), :offset] = first.attention
  attention[len(first.tokens):, offset:] = then.attention
  return Hypothesis(' '.join(t for t in (first.text, then.text) if t),
                    logprob / float(length_penalty(len(tokens), alpha)), logprob, tokens,
                    first.token_logprobs + then.token_logprobs,
                    first.alignment + [a + offset for a in then.alignment], attention)

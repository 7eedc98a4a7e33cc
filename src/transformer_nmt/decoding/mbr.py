"""Minimum Bayes risk choice among a sentence's n-best translations (Kumar & Byrne 2004).

Beam search returns the likeliest hypothesis; MBR returns the one that agrees most, by a
sentence-level metric, with the hypotheses the model finds likely: the argmax over the
n-best list of the expected utility sum_j p_j u(h_i, h_j), with p the model probabilities
(exp of the sequence log-probabilities) renormalised over the list. Every hypothesis is also
one of the pseudo-references, itself included, as in that expectation.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import sacrebleu

from transformer_nmt.decoding.settings import MBR_UTILITIES


def _metric(utility: str) -> sacrebleu.metrics.base.Metric:
  if utility == 'bleu':
    # effective order: a short sentence without 4-gram matches still scores above 0
    return sacrebleu.metrics.BLEU(effective_order=True)
  if utility == 'chrf':
    return sacrebleu.metrics.CHRF()
  raise ValueError(f'MBR utility {utility!r}: expected one of {list(MBR_UTILITIES)}')


def model_weights(logprobs: Sequence[float]) -> np.ndarray:
  """[N] probabilities of N hypotheses renormalised over them (`logprobs`: [N] sequence
  log-probabilities)."""
  weights = np.exp(np.asarray(logprobs, np.float64) - np.max(logprobs))
  return weights / weights.sum()


def utilities_against(candidates: Sequence[str], references: Sequence[str],
                      weights: Sequence[float], utility: str) -> np.ndarray:
  """[C] expected utility of each candidate against the pseudo-references ([R] texts with
  [R] weights summing to 1)."""
  metric = _metric(utility)
  # u[i, j]: candidate i scored against pseudo-reference j as the reference
  u = np.array([[metric.sentence_score(h, [r]).score for r in references] for h in candidates])
  return u @ np.asarray(weights, np.float64)


def expected_utilities(texts: Sequence[str], logprobs: Sequence[float],
                       utility: str) -> np.ndarray:
  """[N] expected utility of each of N hypotheses against all N, weighted by their
  renormalised model probabilities (`logprobs`: [N] sequence log-probabilities)."""
  return utilities_against(texts, texts, model_weights(logprobs), utility)


def mbr_order(texts: Sequence[str], logprobs: Sequence[float], utility: str) -> list[int]:
  """Indices of `texts`, highest expected utility first; ties keep the given order (the
  search's, best first). One hypothesis or none is returned as it is."""
  if len(texts) < 2:
    return list(range(len(texts)))
  gains = expected_utilities(texts, logprobs, utility)
  return sorted(range(len(texts)), key=lambda i: -gains[i])  # sorted() is stable

"""Forced decoding: the model's log-probabilities of given translations, token by token.

What fairseq's score-reference and CTranslate2's score_batch give: reranking n-best lists,
filtering parallel data, checking a search's own scores. Each target token also gets its
last decoder layer's cross-attention averaged over heads (what plots.cross_attention draws)
and an alignment, the source token that attention weighs most (the usual cheap alignment).
Dimension legend: B batch, S source, T target length, H heads.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_nmt.config import ModelConfig
from transformer_nmt.data import batching as data_lib
from transformer_nmt.decoding import ensemble
from transformer_nmt.decoding.ensemble import Models
from transformer_nmt.decoding.kernels import REFERENCE, Kernels
from transformer_nmt.decoding.search import Jit, plain_jit
from transformer_nmt.decoding.settings import DECODE
from transformer_nmt.model.transformer import last_cross_attention


@dataclasses.dataclass(frozen=True)
class Scored:
  """One target's scores. token_logprobs, alignment and attention's rows have one entry per
  target token and one for the EOS that ends it; alignment holds source token positions and
  attention's columns are the source tokens (EOS included)."""

  logprob: float  # log P(target, EOS | source)
  token_logprobs: np.ndarray  # [T + 1] float
  alignment: np.ndarray  # [T + 1] int: the argmax of each attention row
  attention: np.ndarray  # [T + 1, S + 1] float32, each row summing to 1


def token_scores(cfg: Models, params: Any, batch: dict,
                 kernels: Kernels = REFERENCE) -> tuple[jax.Array, jax.Array]:
  """Teacher-forced log P of each `tgt_out` token [B, T] and the last decoder layer's
  cross-attention, mean over heads [B, T, S] (float32). For an ensemble, log P is that of
  the normalised mean of the members' log-probabilities (as in decoding/ensemble.py) and
  the attention the first member's. The alignment is the attention's argmax over S, taken
  by the caller (Scorer) so that one program serves both. `kernels.network` computes."""
  scored = [_member_scores(kernels.network(c), c, p, batch)
            for c, p in ensemble.members(cfg, params)]
  logp = jnp.mean(jnp.stack([s for s, _ in scored]), axis=0)  # [B, T, V]
  if ensemble.is_ensemble(cfg):
    logp = jax.nn.log_softmax(logp, axis=-1)
  target = jnp.take_along_axis(logp, batch['tgt_out'][..., None], axis=-1)[..., 0]
  return target, scored[0][1]


def _member_scores(network: nn.Module, cfg: ModelConfig, params: Any,
                   batch: dict) -> tuple[jax.Array, jax.Array]:
  """One model's log-probabilities [B, T, V] and head-mean cross-attention [B, T, S]."""
  logits, state = network.apply(
      {'params': params}, batch['src'], batch['tgt_in'], batch['src_segments'],
      batch['tgt_segments'], batch['src_positions'], batch['tgt_positions'],
      mutable=['intermediates'])
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B, T, V]
  weights = last_cross_attention(cfg, state['intermediates'])  # [B, H, T, S]
  return logp, jnp.mean(weights, axis=1)  # float32 (attention.attention_weights)


class Scorer:
  """Scores (source, target) id rows in length buckets of about `tokens_per_batch` padded
  tokens per side; one compile per bucket shape (`jit`: search.plain_jit, or a
  ProgramStore's, which keeps them across runs), computed by `kernels.network`."""

  def __init__(self, cfg: Models, *, bos_id: int, pad_id: int, tokens_per_batch: int,
               max_input_len: int = DECODE.max_input_len,
               jit: Jit = plain_jit, kernels: Kernels = REFERENCE):
    self.bos_id, self.pad_id, self.tokens_per_batch = bos_id, pad_id, tokens_per_batch
    self.max_input_len = max_input_len
    self._scores = jit(functools.partial(token_scores, cfg, kernels=kernels), 'score')

  def shapes(self, max_rows: int, max_length: int) -> list[tuple[int, int]]:
    """(rows, length) of every batch that scoring at most `max_rows` pairs of at most
    `max_length` subwords a side can meet: at each grid length up to `max_length`, each
    power-of-two row count `score_ids` plans (from 8, or fewer where the budget holds fewer)
    up to the one that holds `max_rows`."""
    grid = data_lib.length_grid(1, self.max_input_len)
    most = 1 << max(max_rows - 1, 0).bit_length()  # max_rows pairs pad up to this many rows
    shapes = []
    for n in (n for n in grid if n <= max_length):
      cap = 1 << (max(self.tokens_per_batch // n, 1).bit_length() - 1)  # fill_batches' cap
      rows = min(8, cap)
      while rows <= min(cap, max(most, 8)):
        shapes.append((rows, n))
        rows *= 2
    return shapes

  def precompile(self, params: Any, shapes: Sequence[tuple[int, int]], eos_id: int) -> None:
    """Makes (compiles, or loads from the store) the program of each (rows, length) of
    `shapes` (see `shapes`)."""
    for rows, n in shapes:  # `rows` pairs of length n plan as one batch of that shape
      row = np.full(n, eos_id, np.int32)
      self.score_ids(params, [row] * rows, [row] * rows)

  def score_ids(self, params: Any, src_rows: Sequence[np.ndarray],
                tgt_rows: Sequence[np.ndarray]) -> list[Scored]:
    """Rows of ids, each ending in EOS (the target's EOS is scored too), in input order."""
    if not src_rows:
      return []
    longest = max(max(len(s), len(t)) for s, t in zip(src_rows, tgt_rows))
    # One grid of lengths and powers-of-two rows for every input: the shapes, and so the
    # compiled programs (programs.py), recur from one file to the next.
    boundaries = data_lib.length_grid(longest, self.max_input_len)
    data = data_lib.ParallelData(list(src_rows), list(tgt_rows), np.arange(len(src_rows)),
                                 self.pad_id, self.bos_id, boundaries, data_lib.ReadStats())
    out: list[Optional[Scored]] = [None] * len(data)
    sizes = [2 ** i for i in range(max(self.tokens_per_batch, 1).bit_length())]
    for plan in data_lib.fill_batches(data.lengths, boundaries, self.tokens_per_batch, sizes,
                                      min_rows=8):
      batch = data_lib.collate(data, plan)
      logp, attention = map(np.asarray, self._scores(params, batch))  # [B, T], [B, T, S]
      for row, i in enumerate(plan.examples):
        n, s = len(data.tgt[i]), len(data.src[i])
        # a copy: a view would keep the whole batch's [B, T, S] alive with each Scored
        mine = attention[row, :n, :s].copy()  # padding columns hold 0 weight
        out[i] = Scored(float(np.sum(logp[row, :n], dtype=np.float64)), logp[row, :n],
                        np.argmax(mine, axis=-1), mine)
    return out

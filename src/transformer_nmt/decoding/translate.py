"""Translate padded source batches with a Transformer (one model or an ensemble): greedy or
beam search over the cached decoder (self-attention K/V cache, cross-attention K/V computed
once per batch), as one jitted loop (`translate`). The CPU runtime drives the same search
from the host, dropping finished sentences (runtime/compaction.py's CompactingTranslate).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from transformer_nmt.config import ModelConfig
from transformer_nmt.decoding import ensemble
from transformer_nmt.decoding.beam import beam
from transformer_nmt.decoding.ensemble import Models
from transformer_nmt.decoding.kernels import REFERENCE, Kernels
from transformer_nmt.decoding.search import (
  LogitsFn,
  Prefix,
  Search,
  greedy,
  padded_length,
)
from transformer_nmt.decoding.settings import DECODE, DecodeConfig
from transformer_nmt.decoding.spec import SearchSpec

# (cfg, params, src [B, S], src_segments [B, S], cache length) -> (logits_fn, initial cache)
Decoder = Callable[[Models, Any, jax.Array, jax.Array, int], tuple[LogitsFn, Any]]


def cached_decoder(cfg: Models, params: Any, src: jax.Array, src_segments: jax.Array,
                   length: int, kernels: Kernels = REFERENCE) -> tuple[LogitsFn, Any]:
  """The paper's decoder as it runs incrementally: the encoder once, the cross-attention K/V
  once per batch, a self-attention K/V cache of `length` positions (one model or an
  ensemble), computed by `kernels.network`."""
  return (ensemble.step_fn(cfg, params, kernels),
          ensemble.start(cfg, params, src, src_segments, length, kernels))


def search_for(spec: SearchSpec, length: int, rng: Optional[jax.Array] = None) -> Search:
  """The search `translate` runs for outputs of `length` positions: sampling when
  `spec.sampling` (with `rng`), else beam search when the beam is wider than 1 (its
  `spec.n_best` hypotheses per sentence), else greedy."""
  if spec.sampling or spec.decode.beam_size == 1:
    return greedy(spec, length, rng)
  return beam(spec, length)


def output_limits(src_segments: jax.Array, d: DecodeConfig,
              prefix: Optional[Prefix] = None) -> jax.Array:
  """[B] output limits in tokens with EOS: source length + `d.max_extra_len` (§6.1), or
  prefix length + that if longer; at most `d.max_len` subwords and EOS when it is above 0,
  but always room for the prefix and EOS. Filler rows (no source tokens; they pad a bucket's
  last batch) end at once: were they left to run to their length limit, every batch would
  decode for the full output length."""
  src_lens = jnp.sum(src_segments > 0, axis=1)
  given = jnp.zeros_like(src_lens) if prefix is None else prefix.lens
  limits = jnp.maximum(src_lens, given) + d.max_extra_len
  if d.max_len > 0:
    limits = jnp.minimum(limits, d.max_len + 1)
  return jnp.where(src_lens > 0, jnp.maximum(limits, given + 1), 1)


def output_length(src_len: int, max_extra_len: int, max_len: int = 0,
                  prefix_len: int = 0) -> int:
  """Static output length of a batch whose sources are padded to `src_len` and prefixes to
  `prefix_len` (the largest `_max_lens` can give)."""
  length = max(src_len, prefix_len) + max_extra_len
  if max_len > 0:
    length = min(length, max_len + 1)
  return max(length, prefix_len + 1)


def as_prefix(ids: Optional[jax.Array], pad_id: int) -> Optional[Prefix]:
  """[B, P] target prefixes padded with `pad_id` (a row of padding: none) -> a Prefix."""
  if ids is None:
    return None
  return Prefix(ids, jnp.sum(ids != pad_id, axis=1))


def translate(cfg: Models, params: Any, src: jax.Array, src_segments: jax.Array,
              spec: SearchSpec, *, rng: Optional[jax.Array] = None,
              prefix: Optional[jax.Array] = None, grow_cache: bool = True,
              decoder: Optional[Decoder] = None) -> jax.Array:
  """Translates a padded batch: src [B, S] -> ids [B, S + max_extra_len], in one jittable loop
  (with beam search and `spec.n_best` > 1: [B, N, S + max_extra_len], see beam.result).

  `cfg` and `params` are one model's, or tuples of an ensemble's (decoding/ensemble.py).
  Each row may produce up to its own source length + `spec.decode.max_extra_len` tokens
  (§6.1), at most `max_len` + 1 with the output controls' `max_len`. The search is
  `search_for(spec)`'s; with sampling, `rng` draws. With `grow_cache` the self-attention
  cache starts at 2 chunks and doubles as needed (decoding.decode_loop). `prefix` [B, P]
  (padded with `spec.pad_id`) gives the tokens each output must start with; the search
  continues after. Output rows hold the tokens, EOS, then `spec.pad_id`. `decoder` replaces
  the cached one, `cached_decoder` (of `spec.kernels`). Jit with `cfg`, `spec` and `decoder`
  bound.
  """
  d = spec.decode
  given = as_prefix(prefix, spec.pad_id)
  steps = output_length(src.shape[1], d.max_extra_len, d.max_len,
                        0 if prefix is None else prefix.shape[1])
  length = padded_length(steps, d.chunk)
  if decoder is None:
    logits_fn, cache = cached_decoder(cfg, params, src, src_segments, length, spec.kernels)
  else:
    logits_fn, cache = decoder(cfg, params, src, src_segments, length)
  search = search_for(spec, length, rng)
  return search.run(logits_fn, cache, output_limits(src_segments, d, given), steps, d.chunk,
                    grow_cache, given)


def translate_greedy(cfg: ModelConfig, params: Any, src: jax.Array, src_segments: jax.Array, *,
                     bos_id: int, eos_id: int, pad_id: int,
                     max_extra_len: int = DECODE.max_extra_len) -> jax.Array:
  """Greedy translation with the cached decoder: src [B, S] -> ids [B, S + max_extra_len]."""
  spec = SearchSpec(bos_id, eos_id, pad_id, DecodeConfig(beam_size=1, max_extra_len=max_extra_len))
  return translate(cfg, params, src, src_segments, spec)

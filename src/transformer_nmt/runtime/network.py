"""The Transformer as XLA:CPU decodes it fastest: model/'s network with a decoding step built
from one-query kernels (one_step.py) over the cache of cache.py, and, in batch-invariant
programs (decode.batch_invariant), every sum of the network and the search written as halvings
(sums.py). The modules subclass model/'s and keep their names, so the parameters of a trained
model are the same; the outputs are the reference's (tests/runtime/test_network.py).

`CPU` and `CPU_BATCH_INVARIANT` are the decoding.Kernels of this runtime; compiler.kernels
chooses among them and the reference for the backend.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_nmt.config import ModelConfig
from transformer_nmt.decoding.kernels import Kernels
from transformer_nmt.model.attention import MultiHeadAttention, attention_weights, masked_softmax
from transformer_nmt.model.transformer import (
  DecoderLayer,
  EncoderLayer,
  Transformer,
  layer_norm,
)
from transformer_nmt.runtime import one_step, sums, topk
from transformer_nmt.runtime.cache import StepCache, StepKVCache


def _layer_norm(cfg: ModelConfig, halving: bool) -> nn.Module:
  """model/'s LayerNorm, or sums.LayerNorm (its parameters and formula, halving sums)."""
  return sums.LayerNorm(epsilon=cfg.layer_norm_epsilon) if halving else layer_norm(cfg)


class StepAttention(MultiHeadAttention):
  """Multi-head attention whose decoding step runs the one-query kernels; `halving`: its
  softmax sums as sums.py adds them."""

  halving: bool = False

  def _softmax(self) -> Callable[..., jax.Array]:
    return sums.softmax if self.halving else jax.nn.softmax

  def weights(self, q: jax.Array, k: jax.Array, mask: Optional[jax.Array]) -> jax.Array:
    probs = attention_weights(q, k, mask, self._softmax())
    self.sow('intermediates', 'attention_weights', probs)
    return probs

  def step_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[B, S, D] memory -> what `attend_one` takes: keys per head [B, H, S, Dh], values
    [B, S, H, Dh] (once per batch)."""
    k, v = self.project_kv(x)
    return jnp.swapaxes(k, 1, 2), v

  def attend_one(self, x_t: jax.Array, k: jax.Array, v: jax.Array,
                 mask: Optional[jax.Array]) -> jax.Array:
    """One query per row, x_t [N, 1, D], against keys [B, H, S, Dh] and values [B, S, H, Dh]
    from `step_kv` (N = B * G: G consecutive rows, the beams of a sentence, share a key
    row) -> [N, 1, D]."""
    q = self._split(self.query(x_t))
    scale = jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
    logits = one_step.one_query_logits(q * scale, k, self.halving)  # [N, H, 1, S]
    if mask is not None and mask.shape[0] not in (1, q.shape[0]):  # per key row: per query row
      mask = jnp.repeat(mask, q.shape[0] // mask.shape[0], axis=0)
    probs = masked_softmax(logits, mask, self._softmax())
    self.sow('intermediates', 'attention_weights', probs)
    return self._merge(one_step.one_query_values(probs, v, self.halving))

  def step(self, x_t: jax.Array, cache: StepKVCache) -> tuple[jax.Array, StepKVCache]:
    """Self-attention for one new position: x_t [B, 1, D] -> ([B, 1, D], cache with it
    appended)."""
    cache = cache.append(*self.project_kv(x_t))
    probs = cache.attention_weights(self._split(self.query(x_t)), self.halving)
    self.sow('intermediates', 'attention_weights', probs)
    return self._merge(cache.attend(probs, self.halving)), cache


class StepEncoderLayer(EncoderLayer):
  halving: bool = False

  def layer_norm(self) -> nn.Module:
    return _layer_norm(self.cfg, self.halving)

  def attention(self) -> StepAttention:
    return StepAttention(self.cfg, halving=self.halving)


class StepDecoderLayer(DecoderLayer):
  halving: bool = False

  def layer_norm(self) -> nn.Module:
    return _layer_norm(self.cfg, self.halving)

  def attention(self) -> StepAttention:
    return StepAttention(self.cfg, halving=self.halving)

  def step(self, y_t: jax.Array, cache: StepKVCache, cross_k: jax.Array, cross_v: jax.Array,
           cross_mask: Optional[jax.Array]) -> tuple[jax.Array, StepKVCache]:
    """One decoding position: y_t [N, 1, D] -> ([N, 1, D], updated self-attention cache);
    cross_k, cross_v from `StepAttention.step_kv`."""
    def self_attend(h: jax.Array) -> jax.Array:
      nonlocal cache
      out, cache = self.self_attention.step(h, cache)
      return out
    y_t = self.residual(0, y_t, self_attend, True)
    y_t = self.residual(1, y_t, lambda h: self.cross_attention.attend_one(
        h, cross_k, cross_v, cross_mask), True)
    return self.residual(2, y_t, lambda h: self.ffn(h, True), True), cache


class StepTransformer(Transformer):
  """model.Transformer with this runtime's decoding step and cache (`init_cache` gives a
  cache.StepCache; `decode_step` is model/'s loop over these layers)."""

  halving: bool = False

  def encoder_layer(self) -> StepEncoderLayer:
    return StepEncoderLayer(self.cfg, halving=self.halving)

  def decoder_layer(self) -> StepDecoderLayer:
    return StepDecoderLayer(self.cfg, halving=self.halving)

  def layer_norm(self) -> nn.Module:
    return _layer_norm(self.cfg, self.halving)

  def init_cache(self, memory: jax.Array, src_segments: jax.Array, max_len: int) -> StepCache:
    """Cross-attention K/V per head for memory [B, S, D] and empty self-attention caches for
    `max_len` steps."""
    kvs = [layer.cross_attention.step_kv(memory) for layer in self.decoder_layers]
    empty = StepKVCache.zeros(memory.shape[0], max_len, self.cfg.num_heads, self.cfg.head_dim,
                              jnp.dtype(self.cfg.dtype))
    return StepCache(self_attention=tuple(empty for _ in self.decoder_layers),
                     cross_k=tuple(k for k, _ in kvs), cross_v=tuple(v for _, v in kvs),
                     cross_mask=(src_segments > 0)[:, None, None, :])


CPU = Kernels(StepTransformer, jax.nn.logsumexp, topk.top_k)
# Programs compiled without YNNPACK's reductions (compiler.compiler_options), where XLA's own
# reduction loops run slowly: sums as halvings, block maxima taken elementwise.
CPU_BATCH_INVARIANT = Kernels(functools.partial(StepTransformer, halving=True), sums.logsumexp,
                              functools.partial(topk.top_k, elementwise_max=True))

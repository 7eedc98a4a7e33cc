"""Scaled dot-product attention (paper eq. 1), masks, and multi-head attention (§3.2.2).

Dimension legend: B batch, T query length, S key length, H heads, Dh head dim, D model dim.
Masks are boolean, True where attention is allowed, broadcastable to [B, H, T, S].
"""

from __future__ import annotations

from typing import Callable, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_nmt.config import ModelConfig
from transformer_nmt.model.dropout import dropout
from transformer_nmt.model.precision import Dense

# The one minus infinity: masked attention logits and impossible search scores. Finite, so
# that sums and comparisons stay well-defined; exp(NEG_INF - max) is exactly 0 in float32.
NEG_INF = -1.0e9


def attention_weights(q: jax.Array, k: jax.Array, mask: Optional[jax.Array],
                      softmax: Callable[..., jax.Array] = jax.nn.softmax) -> jax.Array:
  """softmax(Q K^T / sqrt(d_k)) of eq. 1 as float32 probabilities [B, H, T, S].

  A query row whose keys are all masked (a padding position) gets all-zero weights, never NaN.

  Args:
    q: [B, T, H, Dh] queries.
    k: [B, S, H, Dh] keys.
    mask: bool, broadcastable to [B, H, T, S]; None means attend everywhere.
    softmax: `jax.nn.softmax`, or one that sums in another order (a runtime's).
  """
  scale = jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
  logits = jnp.einsum('bthd,bshd->bhts', q * scale, k,
                      preferred_element_type=jnp.float32)  # [B, H, T, S]
  return masked_softmax(logits, mask, softmax)


def masked_softmax(logits: jax.Array, mask: Optional[jax.Array],
                   softmax: Callable[..., jax.Array] = jax.nn.softmax) -> jax.Array:
  """softmax over the last axis of float32 `logits` where `mask` allows; all-masked rows get
  zeros (a uniform row would be set to zeros anyway)."""
  if mask is None:
    return softmax(logits, axis=-1)
  probs = softmax(jnp.where(mask, logits, NEG_INF), axis=-1)
  return jnp.where(mask, probs, 0.0)


def apply_attention(probs: jax.Array, v: jax.Array, *, dropout_rng: Optional[jax.Array] = None,
                    dropout_rate: float = 0.0, dropout_bits: int = 16) -> jax.Array:
  """probs [B, H, T, S] @ v [B, S, H, Dh] -> [B, T, H, Dh], with dropout on the weights
  (tensor2tensor's attention dropout, drawn as model/dropout.py does) when `dropout_rng` is
  given."""
  if dropout_rng is not None and dropout_rate > 0.0:
    probs = dropout(dropout_rng, probs, dropout_rate, dropout_bits)
  return jnp.einsum('bhts,bshd->bthd', probs.astype(v.dtype), v)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: Optional[jax.Array],
                          *, dropout_rng: Optional[jax.Array] = None,
                          dropout_rate: float = 0.0, dropout_bits: int = 16) -> jax.Array:
  """Scaled dot-product attention, eq. 1: softmax(Q K^T / sqrt(d_k)) V with a boolean mask.

  Args:
    q: [B, T, H, Dh] queries; k, v: [B, S, H, Dh] keys and values.
    mask: bool, broadcastable to [B, H, T, S]; None means attend everywhere. Fully masked
      query rows return zeros.
    dropout_rng, dropout_rate, dropout_bits: optional dropout on the attention probabilities
      (model/dropout.py).

  Returns:
    [B, T, H, Dh] attended values.
  """
  return apply_attention(attention_weights(q, k, mask), v, dropout_rng=dropout_rng,
                         dropout_rate=dropout_rate, dropout_bits=dropout_bits)


def causal_mask(length: int) -> jax.Array:
  """[1, 1, T, T]: position t may attend to positions <= t (decoder self-attention, §3.2.3)."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def padding_mask(q_segments: jax.Array, kv_segments: jax.Array) -> jax.Array:
  """[B, 1, T, S]: attend only between real tokens of the same segment.

  Args:
    q_segments: [B, T] int, 0 for padding, k > 0 for the k-th sequence in a row.
    kv_segments: [B, S] int, same convention. One sequence per row uses 1 everywhere.
  """
  same = q_segments[:, :, None] == kv_segments[:, None, :]
  real = (q_segments[:, :, None] > 0) & (kv_segments[:, None, :] > 0)
  return (same & real)[:, None]


@flax.struct.dataclass
class KVCache:
  """Decoder self-attention keys and values, written one position per step (§3.2.3: a
  position attends to those before it and itself).

  k, v: [B, L_max, H, Dh], the layout `project_kv` gives; index: [] int32, the next position
  to write. Positions at or after `index` are masked.
  """

  k: jax.Array
  v: jax.Array
  index: jax.Array

  @classmethod
  def zeros(cls, batch: int, max_len: int, num_heads: int, head_dim: int,
            dtype: jnp.dtype = jnp.float32) -> KVCache:
    shape = (batch, max_len, num_heads, head_dim)
    return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((), jnp.int32))

  @property
  def length(self) -> int:
    return self.k.shape[1]

  def append(self, k: jax.Array, v: jax.Array) -> KVCache:
    """Writes k, v: [B, 1, H, Dh] at `index` and advances it."""
    write = lambda cache, x: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
        cache, x.astype(cache.dtype), self.index, axis=1)
    return self.replace(k=write(self.k, k), v=write(self.v, v), index=self.index + 1)

  def resize(self, length: int) -> KVCache:
    """The cache with room for `length` positions: cut, or extended with zeros."""
    extra = length - self.length
    if extra <= 0:
      return self.replace(k=self.k[:, :length], v=self.v[:, :length])
    widths = ((0, 0), (0, extra), (0, 0), (0, 0))
    return self.replace(k=jnp.pad(self.k, widths), v=jnp.pad(self.v, widths))

  def valid_mask(self) -> jax.Array:
    """[1, 1, 1, L_max]: positions written so far (including the one just appended)."""
    return (jnp.arange(self.length) < self.index)[None, None, None, :]


def xavier_dense(features: int, cfg: ModelConfig, use_bias: bool, name: str) -> Dense:
  """Dense layer with Xavier-uniform kernel, float32 params and the configured compute dtype
  (bfloat16 matmuls accumulate in float32, see precision.py)."""
  return Dense(features, use_bias, cfg.dtype, name=name)


class MultiHeadAttention(nn.Module):
  """Multi-head attention with W^Q, W^K, W^V, W^O (§3.2.2); no biases, as in tensor2tensor
  (`model.attention_bias=True` adds them, as Marian has).

  Each projection is one [D, D] Xavier-uniform matrix, i.e. the paper's per-head W_i
  concatenated along the output axis.
  """

  cfg: ModelConfig

  def setup(self) -> None:
    d, bias = self.cfg.d_model, self.cfg.attention_bias
    self.query = xavier_dense(d, self.cfg, bias, 'query')
    self.key = xavier_dense(d, self.cfg, bias, 'key')
    self.value = xavier_dense(d, self.cfg, bias, 'value')
    self.out = xavier_dense(d, self.cfg, bias, 'out')

  def _split(self, x: jax.Array) -> jax.Array:
    return x.reshape(x.shape[:-1] + (self.cfg.num_heads, self.cfg.head_dim))  # [B, L, H, Dh]

  def _merge(self, x: jax.Array) -> jax.Array:
    """[B, T, H, Dh] heads -> [B, T, D] through W^O."""
    return self.out(x.reshape(x.shape[:2] + (self.cfg.d_model,)))

  def project_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[B, S, D] -> keys and values, each [B, S, H, Dh]."""
    return self._split(self.key(x)), self._split(self.value(x))

  def weights(self, q: jax.Array, k: jax.Array, mask: Optional[jax.Array]) -> jax.Array:
    """Eq. 1's weights [B, H, T, S] (`attention_weights`); kept in the 'intermediates'
    collection when the caller asks (attention heatmaps, alignments)."""
    probs = attention_weights(q, k, mask)
    self.sow('intermediates', 'attention_weights', probs)
    return probs

  def attend(self, x_q: jax.Array, k: jax.Array, v: jax.Array, mask: Optional[jax.Array],
             deterministic: bool) -> jax.Array:
    """[B, T, D] queries against precomputed [B, S, H, Dh] keys/values -> [B, T, D]."""
    probs = self.weights(self._split(self.query(x_q)), k, mask)
    rng = None
    if not deterministic and self.cfg.attention_dropout > 0.0:
      rng = self.make_rng('dropout')
    return self._merge(apply_attention(probs, v, dropout_rng=rng,
                                       dropout_rate=self.cfg.attention_dropout,
                                       dropout_bits=self.cfg.dropout_bits))

  def __call__(self, x_q: jax.Array, x_kv: jax.Array, mask: Optional[jax.Array],
               deterministic: bool = True) -> jax.Array:
    """[B, T, D] queries, [B, S, D] memory -> [B, T, D]."""
    k, v = self.project_kv(x_kv)
    return self.attend(x_q, k, v, mask, deterministic)

  def step(self, x_t: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
    """Self-attention for one new position: x_t [B, 1, D] -> ([B, 1, D], cache with it
    appended); the query attends to the positions written so far."""
    cache = cache.append(*self.project_kv(x_t))
    return self.attend(x_t, cache.k, cache.v, cache.valid_mask(), True), cache

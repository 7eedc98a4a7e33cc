"""Embeddings (§3.4), sinusoidal positions (§3.5) and the position-wise FFN (§3.3)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_nmt.config import ModelConfig
from transformer_nmt.model.attention import xavier_dense
from transformer_nmt.model.dropout import Dropout
from transformer_nmt.model.precision import mixed_matmul


def sinusoidal_positions(positions: jax.Array, d_model: int,
                         variant: str = 'interleaved') -> jax.Array:
  """Sinusoidal position encodings for arbitrary (e.g. per-segment) positions.

  'interleaved' is the paper's §3.5: PE[pos, 2i] = sin(pos / 10000^(2i/d)),
  PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).
  'concat' is tensor2tensor's get_timing_signal_1d: [sin(pos*w_i) | cos(pos*w_i)] with
  w_i = 10000^(-i/(d/2 - 1)), i < d/2 (a slightly different timescale spacing).
  'halves' is the paper's rates w_i = 10000^(-2i/d) in the 'concat' layout
  [sin(pos*w_i) | cos(pos*w_i)]: Hugging Face's Marian models (model.positional_encoding).

  Args:
    positions: [..., L] integer positions, starting at 0 for each sequence.
    d_model: even model width D.
    variant: 'interleaved', 'concat' or 'halves'.

  Returns:
    [..., L, D] float32 encodings.
  """
  half = d_model // 2
  i = jnp.arange(half, dtype=jnp.float32)
  if variant in ('interleaved', 'halves'):
    inv_timescales = jnp.power(10000.0, -2.0 * i / d_model)
  elif variant == 'concat':
    inv_timescales = jnp.exp(-i * math.log(10000.0) / max(half - 1, 1))
  else:
    raise ValueError(f'unknown positional encoding {variant!r}')
  angles = positions.astype(jnp.float32)[..., None] * inv_timescales  # [..., L, D/2]
  if variant in ('concat', 'halves'):
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  stacked = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., L, D/2, 2]
  return stacked.reshape(angles.shape[:-1] + (d_model,))


class Embed(nn.Module):
  """Token embedding scaled by sqrt(d_model) (§3.4), usable as the pre-softmax projection.

  Initialised normal(0, d_model^-0.5) so that embedding * sqrt(d_model) has unit scale.
  `model.scale_embeddings=False` leaves out the scaling (for imported models trained so).
  """

  vocab_size: int
  cfg: ModelConfig

  def setup(self) -> None:
    init = nn.initializers.normal(stddev=self.cfg.d_model ** -0.5)
    shape = (self.vocab_size, self.cfg.d_model)
    # A variable, not self.param: the train step may pass the table as [N, V, D] copies
    # (`per_shard`), which self.param would refuse for not having the initial shape.
    self.embedding = self.variable('params', 'embedding',
                                   lambda: init(self.make_rng('params'), shape, jnp.float32))

  def __call__(self, ids: jax.Array) -> jax.Array:
    """[B, L] int ids -> [B, L, D] in the compute dtype."""
    table = self.embedding.value
    if table.ndim == 3:  # [N, V, D]: one copy per batch shard, see `per_shard`
      rows = per_shard(ids, table.shape[0])  # [N, B/N, L]
      x = jax.vmap(lambda t, i: jnp.take(t, i, axis=0))(table, rows).reshape(ids.shape + (-1,))
    else:
      x = jnp.take(table, ids, axis=0)
    if self.cfg.scale_embeddings:
      x = x * math.sqrt(self.cfg.d_model)
    return x.astype(self.cfg.dtype)

  def logits(self, x: jax.Array) -> jax.Array:
    """[B, L, D] -> [B, L, V] float32 logits through the transposed embedding (weight tying)."""
    table = self.embedding.value
    if table.ndim == 3:
      out = jax.vmap(self._logits)(per_shard(x, table.shape[0]), table)  # [N, B/N, L, V]
      return out.reshape(x.shape[:-1] + (-1,))
    return self._logits(x, table)

  def _logits(self, x: jax.Array, table: jax.Array) -> jax.Array:
    if self.cfg.dtype == 'float32':
      return jnp.einsum('bld,vd->blv', x, table)
    out = jnp.float32 if self.cfg.float32_logits else self.cfg.dtype
    return mixed_matmul(x, table, out, True)  # float32 [V, D] gradient, see precision.py


def per_shard(x: jax.Array, shards: int) -> jax.Array:
  """[B, ...] -> [N, B / N, ...]: the rows of each of N batch shards.

  The train step hands `Embed` its table as [N, V, D], one copy per batch shard
  (`sharding.per_shard_tables`), and each shard's rows use their own copy. The tied table's
  three uses (source and target lookups, output projection) then add their gradients on the
  device, and the sum over the N copies is the one cross-device reduction of that gradient;
  with a [V, D] table XLA reduces each use's gradient separately.
  """
  return x.reshape((shards, x.shape[0] // shards) + x.shape[1:])


ACTIVATION_FNS = {'relu': nn.relu, 'swish': nn.swish,
                  'gelu': lambda x: nn.gelu(x, approximate=False)}  # model.activation


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 2), dropout after the ReLU (tensor2tensor).

  `model.activation` replaces the ReLU (swish for Marian models).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """[B, L, D] -> [B, L, D]."""
    activation = ACTIVATION_FNS[self.cfg.activation]
    h = activation(xavier_dense(self.cfg.d_ff, self.cfg, True, 'wi')(x))  # [B, L, F]
    h = Dropout(self.cfg.relu_dropout, self.cfg.dropout_bits)(h, deterministic=deterministic)
    return xavier_dense(self.cfg.d_model, self.cfg, True, 'wo')(h)

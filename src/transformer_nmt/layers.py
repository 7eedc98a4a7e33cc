"""Embeddings (§3.4), sinusoidal positions (§3.5) and the position-wise FFN (§3.3)."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_nmt.attention import xavier_dense
from transformer_nmt.precision import mixed_matmul
from transformer_nmt.config import ModelConfig


def sinusoidal_positions(positions: jax.Array, d_model: int,
                         variant: str = 'interleaved') -> jax.Array:
  """Sinusoidal position encodings for arbitrary (e.g. per-segment) positions.

  'interleaved' is the paper's §3.5: PE[pos, 2i] = sin(pos / 10000^(2i/d)),
  PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).
  'concat' is tensor2tensor's get_timing_signal_1d: [sin(pos*w_i) | cos(pos*w_i)] with
  w_i = 10000^(-i/(d/2 - 1)), i < d/2 (a slightly different timescale spacing).

  Args:
    positions: [..., L] integer positions, starting at 0 for each sequence.
    d_model: even model width D.
    variant: 'interleaved' or 'concat'.

  Returns:
    [..., L, D] float32 encodings.
  """
  half = d_model // 2
  i = jnp.arange(half, dtype=jnp.float32)
  if variant == 'interleaved':
    inv_timescales = jnp.power(10000.0, -2.0 * i / d_model)
  elif variant == 'concat':
    inv_timescales = jnp.exp(-i * math.log(10000.0) / max(half - 1, 1))
  else:
    raise ValueError(f'unknown positional encoding {variant!r}')
  angles = positions.astype(jnp.float32)[..., None] * inv_timescales  # [..., L, D/2]
  if variant == 'concat':
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
  stacked = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., L, D/2, 2]
  return stacked.reshape(angles.shape[:-1] + (d_model,))


class Embed(nn.Module):
  """Token embedding scaled by sqrt(d_model) (§3.4), usable as the pre-softmax projection.

  Initialised normal(0, d_model^-0.5) so that embedding * sqrt(d_model) has unit scale.
  """

  vocab_size: int
  cfg: ModelConfig

  def setup(self) -> None:
    self.embedding = self.param('embedding',
                                nn.initializers.normal(stddev=self.cfg.d_model ** -0.5),
                                (self.vocab_size, self.cfg.d_model), jnp.float32)

  def __call__(self, ids: jax.Array) -> jax.Array:
    """[B, L] int ids -> [B, L, D] in the compute dtype."""
    x = jnp.take(self.embedding, ids, axis=0) * math.sqrt(self.cfg.d_model)
    return x.astype(self.cfg.dtype)

  def logits(self, x: jax.Array) -> jax.Array:
    """[B, L, D] -> [B, L, V] float32 logits through the transposed embedding (weight tying)."""
    if self.cfg.dtype == 'float32':
      return jnp.einsum('bld,vd->blv', x, self.embedding)
    return mixed_matmul(x, self.embedding.astype(self.cfg.dtype).T, jnp.float32)


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 2), dropout after the ReLU (tensor2tensor)."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """[B, L, D] -> [B, L, D]."""
    h = nn.relu(xavier_dense(self.cfg.d_ff, self.cfg, True, 'wi')(x))  # [B, L, F]
    h = nn.Dropout(self.cfg.relu_dropout)(h, deterministic=deterministic)
    return xavier_dense(self.cfg.d_model, self.cfg, True, 'wo')(h)

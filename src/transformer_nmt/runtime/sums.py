"""Sums and maxima as halvings, for programs that XLA's CPU backend compiles without YNNPACK's
reductions (decode.batch_invariant: network.CPU_BATCH_INVARIANT).

Without YNNPACK, XLA sums each row in one fixed order, so a sentence's translation does not
depend on its batch; but it rewrites every reduction over more than 32 elements into
`reduce-window` loops outside the fusions (its tree-reduction pass), which are slow. Adding the
two halves of the axis elementwise until at most 32 elements are left, then reducing those, keeps
the order fixed (the same for every row, whatever the row count) and leaves XLA nothing to
rewrite. Writing the
sum as a reshape and two reductions does not: XLA merges them back into one.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

# XLA's CPU pipeline leaves reductions over at most this many elements as they are.
_WIDTH = 32


def _halved(x: jax.Array, axis: int, combine: Callable[[jax.Array, jax.Array], jax.Array],
            fill: float) -> jax.Array:
  """x with `axis` folded to at most _WIDTH by combining its halves (an odd length is padded
  with `fill`, which `combine` ignores)."""
  axis %= x.ndim
  while x.shape[axis] > _WIDTH:
    if x.shape[axis] % 2:
      pad = [(0, 0)] * x.ndim
      pad[axis] = (0, 1)
      x = jnp.pad(x, pad, constant_values=fill)
    half = x.shape[axis] // 2
    x = combine(jax.lax.slice_in_dim(x, 0, half, axis=axis),
                jax.lax.slice_in_dim(x, half, 2 * half, axis=axis))
  return x


def total(x: jax.Array, axis: int = -1, keepdims: bool = False) -> jax.Array:
  """`jnp.sum(x, axis)` in the fixed halving order."""
  return jnp.sum(_halved(x, axis, jnp.add, 0.0), axis=axis, keepdims=keepdims)


def maximum(x: jax.Array, axis: int = -1, keepdims: bool = False) -> jax.Array:
  """`jnp.max(x, axis)` (exact in any order; halved so that XLA keeps it in its fusions)."""
  return jnp.max(_halved(x, axis, jnp.maximum, -jnp.inf), axis=axis, keepdims=keepdims)


def softmax(x: jax.Array, axis: int = -1) -> jax.Array:
  """`jax.nn.softmax` with halving sums."""
  e = jnp.exp(x - jax.lax.stop_gradient(maximum(x, axis, keepdims=True)))
  return e / total(e, axis, keepdims=True)


def logsumexp(x: jax.Array, axis: int = -1, keepdims: bool = False) -> jax.Array:
  """`jax.nn.logsumexp` with halving sums (finite maxima; decoding's logits are)."""
  peak = jax.lax.stop_gradient(maximum(x, axis, keepdims=True))
  out = jnp.log(total(jnp.exp(x - peak), axis, keepdims=True)) + peak
  return out if keepdims else jnp.squeeze(out, axis)


class LayerNorm(nn.Module):
  """`flax.linen.LayerNorm` over the last axis in float32 (its parameters, names and formula:
  var = E[x^2] - E[x]^2) with halving sums."""

  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x [..., D] -> float32 [..., D]."""
    x = x.astype(jnp.float32)
    features = x.shape[-1]
    mean = total(x, keepdims=True) / features
    var = jnp.maximum(total(x * x, keepdims=True) / features - mean * mean, 0.0)
    scale = self.param('scale', nn.initializers.ones, (features,), jnp.float32)
    bias = self.param('bias', nn.initializers.zeros, (features,), jnp.float32)
    return (x - mean) * (jax.lax.rsqrt(var + self.epsilon) * scale) + bias

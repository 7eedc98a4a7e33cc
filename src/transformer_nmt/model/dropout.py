"""Dropout (§5.4) from 16-bit random draws: one 32-bit threefry word serves two elements.

`jax.random.bernoulli` draws a 32-bit float per element, and threefry, JAX's default generator,
computes one word per element. On a CPU the dropout masks of a small model then take more of a
training step's op time than its output projection. Two 16-bit draws per word make half the words;
the keep probability is then a multiple of 2^-16 (rate 0.1 keeps 58982/65536 = 0.899994; a rate
below 2^-17 rounds to no dropout), and outputs are scaled by the inverse of that probability, so
that E[dropout(x)] = x in exact arithmetic. `model.dropout_bits=32` keeps `jax.random.bernoulli`
(flax's nn.Dropout), whose masks every run before commit 573bac2 drew.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

DROPOUT_BITS = (16, 32)


def keep_mask(rng: jax.Array, rate: float, shape: tuple[int, ...],
              bits: int = 16) -> tuple[jax.Array, float]:
  """(bool mask of `shape`, True where an element is kept; the probability of keeping it).

  With `bits` 16 the draws of the last axis come in pairs from one 32-bit word, so the
  leading axes (a batch split over devices) keep their layout."""
  if bits == 32:
    return jax.random.bernoulli(rng, 1.0 - rate, shape), 1.0 - rate
  if bits != 16:
    raise ValueError(f'bits={bits}; expected one of {DROPOUT_BITS}')
  threshold = round(rate * 65536)  # drop where the 16-bit draw is below it
  if threshold >= 65536:
    return jnp.zeros(shape, bool), 0.0
  last = shape[-1] if shape else 1
  words = jax.random.bits(rng, tuple(shape[:-1]) + (-(-last // 2),), jnp.uint32)
  draws = jax.lax.bitcast_convert_type(words, jnp.uint16)  # [..., ceil(last / 2), 2]
  draws = draws.reshape(draws.shape[:-2] + (2 * words.shape[-1],))[..., :last].reshape(shape)
  return draws >= threshold, 1.0 - threshold / 65536


def dropout(rng: jax.Array, x: jax.Array, rate: float, bits: int = 16,
            broadcast_dims: Sequence[int] = ()) -> jax.Array:
  """x with each element zeroed with probability `rate` (as `keep_mask` rounds it) and the
  rest divided by the probability of keeping them; same shape and dtype. Along
  `broadcast_dims` one draw decides all elements (flax's nn.Dropout argument): (-1,) on
  [B, T, D] embeddings drops whole tokens."""
  if any(not -x.ndim <= d < x.ndim for d in broadcast_dims):
    raise ValueError(f'broadcast_dims={tuple(broadcast_dims)} for an array of {x.ndim} axes')
  shape = tuple(1 if i in {d % x.ndim for d in broadcast_dims} else n
                for i, n in enumerate(x.shape))
  keep, keep_prob = keep_mask(rng, rate, shape, bits)
  if keep_prob == 0.0:
    return jnp.zeros_like(x)
  return jnp.where(keep, x / keep_prob, 0).astype(x.dtype)


class Dropout(nn.Module):
  """nn.Dropout drawing its mask with `keep_mask` (the 'dropout' rng collection)."""

  rate: float
  bits: int = 16
  broadcast_dims: Sequence[int] = ()  # axes where one draw decides every element (`dropout`)

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """[...] -> [...]; the identity when `deterministic` or the rate is 0."""
    if deterministic or self.rate == 0.0:
      return x
    return dropout(self.make_rng('dropout'), x, self.rate, self.bits, self.broadcast_dims)

"""Exact top-k over a large last axis in two passes, for decoding's [rows, vocabulary] scores.

XLA CPU's `lax.top_k` walks every element of every row, which is slow on decoding's scores
(rows of a whole vocabulary). The k largest values lie in the k blocks with the largest
block maxima: each of their blocks has a maximum at least as large as the k-th value, and at
most k blocks can. So a block maximum pass, a top-k over those maxima, and a top-k over the
k chosen blocks give the exact result while the full pass is a cheap reduction.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def top_k(x: jax.Array, k: int, elementwise_max: bool = False) -> tuple[jax.Array, jax.Array]:
  """`lax.top_k` over the last axis: x [..., V] -> values, indices [..., k].

  Ties are broken towards the lower index, as in `lax.top_k`, unless equal values straddle
  the k-th place across more than k blocks (then any of them may be picked). Falls back to
  `lax.top_k` when V has no divisor in [16, 64]: padding or slicing to whole blocks costs
  more than it saves on XLA CPU (a copy of x and a slow strided reduction). With
  `elementwise_max` the block maxima come from elementwise maxima of the blocks' slices
  instead of one reduction: faster when XLA's CPU backend does not hand reductions to
  YNNPACK (decode.batch_invariant), slower when it does.
  """
  size = x.shape[-1]
  block = _block_size(size)
  if block is None or k * block * 4 > size:
    return jax.lax.top_k(x, k)
  blocks = x.reshape(x.shape[:-1] + (size // block, block))  # [..., NB, block]
  maxima = _sliced_max(blocks) if elementwise_max else jnp.max(blocks, axis=-1)
  _, chosen = jax.lax.top_k(maxima, k)  # [..., k]
  chosen = jnp.sort(chosen, axis=-1)  # index order, so ties go to the lower index
  candidates = jnp.take_along_axis(blocks, chosen[..., None], axis=-2)  # [..., k, block]
  values, where = jax.lax.top_k(candidates.reshape(x.shape[:-1] + (k * block,)), k)
  index = jnp.take_along_axis(chosen, where // block, axis=-1) * block + where % block
  return values, index.astype(jnp.int32)


def _block_size(size: int) -> int | None:
  """The divisor of `size` in [16, 64] closest to 32 (the fastest on XLA CPU), or None."""
  divisors = [b for b in range(16, 65) if size % b == 0]
  return min(divisors, key=lambda b: abs(b - 32)) if divisors else None


def _sliced_max(blocks: jax.Array) -> jax.Array:
  """[..., NB, block] -> [..., NB] maxima as elementwise maxima of 8-wide slices, halved down
  to one (a max is exact in any order); the reduction when block is no multiple of 8."""
  if blocks.shape[-1] % 8:
    return jnp.max(blocks, axis=-1)
  width = 8
  parts = blocks.reshape(blocks.shape[:-1] + (blocks.shape[-1] // width, width))
  m = functools.reduce(jnp.maximum, [parts[..., i, :] for i in range(parts.shape[-2])])
  while width > 1:
    width //= 2
    m = jnp.maximum(m[..., :width], m[..., width:])
  return m[..., 0]

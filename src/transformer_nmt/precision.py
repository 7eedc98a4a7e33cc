"""Matmuls for the bfloat16 compute mode: bfloat16 inputs, float32 accumulation, in both the
forward and the backward pass.

A plain bfloat16 `dot_general` also rounds its output to bfloat16, and on CPUs with AMX that
path is slow (measured ~120 GFLOP/s here against ~500 with float32 accumulation, and ~150 for
float32; see bench/RESULTS.md). With `preferred_element_type=float32` the forward pass is fast,
but autodiff then hands the transposed matmuls a float32 cotangent, so the backward pass falls
back to float32 matmuls. `mixed_matmul` fixes that with a custom VJP whose gradient matmuls also
take bfloat16 inputs and accumulate in float32.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def mixed_matmul(x: jax.Array, w: jax.Array, out_dtype: Any) -> jax.Array:
  """x [..., K] @ w [K, N] -> [..., N] in `out_dtype`, accumulated in float32."""
  return jnp.matmul(x, w, preferred_element_type=jnp.float32).astype(out_dtype)


def _fwd(x: jax.Array, w: jax.Array, out_dtype: Any) -> tuple[jax.Array, tuple]:
  return mixed_matmul(x, w, out_dtype), (x, w)


def _bwd(out_dtype: Any, residuals: tuple, g: jax.Array) -> tuple[jax.Array, jax.Array]:
  x, w = residuals
  g = g.astype(x.dtype)  # the cotangent in the input precision: keeps the fast matmul path
  gx = jnp.matmul(g, w.T, preferred_element_type=jnp.float32).astype(x.dtype)
  lead = tuple(range(x.ndim - 1))
  gw = jnp.tensordot(x, g, axes=(lead, lead), preferred_element_type=jnp.float32)  # [K, N]
  return gx, gw.astype(w.dtype)


mixed_matmul.defvjp(_fwd, _bwd)


def dense_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any,
                      precision: Any = None, preferred_element_type: Any = None) -> jax.Array:
  """A `dot_general` for flax.linen.Dense (lhs [..., K], kernel [K, N]) via `mixed_matmul`."""
  (contract_lhs, contract_rhs), (batch_lhs, _) = dimension_numbers
  if tuple(contract_lhs) != (lhs.ndim - 1,) or tuple(contract_rhs) != (0,) or batch_lhs:
    raise ValueError(f'dense_dot_general expects a Dense contraction, got {dimension_numbers}')
  del precision, preferred_element_type
  return mixed_matmul(lhs, rhs, lhs.dtype)

"""Matmuls for the bfloat16 compute mode: bfloat16 inputs, float32 accumulation, in both the
forward and the backward pass, with float32 weight gradients.

A plain bfloat16 `dot_general` also rounds its output to bfloat16, and on CPUs with AMX that path is
slower even than float32, while float32 accumulation is fast. With `preferred_element_type=float32`
the forward pass is fast, but autodiff then hands the transposed matmuls a float32 cotangent, so the
backward pass falls back to float32 matmuls. `mixed_matmul` fixes that with a custom VJP whose
gradient matmuls also take bfloat16 inputs and accumulate in float32.

The float32 weight enters `mixed_matmul` itself and is cast inside, so its gradient leaves the
matmul in float32: the cross-device sum of a data-parallel gradient (which XLA places right
after the matmul that contracts the split batch) is then a float32 sum, as in the paper's
float32 training, not a bfloat16 one. `Dense` is flax's Dense with that matmul.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def mixed_matmul(x: jax.Array, w: jax.Array, out_dtype: Any,
                 transpose_w: bool = False) -> jax.Array:
  """x [..., K] @ w [K, N] (or w [N, K] transposed) -> [..., N] in `out_dtype`, accumulated
  in float32.

  `w` may be float32 (a parameter): it is cast to x's dtype for the product, and its gradient
  comes back in float32, unrounded, in w's own layout. `transpose_w` serves the tied
  embedding ([V, D] table as the output projection): its gradient is computed as [V, D]
  directly, because a transposed bfloat16 -> float32 weight-gradient product is one that XLA
  CPU leaves unfused and cannot run ("Unsupported element type for DotThunk").
  """
  return _fwd(x, w, out_dtype, transpose_w)[0]


def _product(x: jax.Array, w_cast: jax.Array, transpose_w: bool) -> jax.Array:
  w_kn = w_cast.T if transpose_w else w_cast
  return jnp.matmul(x, w_kn, preferred_element_type=jnp.float32)


def _fwd(x: jax.Array, w: jax.Array, out_dtype: Any,
         transpose_w: bool) -> tuple[jax.Array, tuple]:
  w_cast = w.astype(x.dtype)
  out = _product(x, w_cast, transpose_w).astype(out_dtype)
  # The backward pass keeps the weight as cast for the product (half the bytes of a float32
  # weight; for an FSDP-gathered weight, the gathered copy itself) and an empty array that
  # remembers w's dtype for its gradient.
  return out, (x, w_cast, jnp.zeros((0,), w.dtype))


def _bwd(out_dtype: Any, transpose_w: bool, residuals: tuple,
         g: jax.Array) -> tuple[jax.Array, jax.Array]:
  x, w_cast, w_dtype = residuals
  g = g.astype(x.dtype)  # the cotangent in the input precision: keeps the fast matmul path
  w_nk = w_cast if transpose_w else w_cast.T
  gx = jnp.matmul(g, w_nk, preferred_element_type=jnp.float32).astype(x.dtype)
  lead = tuple(range(x.ndim - 1))
  first, second = (g, x) if transpose_w else (x, g)  # gw in w's layout: [N, K] or [K, N]
  gw = jnp.tensordot(first, second, axes=(lead, lead), preferred_element_type=jnp.float32)
  return gx, gw.astype(w_dtype.dtype)


mixed_matmul.defvjp(_fwd, _bwd)


class Dense(nn.Module):
  """y = x W (+ b) with a Xavier-uniform float32 kernel [K, N] and a float32 bias [N].

  In float32 this is flax's Dense. In bfloat16 the matmul is `mixed_matmul` and the bias is
  added to its float32 output before the one rounding to bfloat16, so both gradients reach
  the cross-device reduction in float32.
  """

  features: int
  use_bias: bool
  dtype: str = 'float32'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., K] -> [..., N] in the compute dtype."""
    kernel = self.param('kernel', nn.initializers.xavier_uniform(), (x.shape[-1], self.features),
                        jnp.float32)
    dtype = jnp.dtype(self.dtype)
    if dtype == jnp.float32:
      y = jnp.matmul(x.astype(dtype), kernel)
    else:
      y = mixed_matmul(x.astype(dtype), kernel, jnp.float32 if self.use_bias else dtype)
    if self.use_bias:
      y = y + self.param('bias', nn.initializers.zeros_init(), (self.features,), jnp.float32)
    return y.astype(dtype)

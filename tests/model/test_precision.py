"""bfloat16 matmuls with float32 accumulation: values and gradients match float32."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.model.precision import Dense, mixed_matmul


def _loss(matmul, x, w):
  return jnp.sum(jnp.sin(matmul(x, w).astype(jnp.float32)))


def test_mixed_matmul_value_and_gradients_match_float32():
  x = jax.random.normal(jax.random.key(0), (2, 5, 16))
  w = jax.random.normal(jax.random.key(1), (16, 8)) / 4
  xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  out = mixed_matmul(xb, wb, jnp.bfloat16)
  assert out.dtype == jnp.bfloat16 and out.shape == (2, 5, 8)
  assert mixed_matmul(xb, wb, jnp.float32).dtype == jnp.float32
  ref = jnp.matmul(xb.astype(jnp.float32), wb.astype(jnp.float32))
  np.testing.assert_allclose(np.float32(out), ref, rtol=2e-2, atol=2e-2)
  gx, gw = jax.grad(lambda a, b: _loss(lambda p, q: mixed_matmul(p, q, jnp.bfloat16), a, b),
                    argnums=(0, 1))(xb, wb)
  rx, rw = jax.grad(lambda a, b: _loss(jnp.matmul, a, b), argnums=(0, 1))(
      xb.astype(jnp.float32), wb.astype(jnp.float32))
  assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.float32(gx), rx, rtol=5e-2, atol=5e-2)
  np.testing.assert_allclose(np.float32(gw), rw, rtol=5e-2, atol=1e-1)


def test_float32_weight_gets_an_unrounded_float32_gradient():
  """The cross-device sum of a weight gradient happens on what the matmul's VJP returns: it
  must be float32 and not rounded through bfloat16 first."""
  x = jax.random.normal(jax.random.key(0), (3, 7, 16)).astype(jnp.bfloat16)
  w = jax.random.normal(jax.random.key(1), (16, 8)) / 4
  gw = jax.grad(lambda b: _loss(lambda p, q: mixed_matmul(p, q, jnp.bfloat16), x, b))(w)
  assert gw.dtype == jnp.float32
  assert np.any(np.float32(gw) != np.float32(gw.astype(jnp.bfloat16)))  # not bf16-rounded
  ref = jax.grad(lambda b: _loss(jnp.matmul, x.astype(jnp.float32), b))(w)
  np.testing.assert_allclose(gw, ref, rtol=5e-2, atol=1e-1)


def test_transposed_weight_gradient_keeps_its_layout():
  """transpose_w (the tied embedding [V, D] as the output projection): x @ w.T, with w's
  float32 gradient computed as [V, D], under jit as training runs it."""
  x = jax.random.normal(jax.random.key(0), (3, 7, 16)).astype(jnp.bfloat16)
  table = jax.random.normal(jax.random.key(1), (40, 16)) / 4  # [V, D]
  out = jax.jit(lambda t: mixed_matmul(x, t, jnp.float32, True))(table)
  np.testing.assert_allclose(out, mixed_matmul(x, table.T, jnp.float32), rtol=1e-6)
  grad = jax.jit(jax.grad(lambda t: _loss(lambda p, q: mixed_matmul(p, q, jnp.float32, True),
                                          x, t)))(table)
  assert grad.shape == table.shape and grad.dtype == jnp.float32
  ref = jax.grad(lambda t: _loss(jnp.matmul, x.astype(jnp.float32), t.T))(table)
  np.testing.assert_allclose(grad, ref, rtol=5e-2, atol=1e-1)


@pytest.mark.parametrize('use_bias', [False, True])
def test_dense_matches_flax_dense(use_bias):
  x = jax.random.normal(jax.random.key(2), (2, 5, 16))
  ours = Dense(8, use_bias)
  params = ours.init(jax.random.key(3), x)
  params = jax.tree_util.tree_map(lambda p: p + 0.1, params)  # a non-zero bias
  ref = nn.Dense(8, use_bias=use_bias).apply(params, x)  # same parameter names and shapes
  np.testing.assert_allclose(ours.apply(params, x), ref, rtol=1e-6, atol=1e-6)
  bf16 = Dense(8, use_bias, 'bfloat16')
  out = bf16.apply(params, x)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.float32(out), ref, rtol=3e-2, atol=3e-2)
  grads = jax.grad(lambda p: jnp.sum(bf16.apply(p, x).astype(jnp.float32) ** 2))(params)
  assert all(g.dtype == jnp.float32 for g in jax.tree_util.tree_leaves(grads))

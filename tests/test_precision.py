"""bfloat16 matmuls with float32 accumulation: values and gradients match float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.precision import dense_dot_general, mixed_matmul


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


def test_dense_dot_general_rejects_other_contractions():
  x = jnp.ones((3, 4), jnp.bfloat16)
  assert dense_dot_general(x, jnp.ones((4, 2), jnp.bfloat16), (((1,), (0,)), ((), ()))).shape \
      == (3, 2)
  with pytest.raises(ValueError, match='Dense contraction'):
    dense_dot_general(x, jnp.ones((2, 4), jnp.bfloat16), (((1,), (1,)), ((), ())))

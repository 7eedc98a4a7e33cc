"""runtime/sums.py: the halving sums give the library's values, in one order for every row
count under decode.batch_invariant's XLA options, and leave XLA no reduce-window to make."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.runtime import sums
from transformer_nmt.runtime.compiler import compiler_options


@pytest.mark.parametrize('shape,axis', [((3, 8000), -1), ((3, 257), -1), ((2, 41, 3, 64), 1),
                                        ((4, 20), -1)])
def test_values_are_the_librarys(shape, axis):
  x = jax.random.normal(jax.random.key(0), shape) * 3.0
  np.testing.assert_allclose(sums.total(x, axis), jnp.sum(x, axis), rtol=1e-5, atol=1e-4)
  np.testing.assert_array_equal(sums.maximum(x, axis, keepdims=True),
                                jnp.max(x, axis, keepdims=True))
  np.testing.assert_allclose(sums.softmax(x, axis), jax.nn.softmax(x, axis), rtol=1e-5,
                             atol=1e-7)
  np.testing.assert_allclose(sums.logsumexp(x, axis), jax.nn.logsumexp(x, axis), rtol=1e-6)


def test_layer_norm_is_flaxs():
  x = jax.random.normal(jax.random.key(1), (2, 5, 256)) * 2.0 + 1.0
  ours, theirs = sums.LayerNorm(epsilon=1e-6), nn.LayerNorm(epsilon=1e-6, dtype=jnp.float32)
  params = theirs.init(jax.random.key(2), x)
  assert jax.tree.structure(ours.init(jax.random.key(2), x)) == jax.tree.structure(params)
  params = jax.tree.map(lambda p: p + jax.random.normal(jax.random.key(3), p.shape), params)
  np.testing.assert_allclose(ours.apply(params, x), theirs.apply(params, x), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != 'cpu', reason='XLA CPU options')
@pytest.mark.parametrize('width', [256, 8000])
def test_one_order_for_every_row_count_and_no_reduce_window(width):
  options = compiler_options(True)
  fn = jax.jit(lambda a: sums.logsumexp(a * a, -1), compiler_options=options)
  x = np.random.default_rng(0).standard_normal((1024, width)).astype(np.float32)
  many = np.asarray(fn(x))
  for rows in (1, 4, 8, 16, 300):
    np.testing.assert_array_equal(np.asarray(fn(x[:rows])), many[:rows])
  assert 'reduce-window' not in fn.lower(x).compile().as_text()
  plain = jax.jit(lambda a: jax.nn.logsumexp(a * a, -1), compiler_options=options)
  assert 'reduce-window' in plain.lower(x).compile().as_text()  # what the halving avoids


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.runtime.topk import top_k


@pytest.mark.parametrize('shape', [(3, 8000), (2, 5, 1280), (4, 5003), (2, 40)])
@pytest.mark.parametrize('k', [1, 8])
@pytest.mark.parametrize('elementwise_max', [False, True])
def test_equals_lax_top_k(shape, k, elementwise_max):
  """Blockwise (8000 = 250 blocks of 32, 1280 = 40 of 32) or the fallback (5003 is prime, 40 is
  too short): the same values and indices as lax.top_k."""
  x = jax.random.normal(jax.random.key(k), shape)
  values, index = top_k(x, k, elementwise_max)
  expected_values, expected_index = jax.lax.top_k(x, k)
  np.testing.assert_array_equal(values, expected_values)
  np.testing.assert_array_equal(index, expected_index)


@pytest.mark.parametrize('elementwise_max', [False, True])
def test_ties_go_to_the_lower_index(elementwise_max):
  x = np.zeros((1, 8000), np.float32)
  x[0, [7000, 5, 3000, 6500]] = [2.0, 2.0, 1.0, 2.0]  # three tied maxima in different blocks
  values, index = top_k(jnp.asarray(x), 4, elementwise_max)
  assert index.tolist() == [[5, 6500, 7000, 3000]]
  assert values.tolist() == [[2.0, 2.0, 2.0, 1.0]]

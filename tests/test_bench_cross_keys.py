"""bench/cross_keys.py times the cross-attention logits of before against today's: both must
compute the same logits, each from its own key layout."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / 'bench'))

from cross_keys import logits_before  # noqa: E402

from transformer_nmt.model.one_step import one_query_logits  # noqa: E402


@pytest.mark.parametrize('groups', [1, 4])
@pytest.mark.parametrize('halving', [False, True])
def test_the_logits_of_before_equal_todays(groups, halving):
  b, s, h, d = 3, 5, 2, 8
  q = jax.random.normal(jax.random.key(0), (b * groups, 1, h, d))
  k = jax.random.normal(jax.random.key(1), (b, s, h, d))
  before = logits_before(q, k, halving)
  assert before.shape == (b * groups, h, 1, s)
  np.testing.assert_allclose(before, one_query_logits(q, jnp.swapaxes(k, 1, 2), halving),
                             rtol=1e-5, atol=1e-5)

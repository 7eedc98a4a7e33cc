"""The CPU fast paths of one decoding step against eq. 1 written as einsums."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.model.attention import dot_product_attention, masked_softmax
from transformer_nmt.runtime import one_step


def _qkv(rows, groups, s=5, h=2, d=4, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(groups), 3)
  q = jax.random.normal(keys[0], (rows * groups, 1, h, d)).astype(dtype)
  k = jax.random.normal(keys[1], (rows, s, h, d)).astype(dtype)
  v = jax.random.normal(keys[2], (rows, s, h, d)).astype(dtype)
  return q, k, v


def _per_head(k):
  """Keys [B, S, H, Dh] as a one-query step takes them: [B, H, S, Dh] (step_kv)."""
  return jnp.swapaxes(k, 1, 2)


@pytest.mark.slow
@pytest.mark.parametrize('groups', [1, 4])
def test_one_query_logits_and_values_match_the_einsums(groups):
  q, k, v = _qkv(3, groups)
  k_rows, v_rows = (jnp.repeat(x, groups, axis=0) for x in (k, v))  # row n uses row n // G
  reference = jnp.einsum('bthd,bshd->bhts', q, k_rows)
  for halving in (False, True):
    np.testing.assert_allclose(one_step.one_query_logits(q, _per_head(k), halving), reference,
                               rtol=1e-5, atol=1e-5)
  probs = jax.nn.softmax(reference, axis=-1)
  np.testing.assert_allclose(one_step.one_query_values(probs, v),
                             jnp.einsum('bhts,bshd->bthd', probs, v_rows), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('groups', [1, 4])
def test_one_step_attention_equals_the_general_path(groups):
  """A one-query step through the kernels (keys and values shared by groups of query rows,
  a mask per query row) equals eq. 1's einsum path with the keys and values repeated."""
  q, k, v = _qkv(3, groups)
  n = q.shape[0]
  mask = jax.random.bernoulli(jax.random.key(7), 0.7, (n, 1, 1, 5)).at[:, ..., 0].set(True)
  logits = one_step.one_query_logits(q * q.shape[-1] ** -0.5, _per_head(k))
  weights = masked_softmax(logits, mask)
  fast = one_step.one_query_values(weights, v)
  k_rows, v_rows = (jnp.repeat(x, groups, axis=0) for x in (k, v))
  # Two copies of each query make T = 2, as the general path sees any query length.
  general = dot_product_attention(jnp.concatenate([q, q], 1), k_rows, v_rows,
                                  jnp.concatenate([mask, mask], 2))[:, :1]
  np.testing.assert_allclose(fast, general, rtol=1e-5, atol=1e-5)
  assert weights.shape == (n, 2, 1, 5) and weights.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=1e-5)


def test_bfloat16_inputs_reduce_in_float32():
  q, k, v = _qkv(2, 4, dtype=jnp.bfloat16)
  logits = one_step.one_query_logits(q, _per_head(k))
  assert logits.dtype == jnp.float32
  out = one_step.one_query_values(jax.nn.softmax(logits, -1), v)
  assert out.dtype == jnp.bfloat16 and out.shape == (8, 1, 2, 4)

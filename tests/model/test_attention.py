import jax
import jax.numpy as jnp
import numpy as np

from transformer_nmt.config import ModelConfig
from transformer_nmt.model import attention


def _numpy_attention(q, k, v, mask):
  """Reference eq. 1 per batch and head, q: [B, T, H, D], mask: [B, 1, T, S]."""
  b, t, h, d = q.shape
  out = np.zeros_like(q)
  for bi in range(b):
    for hi in range(h):
      logits = q[bi, :, hi] @ k[bi, :, hi].T / np.sqrt(d)  # [T, S]
      logits = np.where(mask[bi, 0], logits, -np.inf)
      with np.errstate(invalid='ignore'):
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
      p = np.nan_to_num(p)  # rows with every key masked attend to nothing
      out[bi, :, hi] = p @ v[bi, :, hi]
  return out


def test_causal_mask_matches_hand_written():
  expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], bool)
  np.testing.assert_array_equal(attention.causal_mask(4)[0, 0], expected)
  assert attention.causal_mask(4).shape == (1, 1, 4, 4)


def test_padding_mask_matches_hand_written():
  q = jnp.array([[1, 1, 0]])  # two real tokens, one pad
  kv = jnp.array([[1, 1, 1, 0]])
  expected = np.array([[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(attention.padding_mask(q, kv)[0, 0], expected)


def test_padding_mask_separates_packed_segments():
  seg = jnp.array([[1, 1, 2, 2, 0]])
  expected = np.array([[1, 1, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 0],
                       [0, 0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(attention.padding_mask(seg, seg)[0, 0], expected)


def test_attention_matches_numpy_reference():
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=s).astype(np.float32) for s in [(2, 3, 2, 4), (2, 5, 2, 4),
                                                             (2, 5, 2, 4)])
  seg_q = np.array([[1, 1, 1], [1, 1, 0]])
  seg_k = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
  mask = np.asarray(attention.padding_mask(jnp.array(seg_q), jnp.array(seg_k)))
  got = attention.dot_product_attention(q, k, v, mask)
  np.testing.assert_allclose(got, _numpy_attention(q, k, v, mask), atol=1e-5)


def test_fully_masked_rows_give_zeros_not_nan():
  q = k = v = jnp.ones((1, 2, 1, 4))
  mask = jnp.zeros((1, 1, 2, 2), bool)
  out = attention.dot_product_attention(q, k, v, mask)
  assert not np.isnan(np.asarray(out)).any()
  np.testing.assert_array_equal(out, 0.0)
  grads = jax.grad(lambda q: attention.dot_product_attention(q, k, v, mask).sum())(q)
  assert np.isfinite(np.asarray(grads)).all()


def test_attention_dropout_keeps_expectation():
  q = k = jnp.zeros((1, 1, 1, 4))
  v = jnp.ones((1, 64, 1, 4))
  k = jnp.zeros((1, 64, 1, 4))
  outs = [attention.dot_product_attention(q, k, v, None, dropout_rng=jax.random.key(i),
                                          dropout_rate=0.5) for i in range(200)]
  assert abs(float(jnp.mean(jnp.stack(outs))) - 1.0) < 0.05


def test_kv_cache_appends_in_order():
  cache = attention.KVCache.zeros(1, 3, 1, 2)
  for i in range(2):
    cache = cache.append(jnp.full((1, 1, 1, 2), i + 1.0), jnp.full((1, 1, 1, 2), -(i + 1.0)))
  np.testing.assert_array_equal(cache.k[0, :, 0, 1], [1, 2, 0])  # keys: [B, L, H, Dh]
  np.testing.assert_array_equal(cache.v[0, :, 0, 0], [-1, -2, 0])  # values alike
  np.testing.assert_array_equal(cache.valid_mask()[0, 0, 0], [True, True, False])
  assert int(cache.index) == 2
  grown = cache.resize(5)
  np.testing.assert_array_equal(grown.k[0, :, 0, 0], [1, 2, 0, 0, 0])
  np.testing.assert_array_equal(grown.resize(2).v[0, :, 0, 0], [-1, -2])


def test_multi_head_attention_projections_and_shape():
  cfg = ModelConfig(d_model=16, num_heads=4, d_ff=32, num_layers=1, vocab_size=8)
  mha = attention.MultiHeadAttention(cfg)
  x = jnp.ones((2, 3, 16))
  params = mha.init(jax.random.key(0), x, x, None)['params']
  assert sorted(params) == ['key', 'out', 'query', 'value']
  assert params['query']['kernel'].shape == (16, 16)
  assert mha.apply({'params': params}, x, x, None).shape == (2, 3, 16)

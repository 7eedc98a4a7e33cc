import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.config import ModelConfig
from transformer_nmt.decoding import beam, compaction
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
  np.testing.assert_array_equal(cache.k[0, 0, :, 1], [1, 2, 0])  # keys: [B, H, L, Dh]
  np.testing.assert_array_equal(cache.v[0, 0, :, 0], [-1, -2, 0])  # values alike
  np.testing.assert_array_equal(cache.valid_mask()[0, 0, 0], [True, True, False])
  assert int(cache.index) == 2
  grown = cache.resize(5)
  np.testing.assert_array_equal(grown.k[0, 0, :, 0], [1, 2, 0, 0, 0])
  np.testing.assert_array_equal(grown.resize(2).v[0, 0, :, 0], [-1, -2])


def test_bfloat16_kv_cache_keeps_bit_patterns_and_attends_as_bfloat16():
  """A bfloat16 cache stores uint16 bit patterns (XLA CPU would carry bfloat16 through the
  decoding loop as float32 copies); its attention equals the reference on bfloat16-rounded
  keys and values, and its output comes back in bfloat16."""
  rng = np.random.default_rng(0)
  n, h, d = 2, 2, 4
  keys, values = (rng.normal(size=(n, 3, h, d)).astype(np.float32) for _ in range(2))
  cache = attention.KVCache.zeros(n, 4, h, d, jnp.bfloat16)
  assert cache.k.dtype == cache.v.dtype == jnp.uint16
  for t in range(3):
    cache = cache.append(jnp.asarray(keys[:, t:t + 1]), jnp.asarray(values[:, t:t + 1]))
  q = jnp.asarray(rng.normal(size=(n, 1, h, d)), jnp.bfloat16)
  out = cache.attend(cache.attention_weights(q))
  assert out.dtype == jnp.bfloat16
  as_bf16 = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)  # noqa: E731
  mask = np.ones((n, 1, 1, 3), bool)
  expected = _numpy_attention(np.asarray(q, np.float32), as_bf16(keys), as_bf16(values), mask)
  np.testing.assert_allclose(np.asarray(out, np.float32), expected, rtol=1e-2, atol=1e-2)
  np.testing.assert_array_equal(  # the stored bits are exactly the bfloat16 keys
      np.asarray(jax.lax.bitcast_convert_type(cache.k[:, :, :3], jnp.bfloat16), np.float32),
      as_bf16(keys).transpose(0, 2, 1, 3))


@pytest.mark.slow
def test_beam_reorders_move_slots_and_attend_as_moved_keys_would():
  """A beam cache keeps each position in the row that wrote it and reorders only its slots;
  every step attends exactly as a cache whose keys and values are gathered (beam.gather_beams
  over a cache without slots), through the first step's tiling, growth and compaction."""
  rng = np.random.default_rng(0)
  sentences, beams, h, d = 3, 3, 2, 4
  moved = kept = attention.KVCache.zeros(sentences, 3, h, d, jnp.bfloat16)

  def step(moved, kept, rows):
    k, v, q = (jnp.asarray(rng.normal(size=(rows, 1, h, d)), jnp.float32) for _ in range(3))
    moved, kept = moved.append(k, v), kept.append(k, v)
    q = q.astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(kept.attend(kept.attention_weights(q)), np.float32),
                                  np.asarray(moved.attend(moved.attention_weights(q)), np.float32))
    return moved, kept

  def reorder(moved, kept, parents):
    gather = lambda tree: beam.gather_beams(tree, jnp.asarray(parents))  # noqa: E731
    reordered = kept.reorder(gather)
    if kept.slots is not None:
      np.testing.assert_array_equal(reordered.k, kept.k)  # the keys stay where they are
    return gather(moved), reordered

  moved, kept = step(moved, kept, sentences)  # the first step, on one hypothesis each
  moved, kept = reorder(moved, kept, np.zeros((sentences, beams), np.int32))
  assert kept.beams == beams and kept.slots.shape == (sentences * beams, 3)
  assert moved.tile(beams, slots=False).slots is None  # an accelerator's program moves k, v
  for t in range(6):
    if t == 2:
      moved, kept = moved.resize(8), kept.resize(8)
    if t == 4:  # compaction keeps sentences 0 and 2
      take = lambda c: compaction.take_rows(c, np.array([0, 2]), sentences, beams)  # noqa: E731
      moved, kept, sentences = take(moved), take(kept), 2
    moved, kept = step(moved, kept, sentences * beams)
    moved, kept = reorder(moved, kept, rng.integers(0, beams, (sentences, beams)))
  assert len(set(np.asarray(kept.slots)[:, :7].ravel().tolist())) > 1  # beams did move
  moved, kept = beam.tile_beams(moved, 2), kept.tile(2)  # tiling reads each row's own keys
  assert kept.beams == 2
  step(moved, kept, sentences * beams * 2)


def test_multi_head_attention_projections_and_shape():
  cfg = ModelConfig(d_model=16, num_heads=4, d_ff=32, num_layers=1, vocab_size=8)
  mha = attention.MultiHeadAttention(cfg)
  x = jnp.ones((2, 3, 16))
  params = mha.init(jax.random.key(0), x, x, None)['params']
  assert sorted(params) == ['key', 'out', 'query', 'value']
  assert params['query']['kernel'].shape == (16, 16)
  assert mha.apply({'params': params}, x, x, None).shape == (2, 3, 16)


def test_one_query_rows_can_share_keys():
  """One decoding step with G = 3 query rows per key row (beams sharing a sentence's
  cross-attention K/V and mask) equals the reference on keys repeated for every row."""
  rng = np.random.default_rng(3)
  b, g, s, h, d = 2, 3, 5, 2, 4
  q = rng.normal(size=(b * g, 1, h, d)).astype(np.float32)
  k, v = (rng.normal(size=(b, s, h, d)).astype(np.float32) for _ in range(2))
  mask = np.ones((b, 1, 1, s), bool)
  mask[1, ..., 3:] = False
  keys = jnp.swapaxes(jnp.asarray(k), 1, 2)  # per head, as step_kv lays them out
  weights = attention.attention_weights(jnp.asarray(q), keys, jnp.asarray(mask), one_query=True)
  out = attention.apply_attention(weights, jnp.asarray(v), one_query=True)
  rep = lambda x: np.repeat(x, g, axis=0)  # noqa: E731
  np.testing.assert_allclose(out, _numpy_attention(q, rep(k), rep(v), rep(mask)), rtol=1e-5,
                             atol=1e-6)

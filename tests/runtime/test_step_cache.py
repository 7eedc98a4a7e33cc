"""The CPU runtime's decoder cache (runtime/cache.py) against eq. 1 as the reference computes
it: uint16 bits for bfloat16, beam slots."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.decoding import beam
from transformer_nmt.model.attention import dot_product_attention
from transformer_nmt.runtime import compaction
from transformer_nmt.runtime.cache import StepKVCache


def test_bfloat16_kv_cache_keeps_bit_patterns_and_attends_as_bfloat16():
  """A bfloat16 cache stores uint16 bit patterns (XLA CPU would carry bfloat16 through the
  decoding loop as float32 copies); its attention equals the reference on bfloat16-rounded
  keys and values, and its output comes back in bfloat16."""
  rng = np.random.default_rng(0)
  n, h, d = 2, 2, 4
  keys, values = (rng.normal(size=(n, 3, h, d)).astype(np.float32) for _ in range(2))
  cache = StepKVCache.zeros(n, 4, h, d, jnp.bfloat16)
  assert cache.k.dtype == cache.v.dtype == jnp.uint16
  for t in range(3):
    cache = cache.append(jnp.asarray(keys[:, t:t + 1]), jnp.asarray(values[:, t:t + 1]))
  q = jnp.asarray(rng.normal(size=(n, 1, h, d)), jnp.bfloat16)
  out = cache.attend(cache.attention_weights(q))
  assert out.dtype == jnp.bfloat16
  as_bf16 = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)  # noqa: E731
  mask = np.ones((n, 1, 1, 3), bool)
  expected = dot_product_attention(jnp.asarray(q, jnp.float32), as_bf16(keys), as_bf16(values),
                                   mask)
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
  moved = kept = StepKVCache.zeros(sentences, 3, h, d, jnp.bfloat16)

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

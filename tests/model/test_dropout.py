import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.model import dropout as dropout_lib
from transformer_nmt.model import layers, transformer
from transformer_nmt.model.dropout import Dropout, dropout, keep_mask
from transformer_nmt.model.transformer import Transformer, init_params


def test_16_bit_draws_keep_the_rounded_probability_and_scale_by_it():
  """Rate 0.1 keeps 58982 of every 65536 in expectation; kept elements are divided by
  exactly that probability, so the mean is preserved."""
  x = jnp.full((64, 24, 1023), 3.0)  # an odd last axis: its final word is used in half
  y = np.asarray(dropout(jax.random.key(0), x, 0.1))
  keep = 58982 / 65536
  kept = y != 0
  sigma = (keep * (1 - keep) / kept.size) ** 0.5
  assert abs(kept.mean() - keep) < 5 * sigma, kept.mean()
  np.testing.assert_array_equal(y[kept], np.float32(3.0 / keep))
  # Each word's two draws decide neighbouring elements: they must agree no more often than
  # independent draws would (rate 0.5: half the pairs agree).
  half = np.asarray(keep_mask(jax.random.key(1), 0.5, (512, 512))[0])
  agree = (half[:, 0::2] == half[:, 1::2]).mean()
  assert abs(agree - 0.5) < 5 * (0.25 / half[:, 0::2].size) ** 0.5, agree


def test_16_bit_draws_keep_where_a_half_word_reaches_the_rounded_threshold():
  """The mask of an odd last axis against the halves of the key's 32-bit words: kept where
  the half is >= round(0.1 * 65536) = 6554, the last word's second half unused."""
  key = jax.random.key(2)
  words = np.asarray(jax.random.bits(key, (3, 4), jnp.uint32))
  halves = np.asarray(jax.lax.bitcast_convert_type(words, jnp.uint16)).reshape(3, 8)[:, :7]
  mask, keep = keep_mask(key, 0.1, (3, 7))
  np.testing.assert_array_equal(mask, halves >= 6554)
  assert keep == 1 - 6554 / 65536
  assert keep_mask(key, 0.1, (0, 5))[0].shape == (0, 5)  # an empty batch


def test_16_bit_masks_depend_on_the_key_alone():
  a, p = keep_mask(jax.random.key(3), 0.3, (8, 5, 7))
  b, _ = keep_mask(jax.random.key(3), 0.3, (8, 5, 7))
  c, _ = keep_mask(jax.random.key(4), 0.3, (8, 5, 7))
  assert a.shape == (8, 5, 7) and a.dtype == bool and p == 1 - 19661 / 65536
  np.testing.assert_array_equal(a, b)
  assert (np.asarray(a) != np.asarray(c)).any()
  assert keep_mask(jax.random.key(0), 0.2, ())[0].shape == ()
  assert keep_mask(jax.random.key(0), 0.2, (5,))[0].shape == (5,)


def test_dtype_kept_and_edge_rates():
  x = jnp.ones((4, 6), jnp.bfloat16)
  assert dropout(jax.random.key(0), x, 0.2).dtype == jnp.bfloat16
  np.testing.assert_array_equal(dropout(jax.random.key(0), x, 1.0), 0.0)
  np.testing.assert_array_equal(dropout(jax.random.key(0), x, 0.0), x)
  with pytest.raises(ValueError, match='bits=8'):
    keep_mask(jax.random.key(0), 0.1, (4,), bits=8)


@pytest.mark.parametrize('bits', [16, 32])
def test_module_is_the_identity_when_deterministic_or_rate_0(bits):
  x = jnp.arange(12.0).reshape(3, 4)
  rngs = {'dropout': jax.random.key(0)}
  np.testing.assert_array_equal(Dropout(0.5, bits).apply({}, x, True, rngs=rngs), x)
  np.testing.assert_array_equal(Dropout(0.0, bits).apply({}, x, False, rngs=rngs), x)
  assert (Dropout(0.5, bits).apply({}, x, False, rngs=rngs) != x).any()


@pytest.mark.parametrize('broadcast_dims', [(), (-1,), (0, 2)])
def test_32_bit_draws_are_flax_dropout(broadcast_dims):
  x = jax.random.normal(jax.random.key(0), (4, 16, 33))
  rngs = {'dropout': jax.random.key(7)}
  ours = Dropout(0.3, 32, broadcast_dims).apply({}, x, False, rngs=rngs)
  flax_out = nn.Dropout(0.3, broadcast_dims).apply({}, x, False, rngs=rngs)
  np.testing.assert_array_equal(ours, flax_out)


@pytest.mark.parametrize('bits', [16, 32])
def test_broadcast_dims_share_one_draw(bits):
  """Along broadcast_dims an element is dropped exactly when its neighbours are."""
  y = np.asarray(dropout(jax.random.key(3), jnp.ones((8, 16, 5)), 0.5, bits, (-1,)))
  assert ((y == 0).all(-1) | (y == 2.0).all(-1)).all()
  assert 0 < (y == 0).mean() < 1


def _flax_dropout(rate, bits=32, broadcast_dims=()):
  """flax's nn.Dropout in place of ours (same module names, so the same rngs)."""
  return nn.Dropout(rate, broadcast_dims)


def _flax_mask(rng, rate, shape, bits=16):
  return jax.random.bernoulli(rng, 1.0 - rate, shape), 1.0 - rate


@pytest.mark.slow
def test_model_with_32_bit_draws_trains_as_with_flax_dropout(tiny_cfg, monkeypatch):
  """model.dropout_bits=32 draws every mask of a training forward pass (residual,
  embedding, ReLU, attention and word dropout) exactly as flax's nn.Dropout and
  jax.random.bernoulli did: runs from before the 16-bit draws can be reproduced."""
  cfg = dataclasses.replace(tiny_cfg, residual_dropout=0.2, embedding_dropout=0.1,
                            attention_dropout=0.1, relu_dropout=0.3, source_word_dropout=0.1,
                            target_word_dropout=0.2, dropout_bits=32)
  params = init_params(cfg, jax.random.key(0))
  src = jnp.array([[3, 4, 5, 6, 2], [7, 8, 2, 0, 0]])
  tgt = jnp.array([[1, 9, 10, 11], [1, 12, 13, 0]])

  def logits(c):
    return Transformer(c).apply({'params': params}, src, tgt, deterministic=False,
                                rngs={'dropout': jax.random.key(5)})
  ours = logits(cfg)
  sixteen = logits(dataclasses.replace(cfg, dropout_bits=16))
  monkeypatch.setattr(transformer, 'Dropout', _flax_dropout)
  monkeypatch.setattr(layers, 'Dropout', _flax_dropout)
  monkeypatch.setattr(dropout_lib, 'keep_mask', _flax_mask)
  np.testing.assert_array_equal(ours, logits(cfg))
  assert not np.allclose(sixteen, ours)  # the 16-bit draws are other masks


def _embeddings(cfg, params, ids, side, deterministic, rng=None):
  """(word embeddings, positions, the model's embedded input [B, T, D]) of one side."""
  def parts(m):
    embed, words = ((m.src_embed, m.src_word_dropout) if side == 'src'
                    else (m.tgt_embed, m.tgt_word_dropout))
    raw = embed(ids)
    return raw, m._embed(embed, words, ids, None, True) - raw, \
        m._embed(embed, words, ids, None, deterministic)
  return Transformer(cfg).apply({'params': params}, method=parts,
                                rngs=None if rng is None else {'dropout': rng})


@pytest.mark.parametrize('side', ['src', 'tgt'])
def test_word_dropout_zeroes_whole_token_embeddings(tiny_cfg, side):
  """model.source_word_dropout / target_word_dropout: in training each token's word embedding
  is zeroed whole (its position stays) or kept and divided by the keep probability, about
  `rate` of the tokens dropped; inference and the other side are untouched."""
  rates = {'source_word_dropout': 0.5 if side == 'src' else 0.0,
           'target_word_dropout': 0.5 if side == 'tgt' else 0.0}
  cfg = dataclasses.replace(tiny_cfg, **rates)
  params = init_params(cfg, jax.random.key(0))
  ids = jax.random.randint(jax.random.key(1), (32, 16), 3, cfg.vocab_size)
  words, positions, dropped = (np.asarray(x) for x in _embeddings(
      cfg, params, ids, side, False, jax.random.key(2)))
  gone = np.isclose(dropped, positions, atol=1e-6).all(-1)
  kept = np.isclose(dropped, positions + 2.0 * words, atol=1e-5).all(-1)
  assert (gone ^ kept).all()  # every token either dropped whole or kept whole
  assert abs(gone.mean() - 0.5) < 5 * (0.25 / gone.size) ** 0.5, gone.mean()
  np.testing.assert_array_equal(_embeddings(cfg, params, ids, side, True)[2],
                                words + positions)
  other = 'tgt' if side == 'src' else 'src'
  np.testing.assert_array_equal(
      _embeddings(cfg, params, ids, other, False, jax.random.key(2))[2], words + positions)


@pytest.mark.parametrize('side', ['src', 'tgt'])
def test_word_dropout_of_each_side_reaches_its_stack_only(tiny_cfg, side):
  """With every other dropout off, source word dropout changes the encoder's training output
  and not the decoder's (given the same memory), target word dropout the reverse."""
  cfg = dataclasses.replace(tiny_cfg, **{f'{"source" if side == "src" else "target"}'
                                         '_word_dropout': 0.5})
  params = init_params(cfg, jax.random.key(0))
  src = jnp.array([[3, 4, 5, 6, 2], [7, 8, 9, 2, 0]])
  tgt = jnp.array([[1, 9, 10, 11], [1, 12, 13, 14]])
  model, rngs = Transformer(cfg), {'dropout': jax.random.key(4)}

  def encoded(deterministic):
    return model.apply({'params': params}, src, deterministic=deterministic, rngs=rngs,
                       method=Transformer.encode)
  memory = encoded(True)

  def decoded(deterministic):
    return model.apply({'params': params}, memory, tgt, deterministic=deterministic, rngs=rngs,
                       method=Transformer.decode)
  assert np.array_equal(encoded(False), memory) == (side == 'tgt')
  assert np.array_equal(decoded(False), decoded(True)) == (side == 'src')

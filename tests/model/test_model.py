import dataclasses

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base, big
from transformer_nmt.config import ModelConfig
from transformer_nmt.model.transformer import Transformer, count_params, init_params
from transformer_nmt.typed_config import model_config_from_dict


def closed_form_count(vocab: int, d: int, f: int, n: int, pre_ln: bool,
                      n_dec: int | None = None) -> int:
  """Shared, tied embedding + N encoder and N (or n_dec) decoder layers (+ final LNs for
  pre-LN).

  Attention projections have no bias (4 D^2 per attention); the FFN has biases; every
  LayerNorm has a scale and a bias (2 D).
  """
  ffn = d * f + f + f * d + d
  encoder_layer = 4 * d * d + ffn + 2 * 2 * d
  decoder_layer = 2 * 4 * d * d + ffn + 3 * 2 * d
  final_norms = 2 * 2 * d if pre_ln else 0
  n_dec = n if n_dec is None else n_dec
  return vocab * d + n * encoder_layer + n_dec * decoder_layer + final_norms


@pytest.mark.parametrize('config_module, expected_millions', [(base, 63.0), (big, 213.0)])
def test_paper_param_counts_via_eval_shape(config_module, expected_millions):
  c = config_module.get_config()
  cfg = model_config_from_dict(c.model, vocab_size=37000)
  shapes = jax.eval_shape(lambda key: init_params(cfg, key), jax.random.key(0))  # no allocation
  expected = closed_form_count(37000, cfg.d_model, cfg.d_ff, cfg.num_layers, pre_ln=False)
  assert count_params(shapes) == expected
  # The paper reports 65M (base) and 213M (big) with its own vocabulary size.
  assert count_params(shapes) / 1e6 == pytest.approx(expected_millions, rel=0.05)


def test_pre_ln_count_and_untied_output_count(tiny_cfg):
  pre = dataclasses.replace(tiny_cfg, norm_position='pre')
  shapes = jax.eval_shape(lambda key: init_params(pre, key), jax.random.key(0))
  assert count_params(shapes) == closed_form_count(24, 32, 64, 2, pre_ln=True)
  untied = dataclasses.replace(tiny_cfg, tie_output=False, share_embeddings=False,
                               src_vocab_size=30)
  shapes = jax.eval_shape(lambda key: init_params(untied, key), jax.random.key(0))
  base_count = closed_form_count(24, 32, 64, 2, pre_ln=False)
  assert count_params(shapes) == base_count + 30 * 32 + 24 * 32  # + source table + W_out


def test_encoder_and_decoder_depths_of_their_own(tiny_cfg):
  """model.num_encoder_layers / num_decoder_layers override num_layers for one stack."""
  cfg = dataclasses.replace(tiny_cfg, num_layers=2, num_encoder_layers=3, num_decoder_layers=1)
  assert (cfg.encoder_depth, cfg.decoder_depth) == (3, 1)
  assert (tiny_cfg.encoder_depth, tiny_cfg.decoder_depth) == (2, 2)
  shapes = jax.eval_shape(lambda key: init_params(cfg, key), jax.random.key(0))
  assert count_params(shapes) == closed_form_count(24, 32, 64, 3, pre_ln=False, n_dec=1)
  layers = sorted(k for k in shapes if k.endswith(tuple('0123456789')))
  assert layers == ['decoder_layers_0', 'encoder_layers_0', 'encoder_layers_1',
                    'encoder_layers_2']


@pytest.mark.slow
def test_initialisation_scales(tiny_cfg):
  params = init_params(dataclasses.replace(tiny_cfg, vocab_size=4000, d_model=64, d_ff=128),
                       jax.random.key(0))
  emb = np.asarray(params['tgt_embed']['embedding'])
  assert emb.std() == pytest.approx(64 ** -0.5, rel=0.05)  # normal(0, d^-0.5)
  kernel = np.asarray(params['encoder_layers_0']['ffn']['wi']['kernel'])  # [64, 128]
  limit = np.sqrt(6 / (64 + 128))  # Xavier-uniform bound
  assert kernel.max() <= limit and kernel.min() >= -limit and kernel.max() > 0.9 * limit


def _batch():
  src = jnp.array([[5, 6, 7, 3], [8, 9, 3, 0]])
  tgt_in = jnp.array([[2, 10, 11], [2, 12, 0]])
  return src, tgt_in, (src > 0).astype(jnp.int32), (tgt_in > 0).astype(jnp.int32)


@pytest.mark.slow
def test_post_ln_and_pre_ln_differ(tiny_cfg):
  src, tgt, s_seg, t_seg = _batch()
  params = init_params(tiny_cfg, jax.random.key(0))  # same parameter tree for both variants
  post = Transformer(tiny_cfg).apply({'params': params}, src, tgt, s_seg, t_seg)
  pre_cfg = dataclasses.replace(tiny_cfg, norm_position='pre')
  pre_params = init_params(pre_cfg, jax.random.key(0))
  pre = Transformer(pre_cfg).apply({'params': pre_params}, src, tgt, s_seg, t_seg)
  assert post.shape == pre.shape == (2, 3, 24)
  assert float(jnp.abs(post - pre).max()) > 1e-3


def test_padding_does_not_leak_into_real_positions(tiny_cfg):
  src, tgt, s_seg, t_seg = _batch()
  model = Transformer(tiny_cfg)
  params = init_params(tiny_cfg, jax.random.key(0))
  a = model.apply({'params': params}, src, tgt, s_seg, t_seg)
  b = model.apply({'params': params}, src.at[1, 3].set(17), tgt.at[1, 2].set(19), s_seg, t_seg)
  np.testing.assert_allclose(a[1, :2], b[1, :2], atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('depths', [(0, 0), (3, 1)])
def test_cached_decoding_matches_teacher_forcing(tiny_cfg, depths):
  cfg = dataclasses.replace(tiny_cfg, num_encoder_layers=depths[0], num_decoder_layers=depths[1])
  src, tgt, s_seg, _ = _batch()
  variables = {'params': init_params(cfg, jax.random.key(1))}
  full = Transformer(cfg).apply(variables, src, tgt, s_seg)
  np.testing.assert_allclose(_cached_logits(cfg, variables, src, s_seg, tgt), full, atol=1e-5)


def _cached_logits(cfg: ModelConfig, variables: dict, src: jax.Array, s_seg: jax.Array,
                   tgt: jax.Array) -> jax.Array:
  """[B, T, V] logits of tgt [B, T] fed one position at a time through the decoder's cache."""
  model = Transformer(cfg)
  memory = model.apply(variables, src, s_seg, method=Transformer.encode)
  cache = model.apply(variables, memory, s_seg, tgt.shape[1], method=Transformer.init_cache)
  steps = []
  for t in range(tgt.shape[1]):
    logits, cache = model.apply(variables, tgt[:, t], cache, method=Transformer.decode_step)
    steps.append(logits)
  return jnp.stack(steps, 1)


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_params(tiny_cfg):
  cfg = dataclasses.replace(tiny_cfg, dtype='bfloat16')
  params = init_params(cfg, jax.random.key(0))
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
  src, tgt, s_seg, t_seg = _batch()
  logits = Transformer(cfg).apply({'params': params}, src, tgt, s_seg, t_seg)
  assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()


@pytest.mark.slow
def test_bfloat16_logits_option(tiny_cfg):
  """model.float32_logits=False rounds the training logits to bfloat16 (half the bytes of the
  largest array of a step); decoding steps still hand the search float32 logits."""
  cfg16 = dataclasses.replace(tiny_cfg, dtype='bfloat16')
  short = dataclasses.replace(cfg16, float32_logits=False)
  params = init_params(cfg16, jax.random.key(0))
  src, tgt, s_seg, t_seg = _batch()
  ref = Transformer(cfg16).apply({'params': params}, src, tgt, s_seg, t_seg)
  logits = Transformer(short).apply({'params': params}, src, tgt, s_seg, t_seg)
  assert logits.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.float32(logits), ref, atol=0.05, rtol=0.02)
  model = Transformer(short)
  memory = model.apply({'params': params}, src, s_seg, method=Transformer.encode)
  cache = model.apply({'params': params}, memory, s_seg, 4, method=Transformer.init_cache)
  step, _ = model.apply({'params': params}, tgt[:, 0], cache, method=Transformer.decode_step)
  assert step.dtype == jnp.float32


@pytest.mark.slow
def test_bfloat16_gradients_follow_float32(tiny_cfg):
  """The bfloat16 mode (float32 accumulation, custom VJP) computes the float32 model's
  gradient up to bfloat16 rounding, compiled as a train step compiles it (XLA CPU once
  refused the tied embedding's transposed bfloat16 -> float32 gradient product)."""
  params = init_params(tiny_cfg, jax.random.key(0))
  src, tgt, s_seg, t_seg = _batch()

  def grads(dtype):
    model = Transformer(dataclasses.replace(tiny_cfg, dtype=dtype))
    loss = lambda p: jnp.mean(jax.nn.logsumexp(  # noqa: E731
        model.apply({'params': p}, src, tgt, s_seg, t_seg), axis=-1))
    return jax.flatten_util.ravel_pytree(jax.jit(jax.grad(loss))(params))[0]
  g32, g16 = grads('float32'), grads('bfloat16')
  cosine = jnp.dot(g32, g16) / (jnp.linalg.norm(g32) * jnp.linalg.norm(g16))
  assert cosine > 0.99, cosine
  assert 0.9 < jnp.linalg.norm(g16) / jnp.linalg.norm(g32) < 1.1


@pytest.mark.slow
def test_remat_keeps_parameters_and_gradients(tiny_cfg):
  """model.remat recomputes layer activations in the backward pass: same parameter tree, same
  gradients (dropout included: the recomputation reuses the layer's rng), and the compiled
  gradient holds the recomputation."""
  src, tgt, s_seg, t_seg = _batch()
  params = init_params(tiny_cfg, jax.random.key(0))
  remat_cfg = dataclasses.replace(tiny_cfg, remat=True, residual_dropout=0.1)
  assert (jax.tree_util.tree_structure(init_params(remat_cfg, jax.random.key(0)))
          == jax.tree_util.tree_structure(params))

  def grad_fn(cfg):
    def loss(p):
      logits = Transformer(cfg).apply({'params': p}, src, tgt, s_seg, t_seg,
                                      deterministic=False, rngs={'dropout': jax.random.key(1)})
      return jnp.mean(jax.nn.logsumexp(logits, axis=-1))
    return jax.grad(loss)
  plain = jax.flatten_util.ravel_pytree(
      grad_fn(dataclasses.replace(remat_cfg, remat=False))(params))[0]
  remat = jax.flatten_util.ravel_pytree(grad_fn(remat_cfg)(params))[0]
  np.testing.assert_allclose(remat, plain, rtol=1e-4, atol=1e-6)
  assert 'remat' in str(jax.make_jaxpr(grad_fn(remat_cfg))(params))

"""The CPU runtime (runtime/network.py, its cache and kernels) against the reference path
(model/ and decoding/ alone): the same outputs on a noised tiny model."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.config import ModelConfig
from transformer_nmt.decoding.kernels import REFERENCE
from transformer_nmt.decoding.scoring import token_scores
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.decoding.translate import translate
from transformer_nmt.model.transformer import Transformer, init_params
from transformer_nmt.runtime import network
from transformer_nmt.runtime.compaction import CompactingTranslate

BOS, EOS, PAD = 1, 2, 0
# LayerNorm over 64, heads of 32, 40 source positions: the halving sums halve at least once
CFG = ModelConfig(vocab_size=64, num_layers=2, d_model=64, d_ff=96, num_heads=2,
                  residual_dropout=0.0, embedding_dropout=0.0)
RUNTIMES = {'cpu': network.CPU, 'batch_invariant': network.CPU_BATCH_INVARIANT}


@pytest.fixture(scope='module')
def noised():
  """Parameters of an untrained model with noise added to every weight (an initial model's
  zero biases and unit norms would hide a wrong sum), and a batch of 4 sources of lengths
  40, 33, 17 and 5."""
  params = init_params(CFG, jax.random.key(0))
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  params = jax.tree_util.tree_unflatten(tree, [x + 0.3 * jax.random.normal(k, x.shape)
                                               for x, k in zip(leaves, keys)])
  rng = np.random.default_rng(0)
  lengths = [40, 33, 17, 5]
  src = np.zeros((4, 40), np.int32)
  for row, n in enumerate(lengths):
    src[row, :n - 1] = rng.integers(3, CFG.vocab_size, n - 1)
    src[row, n - 1] = EOS
  return params, jnp.asarray(src), jnp.asarray((src != PAD).astype(np.int32))


def _spec(kernels, beam_size):
  return SearchSpec(BOS, EOS, PAD, DecodeConfig(beam_size=beam_size, max_extra_len=8,
                                                chunk=8), kernels=kernels)


def _batch(src, seg):
  """A teacher-forced batch: the sources' first 12 tokens as targets."""
  return {'src': src, 'src_segments': seg, 'src_positions': None, 'tgt_in': src[:, :12],
          'tgt_out': src[:, 1:13], 'tgt_segments': seg[:, :12], 'tgt_positions': None}


@pytest.fixture(scope='module')
def reference(noised):
  """The reference path's greedy and beam-4 outputs and teacher-forced scores."""
  params, src, seg = noised
  outputs = {beam_size: np.asarray(jax.jit(lambda p, s, g: translate(
      CFG, p, s, g, _spec(REFERENCE, beam_size)))(params, src, seg)) for beam_size in (1, 4)}
  assert all((out[:, 0] != EOS).any() for out in outputs.values())  # the model writes
  return outputs, jax.jit(lambda p, b: token_scores(CFG, p, b))(params, _batch(src, seg))


@pytest.mark.slow
@pytest.mark.parametrize('runtime', sorted(RUNTIMES))
def test_the_runtime_translates_and_scores_as_the_reference(noised, reference, runtime):
  """Greedy and beam 4 through the runtime's compacting decoder (what the engine runs; the
  compaction itself: test_compaction.py), and beam 4 as one jitted loop, give the reference's
  tokens; teacher-forced scores and cross-attention agree to float rounding."""
  params, src, seg = noised
  outputs, scores = reference
  kernels = RUNTIMES[runtime]
  for beam_size in (1, 4):
    compacting = CompactingTranslate(CFG, _spec(kernels, beam_size), min_rows=4)
    np.testing.assert_array_equal(compacting(params, src, seg), outputs[beam_size])
  looped = jax.jit(lambda p, s, g: translate(CFG, p, s, g, _spec(kernels, 4)))
  np.testing.assert_array_equal(np.asarray(looped(params, src, seg)), outputs[4])
  got = jax.jit(lambda p, b: token_scores(CFG, p, b, kernels))(params, _batch(src, seg))
  for a, b in zip(got, scores):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_runtime_network_has_the_reference_parameters_and_steps():
  """The runtime's modules keep model/'s names (a trained model's parameters fit both), and
  one bfloat16 decoding step of each gives the same logits."""
  cfg = dataclasses.replace(CFG, dtype='bfloat16')
  params = init_params(cfg, jax.random.key(2))
  runtime = network.StepTransformer(cfg)
  dummy = jnp.ones((1, 1), jnp.int32)
  shapes = jax.eval_shape(lambda: runtime.init(jax.random.key(0), dummy, dummy))['params']
  assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(params)
  src = jnp.asarray(np.arange(3, 15, dtype=np.int32).reshape(2, 6))
  seg = jnp.ones_like(src).at[1, 4:].set(0)

  def three_steps(model, params):
    variables = {'params': params}
    memory = model.apply(variables, src, seg, method='encode')
    cache = model.apply(variables, memory, seg, 8, method='init_cache')
    for token in (BOS, 7, 9):
      step, cache = model.apply(variables, jnp.full((2,), token), cache, method='decode_step')
    return step

  logits = [np.asarray(jax.jit(functools.partial(three_steps, model))(params))
            for model in (Transformer(cfg), runtime)]
  np.testing.assert_allclose(logits[1], logits[0], rtol=2e-2, atol=2e-2)

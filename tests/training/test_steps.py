import dataclasses
import functools

import jax
import numpy as np
import pytest

from transformer_nmt import create_train_state, eval_step, train_step, translate_greedy
from transformer_nmt.config import TrainConfig

PAD, BOS, EOS = 0, 1, 2


def _train_cfg(**overrides) -> TrainConfig:
  """The paper's Adam (0.9, 0.98, 1e-9), no clipping, 50 warm-up steps unless overridden."""
  return TrainConfig(**{'warmup_steps': 50, **overrides}).validate()


def copy_batch(rng: np.random.Generator, rows: int = 32, length: int = 6, vocab: int = 12) -> dict:
  """Random sequences (ids 3..vocab-1) + EOS; the target is the source."""
  ids = rng.integers(3, vocab, size=(rows, length))
  seq = np.concatenate([ids, np.full((rows, 1), EOS)], axis=1).astype(np.int32)  # [B, L]
  ones = np.ones_like(seq)
  positions = np.broadcast_to(np.arange(seq.shape[1]), seq.shape).astype(np.int32)
  tgt_in = np.concatenate([np.full((rows, 1), BOS), seq[:, :-1]], axis=1).astype(np.int32)
  return dict(src=seq, src_segments=ones, src_positions=positions, tgt_in=tgt_in, tgt_out=seq,
              tgt_segments=ones, tgt_positions=positions)


@pytest.fixture(scope='module')
def copy_cfg(tiny_cfg):
  return dataclasses.replace(tiny_cfg, vocab_size=12, d_model=64, d_ff=128, num_heads=4,
                             norm_position='pre')


def test_one_train_step_lowers_loss_on_fixed_batch(copy_cfg):
  state = create_train_state(copy_cfg, _train_cfg(warmup_steps=10), jax.random.key(0))
  batch = copy_batch(np.random.default_rng(0))
  evaluate = jax.jit(functools.partial(eval_step, apply_fn=state.apply_fn, label_smoothing=0.1))
  before = evaluate(state.params, batch)
  state, metrics = jax.jit(functools.partial(train_step, label_smoothing=0.1))(
      state, batch, jax.random.key(1))
  after = evaluate(state.params, batch)
  assert int(state.step) == 1
  assert float(metrics['tokens']) == batch['tgt_out'].size
  assert float(after['loss']) < float(before['loss'])


@pytest.mark.slow
def test_tiny_model_learns_copy_task(copy_cfg):
  state = create_train_state(copy_cfg, _train_cfg(learning_rate_multiplier=0.5),
                             jax.random.key(0))
  step = jax.jit(functools.partial(train_step, label_smoothing=0.0))
  rng = np.random.default_rng(0)
  for _ in range(300):
    state, metrics = step(state, copy_batch(rng), jax.random.key(1))
  assert float(metrics['loss'] / metrics['tokens']) < 0.1
  test = copy_batch(np.random.default_rng(123), rows=16)
  out = translate_greedy(copy_cfg, state.params, test['src'], test['src_segments'], bos_id=BOS,
                         eos_id=EOS, pad_id=PAD, max_extra_len=3)
  out = np.asarray(out)
  assert out.shape == (16, 7 + 3)
  accuracy = (out[:, :7] == test['tgt_out']).mean()
  assert accuracy > 0.95, accuracy  # unseen sequences, decoded greedily with the cache


@pytest.mark.slow
def test_accumulated_micro_batches_equal_one_large_batch(copy_cfg):
  """Two micro-batches with different padding, accumulated, give the update of one batch
  holding all their rows (token mean over the union, not a mean of means)."""
  from transformer_nmt.training.steps import apply_accumulated, grad_step
  state = create_train_state(copy_cfg, _train_cfg(warmup_steps=10), jax.random.key(0))
  a, b = copy_batch(np.random.default_rng(1), rows=8), copy_batch(np.random.default_rng(2), rows=8)
  b['tgt_segments'] = b['tgt_segments'].copy()
  b['tgt_segments'][:, 4:] = 0  # fewer real target tokens in the second micro-batch
  union = {k: np.concatenate([a[k], b[k]]) for k in a}
  rng = jax.random.key(3)
  whole, whole_metrics = train_step(state, union, rng, label_smoothing=0.1)
  grads_a, sums_a = grad_step(state, a, rng, label_smoothing=0.1)
  grads_b, sums_b = grad_step(state, b, rng, label_smoothing=0.1)
  add = lambda x, y: jax.tree_util.tree_map(lambda p, q: p + q, x, y)  # noqa: E731
  accumulated, metrics = apply_accumulated(state, add(grads_a, grads_b), add(sums_a, sums_b))
  assert float(metrics['tokens']) == float(whole_metrics['tokens']) == 8 * 7 + 8 * 4
  np.testing.assert_allclose(float(metrics['grad_norm']), float(whole_metrics['grad_norm']),
                             rtol=1e-5)
  grads_union, sums_union = grad_step(state, union, rng, label_smoothing=0.1)
  for x, y in zip(jax.tree_util.tree_leaves(add(grads_a, grads_b)),
                  jax.tree_util.tree_leaves(grads_union)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
  # Adam's first update is about lr * sign(g): near-zero gradient entries may flip with
  # float32 summation order, so parameters agree to a small fraction of lr (4e-3 here).
  for x, y in zip(jax.tree_util.tree_leaves(accumulated.params),
                  jax.tree_util.tree_leaves(whole.params)):
    np.testing.assert_allclose(x, y, atol=1e-4)

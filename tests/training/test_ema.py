"""train.ema_decay: the moving average of the weights, its update, checkpoints and resume."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.checkpoint import Checkpointer
from transformer_nmt.config import default_config
from transformer_nmt.errors import ConfigError
from transformer_nmt.training.state import (
  TrainState,
  create_train_state,
  ema_decay_at,
  ema_update,
  make_optimizer,
)
from transformer_nmt.typed_config import validate_config


def test_decay_zero_gives_the_parameters_and_one_step_matches_a_hand_computation():
  params = {'w': jnp.array([1.0, -2.0]), 'b': jnp.array(3.0)}
  ema = {'w': jnp.array([0.0, 0.0]), 'b': jnp.array(1.0)}
  np.testing.assert_allclose(ema_update(ema, params, 0.0)['w'], params['w'])
  state = TrainState.create(apply_fn=None, params=params, tx=make_optimizer(0.1), ema=params,
                            ema_decay=0.9)
  grads = {'w': jnp.array([0.5, -0.5]), 'b': jnp.array(1.0)}
  new = state.apply_gradients(grads=grads)
  decay = min(0.9, 2.0 / 11.0)  # after update 1: TensorFlow's num_updates warm-up
  assert float(ema_decay_at(0.9, 1)) == pytest.approx(decay)
  assert float(ema_decay_at(0.9, 10_000)) == pytest.approx(0.9)
  for key in params:
    np.testing.assert_allclose(new.ema[key], decay * params[key] + (1 - decay) * new.params[key],
                               rtol=1e-6)
  assert not np.allclose(new.params['w'], params['w'])  # the update moved the weights


def test_without_warmup_the_decay_is_the_configured_one_from_the_first_step(tiny_cfg):
  """train.ema_warmup=False: ema_decay from update 1, where the warm-up's cap would hold the
  decay below 0.999 until step 8990 (at step 3400 it is 3401 / 3410)."""
  assert float(ema_decay_at(0.999, 3400)) == pytest.approx(3401 / 3410)
  assert float(ema_decay_at(0.999, 8990)) == pytest.approx(0.999)
  assert float(ema_decay_at(0.999, 1, warmup=False)) == pytest.approx(0.999)
  config = default_config()
  config.train.ema_decay, config.train.ema_warmup = 0.9, False
  config.train.warmup_steps = 1  # a first step that moves every weight by about 0.18
  state = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(0))
  assert state.ema_decay == 0.9 and state.ema_warmup is False
  grads = jax.tree_util.tree_map(jnp.ones_like, state.params)
  new = state.apply_gradients(grads=grads)
  for old, ema, params in zip(*(jax.tree_util.tree_leaves(t) for t in
                                (state.params, new.ema, new.params))):
    assert np.all(np.abs(params - old) > 0.1)  # the warm-up's 2/11 would be far off
    np.testing.assert_allclose(ema - old, 0.1 * (params - old), rtol=1e-4, atol=1e-6)
  defaults = validate_config(default_config()).train
  assert create_train_state(tiny_cfg, defaults, jax.random.key(0)).ema_warmup


def _own_buffers(state) -> bool:
  """The average never shares a buffer with the parameters: a step that donates the state
  (on accelerators) would donate it twice."""
  pointers = lambda tree: {x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(tree)}  # noqa: E731
  return not pointers(state.ema) & pointers(state.params)


def test_the_average_starts_as_a_copy(tiny_cfg):
  config = default_config()
  config.train.ema_decay = 0.99
  state = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(0))
  assert _own_buffers(state) and _own_buffers(jax.device_put(state, jax.devices()[0]))
  np.testing.assert_array_equal(jax.flatten_util.ravel_pytree(state.ema)[0],
                                jax.flatten_util.ravel_pytree(state.params)[0])


def test_off_by_default_and_bad_values_refused(tiny_cfg):
  config = default_config()
  state = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(0))
  assert state.ema is None and state.eval_params is state.params
  for bad in (1.0, -0.1):
    config.train.ema_decay = bad
    with pytest.raises(ConfigError, match='train.ema_decay='):
      validate_config(config)


def _run(workdir, num_steps, ema_decay):
  from configs import tiny
  from transformer_nmt.training import loop
  config = tiny.get_config()
  config.data.update(demo_sizes=(200, 10, 10))
  config.train.update(num_steps=num_steps, eval_every=1000, log_every=1, checkpoint_every=2,
                      ema_decay=ema_decay)
  config.eval.update(bleu_sentences=0)
  loop.train_and_evaluate(validate_config(config), str(workdir))


def _checkpoint(workdir, step, ema=True):
  ckpt = Checkpointer(workdir / 'checkpoints', read_only=True)
  try:
    return ckpt.has_ema(step), jax.flatten_util.ravel_pytree(ckpt.restore_params(step, ema))[0]
  finally:
    ckpt.close()


@pytest.mark.slow
def test_ema_is_checkpointed_resumed_exactly_and_decoded(tmp_path):
  """Resumed from its step-2 checkpoint (step 4's removed, as if killed before it), a run
  ends with the EMA it had when uninterrupted; decoding loads the EMA unless told not to, and
  so does recipe.py's 'best' candidate."""
  import shutil

  from transformer_nmt.inference import CheckpointChoice, load_workdir
  from transformer_nmt.training.selection import checkpoint_candidates
  workdir = tmp_path / 'run'
  _run(workdir, 4, 0.5)
  has, straight = _checkpoint(workdir, 4)
  raw = _checkpoint(workdir, 4, ema=False)[1]
  assert has and not np.allclose(raw, straight)
  flat = lambda m: jax.flatten_util.ravel_pytree(m.params)[0]  # noqa: E731
  np.testing.assert_array_equal(flat(load_workdir(workdir)), straight)
  np.testing.assert_array_equal(flat(load_workdir(workdir, CheckpointChoice(ema=False))), raw)
  # recipe.py's 'best' candidate: the weights its validation BLEU was measured on, the EMA
  # (the final evaluation kept step 4 in best/)
  candidates = dict(checkpoint_candidates(workdir, average_last=0))
  assert list(candidates) == ['latest', 'best', 'EMA']
  best = candidates['best']()
  assert best.steps == [4]
  np.testing.assert_array_equal(flat(best), straight)
  shutil.rmtree(workdir / 'checkpoints' / '4')
  _run(workdir, 4, 0.5)  # resumes at step 2
  np.testing.assert_array_equal(_checkpoint(workdir, 4)[1], straight)
  np.testing.assert_array_equal(_checkpoint(workdir, 4, ema=False)[1], raw)


def test_a_checkpoint_restores_whether_or_not_it_has_an_ema(tmp_path, tiny_cfg):
  """train.ema_decay turned on or off between runs: restoring never fails (a failure would
  move the checkpoint aside as damaged); a missing average starts from the weights."""
  from transformer_nmt.checkpoint import loop_state
  config = default_config()
  plain = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(0))
  config.train.ema_decay = 0.9
  averaged = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(1))
  averaged = averaged.replace(ema=jax.tree_util.tree_map(lambda x: x + 1.0, averaged.params))
  ckpt = Checkpointer(tmp_path / 'ckpt')
  ckpt.save(1, plain, loop_state(0, jax.random.key(2)))
  ckpt.save(2, averaged, loop_state(0, jax.random.key(2)))
  ckpt.close()
  ckpt = Checkpointer(tmp_path / 'ckpt')
  flat = lambda tree: jax.flatten_util.ravel_pytree(tree)[0]  # noqa: E731
  turned_on, _ = ckpt.restore(averaged, 1)
  np.testing.assert_array_equal(flat(turned_on.ema), flat(plain.params))
  assert _own_buffers(turned_on)
  turned_off, _ = ckpt.restore(plain, 2)
  assert turned_off.ema is None
  np.testing.assert_array_equal(flat(turned_off.params), flat(averaged.params))
  kept, _ = ckpt.restore(averaged, 2)
  np.testing.assert_array_equal(flat(kept.ema), flat(averaged.ema))
  assert not ckpt.has_ema(1) and ckpt.has_ema(2)
  ckpt.close()

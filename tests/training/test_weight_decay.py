"""train.weight_decay: decoupled weight decay on the matrices only, off by default."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer_nmt.checkpoint import Checkpointer, loop_state
from transformer_nmt.config import default_config
from transformer_nmt.errors import ConfigError
from transformer_nmt.training.state import create_train_state, learning_rate_fn, make_optimizer
from transformer_nmt.typed_config import validate_config

PARAMS = {'dense': {'kernel': jnp.full((3, 4), 2.0), 'bias': jnp.full((4,), 2.0)},
          'norm': {'scale': jnp.full((4,), 2.0)}, 'embed': {'embedding': jnp.full((5, 4), -1.0)}}


def _step(tx: optax.GradientTransformation, params, grads):
  updates, _ = tx.update(grads, tx.init(params), params)
  return optax.apply_updates(params, updates)


def test_one_step_shrinks_the_matrices_by_lr_times_decay_and_leaves_the_rest():
  lr, decay = 0.1, 0.5
  grads = jax.tree_util.tree_map(jnp.ones_like, PARAMS)
  with_decay = _step(make_optimizer(lr, weight_decay=decay), PARAMS, grads)
  without = _step(make_optimizer(lr), PARAMS, grads)
  # Adam's first step moves every weight by lr * g / (|g| + eps) = lr; the decay subtracts
  # lr * decay * w more from the matrices alone.
  for path, leaf in jax.tree_util.tree_leaves_with_path(PARAMS):
    got = _get(with_decay, path)
    decays = path[-1].key in ('kernel', 'embedding')
    expected = _get(without, path) - (lr * decay * leaf if decays else 0.0)
    np.testing.assert_allclose(got, expected, rtol=1e-6, err_msg=jax.tree_util.keystr(path))
    np.testing.assert_allclose(_get(without, path), leaf - lr, rtol=1e-6)


def test_the_decay_follows_the_learning_rate_schedule():
  """With zero gradients Adam's update is 0: what moves is the decay, lr(step) * decay * w."""
  schedule = optax.linear_schedule(0.0, 1.0, transition_steps=10)  # 0 at step 0, 0.1 at 1
  tx = make_optimizer(schedule, weight_decay=0.5)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, PARAMS)
  state = tx.init(PARAMS)
  params = PARAMS
  for lr in (0.0, 0.1):
    updates, state = tx.update(zeros, state, params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_allclose(new['dense']['kernel'], params['dense']['kernel'] * (1 - lr * 0.5),
                               rtol=1e-6)
    np.testing.assert_array_equal(new['dense']['bias'], params['dense']['bias'])
    params = new


def test_off_by_default_keeps_adams_state_layout_and_bad_values_are_refused(tiny_cfg):
  """Checkpoints of runs without decay keep the optimizer state they always had."""
  config = default_config()
  assert config.train.weight_decay == 0.0
  state = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(0))
  adam = optax.adam(lambda step: 1e-3).init(state.params)  # a schedule, as eq. 3
  assert jax.tree_util.tree_structure(state.opt_state) == jax.tree_util.tree_structure(adam)
  config.train.weight_decay = -0.1
  with pytest.raises(ConfigError, match=r'train.weight_decay=-0.1 must be 0 \(off\) or positive'):
    validate_config(config)


def test_the_models_kernels_and_embeddings_decay_and_its_biases_and_norms_do_not(tiny_cfg):
  config = default_config()
  config.train.update(weight_decay=0.01, warmup_steps=1)  # eq. 3's rate 0.18 at the first update
  state = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(0))
  zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
  moved = state.apply_gradients(grads=zeros)  # zero gradients: only the decay moves weights
  factor = 1 - float(learning_rate_fn(tiny_cfg, validate_config(config).train)(0)) * 0.01
  kinds = set()
  for path, before in jax.tree_util.tree_leaves_with_path(state.params):
    kind, name = path[-1].key, jax.tree_util.keystr(path)  # kernel, embedding, bias or scale
    kinds.add(kind)
    after = _get(moved.params, path)
    if kind in ('kernel', 'embedding'):
      np.testing.assert_allclose(after, before * factor, rtol=1e-6, err_msg=name)
    else:
      np.testing.assert_array_equal(after, before, err_msg=name)
  assert kinds == {'kernel', 'embedding', 'bias', 'scale'}, kinds


def test_checkpoints_keep_the_state_and_a_changed_setting_is_named(tiny_cfg, tmp_path):
  """A resume with weight_decay turned on or off since the save cannot read the optimizer
  state: the error names the option instead of calling the files damaged, and moves none."""
  config = default_config()
  config.train.update(weight_decay=0.01, warmup_steps=1)
  state = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(0))
  grads = jax.tree_util.tree_map(jnp.ones_like, state.params)
  state = state.apply_gradients(grads=grads)
  ckpt = Checkpointer(tmp_path / 'run' / 'checkpoints')
  ckpt.save(1, state, loop_state(0, jax.random.key(1)))
  ckpt.close()
  fresh = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(2))
  ckpt = Checkpointer(tmp_path / 'run' / 'checkpoints')
  restored, _ = ckpt.restore_latest_readable(fresh)
  for a, b in zip(jax.tree_util.tree_leaves(restored.opt_state),
                  jax.tree_util.tree_leaves(state.opt_state)):
    np.testing.assert_array_equal(a, b)
  config.train.weight_decay = 0.0
  plain = create_train_state(tiny_cfg, validate_config(config).train, jax.random.key(2))
  with pytest.raises(ConfigError, match='train.weight_decay or train.clip_grad_norm'):
    ckpt.restore_latest_readable(plain)
  assert ckpt.all_steps() == [1]
  ckpt.close()


def _get(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree

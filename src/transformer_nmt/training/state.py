"""Optimizer (paper §5.3) and train-state construction."""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from transformer_nmt.config import ModelConfig, TrainConfig
from transformer_nmt.model.transformer import Transformer, init_params
from transformer_nmt.training.schedules import rsqrt_warmup


def ema_update(ema: Any, params: Any, decay: jax.Array) -> Any:
  """decay * ema + (1 - decay) * params, leaf by leaf."""
  return jax.tree_util.tree_map(lambda e, p: decay * e + (1.0 - decay) * p, ema, params)


def ema_decay_at(decay: float, step: jax.Array, warmup: bool = True) -> jax.Array:
  """The decay used after update `step` (1-based). With `warmup`: min(decay, (1 + step) /
  (10 + step)), the warm-up of TensorFlow's ExponentialMovingAverage(num_updates), so that a
  short run's average is not dominated by the initial weights; it caps the decay until step
  (10 decay - 1) / (1 - decay), e.g. 8990 for 0.999 (train.ema_warmup)."""
  if not warmup:
    return jnp.asarray(decay, jnp.float32)
  step = jnp.asarray(step, jnp.float32)
  return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


class TrainState(train_state.TrainState):
  """flax's TrainState and `ema`, an exponential moving average of the parameters (Polyak
  averaging; train.ema_decay, None when off), kept in float32 beside them, sharded like them
  and checkpointed with them."""

  ema: Any = None
  ema_decay: float = flax.struct.field(pytree_node=False, default=0.0)
  ema_warmup: bool = flax.struct.field(pytree_node=False, default=True)

  def apply_gradients(self, *, grads: Any, **kwargs: Any) -> TrainState:
    new = super().apply_gradients(grads=grads, **kwargs)
    if self.ema is None:
      return new
    decay = ema_decay_at(self.ema_decay, new.step, self.ema_warmup)
    return new.replace(ema=ema_update(self.ema, new.params, decay))

  @property
  def eval_params(self) -> Any:
    """The weights evaluation and decoding use: the average when there is one."""
    return self.params if self.ema is None else self.ema


def decay_mask(params: Any) -> Any:
  """True for the leaves decoupled weight decay shrinks: the matrices (kernels, embeddings),
  not the biases and LayerNorm scales and offsets, whose shrinking is no regulariser."""
  return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)


def make_optimizer(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.98,
                   eps: float = 1e-9, clip_grad_norm: float = 0.0,
                   weight_decay: float = 0.0) -> optax.GradientTransformation:
  """Adam with the paper's beta1 0.9, beta2 0.98, eps 1e-9; optional global-norm clipping
  (not in the paper; 0 disables it) and decoupled weight decay (AdamW, Loshchilov and Hutter
  2019; not in the paper; 0 disables it): each step also subtracts learning rate x
  weight_decay x the weight from every matrix (decay_mask)."""
  if weight_decay > 0:
    adam = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                       mask=decay_mask)
  else:  # optax.adam's state, so that checkpoints of runs without decay keep their layout
    adam = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
  if clip_grad_norm > 0:
    return optax.chain(optax.clip_by_global_norm(clip_grad_norm), adam)
  return adam


def learning_rate_fn(model_cfg: ModelConfig, train_cfg: TrainConfig) -> optax.Schedule:
  """Eq. 3 from a config's `train` section (warmup_steps, learning_rate_multiplier, and
  cooldown_steps of num_steps)."""
  cooldown = train_cfg.cooldown_steps  # num_steps matters only then
  return rsqrt_warmup(model_cfg.d_model, train_cfg.warmup_steps, train_cfg.learning_rate_multiplier,
                      train_cfg.num_steps if cooldown else 0, cooldown)


def create_train_state(model_cfg: ModelConfig, train_cfg: TrainConfig,
                       rng: jax.Array) -> TrainState:
  """Fresh parameters and Adam state for `model_cfg` with the optimizer from `train_cfg`."""
  tx = make_optimizer(learning_rate_fn(model_cfg, train_cfg), b1=train_cfg.adam_b1,
                      b2=train_cfg.adam_b2, eps=train_cfg.adam_eps,
                      clip_grad_norm=train_cfg.clip_grad_norm,
                      weight_decay=float(train_cfg.weight_decay))
  params = init_params(model_cfg, rng)
  decay = float(train_cfg.ema_decay)
  # The average starts as a copy: sharing the parameters' buffers would make a step that
  # donates the state donate them twice (accelerators).
  ema = jax.tree_util.tree_map(jnp.copy, params) if decay > 0 else None
  return TrainState.create(apply_fn=Transformer(model_cfg).apply, params=params, tx=tx,
                           ema=ema, ema_decay=decay,
                           ema_warmup=bool(train_cfg.ema_warmup))

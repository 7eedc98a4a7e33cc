"""Optimizer (paper §5.3) and train-state construction."""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax.training import train_state

from transformer_nmt.config import ModelConfig
from transformer_nmt.model.transformer import Transformer, init_params
from transformer_nmt.training.schedules import rsqrt_warmup

TrainState = train_state.TrainState


def make_optimizer(learning_rate: optax.ScalarOrSchedule, *, b1: float = 0.9, b2: float = 0.98,
                   eps: float = 1e-9, clip_grad_norm: float = 0.0) -> optax.GradientTransformation:
  """Adam with the paper's beta1 0.9, beta2 0.98, eps 1e-9; optional global-norm clipping
  (not in the paper; 0 disables it)."""
  adam = optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
  if clip_grad_norm > 0:
    return optax.chain(optax.clip_by_global_norm(clip_grad_norm), adam)
  return adam


def learning_rate_fn(model_cfg: ModelConfig, train_cfg: Any) -> optax.Schedule:
  """Eq. 3 from a config's `train` section (warmup_steps, learning_rate_multiplier)."""
  return rsqrt_warmup(model_cfg.d_model, train_cfg.warmup_steps, train_cfg.learning_rate_multiplier)


def create_train_state(model_cfg: ModelConfig, train_cfg: Any, rng: jax.Array) -> TrainState:
  """Fresh parameters and Adam state for `model_cfg` with the optimizer from `train_cfg`."""
  tx = make_optimizer(learning_rate_fn(model_cfg, train_cfg), b1=train_cfg.adam_b1,
                      b2=train_cfg.adam_b2, eps=train_cfg.adam_eps,
                      clip_grad_norm=train_cfg.clip_grad_norm)
  params = init_params(model_cfg, rng)
  return TrainState.create(apply_fn=Transformer(model_cfg).apply, params=params, tx=tx)

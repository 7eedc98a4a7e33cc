"""A run's devices and compiled update: the [data, fsdp] mesh, where the train state lives on
it, and the jitted step of one update (one batch, or gradients accumulated over several)."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from transformer_nmt import sharding
from transformer_nmt.config import DataConfig, ModelConfig, TrainConfig
from transformer_nmt.training.state import learning_rate_fn
from transformer_nmt.training.steps import apply_accumulated, grad_step, train_step


def make_mesh(train: TrainConfig, devices: Optional[list] = None) -> Mesh:
  """The [data, fsdp] device mesh of a run: fsdp 1 (data parallel) unless train.shard_params,
  then train.fsdp_devices (0 = all devices) on the fsdp axis."""
  devices = jax.devices() if devices is None else devices
  fsdp = (train.fsdp_devices or len(devices)) if train.shard_params else 1
  return sharding.device_mesh(devices, fsdp)


def state_shardings(state: Any, mesh: Mesh) -> Any:
  """Where the train state lives: replicated on every device, or, when the mesh has an fsdp
  axis, parameters and Adam moments split over it (FSDP)."""
  if mesh.shape[sharding.FSDP_AXIS] > 1:
    placement = sharding.fsdp_shardings(state, mesh)
    split = [p for p in jax.tree_util.tree_leaves(placement) if not p.is_fully_replicated]
    logging.info('FSDP: %d of %d state arrays split over %d devices', len(split),
                 len(jax.tree_util.tree_leaves(placement)), mesh.shape[sharding.FSDP_AXIS])
    return placement
  return jax.tree_util.tree_map(lambda _: sharding.replicated(mesh), state)


def accumulation_steps(train: TrainConfig, data: DataConfig) -> int:
  """Micro-batches per update: train.global_batch_tokens / data.tokens_per_batch, rounded."""
  return max(1, round(train.global_batch_tokens / data.tokens_per_batch))


def jit_steps(model_cfg: ModelConfig, train: TrainConfig, mesh: Mesh,
              placement: Any, donate: bool) -> dict[str, Any]:
  """The jitted programs of one update, keyed 'train' (one batch per update), or 'grad',
  'add' and 'apply' (gradient accumulation). The new state keeps the shardings `placement`;
  with `donate`, the old state's buffers are reused for the new one."""
  lr = learning_rate_fn(model_cfg, train)
  out = (placement, sharding.replicated(mesh))
  donated = 0 if donate else ()
  gather = sharding.params_for_compute(mesh, placement.params, model_cfg.dtype)
  return {
      'train': jax.jit(functools.partial(train_step, label_smoothing=train.label_smoothing,
                                         learning_rate_fn=lr, gather_params=gather),
                       out_shardings=out, donate_argnums=donated),
      'grad': jax.jit(functools.partial(grad_step, label_smoothing=train.label_smoothing,
                                        gather_params=gather)),
      'add': jax.jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b), donate_argnums=donated),
      'apply': jax.jit(functools.partial(apply_accumulated, learning_rate_fn=lr),
                       out_shardings=out, donate_argnums=donated),
  }


def make_step(model_cfg: ModelConfig, train: TrainConfig, mesh: Mesh, accumulate: int,
              placement: Any) -> Callable[[Any, list, jax.Array], tuple[Any, dict]]:
  """(state, micro-batches, rng) -> (state, metrics): one update over `accumulate` batches
  (each batch a dict of [B, L] arrays placed on `mesh`); the old state's buffers are donated
  to the new one on accelerators."""
  steps = jit_steps(model_cfg, train, mesh, placement, donate=jax.default_backend() != 'cpu')
  if accumulate == 1:
    return lambda state, batches, rng: steps['train'](state, batches[0], rng)

  def step(state: Any, batches: list, rng: jax.Array) -> tuple[Any, dict]:
    total = None
    for i, batch in enumerate(batches):
      grads = steps['grad'](state, batch, jax.random.fold_in(rng, i))
      total = grads if total is None else steps['add'](total, grads)
    return steps['apply'](state, *total)
  return step

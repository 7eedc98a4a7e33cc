"""Pure, jittable training and evaluation steps.

A batch is a dict of [B, L] int32 arrays: src, src_segments, src_positions, tgt_in, tgt_out,
tgt_segments, tgt_positions (segments: 0 for padding). Bind the keyword arguments with
functools.partial and jit once:

  step = jax.jit(functools.partial(train_step, label_smoothing=0.1, learning_rate_fn=lr),
                 donate_argnums=0)
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import optax

from transformer_nmt.training.losses import smoothed_cross_entropy
from transformer_nmt.training.state import TrainState

Batch = dict[str, jax.Array]


def _forward(apply_fn: Callable[..., jax.Array], params: Any, batch: Batch, deterministic: bool,
             rngs: Optional[dict] = None) -> jax.Array:
  return apply_fn({'params': params}, batch['src'], batch['tgt_in'], batch['src_segments'],
                  batch['tgt_segments'], batch['src_positions'], batch['tgt_positions'],
                  deterministic=deterministic, rngs=rngs)  # [B, T, V]


def _summed_loss(state: TrainState, batch: Batch, rng: jax.Array, label_smoothing: float,
                 gather_params: Optional[Callable[[Any], Any]]) -> tuple[Any, dict]:
  """Gradients of the summed label-smoothed loss of one batch and its loss sums."""
  dropout_rng = jax.random.fold_in(rng, state.step)
  weights = batch['tgt_segments'] > 0

  def loss_fn(params: Any) -> tuple[jax.Array, dict]:
    if gather_params is not None:
      params = gather_params(params)
    logits = _forward(state.apply_fn, params, batch, False, {'dropout': dropout_rng})
    sums = smoothed_cross_entropy(logits, batch['tgt_out'], weights, label_smoothing)
    return sums['loss'], sums

  return jax.grad(loss_fn, has_aux=True)(state.params)


def train_step(state: TrainState, batch: Batch, rng: jax.Array, *, label_smoothing: float,
               learning_rate_fn: Optional[optax.Schedule] = None,
               gather_params: Optional[Callable[[Any], Any]] = None) -> tuple[TrainState, dict]:
  """One Adam update on the token-mean label-smoothed loss.

  Args:
    state: params, optimizer state and step.
    batch: see module docstring.
    rng: base dropout key; folded with the step so every step draws fresh masks.
    label_smoothing: eps_ls.
    learning_rate_fn: reported in the metrics when given.
    gather_params: FSDP: params -> params whole on every device, applied where the loss uses
      them (`sharding.gather_weights`); None for replicated parameters.

  Returns:
    (new state, metrics): sums 'loss', 'nll', 'correct', 'tokens' and 'grad_norm', 'learning_rate'.
  """
  grads, sums = _summed_loss(state, batch, rng, label_smoothing, gather_params)
  return apply_accumulated(state, grads, sums, learning_rate_fn=learning_rate_fn)


def grad_step(state: TrainState, batch: Batch, rng: jax.Array, *, label_smoothing: float,
              gather_params: Optional[Callable[[Any], Any]] = None) -> tuple[Any, dict]:
  """Gradient accumulation, part 1: gradients of the *summed* loss of one micro-batch and its
  loss sums. `rng` should differ per micro-batch (fold in its index)."""
  return _summed_loss(state, batch, rng, label_smoothing, gather_params)


def apply_accumulated(state: TrainState, grads: Any, sums: dict, *,
                      learning_rate_fn: Optional[optax.Schedule] = None) -> tuple[TrainState,
                                                                                 dict]:
  """Gradient accumulation, part 2: one Adam update with the token mean over all micro-batches
  (`grads` and `sums` added up over them), so A micro-batches give the same update as one
  batch holding all their rows. Metrics as in `train_step`."""
  scale = 1.0 / jnp.maximum(sums['tokens'], 1.0)
  grads = jax.tree_util.tree_map(lambda g: g * scale, grads)
  metrics = dict(sums, grad_norm=optax.tree.norm(grads))
  if learning_rate_fn is not None:
    metrics['learning_rate'] = learning_rate_fn(state.step)
  return state.apply_gradients(grads=grads), metrics


def eval_step(params: Any, batch: Batch, *, apply_fn: Callable[..., jax.Array],
              label_smoothing: float) -> dict:
  """Loss sums on one batch without dropout (see `smoothed_cross_entropy`)."""
  logits = _forward(apply_fn, params, batch, True)
  return smoothed_cross_entropy(logits, batch['tgt_out'], batch['tgt_segments'] > 0,
                                label_smoothing)

"""Orbax checkpoints of the train state: atomic saves, keep the last K, restore the latest."""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from transformer_nmt.errors import DataError


class Checkpointer:
  """Saves {params, opt_state, step, loop} under `workdir/checkpoints/<step>`.

  `loop` holds the rest of the training loop's state (see `loop_state`): the dropout key and
  how many (micro-)batches the input pipeline has handed out, so a resumed run continues with
  exactly the randomness and the batch an uninterrupted run would have used next.

  Orbax writes each step into a temporary directory and renames it when complete, so an
  interrupted save never looks like a checkpoint.
  """

  def __init__(self, directory: str | os.PathLike, keep: int = 5, read_only: bool = False,
               best_metric: Optional[str] = None):
    """With `best_metric`, the `keep` saves with the highest value of that metric are kept
    (saves pass `metrics`), instead of the latest ones."""
    best = dict(best_fn=lambda m: m[best_metric], best_mode='max',
                keep_checkpoints_without_metrics=False) if best_metric else {}
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                           read_only=read_only, **best)
    self._manager = ocp.CheckpointManager(os.path.abspath(directory), options=options,
                                          item_handlers=ocp.StandardCheckpointHandler())

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, loop: dict[str, np.ndarray], force: bool = False,
           metrics: Optional[dict[str, float]] = None) -> None:
    """Starts an asynchronous save of `state` and `loop`; with `force`, also when `step` is
    already saved."""
    if force and step in self._manager.all_steps():
      return
    payload = dict(_payload(state), loop=loop)
    self._manager.save(step, args=ocp.args.StandardSave(payload), force=force, metrics=metrics)

  def metrics(self, step: int) -> Optional[dict[str, float]]:
    """The metrics saved with checkpoint `step` (None if it was saved without)."""
    return self._manager.metrics(step)

  def restore_latest_readable(self, state: Any) -> Optional[tuple[Any, dict]]:
    """(state, loop) of the newest checkpoint that reads back, saying which ones it had to
    skip.

    A checkpoint damaged after it was written (truncated or missing files) is skipped with a
    warning in favour of the one before it; None when there is no checkpoint at all.
    """
    for step in reversed(self.all_steps()):
      try:
        return self.restore(state, step)
      except Exception as e:  # Orbax and TensorStore raise many kinds for damaged files
        logging.warning('Checkpoint at step %d is unreadable (%s: %s); trying the previous one',
                        step, type(e).__name__, str(e).splitlines()[0][:200])
    if self.all_steps():
      raise DataError(f'no readable checkpoint among steps {self.all_steps()}; move the '
                      'checkpoints away to start afresh')
    return None

  def restore(self, state: Any, step: Optional[int] = None) -> tuple[Any, dict]:
    """(state, loop) restored into the structure (and shardings) of `state`; latest step by
    default."""
    step = self.latest_step() if step is None else step
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _payload(state))
    abstract['loop'] = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct,
                                              loop_state(0, jax.random.key(0)))
    restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
    loop = jax.tree_util.tree_map(np.asarray, restored.pop('loop'))
    return state.replace(**restored), loop

  def restore_params(self, step: int) -> Any:
    """Only the parameters of checkpoint `step`, as host arrays (no optimizer needed).

    The target is built from the checkpoint's own metadata on one local device, so a
    checkpoint written by any number of devices or hosts restores here.
    """
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
        self._manager.item_metadata(step))
    restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
    return jax.tree_util.tree_map(np.asarray, restored['params'])

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def loop_state(data_position: int, dropout_key: jax.Array) -> dict[str, np.ndarray]:
  """The training loop's state besides the train state, as host arrays for a checkpoint."""
  return {'data_position': np.asarray(data_position, np.int32),
          'dropout_key': np.asarray(jax.random.key_data(dropout_key))}


def _payload(state: Any) -> dict:
  return {'params': state.params, 'opt_state': state.opt_state, 'step': state.step}

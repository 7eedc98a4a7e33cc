"""Orbax checkpoints of the train state: atomic saves, keep the last K, restore the latest."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import shutil
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.files import write_atomically
from transformer_nmt.workdir import CHECKSUMS

QUARANTINE = 'quarantine'  # where unreadable checkpoints go, inside the checkpoint directory
ITEM = 'default'  # Orbax's directory, in each step directory, for a manager's one item


# The first line of Orbax's error for a saved tree that differs from the one restored into.
LAYOUT_MISMATCH = 'tree structures do not match'


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
    self.directory = pathlib.Path(os.path.abspath(directory))
    self.read_only = read_only
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_handlers=ocp.StandardCheckpointHandler())

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, loop: dict[str, np.ndarray], force: bool = False,
           metrics: Optional[dict[str, float]] = None) -> None:
    """Starts an asynchronous save of `state` and `loop`. With `force`, a step that is already
    saved is left as it is (an interrupted run saves its last step, which may be saved)."""
    self.check_for_errors()  # a failed earlier save (e.g. a full disk) stops the run
    self._seal_finished()
    if force and step in self._manager.all_steps():
      return
    payload = dict(_payload(state), loop=loop)
    self._check_space(step, payload)
    self._manager.save(step, args=ocp.args.StandardSave(payload), force=force, metrics=metrics)

  def save_params(self, step: int, params: Any) -> None:
    """Saves parameters alone, without an optimizer or loop state (an imported model,
    import_marian.py): decoding and train.init_from read them; resuming training from them
    is refused as a state of another layout."""
    self._manager.save(step, args=ocp.args.StandardSave({'params': params}))

  def _check_space(self, step: int, payload: Any) -> None:
    """Refuses a save the disk has no room for, before it starts: a save that runs out of
    space fails in Orbax's background threads, dozens of tracebacks later."""
    arrays = sum(getattr(x, 'nbytes', 8) for x in jax.tree_util.tree_leaves(payload))
    needed = int(arrays * 1.1) + 2 ** 18  # Orbax's metadata on top of the arrays
    free = shutil.disk_usage(self.directory).free
    if free < needed:
      raise DataError(f'no space left on the disk for checkpoint {step}: it needs about '
                      f'{needed / 1e6:.1f} MB in {self.directory}, {free / 1e6:.1f} MB are free; '
                      "free some (a workdir's compile_cache/ can always be deleted) and run "
                      'again to resume')

  def check_for_errors(self) -> None:
    """Raises the error of an asynchronous save that failed (e.g. on a full disk)."""
    self._manager.check_for_errors()

  def metrics(self, step: int) -> Optional[dict[str, float]]:
    """The metrics saved with checkpoint `step` (None if it was saved without)."""
    return self._manager.metrics(step)

  def restore_latest_readable(self, state: Any, quarantine: bool = True
                              ) -> Optional[tuple[Any, dict]]:
    """(state, loop) of the newest checkpoint that reads back; None when there is none.

    A checkpoint damaged after it was written (truncated, missing or corrupted files) is
    skipped for the one before it; once an older one reads back, the damaged ones are moved
    aside to `<directory>/quarantine/<step>` (with `quarantine`; said in the log), so that
    training writes those steps again. When none reads back, the cause is more likely the
    setup than the files: nothing is moved and the first error is raised as a DataError.
    """
    if quarantine:
      self._quarantine_unlisted()
    damaged: list[tuple[int, str]] = []
    for step in reversed(self.all_steps()):
      restored, error = self._try_restore(state, step)
      if error is not None:
        damaged.append((step, error))
        logging.warning('Checkpoint at step %d is unreadable (%s); trying the one before',
                        step, error)
        continue
      for bad, _ in damaged if quarantine else ():
        logging.warning('Moved the unreadable checkpoint of step %d to %s', bad,
                        self.quarantine(bad))
      return restored
    if damaged:
      step, error = damaged[0]
      if all(LAYOUT_MISMATCH in why for _, why in damaged):  # the run's setup, not the files
        raise ConfigError(
            f'the checkpoints in {self.directory} hold a train state of another layout than '
            "this run's (e.g. train.weight_decay or train.clip_grad_norm turned on or off "
            'since they were written): set those back, or start a new --workdir from their '
            f'weights with train.init_from={self.directory.parent}')
      raise DataError(f'no checkpoint in {self.directory} reads back (step {step}: {error}); '
                      f'if the files are damaged, move them to {self.directory / QUARANTINE} '
                      'to start afresh')
    return None

  def _try_restore(self, state: Any, step: int) -> tuple[Optional[tuple[Any, dict]],
                                                        Optional[str]]:
    """(restored, None), or (None, why not). With several processes they judge together:
    the checksums first (each process reads the files), then the restore, and a checkpoint
    that fails on any process counts as damaged on all, so that none resumes from a step
    the others skip (and none waits in a restore that another never starts)."""
    try:
      self.verify(step)
      error = None
    except Exception as e:  # noqa: BLE001 -- file system errors of many kinds
      error = describe(e)
    if not _everywhere(error is None):
      return None, error or 'its checksums fail on another process'
    restored = None
    try:
      restored = self._restore_verified(state, step)
    except Exception as e:  # noqa: BLE001 -- Orbax and TensorStore raise many kinds
      error = describe(e)
    if not _everywhere(error is None):
      return None, error or 'it does not restore on another process'
    return restored, None

  def _quarantine_unlisted(self) -> None:
    """Moves aside step entries that Orbax cannot even list: a name that is a step number but
    not a readable directory (a file, a dangling link, a link loop). Left in place, one would
    block the save of its step at the end of the run that trains up to it again."""
    if not self.directory.is_dir():
      return
    for entry in sorted(self.directory.iterdir(), key=lambda p: p.name):
      if entry.name.isdigit() and not entry.is_dir():  # is_dir follows links: False for loops
        why = ('a link that leads nowhere' if entry.is_symlink() else 'not a directory')
        logging.warning('Checkpoint at step %s is unreadable (%s); moved it to %s', entry.name,
                        why, self.quarantine(int(entry.name)))

  def quarantine(self, step: int) -> Optional[pathlib.Path]:
    """Moves checkpoint `step` to `<directory>/quarantine/<step>` (process 0 only; the others
    wait for it) and returns where it went."""
    source = self.directory / str(step)
    target = self.directory / QUARANTINE / str(step)
    for n in range(1, 1000):  # quarantined before: keep that copy too
      if not os.path.lexists(target):
        break
      target = self.directory / QUARANTINE / f'{step}.{n}'
    if jax.process_index() == 0 and os.path.lexists(source):  # a link is moved, not followed
      target.parent.mkdir(exist_ok=True)
      os.replace(source, target)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f'quarantine {step}')
    self._manager.reload()
    return target

  def _seal_finished(self) -> None:
    """Writes the checksums of every finished save that has none yet (process 0 only)."""
    if self.read_only or jax.process_index() != 0:
      return
    for step in self._manager.all_steps():
      step_dir = self.directory / str(step)
      if step_dir.is_dir() and not (step_dir / CHECKSUMS).exists():
        write_atomically(step_dir / CHECKSUMS, json.dumps(_digests(step_dir), indent=0))

  def verify(self, step: int) -> None:
    """Raises DataError when a file of checkpoint `step` no longer matches the checksum
    written after its save (Orbax's format checks its index, not every array's bytes)."""
    step_dir = self.directory / str(step)
    sums = step_dir / CHECKSUMS
    if not sums.exists():  # sealed at the next save or at close; older runs had none
      return
    expected, found = json.loads(sums.read_text()), _digests(step_dir)
    changed = sorted(name for name in set(expected) | set(found)
                     if expected.get(name) != found.get(name))
    if changed:
      raise DataError(f'checkpoint {step_dir} does not match its checksums ({len(changed)} '
                      f'file(s) changed or missing, e.g. {changed[0]})')

  def restore(self, state: Any, step: Optional[int] = None) -> tuple[Any, dict]:
    """(state, loop) restored into the structure (and shardings) of `state`; latest step by
    default. The checkpoint's checksums are verified first."""
    step = self.latest_step() if step is None else step
    self.verify(step)
    return self._restore_verified(state, step)

  def _restore_verified(self, state: Any, step: int) -> tuple[Any, dict]:
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, _payload(state))
    abstract['loop'] = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct,
                                              loop_state(0, jax.random.key(0)))
    # train.ema_decay may have been turned on or off since this checkpoint was written: an
    # average it lacks starts from its parameters, one it has that is not wanted is dropped.
    stored = set(self._manager.item_metadata(step).keys())
    wanted = abstract.pop('ema', None)
    if 'ema' in stored:
      abstract['ema'] = abstract['params']
    restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
    loop = jax.tree_util.tree_map(np.asarray, restored.pop('loop'))
    ema = restored.pop('ema', None)
    if wanted is not None:  # a copy, never the parameters' own buffers (see create_train_state)
      restored['ema'] = jax.tree_util.tree_map(jnp.copy, restored['params']) if ema is None else ema
    return state.replace(**restored), loop

  def restore_params(self, step: int, ema: bool = True) -> Any:
    """Only the parameters of checkpoint `step`, as host arrays (no optimizer needed): their
    moving average when the checkpoint has one (train.ema_decay) and `ema`, else the raw ones.

    The target is built from the checkpoint's own metadata on one local device, so a
    checkpoint written by any number of devices or hosts restores here.
    """
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    restored = self._read_params(step, ema, lambda metadata: jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata))
    return jax.tree_util.tree_map(np.asarray, restored)

  def restore_params_like(self, step: int, like: Any, ema: bool = True) -> Any:
    """`restore_params` read straight into the shapes, dtypes and shardings of the arrays
    `like` (e.g. a fresh state's parameters on a mesh): no whole copy on one device."""
    return self._read_params(step, ema, lambda _: jax.tree_util.tree_map(
        ocp.utils.to_shape_dtype_struct, like))

  def _read_params(self, step: int, ema: bool, target: Callable[[Any], Any]) -> Any:
    """The parameters (or their moving average) of checkpoint `step`, restored into
    `target(metadata)`, a tree of ShapeDtypeStructs built from the stored tree's metadata."""
    self.verify(step)
    metadata = self._manager.item_metadata(step)
    name = 'ema' if ema and 'ema' in metadata.keys() else 'params'
    abstract = {name: target(metadata[name])}
    # Only this part of the tree is read (the Adam moments are twice its size): much less
    # than a whole restore, which would be most of decode.py's start for a small model.
    reader = ocp.PyTreeCheckpointer()
    try:
      restored = reader.restore(self.directory / str(step) / ITEM, args=ocp.args.PyTreeRestore(
          abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
          partial_restore=True))
    finally:
      reader.close()
    return restored[name]

  def param_shapes(self, step: int) -> Any:
    """The parameters' tree of checkpoint `step` as array metadata (`.shape`, `.dtype`),
    read without their values."""
    return self._manager.item_metadata(step)['params']

  def has_ema(self, step: int) -> bool:
    """Whether checkpoint `step` holds a moving average of the parameters."""
    return 'ema' in self._manager.item_metadata(step).keys()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._seal_finished()
    self._manager.close()


def _everywhere(ok: bool) -> bool:
  """True when `ok` holds on every process (one process: `ok` itself)."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils
  return bool(np.all(multihost_utils.process_allgather(np.array(ok))))


def _digests(step_dir: pathlib.Path) -> dict[str, str]:
  """SHA-256 of every file of a checkpoint directory but the checksum file itself."""
  return {str(p.relative_to(step_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(step_dir.rglob('*')) if p.is_file() and p.name != CHECKSUMS}


def describe(error: Exception) -> str:
  """The first line of a restore error, short: Orbax and TensorStore errors run to pages."""
  first = str(error).strip().splitlines()[0] if str(error).strip() else ''
  return f'{type(error).__name__}: {first[:200]}'


def loop_state(data_position: int, dropout_key: jax.Array) -> dict[str, np.ndarray]:
  """The training loop's state besides the train state, as host arrays for a checkpoint."""
  return {'data_position': np.asarray(data_position, np.int32),
          'dropout_key': np.asarray(jax.random.key_data(dropout_key))}


def _payload(state: Any) -> dict:
  payload = {'params': state.params, 'opt_state': state.opt_state, 'step': state.step}
  if getattr(state, 'ema', None) is not None:
    payload['ema'] = state.ema
  return payload

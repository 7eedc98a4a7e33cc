"""Data parallelism with jit over a device mesh (what pmap has become).

One mesh axis, 'data', spans every device of every process. Batches are split along their
rows over it; parameters and optimizer state are replicated, so XLA inserts the gradient
all-reduce that pmap users wrote by hand as `lax.pmean`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = 'data'


def data_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A 1-D mesh over `devices` (default: all devices of all processes)."""
  return Mesh(np.asarray(devices if devices is not None else jax.devices()), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows split over the data axis, the rest of each array kept whole."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Places a pytree (e.g. the train state) on every device of the mesh."""
  return jax.device_put(tree, replicated(mesh))


def fsdp_shardings(tree: Any, mesh: Mesh, min_size: int = 2 ** 14) -> Any:
  """FSDP-style placement: each array of at least `min_size` elements is split over the data
  axis along its largest dimension that the mesh divides; smaller ones are replicated.

  Each device then holds 1/N of the parameters and Adam moments; XLA all-gathers a weight
  where a layer needs it and reduce-scatters its gradient (ZeRO-3 in effect).
  """
  def place(x: Any) -> NamedSharding:
    shape = getattr(x, 'shape', ())
    if int(np.prod(shape)) < min_size:
      return replicated(mesh)
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
      if shape[dim] % mesh.size == 0:
        spec = [None] * len(shape)
        spec[dim] = DATA_AXIS
        return NamedSharding(mesh, PartitionSpec(*spec))
    return replicated(mesh)
  return jax.tree_util.tree_map(place, tree)


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Host arrays [B_local, ...] of this process -> global arrays [B_local * processes, ...]
  split over the data axis. B_local must be a multiple of this process's device count."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


def process_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's contiguous share of a global host batch's rows.

  Every process plans the same global batches (same seed); each feeds only its slice to
  `shard_batch`, so the global array equals the single-process batch.
  """
  count, index = jax.process_count(), jax.process_index()
  if count == 1:
    return batch
  rows = next(iter(batch.values())).shape[0] // count
  return {k: v[index * rows:(index + 1) * rows] for k, v in batch.items()}


def local_copy(tree: Any) -> Any:
  """Host copy of a pytree, readable in every process (e.g. for evaluation); sharded arrays
  (FSDP) are gathered first."""
  def copy(x: Any) -> Any:
    if not isinstance(x, jax.Array):
      return x
    if x.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    if x.is_fully_addressable:
      return np.asarray(x)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return jax.tree_util.tree_map(copy, tree)


def barrier(name: str) -> None:
  """Waits until every process gets here (no-op with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def is_leader() -> bool:
  """Process 0 writes shared files (tokenizer, config, metrics) for everyone."""
  return jax.process_index() == 0


def initialize_distributed(coordinator_address: str, num_processes: int, process_id: int,
                           auto: bool = False) -> None:
  """Starts multi-process JAX before any other JAX call.

  With a coordinator address, the process count and id come from the arguments (a cluster
  or localhost); with `auto`, JAX detects them (TPU pods, SLURM, Open MPI). CPU processes use
  gloo collectives.
  """
  if not coordinator_address and not auto:
    return
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if auto:
    jax.distributed.initialize()
  else:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)

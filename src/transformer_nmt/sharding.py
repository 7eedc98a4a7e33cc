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


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Host arrays [B_local, ...] of this process -> global arrays [B_local * processes, ...]
  split over the data axis. B_local must be a multiple of this process's device count."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}

"""Data parallelism and FSDP with jit over a device mesh (what pmap has become).

The mesh has two axes, `data` x `fsdp`, over every device of every process. Batches are split
along their rows over both. Plain data parallelism (the default) is the mesh [N, 1]: parameters
and optimizer state are replicated, and XLA inserts the gradient all-reduce that pmap users
wrote by hand as `lax.pmean`. FSDP (ZeRO-3) is the mesh [N / F, F]: every large parameter and
its Adam moments are split over the F devices of the `fsdp` axis; the train step gathers the
weights (in the compute dtype) where the model uses them and reduce-scatters their float32
gradients (`gather_weights`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_nmt.errors import ConfigError, UserError

DATA_AXIS, FSDP_AXIS = 'data', 'fsdp'
BATCH_AXES = (DATA_AXIS, FSDP_AXIS)  # batch rows are split over the whole mesh


def device_mesh(devices: Optional[Sequence[jax.Device]] = None, fsdp: int = 1) -> Mesh:
  """The [data, fsdp] mesh over `devices` (default: all devices of all processes), with
  `fsdp` devices on the parameter-splitting axis (1 = plain data parallelism)."""
  devices = list(devices if devices is not None else jax.devices())
  if fsdp < 1 or len(devices) % fsdp:
    raise ConfigError(f'train.fsdp_devices={fsdp} must divide the {len(devices)} devices')
  shape = (len(devices) // fsdp, fsdp)
  try:  # on TPUs, neighbours on the interconnect become neighbours on the fsdp axis
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, (DATA_AXIS, FSDP_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows split over the whole mesh (both axes), the rest of each array kept whole."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def fsdp_shardings(tree: Any, mesh: Mesh, min_size: int = 2 ** 14) -> Any:
  """FSDP placement: each array of at least `min_size` elements is split over the `fsdp` axis
  along its largest dimension that the axis divides; smaller ones are replicated.

  Each device then holds 1/F of the parameters and Adam moments (ZeRO-3); the train step
  gathers the weights where the model needs them (`gather_weights`).
  """
  size = mesh.shape[FSDP_AXIS]

  def place(x: Any) -> NamedSharding:
    shape = getattr(x, 'shape', ())
    if size == 1 or int(np.prod(shape)) < min_size:
      return replicated(mesh)
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
      if shape[dim] % size == 0:
        spec = [None] * len(shape)
        spec[dim] = FSDP_AXIS
        return NamedSharding(mesh, PartitionSpec(*spec))
    return replicated(mesh)
  return jax.tree_util.tree_map(place, tree)


def gather_weights(params: Any, shardings: Any, compute_dtype: Any) -> Any:
  """FSDP inside a jitted step: the parameters, whole on every device, for the forward pass.

  Left to itself, XLA's partitioner meets a weight split over `fsdp` and a batch split over
  the same devices by moving the activations ([B, L, D], even the [B, L, V] logits) between
  devices. Gathering each weight explicitly keeps the batch where it is: matrices travel in
  the compute dtype (half the bytes in bfloat16; the model casts them to it anyway) and
  vectors (biases, LayerNorm) in float32. The gradient of the gather is a float32
  reduction back to the parameter's own sharding (a reduce-scatter, or on large TPU slices an
  all-reduce and a slice, as XLA chooses): one cross-device reduction per parameter, in
  float32, whatever the compute dtype.

  Args:
    params: float32 parameter pytree, placed by `shardings` (e.g. `fsdp_shardings`).
    shardings: NamedSharding pytree matching `params`.
    compute_dtype: the model's compute dtype.
  """
  def gather(x: jax.Array, own: NamedSharding) -> jax.Array:
    if own.is_fully_replicated:
      return x
    travel = jnp.dtype(compute_dtype) if x.ndim >= 2 else x.dtype
    return _gather(x, own, replicated(own.mesh), travel)
  return jax.tree_util.tree_map(gather, params, shardings)


def per_shard_tables(params: Any, mesh: Mesh) -> Any:
  """Each embedding table [V, D] as [N, V, D], one copy per batch shard of the mesh (see
  `layers.per_shard`): a shared table's gradient is then reduced across devices once, not
  once per use. The price is one more copy of the table per device among the step's
  temporaries."""
  n = mesh.size

  def expand(path: tuple, x: jax.Array) -> jax.Array:
    if n == 1 or getattr(path[-1], 'key', None) != 'embedding':
      return x
    copies = jnp.broadcast_to(x[None], (n,) + x.shape)
    return jax.lax.with_sharding_constraint(copies, NamedSharding(mesh, PartitionSpec(BATCH_AXES)))
  return jax.tree_util.tree_map_with_path(expand, params)


def params_for_compute(mesh: Mesh, shardings: Any, compute_dtype: Any) -> Callable[[Any], Any]:
  """The train step's view of its parameters: FSDP's gathered weights (`gather_weights`,
  when the mesh has an fsdp axis) with per-shard embedding tables (`per_shard_tables`)."""
  def prepare(params: Any) -> Any:
    if mesh.shape[FSDP_AXIS] > 1:
      params = gather_weights(params, shardings, compute_dtype)
    return per_shard_tables(params, mesh)
  return prepare


def _gather(x: jax.Array, own: NamedSharding, whole: NamedSharding, travel: Any) -> jax.Array:
  # XLA's GPU pipeline allows excess precision and folds the round trip f32 -> bf16 -> f32
  # away, gathering float32 (twice the bytes); a barrier on the gathered value keeps it. The
  # TPU compiler keeps the round trip by itself, and schedules better without the barrier.
  on_gpu = own.mesh.devices.flat[0].platform == 'gpu'

  @jax.custom_vjp
  def gathered(x: jax.Array) -> jax.Array:
    whole_x = jax.lax.with_sharding_constraint(x.astype(travel), whole)
    return (jax.lax.optimization_barrier(whole_x) if on_gpu else whole_x).astype(x.dtype)

  def forward(x: jax.Array) -> tuple[jax.Array, None]:
    return gathered(x), None

  def backward(_: None, g: jax.Array) -> tuple[jax.Array]:
    return (jax.lax.with_sharding_constraint(g.astype(x.dtype), own),)

  gathered.defvjp(forward, backward)
  return gathered(x)


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Host arrays [B_local, ...] of this process -> global arrays [B_local * processes, ...]
  split over the data axis. B_local must be a multiple of this process's device count."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}


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


def on_leader(action: Callable[[], Any]) -> None:
  """Runs `action` on process 0 only; a UserError it raises is raised on every process, so
  that a refusal there (a busy workdir, another model's checkpoints) stops all processes
  instead of leaving the others waiting for process 0 at their next collective."""
  message, refusal = '', None
  if is_leader():
    try:
      action()
    except UserError as e:
      message, refusal = str(e), e
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    raw = np.zeros(4096, np.uint8)
    encoded = np.frombuffer(message.encode()[:4096], np.uint8)
    raw[:len(encoded)] = encoded
    message = bytes(multihost_utils.broadcast_one_to_all(raw)).rstrip(b'\0').decode(
        errors='replace')
  if refusal is not None:
    raise refusal
  if message:
    raise UserError(message)


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

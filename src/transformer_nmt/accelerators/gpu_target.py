"""GPU target configs: XLA's description of a GPU (SMs, memory, clocks, compute capability,
CUDA and cuDNN versions), which lets XLA compile GPU programs on a machine without one
(aot.py). The project ships them in gpu_targets/; `write_attached` writes the one of the GPU
at hand, for the first run on a new kind of card to replace a hand-written one.
"""

from __future__ import annotations

import importlib.resources
from typing import Any


def config(kind: str) -> str:
  """The GpuTargetConfigProto text the project ships for a GPU kind ('h100')."""
  shipped = importlib.resources.files('transformer_nmt.accelerators') / 'gpu_targets'
  return (shipped / f'{kind}.txtpb').read_text()


# cudaDeviceAttr numbers (CUDA runtime API): the clocks and bus width left cudaDeviceProp in
# CUDA 13 but stay attributes.
_CLOCK_KHZ, _MEMORY_CLOCK_KHZ, _BUS_BITS = 13, 36, 37


def config_of(props: dict[str, Any], clock_khz: int, memory_clock_khz: int, bus_bits: int,
              dnn: tuple[int, int], runtime: tuple[int, int], name: str) -> str:
  """XLA's GpuTargetConfigProto in text form for a CUDA device, from its cudaDeviceProp
  fields (as cupy.cuda.runtime.getDeviceProperties gives them), clocks, memory bus width,
  and the cuDNN and CUDA runtime versions. jax has no call that returns the target config of
  an attached GPU, so the GPU benchmark script assembles it from the card (for gpu_targets/)."""
  grid = props['maxGridSize']
  fpus = 128 if props['major'] >= 8 else 64  # FP32 lanes per SM: Ampere/Hopper 128, Volta 64
  bandwidth = 2 * memory_clock_khz * 1000 * bus_bits // 8  # double data rate
  return '\n'.join([
      'gpu_device_info {',
      f"  threads_per_block_limit: {props['maxThreadsPerBlock']}",
      f"  threads_per_warp: {props['warpSize']}",
      f"  shared_memory_per_block: {props['sharedMemPerBlock']}",
      f"  shared_memory_per_core: {props['sharedMemPerMultiprocessor']}",
      f"  threads_per_core_limit: {props['maxThreadsPerMultiProcessor']}",
      f"  core_count: {props['multiProcessorCount']}",
      f'  fpus_per_core: {fpus}',
      f'  block_dim_limit_x: {grid[0]}', f'  block_dim_limit_y: {grid[1]}',
      f'  block_dim_limit_z: {grid[2]}',
      f'  memory_bandwidth: {bandwidth}',
      f"  l2_cache_size: {props['l2CacheSize']}",
      f'  clock_rate_ghz: {clock_khz / 1e6:g}',
      f"  device_memory_size: {props['totalGlobalMem']}",
      f"  shared_memory_per_block_optin: {props['sharedMemPerBlockOptin']}",
      f"  cuda_compute_capability {{ major: {props['major']} minor: {props['minor']} }}",
      f"  registers_per_core_limit: {props['regsPerMultiprocessor']}",
      f"  registers_per_block_limit: {props['regsPerBlock']}",
      '}', 'platform_name: "CUDA"',
      f'dnn_version_info {{ major: {dnn[0]} minor: {dnn[1]} }}',
      f'runtime_version {{ major: {runtime[0]} minor: {runtime[1]} }}',
      f'device_description_str: "{name}"', ''])


def write_attached(path: str) -> None:
  """The attached GPU's target config (`config_of`), read through cupy and jax's CUDA
  version helpers, into `path`."""
  import cupy  # on GPU machines only
  from jax._src.lib import cuda_versions  # the CUDA plugin's version helpers
  if cuda_versions is None:
    raise RuntimeError('jax has no CUDA plugin')
  rt = cupy.cuda.runtime
  props = rt.getDeviceProperties(0)
  name = props['name'].decode() if isinstance(props['name'], bytes) else props['name']
  dnn, cuda = cuda_versions.cudnn_get_version(), cuda_versions.cuda_runtime_get_version()
  text = config_of(props, rt.deviceGetAttribute(_CLOCK_KHZ, 0),
                   rt.deviceGetAttribute(_MEMORY_CLOCK_KHZ, 0), rt.deviceGetAttribute(_BUS_BITS, 0),
                   (dnn // 10000, dnn // 100 % 100), (cuda // 1000, cuda // 10 % 100), name)
  with open(path, 'w') as f:
    f.write(text)

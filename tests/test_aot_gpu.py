"""GPU programs compiled on this CPU (the CUDA plugin without CUDA libraries, from
requirements-dev.txt, and the H100 target config the project ships): data parallelism reduces
float32 gradients, FSDP gathers weights in the compute dtype (XLA's GPU compiler would
otherwise fold the bfloat16 round trip away and gather float32), aot_compile.py end to end.
Tiny shapes on 2 and 8 GPUs."""

import json

import pytest

pytest.importorskip('jax_plugins.xla_cuda12',
                    reason='needs the CUDA plugin: pip install -r requirements-dev.txt')

from test_aot import (  # noqa: E402,I001
    D_MODEL, LENGTH, ROWS, VOCAB, _activation_like, _aot, _config, _param_shapes)

from transformer_nmt.accelerators import aot, gpu_target  # noqa: E402
from transformer_nmt.errors import UserError  # noqa: E402


def _compiled(topology: str, shard_params: bool):
  devices, chip = aot.topology_devices(topology)
  assert chip.gpu and all('H100' in d.device_kind for d in devices)
  program = aot.train_program(_config(shard_params), devices, ROWS, LENGTH)
  return program, program.lowered.compile()


def test_gpu_topology_names_hosts_and_devices():
  devices, chip = aot.topology_devices('h100:2x4')
  assert len(devices) == 8 and sorted({d.process_index for d in devices}) == [0, 1]
  assert chip.hbm_bytes > 79 * 2 ** 30 and chip.name == 'NVIDIA H100 80GB'


@pytest.mark.slow
def test_gpu_data_parallel_reduces_float32_gradients_once():
  _, compiled = _compiled('h100:2', False)
  found = aot.collectives(compiled.as_text())
  assert {c.kind for c in found} == {'all-reduce'}, found
  arrays = [a for c in found for a in c.arrays]
  assert all(dtype == 'f32' for dtype, _ in arrays), arrays
  assert not any(_activation_like(shape) for _, shape in arrays), arrays
  assert compiled.memory_analysis().argument_size_in_bytes > 0


@pytest.mark.slow
def test_gpu_fsdp_gathers_weights_in_bfloat16_and_reduce_scatters_float32():
  program, compiled = _compiled('h100:8', True)
  found = aot.collectives(compiled.as_text())
  params = _param_shapes()
  gathers = [a for c in found if c.kind == 'all-gather' for a in c.arrays]
  scatters = [a for c in found if c.kind == 'reduce-scatter' for a in c.arrays]
  whole = [a for a in gathers if a[1] in params]
  assert whole and scatters
  assert all(dtype == 'bf16' for dtype, _ in gathers), gathers  # the compute dtype, not f32
  assert all(dtype == 'f32' and shape in params for dtype, shape in scatters), scatters
  split = sum(1 for s in params if s[0] * (s[1] if len(s) > 1 else 1) >= 2 ** 14)
  assert len(whole) == split, (len(whole), split)  # each split weight gathered once
  assert (VOCAB, D_MODEL) in [shape for _, shape in whole]
  moved = [a for c in found for a in c.arrays]
  assert not any(_activation_like(shape) for _, shape in moved), moved


def test_missing_cuda_plugin_is_one_line(monkeypatch):
  from jax.experimental import topologies

  def missing(**_):
    raise NotImplementedError('topology not implemented for cuda')
  monkeypatch.setattr(topologies, 'get_topology_desc', missing)
  with pytest.raises(UserError, match=r'h100:8 needs the CUDA plugin .*jax-cuda12-plugin=='):
    aot.topology_devices('h100:8')


@pytest.mark.slow
def test_aot_compile_gpu_report():
  result = _aot('--topology', 'h100:2', '--batch', '8', '--length', '16')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'train step on h100:2 (2 x NVIDIA H100 80GB), global batch 8 x 16' in result.stdout
  assert 'of 79.10 GiB HBM' in result.stdout and 'all-reduce: 1 ops' in result.stdout
  assert 'XLA_PYTHON_CLIENT_MEM_FRACTION' in result.stdout
  assert 'no FLOP count or step time' in result.stdout
  report = json.loads(_aot('--topology', 'h100:2', '--batch', '8', '--length', '16',
                           '--json').stdout)
  assert report['gpu'] and report['chips'] == 2 and report['step'] == {}
  assert report['memory']['total'] > report['memory']['argument'] > 0


@pytest.mark.slow
def test_aot_compile_gpu_decode():
  result = _aot('--topology', 'h100:2', '--batch', '4', '--length', '12', '--decode', '--json')
  assert result.returncode == 0, result.stderr[-3000:]
  encoder, step = json.loads(result.stdout)
  assert (encoder['program'], step['program']) == ('encoder', 'decoder step')
  assert step['memory']['argument'] > 0 and encoder['chip'] == 'NVIDIA H100 80GB'


@pytest.mark.slow
def test_aot_compile_refuses_a_model_too_large_for_80_gb():
  result = _aot('--topology', 'h100:2', '--batch', '8', '--length', '16',
                '--config.model.d_model=16384', '--config.model.d_ff=65536')
  assert result.returncode == 1, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and 'GiB over the budget of 79.10 GiB' in errors[0], result.stderr
  assert 'Traceback' not in result.stderr


@pytest.mark.parametrize('topology', ['h100:0', 'a100:8', 'h100:2x2x2'])
def test_aot_compile_bad_gpu_topology_is_one_line(topology):
  result = _aot('--topology', topology)
  assert result.returncode == 2, result.stderr[-3000:]
  line = [x for x in result.stderr.splitlines() if x.startswith('error:')]
  assert len(line) == 1 and 'h100:8x8' in line[0], result.stderr
  assert 'Traceback' not in result.stderr


H100_PROPERTIES = dict(  # cudaDeviceProp of an H100 SXM, as cupy gives it
    maxThreadsPerBlock=1024, warpSize=32, sharedMemPerBlock=49152,
    sharedMemPerMultiprocessor=233472, maxThreadsPerMultiProcessor=2048, multiProcessorCount=132,
    maxGridSize=(2147483647, 65535, 65535), l2CacheSize=52428800, totalGlobalMem=84929347584,
    sharedMemPerBlockOptin=232448, major=9, minor=0, regsPerMultiprocessor=65536,
    regsPerBlock=65536)


def _fields(text: str) -> list[tuple[str, str]]:
  """(name, value) of every field in order, a minor version of 0 (the default) left out."""
  import re
  text = re.sub(r'#.*', '', text)
  return [f for f in re.findall(r'(\w+): ("[^"]*"|[\d.]+)', text) if f != ('minor', '0')]


def test_target_config_from_device_properties_compiles_and_matches_the_shipped_one():
  import jax
  import jax.numpy as jnp
  from jax.experimental import topologies
  text = gpu_target.config_of(H100_PROPERTIES, 1_980_000, 2_619_000, 5120, (9, 8), (12, 8),
                                  'NVIDIA H100 80GB HBM3')
  # memory_bandwidth: 2 x 2619 MHz x 5120 bits = 3.35232 TB/s
  assert _fields(text) == _fields(gpu_target.config('h100'))
  devices = topologies.get_topology_desc(platform='cuda', target_config=text,
                                         topology='1x1x1').devices
  x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16,
                           sharding=jax.sharding.SingleDeviceSharding(devices[0]))
  assert jax.jit(lambda a: a @ a).lower(x).compile().memory_analysis().output_size_in_bytes > 0

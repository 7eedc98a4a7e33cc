"""Data parallelism over 8 simulated CPU devices (run in subprocesses: the device count is
fixed when JAX starts)."""

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

EIGHT_DEVICES = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8',
                     JAX_PLATFORMS='cpu')

SAME_STEP_ON_1_AND_8_DEVICES = r'''
import jax, numpy as np
from transformer_nmt import ModelConfig, create_train_state, sharding
from transformer_nmt.config import TrainConfig
from transformer_nmt.training import jitted

assert jax.device_count() == 8, jax.devices()
cfg = ModelConfig(vocab_size=40, num_layers=1, d_model=32, d_ff=64, num_heads=4,
                  residual_dropout=0.1, embedding_dropout=0.1, attention_dropout=0.1)
train = TrainConfig(warmup_steps=10)  # Adam 0.9 / 0.98 / 1e-9, label smoothing 0.1: the paper's
rng = np.random.default_rng(0)
lengths = rng.integers(2, 9, size=16)
segments = (np.arange(9)[None] < lengths[:, None]).astype(np.int32)
ids = np.where(segments > 0, rng.integers(4, 40, size=(16, 9)), 0).astype(np.int32)
positions = np.broadcast_to(np.arange(9), (16, 9)).astype(np.int32)
batch = dict(src=ids, src_segments=segments, src_positions=positions, tgt_in=ids,
             tgt_out=ids, tgt_segments=segments, tgt_positions=positions)
params = []
for devices, fsdp in ((jax.devices()[:1], False), (jax.devices(), False), (jax.devices(), True)):
  mesh = sharding.device_mesh(devices, fsdp=len(devices) if fsdp else 1)
  state = create_train_state(cfg, train, jax.random.key(0))
  placement = (sharding.fsdp_shardings(state, mesh, min_size=64) if fsdp else
               jitted.state_shardings(state, mesh))
  step = jitted.jit_steps(cfg, train, mesh, placement, donate=False)['train']  # train.py's step
  state = jax.device_put(state, placement)
  for _ in range(2):
    global_batch = sharding.shard_batch(batch, mesh)
    state, metrics = step(state, global_batch, jax.random.key(1))
  shards = len(global_batch['src'].addressable_shards)
  kernel = state.params['encoder_layers_0']['ffn']['wi']['kernel']  # [32, 64]
  mu = state.opt_state[0].mu['encoder_layers_0']['ffn']['wi']['kernel']
  print('devices', len(devices), 'fsdp', fsdp, 'shards', shards, 'kernel shard',
        kernel.addressable_shards[0].data.shape, 'adam shard', mu.addressable_shards[0].data.shape,
        'loss', float(metrics['loss']))
  params.append(sharding.local_copy(state.params))
for other in params[1:]:
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4),
                         params[0], other)
print('SAME')
'''


@pytest.mark.slow
def test_steps_on_8_devices_replicated_or_fsdp_equal_1_device():
  result = subprocess.run([sys.executable, '-c', SAME_STEP_ON_1_AND_8_DEVICES], cwd=ROOT,
                          env=EIGHT_DEVICES, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'devices 8 fsdp False shards 8 kernel shard (32, 64)' in result.stdout, result.stdout
  # FSDP: each device holds 1/8 of the kernel and of its Adam moment, on the larger axis
  assert 'devices 8 fsdp True shards 8 kernel shard (32, 8) adam shard (32, 8)' in result.stdout
  assert 'SAME' in result.stdout, result.stdout


@pytest.mark.slow
def test_train_py_runs_fsdp_on_8_devices_with_packing(tmp_path):
  model = ['--config.model.d_model=128', '--config.model.d_ff=256']  # arrays worth splitting
  result = subprocess.run([sys.executable, 'train.py', '--config', 'configs/tiny.py', '--workdir',
                           str(tmp_path / 'run'), '--config.train.num_steps=10',
                           '--config.data.pack_length=48', '--config.train.shard_params=True',
                           *model], cwd=ROOT,
                          env=EIGHT_DEVICES, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Data parallel over 8 devices' in result.stderr
  assert re.search(r'FSDP: [1-9]\d* of \d+ state arrays split over 8 devices', result.stderr)
  assert 'step 10/10' in result.stderr and 'eval at step 10' in result.stderr
  # A checkpoint written by 8 devices restores on 1: for decoding, and for resuming training.
  single = dict(os.environ, JAX_PLATFORMS='cpu')
  single.pop('XLA_FLAGS', None)
  decoded = subprocess.run([sys.executable, 'decode.py', '--workdir', str(tmp_path / 'run'),
                            '--beam_size', '2', '--max_extra_len', '4'], cwd=ROOT, env=single,
                           input='I see two red apples.\n', capture_output=True, text=True,
                           timeout=300)
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  assert 'sentences/s' in decoded.stderr
  resumed = subprocess.run([sys.executable, 'train.py', '--config', 'configs/tiny.py',
                            '--workdir', str(tmp_path / 'run'), '--config.train.num_steps=12',
                            '--config.eval.bleu_sentences=0', *model],  # decoded above
                           cwd=ROOT, env=single, capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'Resumed from checkpoint at step 10' in resumed.stderr


def test_device_mesh_axes_and_a_bad_fsdp_size():
  import jax

  from transformer_nmt import ConfigError, sharding
  mesh = sharding.device_mesh(jax.devices()[:1])
  assert mesh.axis_names == ('data', 'fsdp') and mesh.devices.shape == (1, 1)
  with pytest.raises(ConfigError, match='train.fsdp_devices=2 must divide the 1 devices'):
    sharding.device_mesh(jax.devices()[:1], fsdp=2)

"""Step time of one global batch on 1 device against N simulated CPU devices (and FSDP).

  python bench/data_parallel.py --devices 8 --steps 10

Each setting runs in its own process (the device count is fixed when JAX starts) on the same
global batch as bench/train.py. Simulated devices share the same cores, so this measures the
overhead of the sharded program (collectives, partitioning), not a speed-up.
"""

import json
import os
import pathlib
import statistics
import subprocess
import sys

from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]

_DEVICES = flags.DEFINE_integer('devices', 8, 'Simulated devices to compare with one.')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps per setting.')
_CONFIG = flags.DEFINE_string('config', 'configs/small.py', 'Config file (model section).')
_BATCH = flags.DEFINE_integer('batch', 64, 'Rows per global batch.')
_LENGTH = flags.DEFINE_integer('length', 24, 'Padded length.')
_CHILD = flags.DEFINE_string('child', None, 'Internal: replicated or fsdp.')

CHILD = r'''
import json, sys, time
sys.path.insert(0, '.'); sys.path.insert(0, 'bench')  # bench/train.py, not train.py
import jax
from absl import flags
import train as bench_train
flags.FLAGS(['x', '--config', sys.argv[1], '--batch', sys.argv[2], '--length', sys.argv[3]])
from transformer_nmt import sharding
from transformer_nmt.config import TrainConfig
from transformer_nmt.training import jitted
from transformer_nmt.training.state import create_train_state
from transformer_nmt.typed_config import model_config_from_dict
m = bench_train.model_section()
cfg = model_config_from_dict({k: v for k, v in m.items() if k != 'vocab_size'},
                             vocab_size=m['vocab_size'], src_vocab_size=m['vocab_size'])
t = TrainConfig()  # the paper's: warmup 4000, Adam 0.9 / 0.98 / 1e-9, label smoothing 0.1
fsdp = sys.argv[4] == 'fsdp'
mesh = sharding.device_mesh(fsdp=jax.device_count() if fsdp else 1)
state = create_train_state(cfg, t, jax.random.key(0))
placement = jitted.state_shardings(state, mesh)
state = jax.device_put(state, placement)
batch = sharding.shard_batch(bench_train.numpy_batch(m['vocab_size']), mesh)
step = jitted.jit_steps(cfg, t, mesh, placement, donate=False)['train']
t0 = time.perf_counter()
state, metrics = step(state, batch, jax.random.key(1)); jax.block_until_ready(metrics)
first = time.perf_counter() - t0
times = []
for _ in range(int(sys.argv[5])):
  t0 = time.perf_counter()
  state, metrics = step(state, batch, jax.random.key(1)); jax.block_until_ready(metrics)
  times.append(time.perf_counter() - t0)
print('RESULT ' + json.dumps({'devices': jax.device_count(), 'first': first, 'times': times}))
'''


def run(devices: int, mode: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
  proc = subprocess.run([sys.executable, '-c', CHILD, _CONFIG.value, str(_BATCH.value),
                         str(_LENGTH.value), mode, str(_STEPS.value)], cwd=ROOT, env=env,
                        capture_output=True, text=True)
  lines = [line for line in proc.stdout.splitlines() if line.startswith('RESULT ')]
  if proc.returncode or not lines:
    raise SystemExit(f'{devices} devices, {mode}: failed\n{proc.stderr[-2000:]}')
  return json.loads(lines[-1][len('RESULT '):])


def main(argv: list[str]) -> None:
  del argv
  rows = []
  for devices, mode in ((1, 'replicated'), (_DEVICES.value, 'replicated'),
                        (_DEVICES.value, 'fsdp')):
    r = run(devices, mode)
    rows.append((devices, mode, statistics.median(r['times']), r['first']))
  base = rows[0][2]
  print(f'{_CONFIG.value}, global batch {_BATCH.value} x {_LENGTH.value}, {_STEPS.value} steps, '
        f'{os.cpu_count()} cores\n\n| devices | parameters | step ms (median) | vs 1 device | '
        'first step s |\n| ---: | --- | ---: | ---: | ---: |')
  for devices, mode, median, first in rows:
    print(f'| {devices} | {mode} | {1e3 * median:.0f} | {median / base:.2f}x | {first:.1f} |')


if __name__ == '__main__':
  app.run(main)

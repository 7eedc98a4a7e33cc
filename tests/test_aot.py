"""TPU programs compiled on this CPU (libtpu from requirements-dev.txt): the train step's
cross-chip reductions are float32, data parallelism moves no activations, FSDP gathers weights
and reduce-scatters gradients; aot_compile.py end to end. Tiny shapes on small slices."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

pytest.importorskip('libtpu', reason='needs libtpu: pip install -r requirements-dev.txt')
for name, value in (('TPU_ACCELERATOR_TYPE', 'v5litepod-4'), ('TPU_SKIP_MDS_QUERY', '1'),
                    ('TPU_WORKER_HOSTNAMES', 'localhost'),  # quiet libtpu's host probing
                    ('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')):  # aot_compile.py runs beside us
  os.environ.setdefault(name, value)

from configs import tiny  # noqa: E402
from transformer_nmt.accelerators import aot  # noqa: E402
from transformer_nmt.typed_config import validate_config  # noqa: E402

ROWS, LENGTH = 48, 20  # global rows (12 or 6 per chip) x tokens: no weight has these dims
VOCAB, D_MODEL, D_FF = 1024, 128, 256


def _config(shard_params: bool, dtype: str = 'bfloat16'):
  c = tiny.get_config()
  c.model.update(d_model=D_MODEL, d_ff=D_FF, num_heads=4, dtype=dtype)
  c.data.vocab_size = VOCAB
  c.train.shard_params = shard_params
  return validate_config(c)


def _compiled(topology: str, shard_params: bool):
  devices, _ = aot.topology_devices(topology)
  program = aot.train_program(_config(shard_params), devices, ROWS, LENGTH)
  return program, program.lowered.compile()


@pytest.fixture(scope='module')
def data_parallel():
  return _compiled('v5e:2x2', False)


@pytest.fixture(scope='module')
def fsdp_8():
  return _compiled('v5e:2x4', True), _compiled('v5e:2x4', False)


def _param_shapes() -> list[tuple[int, ...]]:
  import jax

  from transformer_nmt.model.transformer import init_params
  cfg = aot._model_config(_config(False))
  params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  return [tuple(x.shape) for x in jax.tree_util.tree_leaves(params)]


def _activation_like(shape: tuple[int, ...]) -> bool:
  """[batch rows (global or per chip), length, ...]-shaped, in any order."""
  return LENGTH in shape or any(rows in shape for rows in (ROWS, ROWS // 4, ROWS // 8))


@pytest.mark.slow
def test_data_parallel_reduces_gradients_once_in_float32(data_parallel):
  _, compiled = data_parallel
  found = aot.collectives(compiled.as_text())
  assert found, 'a data-parallel step must reduce its gradients across chips'
  reductions = [c for c in found if c.kind in ('all-reduce', 'reduce-scatter')]
  assert {c.kind for c in found} == {'all-reduce'}  # nothing gathered or permuted
  arrays = [a for c in reductions for a in c.arrays]
  assert all(dtype == 'f32' for dtype, _ in arrays), arrays
  assert not any(_activation_like(shape) for _, shape in arrays), arrays
  # The tied embedding (source and target lookups, output projection): one reduction.
  assert sum(shape == (VOCAB, D_MODEL) for _, shape in arrays) == 1, arrays
  params = _param_shapes()
  assert {shape for _, shape in arrays if len(shape) == 2} == {s for s in params if len(s) == 2}


@pytest.mark.slow
def test_fsdp_splits_state_gathers_weights_and_reduce_scatters_gradients(fsdp_8):
  (program, compiled), (replicated, replicated_compiled) = fsdp_8
  # Parameters and Adam moments: about 1/8 on each of the 8 chips (vectors stay whole).
  ratio = program.parameter_bytes_per_chip / replicated.parameter_bytes_per_chip
  assert 0.125 <= ratio < 0.14, ratio
  arguments = compiled.memory_analysis().argument_size_in_bytes
  assert arguments < 0.14 * replicated_compiled.memory_analysis().argument_size_in_bytes
  found = aot.collectives(compiled.as_text())
  params = _param_shapes()
  gathers = [a for c in found if c.kind == 'all-gather' for a in c.arrays]
  scatters = [a for c in found if c.kind == 'reduce-scatter' for a in c.arrays]
  assert gathers and scatters
  # Weights gathered in the compute dtype, each once; nothing of a batch's shape moves.
  assert all(dtype == 'bf16' and shape in params for dtype, shape in gathers), gathers
  assert all(dtype == 'f32' and shape in params for dtype, shape in scatters), scatters
  moved = [a for c in found for a in c.arrays]
  assert not any(_activation_like(shape) for _, shape in moved), moved
  assert all(dtype == 'f32' for c in found if c.kind != 'all-gather' for dtype, _ in c.arrays)
  split = sum(1 for s in params if int(np.prod(s)) >= 2 ** 14)
  assert len(gathers) == split  # each split weight gathered once, kept for the backward pass


def _aot(*flags: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, 'aot_compile.py', '--config', 'configs/tiny.py',
                         *flags], cwd=ROOT, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))


@pytest.mark.slow
def test_aot_compile_reports_and_json_parses():
  text = _aot('--topology', 'v5e:2x2', '--batch', '16', '--length', '24', '--top', '3')
  assert text.returncode == 0, text.stderr[-3000:]
  top = [line for line in text.stdout.splitlines() if ' cycles  ' in line]
  # each with its JAX operation's path (the end of it when long: dropout/ge, ffn/wo/dot_general)
  assert len(top) == 3 and all(re.search(r'\S/\S+$', line) for line in top), top
  assert 'train step on v5e:2x2 (4 x TPU v5e), global batch 16 x 24' in text.stdout
  assert "step by XLA's estimated cycles" in text.stdout and 'all-reduce: ' in text.stdout
  report = json.loads(_aot('--topology', 'v5e:2x2', '--batch', '16', '--length', '24',
                           '--json').stdout)
  assert report['chips'] == 4 and report['memory']['hbm'] == 16 * 2 ** 30
  assert report['memory']['total'] > report['memory']['argument'] > 0
  assert report['flops'] > 0 and report['collectives']['all-reduce']['count'] >= 1
  assert 0 < report['step']['xla_estimate']['mfu'] < 1


@pytest.mark.slow
def test_aot_compile_decode_reports_encoder_and_decoder_step():
  result = _aot('--topology', 'v5e:2x2', '--batch', '8', '--length', '16', '--decode',
                '--json')
  assert result.returncode == 0, result.stderr[-3000:]
  encoder, step = json.loads(result.stdout)
  assert encoder['program'] == 'encoder' and step['program'] == 'decoder step'
  assert 'beam 4, cache of 26 positions' in step['shape']  # 16 + decode.max_extra_len 10
  assert step['flops'] > 0 and step['memory']['argument'] > 0


@pytest.mark.slow
def test_aot_compile_over_budget_exits_with_one_line():
  result = _aot('--topology', 'v5e:2x2', '--batch', '16', '--length', '24',
                '--config.model.d_model=8192', '--config.model.d_ff=32768')
  assert result.returncode == 1, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and 'GiB over the' in errors[0], result.stderr
  assert 'Traceback' not in result.stderr


@pytest.mark.parametrize('topology', ['v5litepod-16', 'v9z:2x2', 'v5e:3x5x7x9'])
def test_aot_compile_unknown_topology_lists_valid_ones(topology):
  result = _aot('--topology', topology)
  assert result.returncode == 2
  assert 'Traceback' not in result.stderr
  line = [x for x in result.stderr.splitlines() if x.startswith('error:')]
  assert len(line) == 1 and 'v5e:4x4' in line[0], result.stderr

"""The CPU's bfloat16 instructions, and the compute dtype decoding takes by default."""

import dataclasses
import json
import shutil

import jax
import pytest

from transformer_nmt.config import ModelConfig
from transformer_nmt.inference import loading
from transformer_nmt.runtime import host_cpu


@pytest.mark.parametrize('line, expected', [
    ('flags\t\t: fpu sse2 avx avx2 fma\n', False),  # an AVX2 x86 CPU
    ('flags\t\t: fpu avx2 avx512f avx512_bf16\n', True),
    ('flags\t\t: fpu avx2 avx512f amx_tile amx_bf16\n', True),
    ('flags\t\t: fpu avx512f avx_ne_convert\n', False),  # conversions alone multiply nothing
    ('Features\t: fp asimd sve bf16 i8mm\n', True),  # Arm
    ('Features\t: fp asimd\n', False),
    ('', None),  # no /proc/cpuinfo: not known
])
def test_bfloat16_instructions_from_the_flags(monkeypatch, line, expected):
  monkeypatch.setattr(host_cpu, 'flags_line', lambda: line)
  assert host_cpu.has_bfloat16() is expected


def test_the_flags_line_is_the_first_cpus():
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      lines = [line for line in f if line.startswith(('flags', 'Features'))]
  except OSError:
    lines = []
  assert host_cpu.flags_line() == (lines[0] if lines else '')


def test_a_bfloat16_model_decodes_in_float32_on_a_cpu_without_bfloat16(monkeypatch):
  f32, bf16 = ModelConfig(), dataclasses.replace(ModelConfig(), dtype='bfloat16')
  for has, expected in ((False, 'float32'), (True, None), (None, None)):
    monkeypatch.setattr(host_cpu, 'has_bfloat16', lambda has=has: has)
    assert loading.default_dtype(bf16) == expected
    assert loading.default_dtype((f32, bf16)) == expected  # an ensemble: every member
    assert loading.default_dtype(f32) is None and loading.default_dtype((f32, f32)) is None
  monkeypatch.setattr(host_cpu, 'has_bfloat16', lambda: False)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')  # an accelerator keeps bfloat16
  assert loading.default_dtype(bf16) is None


def test_loading_takes_the_default_unless_a_dtype_is_asked_for(tiny_workdir, tmp_path,
                                                                  monkeypatch):
  workdir = tmp_path / 'run'
  shutil.copytree(tiny_workdir, workdir, ignore=shutil.ignore_patterns('programs'))
  config = json.loads((workdir / 'config.json').read_text())
  config['model']['dtype'] = config['resolved_model']['dtype'] = 'bfloat16'  # as if so trained
  (workdir / 'config.json').write_text(json.dumps(config))
  monkeypatch.setattr(host_cpu, 'has_bfloat16', lambda: False)
  assert loading.load_workdir(workdir).cfg.dtype == 'float32'  # recipe.py's selection too
  assert loading.load_model(workdir).cfg.dtype == 'float32'
  assert loading.load_model(workdir, dtype='bfloat16').cfg.dtype == 'bfloat16'
  monkeypatch.setattr(host_cpu, 'has_bfloat16', lambda: True)
  assert loading.load_model(workdir).cfg.dtype == 'bfloat16'

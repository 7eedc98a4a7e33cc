"""bench/gpu.py, the prepared GPU device run, on this CPU with --smoke: its steps run and
report, and a step that overruns the deadline is stopped and recorded while the run goes on
and still writes its results. The training-speed step is marked slow."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT


def _gpu(out, *flags: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, 'bench/gpu.py', '--smoke', '--out', str(out), *flags],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_environment_step_reports(tmp_path):
  result = _gpu(tmp_path, '--steps', 'environment')
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / 'results.json').read_text())
  assert report['environment']['rc'] == 0
  assert 'CpuDevice' in report['environment']['devices'][0]
  assert 'jaxlib:' in (tmp_path / 'environment.txt').read_text()
  assert '## environment: rc 0' in (tmp_path / 'summary.md').read_text()
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      'environment.txt', 'results.json', 'summary.md']


@pytest.mark.slow
def test_training_speed_step_reports_its_table(tmp_path):
  result = _gpu(tmp_path, '--steps', 'train_speed')
  assert result.returncode == 0, result.stderr[-3000:]
  speed = json.loads((tmp_path / 'results.json').read_text())['train_speed']
  assert speed['rc'] == 0 and not speed['stopped']
  rows = [row for row in speed['table'] if row.startswith('| jax-bfloat16 |')]
  assert len(rows) == 1 and float(rows[0].split('|')[2].replace(',', '')) > 0, speed['table']
  summary = (tmp_path / 'summary.md').read_text()
  assert '## train_speed: rc 0' in summary and '| jax-bfloat16 |' in summary


def test_a_step_past_the_deadline_is_stopped_and_the_rest_recorded(tmp_path):
  result = _gpu(tmp_path, '--steps', 'tests,recipe', '--deadline_s', '6')
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / 'results.json').read_text())
  assert report['tests']['stopped'] and report['tests']['rc'] is None
  assert report['tests']['seconds'] < 15
  assert report['recipe'] == {'skipped': 'no time left'}
  assert 'stopped at its time limit' in (tmp_path / 'tests.log').read_text()
  assert '## recipe: no time left' in (tmp_path / 'summary.md').read_text()

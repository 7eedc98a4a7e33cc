"""A batch that cannot fit is refused before anything is built (issue 52)."""

import dataclasses
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from transformer_nmt.config import DataConfig
from transformer_nmt.errors import ConfigError
from transformer_nmt.training.memory import LOGIT_BYTES, check_batch_fits, device_memory


@dataclasses.dataclass
class FakeGpu:
  platform: str = 'gpu'
  device_kind: str = 'NVIDIA H100 80GB HBM3'

  def memory_stats(self):
    return {'bytes_limit': 60 * 10 ** 9}


def test_the_limit_is_the_accelerators_memory_or_the_hosts():
  assert device_memory([FakeGpu(), FakeGpu()]) == (120 * 10 ** 9, '2 x NVIDIA H100 80GB HBM3')
  ram, what = device_memory()  # this machine's CPU devices share its RAM
  assert what == "the host's RAM" and ram > 10 ** 9


def test_a_batch_whose_logits_overflow_the_devices_is_refused_with_its_size():
  data = DataConfig(vocab_size=32000, tokens_per_batch=25_000)  # the paper's batch: 6.4 GB
  check_batch_fits(data, devices=[FakeGpu()])
  huge = dataclasses.replace(data, tokens_per_batch=1_000_000)  # 256 GB of logits
  with pytest.raises(ConfigError, match=r'data.tokens_per_batch=1000000 cannot fit: its logits '
                     r'alone take 256.0 GB .* more than the 60.0 GB of 1 x NVIDIA H100'):
    check_batch_fits(huge, devices=[FakeGpu()])
  check_batch_fits(huge, processes=8, devices=[FakeGpu()])  # each process builds 1/8
  assert LOGIT_BYTES == 8


def test_train_py_refuses_a_billion_token_batch_at_once(tmp_path):
  started = time.time()
  result = subprocess.run([sys.executable, 'train.py', '--config', 'configs/tiny.py',
                           '--workdir', str(tmp_path / 'run'),
                           '--config.data.tokens_per_batch=1000000000'],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and 'Traceback' not in result.stderr
  assert 'error: data.tokens_per_batch=1000000000 cannot fit: its logits alone take ' \
         '1,600.0 GB' in result.stderr, result.stderr[-2000:]
  assert time.time() - started < 60 and not (tmp_path / 'run').exists()

"""Stopping on SIGTERM or Ctrl-C: a flag checked at step boundaries and between evaluation
batches; on two processes, both stop at the same step with one complete checkpoint, and
resumed they train as one process with two devices does (multi-host training, tested here
once for both)."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, shared_compile_cache

from transformer_nmt.training.preemption import StopRequest
from transformer_nmt.typed_config import validate_config


def test_a_signal_only_sets_the_flag():
  stop = StopRequest()
  before = signal.getsignal(signal.SIGTERM)
  with stop.watching():
    assert not stop.requested() and not stop.should_stop(1)
    os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this (the main) thread
    assert stop.requested() and stop.should_stop(2)
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C stops at once
      os.kill(os.getpid(), signal.SIGINT)
  assert signal.getsignal(signal.SIGTERM) is before  # the old handlers are back


def _wait_for(path: pathlib.Path, text: str, timeout: float = 240) -> None:
  deadline = time.time() + timeout
  while text not in (path.read_text() if path.exists() else ''):
    assert time.time() < deadline, f'no {text!r} in {path}: {path.read_text()[-2000:]}'
    time.sleep(0.2)


def _losses(workdir: pathlib.Path) -> dict[int, float]:
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return {r['step']: r['train_loss'] for r in rows if 'train_loss' in r}


@pytest.mark.slow
def test_sigterm_during_evaluation_stops_it_and_saves(tmp_path):
  workdir, log = tmp_path / 'run', tmp_path / 'stderr'
  cmd = [sys.executable, 'train.py', '--config', 'configs/tiny.py', '--workdir', str(workdir),
         '--config.train.num_steps=1000', '--config.train.eval_every=4',
         '--config.train.log_every=4', '--config.train.checkpoint_every=1000',
         '--config.data.demo_sizes=(400,3000,20)', '--config.eval.bleu_sentences=0']
  with open(log, 'w') as err:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=shared_compile_cache(), stderr=err,
                            stdout=subprocess.DEVNULL)
    _wait_for(log, 'step 4/1000')  # logged just before the evaluation of step 4 starts
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 130
  text = log.read_text()
  assert 'Stopped on request: saved checkpoint at step 4' in text, text[-2000:]
  assert 'eval at step 4' not in text and 'Traceback' not in text  # 3000 sentences: cut short
  assert [p.name for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit()] == ['4']


def _free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


TINY_RUN = ['train.py', '--config', 'configs/tiny.py', '--config.train.log_every=1',
            '--config.train.eval_every=1000', '--config.train.checkpoint_every=1000',
            '--config.eval.bleu_sentences=0']  # the losses are compared, not translations


def _two_processes(workdir: pathlib.Path, logs: pathlib.Path, *flags: str) -> list:
  """train.py on two processes, their logs in `logs`; a compilation cache of their own (the
  suite's is for one process at a time), so that later pairs load what the first compiled."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', JAX_COMPILATION_CACHE_DIR=str(logs / 'cache'))
  env.pop('XLA_FLAGS', None)
  address = f'127.0.0.1:{_free_port()}'
  procs = []
  for i in range(2):
    with open(logs / f'stderr{i}', 'w') as err:
      procs.append(subprocess.Popen(
          [sys.executable, *TINY_RUN, '--workdir', str(workdir), *flags,
           f'--coordinator_address={address}', '--num_processes=2', f'--process_id={i}'],
          cwd=ROOT, env=env, stderr=err, stdout=subprocess.DEVNULL))
  return procs


@pytest.mark.slow
def test_two_processes_stop_together_and_train_like_one_process_with_two_devices(tmp_path):
  """SIGTERM to one of two processes stops both at one step with one complete checkpoint;
  resumed, the pair's losses are those of one process with two devices run straight through."""
  workdir = tmp_path / 'mp'
  procs = _two_processes(workdir, tmp_path, '--config.train.num_steps=1000')
  _wait_for(tmp_path / 'stderr1', 'step 5/1000')
  procs[1].send_signal(signal.SIGTERM)  # the other process is not told
  codes = [p.wait(timeout=180) for p in procs]
  logs = [(tmp_path / f'stderr{i}').read_text() for i in range(2)]
  assert codes == [130, 130], [log[-2000:] for log in logs]
  stops = [[line for line in log.splitlines() if 'Stopped on request' in line] for log in logs]
  assert stops[0] and [s[0].split('step ')[-1] for s in stops] == \
      [stops[0][0].split('step ')[-1]] * 2, stops
  step = int(stops[0][0].split('step ')[1].split(';')[0])
  saved = [p.name for p in (workdir / 'checkpoints').iterdir()]
  assert [s for s in saved if s.isdigit()] == [str(step)], saved  # one complete checkpoint,
  assert not [s for s in saved if 'tmp' in s], saved  # nothing unfinished beside it

  end = f'--config.train.num_steps={step + 3}'
  procs = _two_processes(workdir, tmp_path, end)
  assert [p.wait(timeout=300) for p in procs] == [0, 0], (tmp_path / 'stderr0').read_text()[-2000:]
  # Both processes report the same losses (they hold the same replicated parameters).
  last = [[line.split('|')[1] for line in (tmp_path / f'stderr{i}').read_text().splitlines()
           if f'step {step + 3}/{step + 3}' in line] for i in range(2)]
  assert last[0] and last[0] == last[1], last
  straight = tmp_path / 'straight'
  env = dict(shared_compile_cache(), JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_force_host_platform_device_count=2')
  single = subprocess.run([sys.executable, *TINY_RUN, '--workdir', str(straight), end], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
  assert single.returncode == 0, single.stderr[-3000:]
  resumed, expected = _losses(workdir), _losses(straight)
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert [r['step'] for r in rows if 'train_loss' in r] == list(range(1, step + 4))  # process 0's
  np.testing.assert_allclose([resumed[s] for s in sorted(resumed)],
                             [expected[s] for s in sorted(resumed)], rtol=1e-5)


@pytest.mark.slow
def test_sigterm_during_a_checkpoint_save_lets_it_finish_then_stops(tmp_path, monkeypatch):
  """The signal lands while the step-2 checkpoint is being written: the save completes (the
  handler only sets the flag), the run stops at that step boundary, and a rerun resumes
  from the complete checkpoint (its checksums verify) to the end."""
  import orbax.checkpoint as ocp

  from configs import tiny
  from transformer_nmt.checkpoint import CHECKSUMS
  from transformer_nmt.training import loop as trainer
  from transformer_nmt.training.preemption import Stopped

  config = tiny.get_config()
  config.data.update(demo_sizes=(200, 10, 10))
  config.train.update(num_steps=4, log_every=1, eval_every=1000, checkpoint_every=2)
  config.eval.update(bleu_sentences=0)
  workdir = tmp_path / 'run'
  real_save, signalled = ocp.CheckpointManager.save, []

  def save_with_a_signal(manager, step, *args, **kwargs):
    if step == 2 and not signalled:
      signalled.append(step)
      os.kill(os.getpid(), signal.SIGTERM)  # delivered now, before the save's first byte
    return real_save(manager, step, *args, **kwargs)
  monkeypatch.setattr(ocp.CheckpointManager, 'save', save_with_a_signal)
  with pytest.raises(Stopped):
    trainer.train_and_evaluate(validate_config(config), str(workdir))
  assert signalled == [2]
  checkpoints = workdir / 'checkpoints'
  assert sorted(p.name for p in checkpoints.iterdir() if p.name.isdigit()) == ['2']
  assert json.loads((checkpoints / '2' / CHECKSUMS).read_text())  # sealed: the save finished
  assert max(_losses(workdir)) == 2
  # verifies the checksums, then resumes
  trainer.train_and_evaluate(validate_config(config), str(workdir))
  assert sorted(_losses(workdir)) == [1, 2, 3, 4]
  assert not (checkpoints / 'quarantine').exists()

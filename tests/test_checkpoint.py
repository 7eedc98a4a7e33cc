"""Checkpoints that were damaged after they were written: detected, skipped, moved aside."""

import collections

import jax
import numpy as np
import pytest

from transformer_nmt.checkpoint import CHECKSUMS, QUARANTINE, Checkpointer, loop_state
from transformer_nmt.config import TrainConfig
from transformer_nmt.errors import DataError
from transformer_nmt.training.state import create_train_state


def _saved(directory, tiny_cfg, steps):
  state = create_train_state(tiny_cfg, TrainConfig(), jax.random.key(0))
  ckpt = Checkpointer(directory, keep=5)
  for step in steps:
    ckpt.save(step, state.replace(step=step), loop_state(step, jax.random.key(step)))
  ckpt.close()
  return state


def _flip_a_bit(step_dir):
  data = max((p for p in step_dir.rglob('*') if p.is_file() and p.parent.name == 'd'),
             key=lambda p: p.stat().st_size)
  raw = bytearray(data.read_bytes())
  raw[len(raw) // 2] ^= 0x04  # one bit, in the middle of the largest data file
  data.write_bytes(bytes(raw))


def test_a_bit_flip_is_caught_and_the_checkpoint_moved_aside(tmp_path, tiny_cfg):
  state = _saved(tmp_path / 'ckpt', tiny_cfg, [1, 2])
  assert all((tmp_path / 'ckpt' / str(s) / CHECKSUMS).exists() for s in (1, 2))  # sealed
  _flip_a_bit(tmp_path / 'ckpt' / '2')
  ckpt = Checkpointer(tmp_path / 'ckpt')
  with pytest.raises(DataError, match='does not match its checksums'):
    ckpt.restore(state, 2)
  restored, loop = ckpt.restore_latest_readable(state)
  assert int(restored.step) == 1 and int(loop['data_position']) == 1
  np.testing.assert_array_equal(restored.params['tgt_embed']['embedding'],
                                state.params['tgt_embed']['embedding'])
  assert ckpt.all_steps() == [1]  # step 2 can be written again
  assert (tmp_path / 'ckpt' / QUARANTINE / '2').is_dir()
  ckpt.save(2, state.replace(step=2), loop_state(2, jax.random.key(2)))
  ckpt.close()
  assert Checkpointer(tmp_path / 'ckpt', read_only=True).all_steps() == [1, 2]


def test_no_readable_checkpoint_moves_nothing(tmp_path, tiny_cfg):
  state = _saved(tmp_path / 'ckpt', tiny_cfg, [1])
  _flip_a_bit(tmp_path / 'ckpt' / '1')
  ckpt = Checkpointer(tmp_path / 'ckpt')
  with pytest.raises(DataError, match='no checkpoint in .* reads back'):
    ckpt.restore_latest_readable(state)
  ckpt.close()
  assert (tmp_path / 'ckpt' / '1').is_dir() and not (tmp_path / 'ckpt' / QUARANTINE).exists()


@pytest.mark.parametrize('fails', ['checksums', 'restore'])
def test_processes_agree_a_checkpoint_is_damaged_when_one_cannot_read_it(tmp_path, tiny_cfg,
                                                                         monkeypatch, fails):
  """Another process (simulated: the all-gather of the verdicts) cannot read step 2 although
  this one can: every process then skips step 2 and resumes from step 1."""
  from transformer_nmt import checkpoint
  state = _saved(tmp_path / 'ckpt', tiny_cfg, [1, 2])
  ckpt = Checkpointer(tmp_path / 'ckpt')
  at, calls = [], collections.Counter()
  real_verify = ckpt.verify
  monkeypatch.setattr(ckpt, 'verify', lambda step: (at.append(step), real_verify(step)))
  failing_call = {'checksums': 1, 'restore': 2}[fails]  # the verdicts asked per step, in order

  def everywhere(ok):  # this process's verdict and the simulated other's
    calls[at[-1]] += 1
    return ok and not (at[-1] == 2 and calls[2] == failing_call)
  monkeypatch.setattr(checkpoint, '_everywhere', everywhere)
  restored, _ = ckpt.restore_latest_readable(state)
  assert int(restored.step) == 1 and ckpt.all_steps() == [1]
  assert (tmp_path / 'ckpt' / QUARANTINE / '2').is_dir()
  ckpt.close()

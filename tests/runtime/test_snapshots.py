"""Parameter snapshots (runtime/snapshots.py): a second load of the same checkpoints reads
the snapshot without Orbax and gives the restored parameters exactly; other checkpoints,
damaged snapshots and unwritable workdirs fall back to the checkpoint."""

import logging
import os
import shutil

import jax
import numpy as np
import pytest

from transformer_nmt import checkpoint
from transformer_nmt.inference import CheckpointChoice, load_workdir
from transformer_nmt.runtime import snapshots


@pytest.fixture
def workdir(tiny_workdir, tmp_path):
  """A workdir of its own (snapshots are written into it) sharing the tiny run's files."""
  scratch = tmp_path / 'run'
  scratch.mkdir()
  for name in ('config.json', 'spm.model', 'checkpoints'):
    (scratch / name).symlink_to(tiny_workdir / name)
  return scratch


def _assert_same(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    assert x.dtype == y.dtype and np.array_equal(x, y)


@pytest.mark.parametrize('options', [{}, {'average_last': 2}, {'step': 10},
                                     {'ema': False}])
def test_a_second_load_reads_the_snapshot_and_gives_the_same_parameters(workdir, options,
                                                                         monkeypatch):
  choice = CheckpointChoice(**options)
  truth = load_workdir(workdir, choice)
  assert not (workdir / 'programs').exists()  # no snapshot without being asked
  first = load_workdir(workdir, choice, snapshot=True)
  assert len(list((workdir / 'programs' / 'params').glob('*.npz'))) == 1
  with monkeypatch.context() as m:
    m.setattr(checkpoint, 'Checkpointer', lambda *_, **__: pytest.fail('restored'))
    second = load_workdir(workdir, choice, snapshot=True)
  assert first.steps == second.steps == truth.steps
  _assert_same(truth.params, first.params)
  _assert_same(truth.params, second.params)


def test_other_checkpoints_have_other_snapshots(tiny_workdir, tmp_path):
  checkpoints = tmp_path / 'checkpoints'
  shutil.copytree(tiny_workdir / 'checkpoints', checkpoints)
  root = tmp_path / 'programs'
  latest = snapshots.snapshot_path(root, checkpoints, [20], ema=True)
  assert latest != snapshots.snapshot_path(root, checkpoints, [20], ema=False)
  assert latest != snapshots.snapshot_path(root, checkpoints, [10, 20], ema=True)
  sums = checkpoints / '20' / checkpoint.CHECKSUMS
  sums.write_text(sums.read_text().replace('"', "'", 1))  # a retrained step 20
  assert snapshots.snapshot_path(root, checkpoints, [20], ema=True) not in (latest, None)
  rewritten = snapshots.snapshot_path(root, checkpoints, [20], ema=True)
  some_file = next(f for f in sorted((checkpoints / '20').rglob('*')) if f.is_file()
                   and f.name != checkpoint.CHECKSUMS)
  os.utime(some_file, ns=(1, 1))  # a file changed since the save (its checksum is not redone)
  assert snapshots.snapshot_path(root, checkpoints, [20], ema=True) not in (rewritten, None)
  sums.unlink()  # a save not sealed yet: no snapshot
  assert snapshots.snapshot_path(root, checkpoints, [20], ema=True) is None
  assert snapshots.step_numbers(checkpoints) == [10, 20]


def test_a_damaged_snapshot_is_ignored_and_written_again(workdir, caplog):
  truth = load_workdir(workdir, snapshot=True)
  path, = (workdir / 'programs' / 'params').glob('*.npz')
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF  # one flipped byte inside an array
  path.write_bytes(bytes(data))
  caplog.set_level(logging.WARNING)
  again = load_workdir(workdir, snapshot=True)
  assert 'does not load' in caplog.text and str(path) in caplog.text
  _assert_same(truth.params, again.params)
  assert snapshots.load(path) is not None  # rewritten whole from the checkpoint


def test_an_unwritable_workdir_warns_and_loads(workdir, caplog):
  (workdir / 'programs').write_text('not a directory')
  caplog.set_level(logging.WARNING)
  model = load_workdir(workdir, snapshot=True)
  assert 'Not keeping a parameter snapshot' in caplog.text
  _assert_same(load_workdir(workdir).params, model.params)


def test_only_the_newest_snapshots_are_kept(tmp_path):
  for n in range(snapshots.KEEP + 2):
    path = tmp_path / 'params' / f'{n}.npz'
    snapshots.save(path, {'layer': {'w': np.full(3, n, np.float32)}})
    os.utime(path, ns=(n * 10**9, n * 10**9))  # distinct ages whatever the clock's resolution
  kept = sorted(p.name for p in (tmp_path / 'params').glob('*.npz'))
  assert kept == [f'{n}.npz' for n in range(2, snapshots.KEEP + 2)]
  assert snapshots.load(tmp_path / 'params' / '4.npz')['layer']['w'].tolist() == [4.0] * 3

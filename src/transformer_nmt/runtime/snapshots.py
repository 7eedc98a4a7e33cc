"""Decode-ready parameter snapshots: what a workdir's checkpoints restore to, as one .npz.

For a small model most of decode.py's start goes to its checkpoint: importing Orbax, hashing the
step's files against its checksums.json (Adam moments included), and reading the weights through
TensorStore. A snapshot holds the restored parameters (the moving average or the raw ones; the mean
when several steps are averaged) as plain arrays in WORKDIR/programs/params/, named after the
checksums of the checkpoints they come from and the sizes and modification times of their files. A
retrained or replaced checkpoint, or one whose files changed since, never finds an old snapshot; a
checkpoint without checksums (a save not yet sealed) gets none. The newest three snapshots are kept.
Each zip member's CRC is checked as it is read, so a damaged snapshot does not load: it is then
ignored with a warning and the checkpoint restored as usual. Like the stored programs, a snapshot
never stops a translation: one that cannot be written is skipped with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import zipfile
from typing import Any, Optional, Sequence

import numpy as np

from transformer_nmt.files import atomic_output
from transformer_nmt.workdir import CHECKSUMS


def step_numbers(directory: pathlib.Path) -> list[int]:
  """The checkpoint steps in `directory`: its subdirectories named by an integer (Orbax
  writes a save under another name and renames it when complete)."""
  try:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())
  except OSError:
    return []


def snapshot_path(root: pathlib.Path, directory: pathlib.Path, steps: Sequence[int],
                  ema: bool) -> Optional[pathlib.Path]:
  """Where the snapshot of `steps` of checkpoint `directory` (their mean; `ema` as for
  Checkpointer.restore_params) lives under `root`, or None when a step has no checksums.

  The name covers each step's checksums and every file's size and modification time: a
  checkpoint written again, or a file of it changed since, gets another name (a restore
  would verify it against its checksums; the snapshot then is not there to bypass that)."""
  digest = hashlib.sha256(json.dumps({'ema': ema}).encode())
  for step in steps:
    step_dir = directory / str(step)
    try:
      digest.update(f'{step}\0'.encode() + (step_dir / CHECKSUMS).read_bytes())
      for path in sorted(step_dir.rglob('*')):
        if path.is_file():
          info = path.stat()
          digest.update(f'{path.relative_to(step_dir)}\0{info.st_size}\0{info.st_mtime_ns}\0'
                        .encode())
    except OSError:
      return None
  return root / 'params' / f'{digest.hexdigest()[:24]}.npz'


def load(path: pathlib.Path) -> Optional[Any]:
  """The parameter tree stored at `path` (nested dicts of arrays), or None when there is none
  or it does not read back whole (with a warning)."""
  if not path.exists():
    return None
  try:
    with np.load(path, allow_pickle=False) as stored:
      flat = {name: stored[name] for name in stored.files}
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    logging.warning('Parameter snapshot %s does not load (%s); restoring the checkpoint', path,
                    str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
    return None
  tree: dict[str, Any] = {}
  for name, array in flat.items():
    *parents, leaf = name.split('/')
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = array
  return tree


KEEP = 3  # snapshots kept per workdir, the newest: each new set of checkpoints adds one


def save(path: pathlib.Path, params: Any) -> None:
  """Writes `params` (nested dicts of arrays) to `path` atomically and removes all but the
  newest `KEEP` snapshots beside it; warns instead of failing."""
  flat: dict[str, np.ndarray] = {}

  def walk(node: Any, prefix: str) -> None:
    for key, value in node.items():
      if isinstance(value, dict):
        walk(value, f'{prefix}{key}/')
      else:
        flat[f'{prefix}{key}'] = np.asarray(value)

  try:
    walk(params, '')
    os.makedirs(path.parent, exist_ok=True)
    with atomic_output(path, binary=True) as f:
      np.savez(f, **flat)
    older = sorted(path.parent.glob('*.npz'), key=lambda p: p.stat().st_mtime_ns)[:-KEEP]
    for stale in older:
      if stale != path:
        stale.unlink()
  except (OSError, ValueError, TypeError, AttributeError) as e:
    logging.warning('Not keeping a parameter snapshot in %s (%s)', path.parent, e)

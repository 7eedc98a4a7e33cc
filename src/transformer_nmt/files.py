"""Writing a file so that readers never see it half-written."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import re
import stat
import tempfile
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, binary: bool = False) -> Iterator[IO]:
  """Opens a temporary file beside `path` for writing; on leaving the block without an error
  it replaces `path` (one rename), otherwise it is removed and `path` stays as it was.

    with atomic_output('out.txt') as f:
      f.write(text)
  """
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=path.parent)
  # Held while it is written (the kernel drops it when the process ends, kill -9 included):
  # remove_stale_temporaries tells a live writer's file from one a killed process left. A
  # file system without locks only loses that cleanup, not the write.
  with contextlib.suppress(OSError):
    fcntl.flock(fd, fcntl.LOCK_EX)
  try:
    with os.fdopen(fd, 'wb' if binary else 'w', **({} if binary else
                                                   {'encoding': 'utf-8', 'newline': '\n'})) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, _mode_for(path))  # mkstemp creates the file readable by its owner only
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


def _mode_for(path: pathlib.Path) -> int:
  """The permissions `path` keeps when replaced: its own when it exists (a private output
  stays private), else what open() would give a new file under the process's umask."""
  try:
    return stat.S_IMODE(os.stat(path).st_mode)
  except FileNotFoundError:
    return 0o666 & ~current_umask()


def current_umask() -> int:
  """The process's umask, read without changing it (os.umask can only set it, and setting
  it to read it would race with other threads creating files)."""
  try:
    with open('/proc/self/status', encoding='ascii') as f:
      for line in f:
        if line.startswith('Umask:'):
          return int(line.split()[1], 8)
  except (OSError, ValueError):
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def write_atomically(path: str | os.PathLike, content: str | bytes) -> None:
  """`path` holds `content` (text as UTF-8), or, if writing fails, what it held before."""
  with atomic_output(path, binary=isinstance(content, bytes)) as f:
    f.write(content)


def remove_stale_temporaries(path: str | os.PathLike) -> list[pathlib.Path]:
  """Removes the temporary files that `atomic_output` left beside `path` when its process was
  killed before it could remove them (kill -9, a power cut): hidden files named as it names
  them (.NAME.XXXXXXXX.tmp) that no live process holds. Returns the paths removed."""
  path = pathlib.Path(path)
  own = re.compile(rf'\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp')  # mkstemp's names
  removed = []
  try:
    entries = [e for e in path.parent.iterdir() if own.fullmatch(e.name)]
  except OSError:
    return removed
  for entry in entries:
    try:
      with open(entry, 'rb') as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: a writer is still at work
        entry.unlink()
      removed.append(entry)
    except OSError:  # BlockingIOError included: in use, gone already, or not ours to remove
      continue
  return removed

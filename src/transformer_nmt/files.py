"""Writing a file so that readers never see it half-written."""

from __future__ import annotations

import contextlib
import os
import pathlib
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

"""decode.py's output file, held by one process at a time.

  .OUTPUT.lock           held (an OS file lock) by the process writing OUTPUT or OUTPUT.partial;
                         removed when it ends (a killed one's is taken over by the next run)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
from typing import Iterator

from transformer_nmt.errors import DataError


def lock_path(path: str | os.PathLike) -> pathlib.Path:
  path = pathlib.Path(path)
  return path.parent / f'.{path.name}.lock'


@contextlib.contextmanager
def hold(path: str | os.PathLike, flag: str = '--output') -> Iterator[None]:
  """Holds the output `path` (and its .partial) for this process: an OS lock on .NAME.lock
  beside it, which the kernel releases however the process ends. Raises DataError naming
  the process that holds it. The lock file is removed on leaving."""
  lock = lock_path(path)
  while True:
    try:
      handle = open(lock, 'a+', encoding='utf-8')
    except OSError as e:
      raise DataError(f'{flag}={path}: cannot create its lock file {lock} '
                      f'({e.strerror or e})') from None
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.seek(0)
      holder = handle.read().strip() or 'unknown'
      handle.close()
      raise DataError(f'{flag}={path} is being written by another process (PID {holder}); '
                      'wait for it to finish or choose another output') from None
    # Its last holder may have removed the file between our open and our lock: that lock
    # is on a file nobody else will open, so take the one now at the path instead.
    with contextlib.suppress(FileNotFoundError):
      if os.path.samestat(os.fstat(handle.fileno()), os.stat(lock)):
        break
    handle.close()
  try:
    handle.seek(0)
    handle.truncate()
    handle.write(f'{os.getpid()}\n')
    handle.flush()
    yield
  finally:
    with contextlib.suppress(OSError):
      lock.unlink()  # while still held: see the loop above
    handle.close()

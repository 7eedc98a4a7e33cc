"""A directory written whole or not at all (import_marian.py's workdir, export_marian.py's
model): written beside its final name, as a hidden .NAME.PID@HOST.XXXXXXXX.partial directory,
and renamed when complete. A refusal or an error (a full disk) removes it. Ctrl-C and SIGTERM
(in the main thread) stop the writer at the next point where it can stop cleanly and remove
it too, raising Stopped; a second Ctrl-C stops at once. What no handler sees (SIGKILL, a power
cut) or that second Ctrl-C can leave it; the next write of the same name removes it once the
process named in it is gone from this host.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import re
import shutil
import signal
import socket
import tempfile
import threading
from typing import Any, Callable, Iterator

from transformer_nmt.files import current_umask


class Stopped(KeyboardInterrupt):
  """Ctrl-C or SIGTERM (`signum`) stopped a writer; what it had written is removed."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


@contextlib.contextmanager
def stops() -> Iterator[Callable[[], None]]:
  """SIGINT and SIGTERM only noted while writing; the function yielded raises Stopped at
  the points where stopping is clean. An exception raised by the handler itself would land
  wherever Python is: in Orbax's threads' machinery, whose writes then go on into what the
  cleanup removes, or in a garbage-collection callback, where it is lost. A second Ctrl-C
  raises KeyboardInterrupt at once. Outside the main thread (no handlers there) nothing is
  noted."""
  if threading.current_thread() is not threading.main_thread():
    yield lambda: None
    return
  received: list[int] = []

  def note(signum: int, frame: Any) -> None:
    del frame
    if received and signum == signal.SIGINT:
      raise KeyboardInterrupt
    received.append(signum)

  def stop_here() -> None:
    if received:
      raise Stopped(received[0])

  # A signal ignored by whoever started us (a background job's SIGINT) stays ignored.
  previous = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)
              if signal.getsignal(s) is not signal.SIG_IGN}
  try:
    yield stop_here
  finally:
    for s, handler in previous.items():  # None: one not set from Python
      signal.signal(s, signal.SIG_DFL if handler is None else handler)


def check_empty(out: pathlib.Path, flag: str, error: type[Exception]) -> None:
  """`error` unless `out` (given as `flag`) is missing or an empty directory."""
  try:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
      raise error(f'{flag}={out} exists and is not empty; choose a new directory')
  except OSError as e:
    raise error(f'{flag}={out}: cannot look into it ({e.strerror})') from None


@contextlib.contextmanager
def staged(out: pathlib.Path, flag: str, what: str, needed: int, error: type[Exception],
           stop_here: Callable[[], None]) -> Iterator[pathlib.Path]:
  """Yields the partial directory to fill; renames it to `out` (missing or empty, see
  check_empty) when the block ends. `needed`: about how many bytes `what` ('the import')
  writes, refused before writing when the disk has less; a full disk while writing is
  reported for `flag`=`out` too, as `error`, with nothing left."""
  partial = _partial_directory(out, flag, error)
  try:
    free = shutil.disk_usage(partial).free
    if free < needed:  # refused before Orbax's threads fail with a page of logging
      raise error(_no_space(out, flag, what, needed, free))
    yield partial
    os.chmod(partial, 0o777 & ~current_umask())  # mkdtemp makes it private
    stop_here()  # the last point: a signal after it finds the directory complete
    if out.exists():
      out.rmdir()  # empty (checked before): rename(2) then puts the directory in its place
    os.replace(partial, out)
  except BaseException as e:
    shutil.rmtree(partial, ignore_errors=True)
    # Named for `out`: shutil's error names the file copied, Orbax's its own temporary.
    if isinstance(e, Exception) and is_full_disk(e):
      raise error(_no_space(out, flag, what, needed)) from None
    raise


def _no_space(out: pathlib.Path, flag: str, what: str, needed: int,
              free: int | None = None) -> str:
  """The line for a full disk; `free`: measured before writing (unknown once the disk has
  filled while writing, with what was written since removed)."""
  return (f'no space left on the disk of {flag}={out}: {what} needs about '
          f'{needed / 1e6:.1f} MB, '
          + ('the disk filled while writing' if free is None else f'{free / 1e6:.1f} MB are free')
          + '; free some and run again (nothing was written)')


def is_full_disk(error: BaseException | None) -> bool:
  """Whether `error` or one it was raised from or during is ENOSPC (or a full quota); Orbax
  and TensorStore wrap it in their own exceptions, sometimes as text only."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if getattr(error, 'errno', None) in (errno.ENOSPC, errno.EDQUOT) or any(
        text in str(error) for text in ('No space left on device', 'Disk quota exceeded')):
      return True
    error = error.__cause__ or error.__context__
  return False


def _partial_directory(out: pathlib.Path, flag: str, error: type[Exception]) -> pathlib.Path:
  """A new empty hidden directory beside `out`, named for this process and host so that a
  later writer can tell whether its writer is gone (module docstring); earlier ones left
  behind by a killed process are removed first. `error` if it cannot be made."""
  host = re.sub(r'[^A-Za-z0-9.-]', '_', socket.gethostname())
  try:
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out, host)
    return pathlib.Path(tempfile.mkdtemp(prefix=f'.{out.name}.{os.getpid()}@{host}.',
                                         suffix='.partial', dir=out.parent))
  except OSError as e:
    file = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if file is not None:
      raise error(f'{flag}={out}: {file} is a file, not a directory') from None
    raise error(f'{flag}={out}: cannot create it in {out.parent} ({e.strerror})') from None


def _remove_stale_partials(out: pathlib.Path, host: str) -> None:
  pattern = re.compile(re.escape(f'.{out.name}.') + r'(\d+)@' + re.escape(host)
                       + r'\.[a-z0-9_]+\.partial')
  for entry in out.parent.iterdir():
    match = pattern.fullmatch(entry.name)
    if match and entry.is_dir() and not _alive(int(match.group(1))):
      shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)  # signal 0: only whether the process exists
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's
    pass
  return True

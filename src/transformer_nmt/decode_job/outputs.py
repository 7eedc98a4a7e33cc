"""decode.py's output file: held by one process at a time, and resumable through
OUTPUT.partial with a record of what it belongs to.

  .OUTPUT.lock           held (an OS file lock) by the process writing OUTPUT or OUTPUT.partial;
                         removed when it ends (a killed one's is taken over by the next run)
  OUTPUT.partial         --resume: the translations written so far, one line per input line
  OUTPUT.partial.json    --resume: what the partial belongs to (settings, hash of the input
                         lines translated) and how much of it is complete (lines, bytes, hash),
                         rewritten after each block; removed with the partial at the end

A partial whose record is missing or does not match (other settings, another input, a file
changed since) is refused, never trusted: appending to it would misalign every later line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
from typing import IO, Any, Iterator, Optional

from transformer_nmt.errors import DataError
from transformer_nmt.files import write_atomically

RECORD_VERSION = 1


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


def partial_path(path: str | os.PathLike) -> str:
  return f'{path}.partial'


def record_path(path: str | os.PathLike) -> str:
  return f'{path}.partial.json'


def _line_bytes(lines: list[str]) -> bytes:
  """Input lines as hashed: each as UTF-8 (lone surrogates kept) and a newline."""
  return b''.join(line.encode('utf-8', 'surrogatepass') + b'\n' for line in lines)


@dataclasses.dataclass
class Partial:
  """OUTPUT.partial opened for --resume (`resume`): its first `done` lines translate input
  lines whose hash the record keeps (`expected_input`); `skip` drops those lines from the
  input, checking them; `written` appends a block's translations and records them."""

  path: str
  settings: dict[str, Any]
  file: Optional[IO[bytes]] = None
  done: int = 0
  size: int = 0
  expected_input: str = ''
  output_hash: Any = dataclasses.field(default_factory=hashlib.sha256)
  input_hash: Any = dataclasses.field(default_factory=hashlib.sha256)

  def refuse(self, why: str) -> DataError:
    return DataError(f'--resume: {partial_path(self.path)} {why}; delete it and '
                     f'{record_path(self.path)} to translate from the start')

  def skip(self, blocks: Iterator[list[str]]) -> Iterator[list[str]]:
    """The blocks without their first `done` lines, which must be the input lines the
    partial translated; raises DataError before handing out any block otherwise."""
    blocks, left, rest = iter(blocks), self.done, []
    while left:
      block = next(blocks, None)
      if block is None:
        raise self.refuse(f'holds {self.done} translated lines but the input has only '
                          f'{self.done - left}')
      head, rest = block[:left], block[left:]
      self.input_hash.update(_line_bytes(head))
      left -= len(head)
    if self.done and self.input_hash.hexdigest() != self.expected_input:
      raise self.refuse(f'translates other lines than the first {self.done} of this input')
    if rest:
      yield rest
    yield from blocks

  def written(self, lines: list[str], text: str) -> None:
    """Appends `text`, the translations of input `lines`, and records them (the partial's
    lines are on disk before the record says so; a kill in between leaves lines the next run
    cuts off and translates again)."""
    data = text.encode('utf-8', 'surrogatepass')
    self.file.write(data)
    self.file.flush()
    os.fsync(self.file.fileno())
    self.done += len(lines)
    self.size += len(data)
    self.output_hash.update(data)
    self.input_hash.update(_line_bytes(lines))
    self._record()

  def _record(self) -> None:
    write_atomically(record_path(self.path), json.dumps({
        'version': RECORD_VERSION, 'settings': self.settings, 'lines': self.done,
        'bytes': self.size, 'partial_sha256': self.output_hash.hexdigest(),
        'input_sha256': self.input_hash.hexdigest()}, indent=1) + '\n')


def _read_record(path: str) -> Optional[dict[str, Any]]:
  """OUTPUT.partial.json, None when absent; DataError when unreadable."""
  record = record_path(path)
  try:
    with open(record, encoding='utf-8') as f:
      stored = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise DataError(f'--resume: {record} is damaged ({e}); delete it and '
                    f'{partial_path(path)} to translate from the start') from None
  kinds = {'version': int, 'settings': dict, 'lines': int, 'bytes': int,
           'partial_sha256': str, 'input_sha256': str}
  if not (isinstance(stored, dict) and set(stored) == set(kinds)
          and all(isinstance(stored[k], kind) for k, kind in kinds.items())
          and stored['version'] == RECORD_VERSION and min(stored['lines'], stored['bytes']) >= 0):
    raise DataError(f'--resume: {record} is not a record this version wrote; delete it and '
                    f'{partial_path(path)} to translate from the start')
  return stored


def _difference(then: dict[str, Any], now: dict[str, Any], prefix: str = '') -> str:
  """The first setting that differs, as 'name: X then, Y now'."""
  for key in sorted(set(then) | set(now)):
    a, b = then.get(key), now.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      found = _difference(a, b, f'{prefix}{key}.')
      if found:
        return found
    elif a != b:
      return f'{prefix}{key}: {a!r} then, {b!r} now'
  return ''


@contextlib.contextmanager
def resume(path: str, settings: dict[str, Any]) -> Iterator[Partial]:
  """OUTPUT.partial opened for appending after its last recorded line, checked against its
  record (OUTPUT.partial.json) and `settings` (what decides the translations: a JSON-able
  mapping); a new one when there is none. On leaving without an error the partial becomes
  `path` and the record goes; otherwise both stay for the next run.

  Raises DataError (before anything is written) for a partial without a record, one written
  with other settings, or one changed since it was written."""
  settings = json.loads(json.dumps(settings))  # as the record will read back
  partial = Partial(path, settings)
  exists = os.path.exists(partial_path(path))
  stored = _read_record(path) if exists else None  # a record without its partial: start anew
  if exists and stored is None:
    raise partial.refuse(f'has no record of what it belongs to ({record_path(path)})')
  if exists:
    if stored['settings'] != settings:
      raise partial.refuse('was written with other settings ('
                           f'{_difference(stored["settings"], settings)})')
    with open(partial_path(path), 'rb') as f:
      data = f.read(stored['bytes'] + 1)
    if len(data) < stored['bytes']:
      raise partial.refuse(f'is shorter than its record says ({len(data)} bytes, not '
                           f'{stored["bytes"]}): it was changed')
    data = data[:stored['bytes']]
    if (data.count(b'\n') != stored['lines']
        or hashlib.sha256(data).hexdigest() != stored['partial_sha256']):
      raise partial.refuse('was changed since it was written')
    partial.done, partial.size = stored['lines'], stored['bytes']
    partial.output_hash.update(data)
    partial.expected_input = stored['input_sha256']
  partial._record()  # before a new partial exists: a kill leaves no partial without record
  with open(partial_path(path), 'ab' if exists else 'wb') as f:
    f.truncate(partial.size)  # lines written after the last record are translated again
    partial.file = f
    yield partial
    f.flush()
    os.fsync(f.fileno())
  os.replace(partial_path(path), path)
  with contextlib.suppress(FileNotFoundError):
    os.unlink(record_path(path))

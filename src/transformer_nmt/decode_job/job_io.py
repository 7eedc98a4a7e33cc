"""The files of a translation job: its input read whole or in blocks (a file or stdin), its
output written atomically or to stdout and held against a second writer, checked before any
work, and a progress line on stderr."""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import time
from typing import IO, Iterator, Mapping, Optional, Sequence

from transformer_nmt.data import batching as data_lib
from transformer_nmt.errors import DataError
from transformer_nmt.workdir import Workdir

DEFAULT_BUFFER = 2000  # lines per block of a file or pipe: memory stays bounded by a block


def read(path: str) -> list[str]:
  """Every line of `path` ('-': stdin)."""
  if path == '-':
    return data_lib.split_lines(sys.stdin.buffer.read(), '<stdin>')
  return data_lib.read_lines(path)


def check_output(path: str, sources: Mapping[str, Optional[str]],
                 workdirs: Sequence[str]) -> None:
  """Before any work: the output can be written, and is none of the files read (`sources`:
  flag -> path) nor any file of the workdirs used (their tokenizer, config, checkpoints)."""
  if path == '-':
    return
  out = pathlib.Path(path).absolute()
  for workdir in workdirs:
    if Workdir(workdir).owns(out):
      raise DataError(f'--output={path} is a file of the workdir {workdir}: writing it would '
                      'damage the run; choose a path outside the workdir\'s own files')
  if out.is_dir():
    raise DataError(f'--output={path} is a directory')
  if out.exists() and not out.is_file():  # a device or pipe: replacing it would be wrong
    raise DataError(f'--output={path} is not a regular file; use --output=- for stdout')
  if not out.parent.is_dir():
    raise DataError(f'--output={path}: the directory {out.parent} does not exist')
  if not os.access(out.parent, os.W_OK):
    raise DataError(f'--output={path}: cannot write to {out.parent}')
  for flag, source in sources.items():
    if source and source != '-' and pathlib.Path(source).exists() and (
        out.resolve() == pathlib.Path(source).resolve()
        or out.exists() and os.path.samefile(out, source)):
      raise DataError(f'--output={path} is also the {flag} file: it would be overwritten')


def check_streams(input_path: str, output_path: str, writes_output: bool,
                  prints_scores: bool) -> None:
  """A closed stdin or stdout (`<&-`, `>&-`: Python then has None for them) that the job
  would read or write is refused before any work, not met after it."""
  if sys.stdin is None and input_path == '-':
    raise DataError('--input=- reads stdin, which is closed; give --input FILE')
  if sys.stdout is None and output_path == '-' and writes_output:
    raise DataError('--output=- writes to stdout, which is closed; give --output FILE')
  if sys.stdout is None and prints_scores:
    raise DataError('--reference prints its scores on stdout, which is closed')


@contextlib.contextmanager
def output(path: str) -> Iterator[IO[str]]:
  """stdout, or a file written through a temporary one and renamed at the end, so that it is
  never left half-written (an interrupted run leaves the old file as it was)."""
  if path == '-':
    yield sys.stdout
    return
  from transformer_nmt.files import atomic_output
  with atomic_output(path) as f:
    yield f


@contextlib.contextmanager
def held(path: str) -> Iterator[None]:
  """`path` (and PATH.partial) held by this job, so that a second job writing it is refused
  (outputs.hold), with the temporary files that killed runs left beside it removed; nothing
  for stdout."""
  if path == '-':
    yield
    return
  from transformer_nmt.decode_job import outputs
  from transformer_nmt.files import remove_stale_temporaries
  with outputs.hold(path):
    removed = remove_stale_temporaries(path)
    if removed:
      print(f'removed {len(removed)} temporary file(s) that an interrupted run left beside '
            f'{path}', file=sys.stderr)
    yield


def input_blocks(path: str, size: int) -> Iterator[list[str]]:
  """The input in blocks of `size` lines (0: one line at a time from a terminal, else
  DEFAULT_BUFFER); the file is opened now, so that a missing one fails before any work."""
  if path == '-':
    stream, name = sys.stdin.buffer, '<stdin>'
  else:
    try:
      stream, name = open(path, 'rb'), path
    except OSError as e:
      raise DataError(f'{path}: cannot read ({e.strerror})') from None
  if size == 0:
    size = 1 if path == '-' and sys.stdin.isatty() else DEFAULT_BUFFER
  return data_lib.line_blocks(stream, name, size)


class Progress:
  """Prints 'translated n[/N] sentences' to stderr about every 10% of a known total, or
  every 10 seconds of a stream."""

  def __init__(self, total: Optional[int], enabled: bool):
    self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.time()
    self.next = max(1, total // 10) if total else 0
    self.next_time = self.t0 + 10.0

  def __call__(self, n: int) -> None:
    self.done += n
    due = self.done >= self.next if self.total else time.time() >= self.next_time
    if self.enabled and due:
      rate = self.done / max(time.time() - self.t0, 1e-9)
      of = f'/{self.total}' if self.total else ''
      print(f'translated {self.done}{of} sentences ({rate:.1f}/s)', file=sys.stderr)
      self.next += max(1, (self.total or 0) // 10)
      self.next_time = time.time() + 10.0

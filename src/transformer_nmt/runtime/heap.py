"""Host memory of decoding on a CPU: freed memory given back between batches, fewer heaps,
and the memory maps that compiled programs hold.

On a CPU a batch's decoder state and its programs' working buffers are host memory. glibc's
malloc keeps what they free in its heaps, one per thread, and fragmented heaps are not
shrunk, so a long job's resident memory kept growing with the largest batches it had met.
`malloc_trim` after a batch returns the free pages: a lower peak at about the same speed. A
trim walks every free chunk of every heap, though, and asks the kernel to drop each one's
pages: once the compiler has run in the process, the heaps hold so many that trimming after
every batch slows a server that compiled its programs at start well below one that loaded
them, each trim holding the heaps' locks meanwhile. So batches trim only once the resident
memory has grown by `TRIM_AFTER_GROWTH` since the last trim: what a long job's batches leave
is still returned. Fewer heaps fragment less: with `limit_heaps(2)` a job whose programs are
stored peaks lower again at the same speed, but a run that compiles its programs takes
longer, its compiler threads waiting on the two heaps.

XLA's CPU backend loads each kernel of a program as an object of its own, a few memory maps
each, and a server holds a few hundred programs: serve.py's default warm-up comes near the
number of maps Linux lets a process have (vm.max_map_count), and an allocation past it
crashes the process. `check_memory_maps` turns that crash into a clear error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import pathlib
from typing import Callable, Optional

from transformer_nmt.errors import ConfigError

_M_ARENA_MAX = -8  # mallopt's parameter for the most heaps (arenas), glibc's malloc.h
# Making programs stops past this share of the limit on memory maps: the rest is room for
# the batches' buffers, which glibc maps one by one above its threshold (128 KiB).
MAPS_SHARE = 0.9
# A batch trims the heaps once the resident memory is this much above its size after the
# last trim (release_free_memory).
TRIM_AFTER_GROWTH = 64 << 20
_resident_after_trim = [0]  # bytes; written by whichever thread trimmed last
_PAGE = mmap.PAGESIZE


@functools.cache
def _libc_function(name: str, argtypes: tuple) -> Optional[Callable[..., int]]:
  """The C library's function `name` (returning int), or None on a C library without it
  (glibc's malloc_trim and mallopt; not on macOS, musl or Windows)."""
  library = ctypes.util.find_library('c')
  try:
    fn = getattr(ctypes.CDLL(library), name, None) if library else None
  except OSError:
    return None
  if fn is not None:
    fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
  return fn


def _malloc_trim() -> Optional[Callable[[int], int]]:
  return _libc_function('malloc_trim', (ctypes.c_size_t,))


def limit_heaps(count: int) -> bool:
  """Lets glibc's malloc make at most `count` heaps (arenas; by default up to 8 per core, one
  per thread as threads start to allocate). Threads that have a heap keep it, so call this
  before the threads start. False where that is not possible."""
  mallopt = _libc_function('mallopt', (ctypes.c_int, ctypes.c_int))
  return mallopt is not None and mallopt(_M_ARENA_MAX, count) == 1


def heaps_for(requested: int, programs: Optional[pathlib.Path], compiling: bool = False) -> int:
  """The heap count for a decoding run (decode.py --malloc_heaps): `requested` when it is 0
  (the C library's default) or more; for -1 (automatic), 2 when `programs` (a workdir's
  program store) holds compiled programs, which the run then mostly loads, unless the run is
  `compiling` them (decode.py --precompile); else 0. Programs of another identity count too
  (a run after an upgrade compiles with 2 heaps once): telling them apart needs the backend,
  whose threads would have started."""
  if requested >= 0:
    return requested
  stored = programs is not None and any(programs.glob('*/*.program'))
  return 2 if stored and not compiling else 0


def release_free_memory(after_growth: int = 0) -> bool:
  """Returns the C heap's free pages to the operating system once the process's resident
  memory is `after_growth` bytes or more above what it was after the last trim (0: now).
  True when it trimmed; False where that is not possible or not due. Safe from any thread
  (malloc_trim locks each heap in turn; two threads may both trim)."""
  trim = _malloc_trim()
  if trim is None:
    return False
  if after_growth > 0:
    resident = resident_bytes()
    if resident is not None and resident < _resident_after_trim[0] + after_growth:
      return False
  trim(0)
  _resident_after_trim[0] = resident_bytes() or 0
  return True


def resident_bytes() -> Optional[int]:
  """This process's resident memory, or None where /proc does not say."""
  try:
    with open('/proc/self/statm', 'rb') as f:
      return int(f.read().split()[1]) * _PAGE
  except (OSError, ValueError, IndexError):
    return None


def memory_maps() -> Optional[tuple[int, int]]:
  """(memory maps this process holds, the most Linux allows one: vm.max_map_count), or None
  where /proc does not say."""
  try:
    with open('/proc/self/maps', 'rb') as f:
      used = sum(1 for _ in f)
    limit = int(pathlib.Path('/proc/sys/vm/max_map_count').read_text())
  except (OSError, ValueError):
    return None
  return used, limit


def check_memory_maps(made: str, fewer: str) -> None:
  """Raises ConfigError when this process holds more than MAPS_SHARE of the memory maps Linux
  allows it: more programs would crash it. `made` says what was made so far, `fewer` how to
  make fewer."""
  maps = memory_maps()
  if maps is not None and maps[0] > MAPS_SHARE * maps[1]:
    raise ConfigError(f'{maps[0]} memory maps in use of the {maps[1]} Linux allows a process '
                      f'(vm.max_map_count) after {made}: each compiled kernel takes a few, and '
                      'past the limit the process crashes. Raise it (sysctl -w '
                      f'vm.max_map_count=262144) or make fewer programs ({fewer})')

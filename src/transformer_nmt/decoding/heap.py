"""Giving freed host memory back to the operating system between decoding batches.

On a CPU a batch's decoder state and its programs' working buffers are host memory. glibc's
malloc keeps what they free in its heaps, one per thread, and fragmented heaps are not
shrunk, so a long job's resident memory kept growing with the largest batches it had met:
1000 lines of test2016 peaked at 1.25-1.31 GB. `malloc_trim` after each batch returns the
free pages: 1.04-1.23 GB, at about the same speed (bench/RESULTS.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Callable, Optional


@functools.cache
def _malloc_trim() -> Optional[Callable[[int], int]]:
  """glibc's malloc_trim, or None on a C library without it (macOS, musl, Windows)."""
  name = ctypes.util.find_library('c')
  try:
    trim = getattr(ctypes.CDLL(name), 'malloc_trim', None) if name else None
  except OSError:
    return None
  if trim is not None:
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
  return trim


def release_free_memory() -> bool:
  """Returns the C heap's free pages to the operating system; False where that is not
  possible. Safe from any thread (malloc_trim locks each heap in turn)."""
  trim = _malloc_trim()
  if trim is None:
    return False
  trim(0)
  return True

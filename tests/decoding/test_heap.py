"""heap.py: freed host memory goes back to the system where the C library allows it."""

import sys

import numpy as np
import pytest

from transformer_nmt.decoding import heap


def _resident_bytes() -> int:
  with open('/proc/self/statm', encoding='utf-8') as f:
    return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc on Linux only')
def test_free_pages_go_back_to_the_system():
  """Many small freed arrays (below malloc's mmap threshold, so they stay in its heap) leave
  the resident size up until the heap is trimmed."""
  if heap._malloc_trim() is None:
    pytest.skip('this C library has no malloc_trim')
  before = _resident_bytes()
  arrays = [np.ones(8 * 1024, np.float64) for _ in range(8000)]  # 64 KiB each, ~0.5 GB
  del arrays[:-1]  # the last one pins the top of the heap: only a trim can give pages back
  kept = _resident_bytes()
  assert kept > before + 400 * 2**20  # freed, but still resident
  assert heap.release_free_memory()
  assert _resident_bytes() < kept - (kept - before) // 2


def test_without_malloc_trim_nothing_happens(monkeypatch):
  monkeypatch.setattr(heap, '_malloc_trim', lambda: None)
  assert heap.release_free_memory() is False

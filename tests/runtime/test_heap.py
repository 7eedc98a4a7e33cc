"""heap.py: freed host memory goes back to the system where the C library allows it."""

import mmap
import sys

import numpy as np
import pytest

from transformer_nmt.errors import ConfigError
from transformer_nmt.runtime import heap


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


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc on Linux only')
def test_a_trim_waits_until_the_resident_memory_has_grown():
  """With `after_growth` a trim is due only once the resident memory rose that much since the
  last trim: freed pages stay resident until then, and go back once it is due."""
  if heap._malloc_trim() is None:
    pytest.skip('this C library has no malloc_trim')
  assert heap.release_free_memory()  # the mark: the resident memory after this trim
  assert heap.resident_bytes() == _resident_bytes()
  arrays = [np.ones(8 * 1024, np.float64) for _ in range(8000)]  # 64 KiB each, ~0.5 GB
  del arrays[:-1]
  kept = _resident_bytes()
  assert heap.release_free_memory(after_growth=1 << 40) is False  # not due
  assert _resident_bytes() > kept - 50 * 2**20  # nothing went back
  assert heap.release_free_memory(after_growth=256 * 2**20)  # ~0.5 GB grown: due
  assert _resident_bytes() < kept - 200 * 2**20


def test_without_malloc_trim_nothing_happens(monkeypatch):
  monkeypatch.setattr(heap, '_malloc_trim', lambda: None)
  assert heap.release_free_memory() is False


_COUNT_HEAPS = '''
import ctypes, sys, threading
from transformer_nmt.runtime import heap
if sys.argv[1] != '0':
  assert heap.limit_heaps(int(sys.argv[1]))
def allocate(together):
  blocks = [ctypes.create_string_buffer(4096) for _ in range(200)]  # malloc in this thread
  together.wait()  # all alive at once: none takes over the heap of one that has ended
together = threading.Barrier(6)
threads = [threading.Thread(target=allocate, args=(together,)) for _ in range(6)]
for t in threads:
  t.start()
for t in threads:
  t.join()
ctypes.CDLL(None).malloc_stats()  # one 'Arena N:' block per heap, on stderr
'''


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc on Linux only')
@pytest.mark.parametrize('limit', [0, 1, 2])
def test_limit_heaps_caps_the_heaps_threads_get(limit):
  """Six threads allocating at once get heaps of their own by default; with the limit they
  share `limit` heaps (counted by glibc's malloc_stats, in a fresh process)."""
  import ctypes
  import subprocess
  if heap._libc_function('mallopt', (ctypes.c_int, ctypes.c_int)) is None or not hasattr(
      ctypes.CDLL(None), 'malloc_stats'):
    pytest.skip('this C library has no mallopt or malloc_stats')
  out = subprocess.run([sys.executable, '-c', _COUNT_HEAPS, str(limit)], capture_output=True,
                       text=True, check=True).stderr
  heaps = out.count('Arena ')
  assert heaps == limit if limit else heaps > 2


def test_heaps_for_a_decoding_run(tmp_path):
  """decode.py --malloc_heaps: a count given outright is kept; the automatic one (-1) is 2
  for a run that loads stored programs and glibc's default (0) otherwise."""
  store = tmp_path / 'programs'
  assert heap.heaps_for(-1, None) == 0  # --noprograms
  assert heap.heaps_for(-1, store) == 0  # no store yet
  (store / 'a1b2').mkdir(parents=True)
  assert heap.heaps_for(-1, store) == 0  # an identity without programs
  (store / 'a1b2' / 'advance-0.program').write_bytes(b'')
  assert heap.heaps_for(-1, store) == 2
  assert heap.heaps_for(-1, store, compiling=True) == 0  # --precompile
  assert heap.heaps_for(0, store) == 0
  assert heap.heaps_for(3, None) == 3


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='/proc on Linux only')
def test_memory_maps_are_counted_against_the_limit(monkeypatch, tmp_path):
  """memory_maps counts the lines of /proc/self/maps against vm.max_map_count;
  check_memory_maps raises past MAPS_SHARE of the limit only, naming it and the remedy."""
  path = tmp_path / 'mapped'
  path.write_bytes(bytes(4096))
  with open(path, 'r+b') as f, mmap.mmap(f.fileno(), 4096):  # a file's map: a line of its own
    used, limit = heap.memory_maps()
    with open('/proc/self/maps', encoding='utf-8') as maps:
      lines = maps.read().splitlines()
  assert sum(str(path) in line for line in lines) == 1
  assert abs(used - len(lines)) < 100  # other threads may map or unmap meanwhile
  with open('/proc/sys/vm/max_map_count', encoding='utf-8') as f:
    assert limit == int(f.read())
  heap.check_memory_maps('everything', 'fewer')  # this test process is far below
  monkeypatch.setattr(heap, 'memory_maps', lambda: (int(heap.MAPS_SHARE * 1000) + 1, 1000))
  with pytest.raises(ConfigError, match=r'^901 memory maps in use of the 1000 Linux allows a '
                     r'process \(vm.max_map_count\) after 3 programs: .*sysctl .*\(fewer\)$'):
    heap.check_memory_maps('3 programs', 'fewer')
  monkeypatch.setattr(heap, 'memory_maps', lambda: None)  # no /proc: nothing to check
  heap.check_memory_maps('3 programs', 'fewer')

"""Batches built ahead of the training step, in a background thread.

The training loop hands a batch to the devices and, while they compute (JAX dispatches
asynchronously), the thread builds the next few: collation, an epoch's plan, subword
sampling's re-encoding. NumPy and SentencePiece release the GIL for most of that work. The
loop counts the batches it has consumed, not those built ahead, so a checkpoint's data
position (and so resumption) is unchanged by prefetching.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar('T')


class _End:
  """The source is exhausted."""


class _Failure:
  """The source raised `error`; the consumer raises it in turn."""

  def __init__(self, error: BaseException):
    self.error = error


class Prefetcher(Generic[T]):
  """An iterator over `source`, up to `depth` items ahead of its consumer.

  depth 0 runs `source` on the consumer's thread (no thread at all). An exception raised
  by `source` is raised by the `next` call that would have returned the item it failed to
  make. `waited` is the total time `next` spent waiting for an item (with depth 0: building
  it), read by the training loop as its time spent waiting for data. `close` stops the
  thread; items built ahead are dropped.
  """

  def __init__(self, source: Iterator[T], depth: int,
               clock: Callable[[], float] = time.perf_counter):
    self.waited, self._clock, self._source = 0.0, clock, source
    self._thread = None
    if depth > 0:
      self._queue: queue.Queue = queue.Queue(maxsize=depth)
      self._stop = threading.Event()
      self._thread = threading.Thread(target=self._produce, name='prefetch', daemon=True)
      self._thread.start()

  def __iter__(self) -> Prefetcher[T]:
    return self

  def __next__(self) -> T:
    start = self._clock()
    try:
      if self._thread is None:
        return next(self._source)
      item = self._queue.get()
    finally:
      self.waited += self._clock() - start
    if isinstance(item, _Failure):
      self._queue.put(item)  # a later call raises it again rather than waiting forever
      raise item.error
    if isinstance(item, _End):
      self._queue.put(item)
      raise StopIteration
    return item

  def _produce(self) -> None:
    try:
      for item in self._source:
        if not self._put(item):
          return
      self._put(_End())
    except BaseException as e:  # handed to the consumer, whatever it is
      self._put(_Failure(e))

  def _put(self, item: object) -> bool:
    """Waits for room in the queue; False once `close` has been called."""
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.05)
        return True
      except queue.Full:
        continue
    return False

  def close(self, timeout: float = 10.0) -> None:
    """Stops the thread (after the item it is building, if any) and drops what was built."""
    if self._thread is None:
      return
    self._stop.set()
    self._thread.join(timeout)
    while not self._queue.empty():
      self._queue.get_nowait()

  def __enter__(self) -> Prefetcher[T]:
    return self

  def __exit__(self, *_: object) -> None:
    self.close()

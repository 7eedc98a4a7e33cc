"""data.prefetch: batches built ahead in a thread are the same batches, failures reach the
loop, and closing stops the thread."""

import itertools
import threading
import time

import pytest

from transformer_nmt.data.prefetch import Prefetcher
from transformer_nmt.errors import DataError


@pytest.mark.parametrize('depth', [0, 1, 3])
def test_the_same_items_in_the_same_order(depth):
  with Prefetcher(iter(range(50)), depth) as items:
    assert list(items) == list(range(50))
    with pytest.raises(StopIteration):  # and stays exhausted
      next(items)


@pytest.mark.parametrize('depth', [0, 2])
def test_a_failure_in_the_source_is_raised_in_the_consumer(depth):
  def source():
    yield from range(3)
    raise DataError('train.en:7: invalid UTF-8')
  with Prefetcher(source(), depth) as items:
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(DataError, match='train.en:7'):
      next(items)
    if depth:  # a second call does not hang
      with pytest.raises(DataError):
        next(items)


def test_close_stops_the_thread_and_builds_at_most_depth_ahead():
  made = []

  def endless():
    for i in itertools.count():
      made.append(i)
      yield i
  items = Prefetcher(endless(), 2)
  assert [next(items) for _ in range(5)] == list(range(5))
  time.sleep(0.3)  # room for the thread to fill the queue
  assert len(made) <= 5 + 2 + 1  # consumed, queued, and one waiting for room
  items.close()
  assert not any(t.name == 'prefetch' and t.is_alive() for t in threading.enumerate())


def test_waited_counts_time_spent_waiting_for_items():
  def slow():
    for i in range(3):
      time.sleep(0.1)
      yield i
  items = Prefetcher(slow(), 0)
  next(items), next(items)
  assert items.waited >= 0.19  # built on the consumer's thread: all of it is waiting
  fast = Prefetcher(slow(), 4)
  time.sleep(0.5)  # built ahead while the consumer was busy elsewhere
  next(fast), next(fast)
  assert fast.waited < 0.05
  fast.close()

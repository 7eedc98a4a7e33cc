"""Batching across requests for serve.py: the sentences of concurrent requests share batches
up to a token budget, waiting at most a few milliseconds to fill one, with the requests served
round-robin so that a long one cannot starve short ones. Pure Python, a worker thread per
batch run at once: it calls the `run_batch` it is given (in practice the engine's) and knows
nothing of HTTP or JAX, so its tests run a fake."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Callable, Generic, Optional, Sequence, TypeVar

In = TypeVar('In')
Out = TypeVar('Out')


class QueueFull(Exception):
  """More sentences are queued than the scheduler holds: the caller should retry later."""


class DeadlineExceeded(Exception):
  """A request's deadline passed before all its sentences ran; the rest were dropped."""


class SchedulerClosed(Exception):
  """`submit` after `close`."""


@dataclasses.dataclass(eq=False)
class _Request(Generic[In, Out]):
  items: Sequence[In]
  deadline: Optional[float]  # time.monotonic() value, or None
  future: concurrent.futures.Future
  submitted: float
  pending: collections.deque  # indices of items not yet taken into a batch
  results: list
  left: int  # items whose results have not come back
  on_item: Optional[Callable[[int, object], None]]  # called as each item's result comes


  def done(self) -> bool:
    return self.future.done()


@dataclasses.dataclass
class Stats:
  """Counters for metrics; read them under no lock (each is one int or float)."""

  batches: int = 0
  sentences: int = 0
  tokens: int = 0  # count_tokens summed over the sentences run
  expired: int = 0  # requests failed by their deadline
  cancelled: int = 0  # requests whose caller gave up (cancelled future) with work pending
  last_fill: float = 0.0  # the last batch's tokens / tokens_per_batch


class Scheduler(Generic[In, Out]):
  """One queue of sentences from many requests, run in batches by one worker thread.

    scheduler = Scheduler(engine.translate, tokens_per_batch=4096,
                          count_tokens=lambda s: len(s.split()), max_wait_ms=5,
                          max_queue_sentences=10_000)
    future = scheduler.submit(['Ein Hund.', 'Eine Katze.'], deadline=time.monotonic() + 30)
    future.result()   # -> ['A dog.', 'A cat.'] (or DeadlineExceeded, or run_batch's error)
    future.cancel()   # the caller went away: its sentences not yet run are dropped

  A batch takes one sentence from each waiting request in turn (round-robin, starting after
  the request the last batch ended with) while their `count_tokens` sum stays within
  `tokens_per_batch` (a single sentence over the budget runs alone). It starts once the
  queue holds a full budget or `max_wait_ms` after the oldest waiting request came.
  `on_batch(sentences, tokens, seconds)` is called after each batch (metrics). With
  `mix_requests` off a batch holds one request's sentences only (the requests still take
  turns): serving without batching across requests, to measure what that batching gains.
  `workers` batches run at once, each from a thread of its own: a batch then starts while
  the one before decodes its last sentences on one core."""

  def __init__(self, run_batch: Callable[[list[In]], Sequence[Out]], *, tokens_per_batch: int,
               count_tokens: Callable[[In], int], max_wait_ms: float,
               max_queue_sentences: int, mix_requests: bool = True, workers: int = 1,
               on_batch: Optional[Callable[[int, int, float], None]] = None):
    if min(tokens_per_batch, max_queue_sentences, workers) < 1 or max_wait_ms < 0:
      raise ValueError(f'tokens_per_batch={tokens_per_batch}, max_queue_sentences='
                       f'{max_queue_sentences} and workers={workers} must be positive, '
                       f'max_wait_ms={max_wait_ms} not negative')
    self.run_batch, self.count_tokens = run_batch, count_tokens
    self.tokens_per_batch, self.max_wait = tokens_per_batch, max_wait_ms / 1000
    self.max_queue_sentences, self.on_batch = max_queue_sentences, on_batch
    self.mix_requests = mix_requests
    self.stats = Stats()
    self._requests: collections.deque[_Request] = collections.deque()  # round-robin order
    self._queued = 0  # sentences waiting (not yet in a batch)
    self._queued_tokens = 0
    self._closing = False
    self._cond = threading.Condition()
    self._results = threading.Lock()  # results and counters, which workers update at once
    self._threads = [threading.Thread(target=self._work, name=f'scheduler-{i}', daemon=True)
                     for i in range(workers)]
    for thread in self._threads:
      thread.start()
    # Deadlines pass while the worker runs a batch too: a second thread fails those requests
    # then, so that their callers hear at once and their sentences leave the queue.
    self._reaper = threading.Thread(target=self._reap, name='scheduler-deadlines', daemon=True)
    self._reaper.start()

  @property
  def queue_depth(self) -> int:
    """Sentences waiting for a batch."""
    return self._queued

  def submit(self, items: Sequence[In], deadline: Optional[float] = None,
             on_item: Optional[Callable[[int, Out], None]] = None
             ) -> concurrent.futures.Future:
    """Queues one request's sentences; its future gets their outputs in input order.
    `deadline` is a time.monotonic() value. `on_item(index, output)` is called (from the
    worker thread, before the future is set) as each sentence's output comes, for answers
    streamed sentence by sentence. Raises QueueFull when they do not fit the queue,
    SchedulerClosed after `close`."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    if not items:
      future.set_result([])
      return future
    tokens = sum(self.count_tokens(item) for item in items)
    with self._cond:
      if self._closing:
        raise SchedulerClosed('the scheduler is closed')
      if self._queued + len(items) > self.max_queue_sentences:
        raise QueueFull(f'{self._queued} sentences queued; {len(items)} more would pass '
                        f'max_queue_sentences={self.max_queue_sentences}')
      self._requests.append(_Request(items, deadline, future, time.monotonic(),
                                     collections.deque(range(len(items))),
                                     [None] * len(items), len(items), on_item))
      self._queued += len(items)
      self._queued_tokens += tokens
      self._cond.notify_all()
    future.add_done_callback(self._wake)  # a cancelled request leaves the queue at once
    return future

  def _wake(self, _: concurrent.futures.Future) -> None:
    with self._cond:
      self._cond.notify_all()

  def close(self, timeout: Optional[float] = None) -> None:
    """Runs what is queued (without waiting to fill batches), then stops the workers."""
    with self._cond:
      self._closing = True
      self._cond.notify_all()
    for thread in self._threads:
      thread.join(timeout)
    self._reaper.join(timeout)

  # The worker threads.

  def _reap(self) -> None:
    with self._cond:
      while not (self._closing and not self._requests):
        now = time.monotonic()
        earliest = self._prune(now)
        self._cond.wait(None if earliest is None else earliest - now)

  def _drop(self, request: _Request) -> None:
    """Forgets a request's sentences not yet taken (under the lock)."""
    for i in request.pending:
      self._queued -= 1
      self._queued_tokens -= self.count_tokens(request.items[i])
    request.pending.clear()

  def _prune(self, now: float) -> Optional[float]:
    """Drops cancelled requests, fails those past their deadline (under the lock); returns
    the earliest deadline still ahead, or None."""
    earliest = None
    for request in list(self._requests):
      if request.done():  # cancelled by its caller, or failed by an earlier batch
        self.stats.cancelled += request.future.cancelled() and bool(request.pending)
        self._drop(request)
      elif request.deadline is not None and now >= request.deadline:
        self._drop(request)
        self.stats.expired += 1
        _settle(request.future, error=DeadlineExceeded('the request passed its deadline'))
      elif request.deadline is not None and request.pending:
        earliest = request.deadline if earliest is None else min(earliest, request.deadline)
      if not request.pending:
        self._requests.remove(request)
    return earliest

  def _take(self) -> list[tuple[_Request, int]]:
    """The next batch (under the lock): round-robin over the waiting requests."""
    batch: list[tuple[_Request, int]] = []
    tokens, skipped = 0, 0
    while self._requests and skipped < len(self._requests):
      request = self._requests[0]
      self._requests.rotate(-1)  # the next batch starts after the last request served
      cost = self.count_tokens(request.items[request.pending[0]])
      if batch and (tokens + cost > self.tokens_per_batch
                    or not self.mix_requests and request is not batch[0][0]):
        skipped += 1  # its next sentence does not fit: maybe another request's does
        continue
      i = request.pending.popleft()
      batch.append((request, i))
      tokens += cost
      self._queued -= 1
      self._queued_tokens -= cost
      skipped = 0
      if not request.pending:
        self._requests.remove(request)
    return batch

  def _work(self) -> None:
    while True:
      with self._cond:
        while True:
          now = time.monotonic()
          earliest = self._prune(now)
          if not self._requests:
            if self._closing:
              self._cond.notify_all()  # the deadline thread stops too
              return
            self._cond.wait(None if earliest is None else earliest - now)
            continue
          start = min(r.submitted for r in self._requests) + self.max_wait
          if self._closing or self._queued_tokens >= self.tokens_per_batch or now >= start:
            break
          wake = start if earliest is None else min(start, earliest)
          self._cond.wait(max(wake - now, 0))
        batch = self._take()
      self._run(batch)

  def _run(self, batch: list[tuple[_Request, int]]) -> None:
    """Runs one batch outside the lock and hands each request its results."""
    items = [request.items[i] for request, i in batch]
    t0 = time.monotonic()
    try:
      outputs = list(self.run_batch(items))
      if len(outputs) != len(items):
        raise RuntimeError(f'run_batch gave {len(outputs)} outputs for {len(items)} inputs')
    except Exception as e:  # noqa: BLE001 -- the batch's requests get the error, not the thread
      with self._cond:
        for request, _ in batch:
          self._drop(request)
          _settle(request.future, error=e)
      return
    seconds = time.monotonic() - t0
    tokens = sum(self.count_tokens(item) for item in items)
    with self._results:
      self.stats.batches += 1
      self.stats.sentences += len(items)
      self.stats.tokens += tokens
      self.stats.last_fill = tokens / self.tokens_per_batch
    for (request, i), output in zip(batch, outputs):
      if request.on_item is not None and not request.done():
        try:
          request.on_item(i, output)
        except Exception as e:  # noqa: BLE001 -- the caller's failure ends its request only
          with self._cond:
            self._drop(request)
          _settle(request.future, error=e)
          continue
      with self._results:  # another worker may hold some of the request's sentences:
        request.results[i] = output  # the last one to finish settles it, after every
        request.left -= 1  # on_item of the others
        last = request.left == 0
      if last:
        _settle(request.future, result=request.results)
    if self.on_batch is not None:
      self.on_batch(len(items), tokens, seconds)


def _settle(future: concurrent.futures.Future, result: object = None,
            error: Optional[BaseException] = None) -> None:
  """Sets a future's outcome unless its caller cancelled it (or it is already set)."""
  try:
    if error is not None:
      future.set_exception(error)
    else:
      future.set_result(result)
  except concurrent.futures.InvalidStateError:
    pass

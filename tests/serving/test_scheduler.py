"""The scheduler of serve.py with a fake, deterministic run_batch (no JAX)."""

import concurrent.futures
import threading
import time

import pytest

from transformer_nmt.serving.scheduler import (
  DeadlineExceeded,
  QueueFull,
  Scheduler,
  SchedulerClosed,
)


class FakeEngine:
  """Upper-cases each sentence and records the batches; `gate` (when set) holds each batch
  until released, so that tests can fill the queue behind a running batch."""

  def __init__(self, gate: bool = False):
    self.batches: list[list[str]] = []
    self.gate = threading.Event()
    self.started = threading.Event()
    if not gate:
      self.gate.set()

  def __call__(self, items: list[str]) -> list[str]:
    self.batches.append(list(items))
    self.started.set()
    assert self.gate.wait(10)
    return [s.upper() for s in items]


def make(engine, **kwargs) -> Scheduler:
  options = dict(tokens_per_batch=100, count_tokens=lambda s: len(s.split()), max_wait_ms=50,
                 max_queue_sentences=1000)
  return Scheduler(engine, **{**options, **kwargs})


def held(**kwargs):
  """A scheduler whose worker is busy with request ['a'] (held by the gated fake engine)."""
  engine = FakeEngine(gate=True)
  s = make(engine, **{'max_wait_ms': 0, **kwargs})
  running = s.submit(['a'])
  assert engine.started.wait(5)  # 'a' left the queue for a batch
  return engine, s, running


def test_results_in_input_order_per_request():
  engine = FakeEngine()
  s = make(engine, tokens_per_batch=3)  # a batch of 3 one-word sentences: several batches
  words = [f'w{i}' for i in range(10)]
  assert s.submit(words).result(5) == [w.upper() for w in words]
  assert len(engine.batches) >= 4
  assert all(len(b) <= 3 for b in engine.batches)
  assert s.stats.sentences == 10 and s.stats.batches == len(engine.batches)
  s.close()


def test_empty_request_is_done_at_once():
  s = make(FakeEngine())
  assert s.submit([]).result(1) == []
  s.close()


def test_two_requests_share_a_batch():
  engine = FakeEngine()
  s = make(engine, max_wait_ms=500)  # both arrive well within the wait
  a, b = s.submit(['a1', 'a2']), s.submit(['b1'])
  assert a.result(5) == ['A1', 'A2'] and b.result(5) == ['B1']
  assert engine.batches == [['a1', 'b1', 'a2']]  # one batch, round-robin
  s.close()


def test_token_budget_is_respected():
  engine = FakeEngine()
  s = make(engine, tokens_per_batch=5, max_wait_ms=200)
  sentences = ['one two three', 'four five', 'six', 'seven eight nine ten', 'x' * 3]
  assert s.submit(sentences).result(5) == [x.upper() for x in sentences]
  for batch in engine.batches:
    assert sum(len(x.split()) for x in batch) <= 5, batch
  assert sorted(x for b in engine.batches for x in b) == sorted(sentences)


def test_a_sentence_over_the_budget_runs_alone():
  engine = FakeEngine()
  s = make(engine, tokens_per_batch=2)
  assert s.submit(['a b c d', 'e']).result(5) == ['A B C D', 'E']
  assert engine.batches == [['a b c d'], ['e']]
  s.close()


def test_max_wait_is_honoured():
  engine = FakeEngine()
  s = make(engine, tokens_per_batch=1000, max_wait_ms=300)  # a budget never filled
  t0 = time.monotonic()
  future = s.submit(['a'])
  assert future.result(5) == ['A']
  waited = time.monotonic() - t0
  assert 0.25 <= waited < 2.5, waited
  s.close()


def test_a_full_budget_does_not_wait():
  engine = FakeEngine()
  s = make(engine, tokens_per_batch=2, max_wait_ms=5000)
  t0 = time.monotonic()
  assert s.submit(['a', 'b']).result(5) == ['A', 'B']
  assert time.monotonic() - t0 < 2.5


def test_round_robin_interleaves_a_long_request_with_short_ones():
  engine = FakeEngine(gate=True)
  s = make(engine, tokens_per_batch=2, max_wait_ms=0)
  first = s.submit(['x'])  # holds the worker while the others queue
  assert engine.started.wait(5)
  long = s.submit([f'L{i}' for i in range(8)])
  short = [s.submit([f'S{i}']) for i in range(3)]
  engine.gate.set()
  assert first.result(5) == ['X']
  assert [f.result(5) for f in short] == [['S0'], ['S1'], ['S2']]
  assert long.result(5) == [f'L{i}' for i in range(8)]
  # the short requests ran within the first two batches after the blocked one, not after
  # all eight sentences of the long one
  assert engine.batches[1:3] == [['L0', 'S0'], ['S1', 'S2']]
  s.close()


def test_without_mixing_each_batch_holds_one_request():
  engine = FakeEngine(gate=True)
  s = make(engine, tokens_per_batch=10, max_wait_ms=0, mix_requests=False)
  first = s.submit(['x'])
  assert engine.started.wait(5)
  a, b = s.submit(['a1', 'a2', 'a3']), s.submit(['b1', 'b2'])
  engine.gate.set()
  assert first.result(5) == ['X'] and a.result(5) == ['A1', 'A2', 'A3']
  assert b.result(5) == ['B1', 'B2']
  assert sorted(engine.batches[1:]) == [['a1', 'a2', 'a3'], ['b1', 'b2']]
  s.close()


def test_each_result_is_handed_on_as_it_comes_before_the_future():
  engine = FakeEngine()
  s = make(engine, tokens_per_batch=1, max_wait_ms=0)  # one sentence per batch
  seen = []
  future = s.submit(['a', 'b', 'c'], on_item=lambda i, out: seen.append((i, out,
                                                                         future.done())))
  assert future.result(5) == ['A', 'B', 'C']
  assert seen == [(0, 'A', False), (1, 'B', False), (2, 'C', False)]
  s.close()


def test_a_failing_on_item_ends_its_request_only():
  engine = FakeEngine()
  s = make(engine, tokens_per_batch=1, max_wait_ms=0)
  def fail(i, out):
    raise OSError('the client is gone')
  broken = s.submit(['a', 'b', 'c'], on_item=fail)
  with pytest.raises(OSError, match='gone'):
    broken.result(5)
  assert s.submit(['d']).result(5) == ['D']
  assert [x for batch in engine.batches for x in batch] == ['a', 'd']  # 'b', 'c' dropped
  s.close()


def test_queue_full():
  engine, s, running = held(max_queue_sentences=2)
  queued = s.submit(['b', 'c'])
  with pytest.raises(QueueFull, match='max_queue_sentences=2'):
    s.submit(['d'])
  assert s.queue_depth == 2
  engine.gate.set()
  assert running.result(5) == ['A'] and queued.result(5) == ['B', 'C']
  assert s.submit(['d']).result(5) == ['D']  # room again
  s.close()


def test_deadline_fails_the_request_and_drops_its_sentences():
  engine, s, running = held()
  late = s.submit(['b', 'c'], deadline=time.monotonic() + 0.2)
  on_time = s.submit(['d'], deadline=time.monotonic() + 60)
  with pytest.raises(DeadlineExceeded):
    late.result(5)  # failed while the worker is still busy with 'a'
  engine.gate.set()
  assert running.result(5) == ['A'] and on_time.result(5) == ['D']
  assert all('b' not in batch and 'c' not in batch for batch in engine.batches)
  assert s.stats.expired == 1 and s.queue_depth == 0
  s.close()


def test_cancel_drops_pending_sentences():
  engine, s, running = held()
  gone = s.submit(['b', 'c'])
  kept = s.submit(['d'])
  assert gone.cancel()
  engine.gate.set()
  assert running.result(5) == ['A'] and kept.result(5) == ['D']
  assert [x for batch in engine.batches for x in batch] == ['a', 'd']
  assert s.stats.cancelled == 1 and s.queue_depth == 0
  with pytest.raises(concurrent.futures.CancelledError):
    gone.result(0)
  s.close()


def test_close_finishes_what_is_queued_then_stops():
  engine = FakeEngine(gate=True)
  s = make(engine, max_wait_ms=10_000)  # close does not wait for a batch to fill
  first = s.submit(['a'])
  second = s.submit(['b'])
  engine.gate.set()
  t0 = time.monotonic()
  s.close(timeout=5)
  assert time.monotonic() - t0 < 2.5
  assert first.result(0) == ['A'] and second.result(0) == ['B']
  assert not any(thread.is_alive() for thread in s._threads)
  with pytest.raises(SchedulerClosed):
    s.submit(['c'])


def test_an_error_of_run_batch_fails_its_requests_only():
  def run(items):
    if 'bad' in items:
      raise ValueError('boom')
    return items
  s = make(run, tokens_per_batch=1, max_wait_ms=0)
  bad = s.submit(['bad', 'more'])
  with pytest.raises(ValueError, match='boom'):
    bad.result(5)
  assert s.submit(['fine']).result(5) == ['fine']  # the worker lives on
  s.close()


@pytest.mark.parametrize('workers', [1, 2])
def test_concurrent_submitters_get_their_own_results(workers):
  s = make(FakeEngine(), tokens_per_batch=7, max_wait_ms=2, workers=workers)
  def client(k):
    lines = [f'c{k}s{i}' for i in range(k % 5 + 1)]
    return s.submit(lines).result(10) == [x.upper() for x in lines]
  with concurrent.futures.ThreadPoolExecutor(8) as pool:
    assert all(pool.map(client, range(40)))
  assert s.stats.sentences == sum(k % 5 + 1 for k in range(40))
  s.close()


def test_bad_settings_are_refused():
  with pytest.raises(ValueError, match='tokens_per_batch'):
    make(FakeEngine(), tokens_per_batch=0)
  with pytest.raises(ValueError, match='workers=0'):
    make(FakeEngine(), workers=0)


def test_two_workers_run_two_batches_at_once():
  together = threading.Barrier(2, timeout=5)  # passes only while two batches run
  def run(items):
    together.wait()
    return [x.upper() for x in items]
  s = make(run, tokens_per_batch=2, max_wait_ms=0, workers=2)
  seen = []
  future = s.submit(['a', 'b', 'c', 'd'],  # two batches of two sentences, one per worker
                    on_item=lambda i, out: seen.append((i, out, future.done())))
  assert future.result(10) == ['A', 'B', 'C', 'D']
  assert sorted(seen) == [(i, x, False) for i, x in enumerate('ABCD')]  # all before the end
  assert s.stats.batches == 2 and s.stats.sentences == 4
  s.close()

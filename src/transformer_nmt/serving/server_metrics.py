"""serve.py's Prometheus metrics: requests, errors by kind, latency, the scheduler's queue
and batches, tokens, the programs loaded from the store or compiled by XLA, and the time the
garbage collector held the process."""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

import jax
import prometheus_client as prom

from transformer_nmt.inference.engine import Engine
from transformer_nmt.runtime import heap
from transformer_nmt.serving.scheduler import Scheduler


class Metrics:
  """The server's counters, histograms and gauges, in a registry of their own (one per app)."""

  def __init__(self, scheduler: Callable[[], Scheduler], engine: Engine):
    self.registry = r = prom.CollectorRegistry()
    self.requests = prom.Counter('nmt_requests', 'Requests by endpoint and status',
                                 ['endpoint', 'status'], registry=r)
    self.errors = prom.Counter('nmt_errors', 'Failed requests by kind', ['kind'], registry=r)
    self.latency = prom.Histogram('nmt_request_seconds', 'Request latency', ['endpoint'],
                                  registry=r, buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5,
                                                       5, 10, 30, 60))
    self.batch_fill = prom.Histogram('nmt_batch_fill', 'Source tokens of a batch / its budget',
                                     registry=r, buckets=(.1, .2, .3, .4, .5, .6, .7, .8, .9, 1))
    self.batches = prom.Counter('nmt_batches', 'Batches run', registry=r)
    self.sentences = prom.Counter('nmt_sentences', 'Sentences run (translated or scored)',
                                  registry=r)
    self.target_tokens = prom.Counter('nmt_target_tokens', 'Target subwords translated',
                                      registry=r)
    self.batch_seconds = prom.Counter('nmt_batch_seconds', 'Time spent running batches (tokens/s'
                                      ' = rate(nmt_target_tokens) / rate(nmt_batch_seconds))',
                                      registry=r)
    queue = prom.Gauge('nmt_queue_sentences', 'Sentences waiting for a batch', registry=r)
    queue.set_function(lambda: scheduler().queue_depth)
    loaded = prom.Gauge('nmt_programs_loaded', 'Stored programs loaded', registry=r)
    loaded.set_function(lambda: 0 if engine.store is None else engine.store.loaded)
    compiled = prom.Gauge('nmt_programs_compiled', 'XLA programs compiled by this process '
                          '(flat once warm: a rise means a request waited for a compile)',
                          registry=r)
    compiled.set_function(lambda: _compiles.count)
    maps = prom.Gauge('nmt_memory_maps', 'Memory maps the process holds, and the most Linux '
                      'allows it (vm.max_map_count): each compiled program holds a few hundred',
                      ['of'], registry=r)
    maps.labels('used').set_function(lambda: (heap.memory_maps() or (0, 0))[0])
    maps.labels('limit').set_function(lambda: (heap.memory_maps() or (0, 0))[1])
    split = prom.Gauge('nmt_lines_split', 'Lines translated in pieces split at sentence ends '
                       '(longer than decode.split_len)', registry=r)
    split.set_function(lambda: engine.lines_split)
    cut = prom.Gauge('nmt_sentences_cut', 'Sentences longer than the longest prepared source, '
                     'translated in pieces cut mid-sentence', registry=r)
    cut.set_function(lambda: engine.sentences_cut)
    paused = prom.Gauge('nmt_gc_seconds', 'Seconds the garbage collector ran, by generation '
                        '(threads that need the GIL wait meanwhile: the event loop, the Python '
                        'between programs)', ['generation'], registry=r)
    for generation in range(len(_gc_pauses.seconds)):
      paused.labels(str(generation)).set_function(
          lambda g=generation: _gc_pauses.seconds[g])


class _Compiles:
  """Counts the process's XLA compilations (JAX reports each backend compile's duration)."""

  def __init__(self):
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self._heard)

  def _heard(self, event: str, seconds: float, **_: Any) -> None:
    if event == '/jax/core/compile/backend_compile_duration':
      self.count += 1


_compiles = _Compiles()


class _GcPauses:
  """Sums the process's garbage collection time per generation (gc.callbacks, once per
  process: apps come and go in tests, the collector is one)."""

  def __init__(self):
    self.seconds = [0.0] * len(gc.get_count())
    self._began = 0.0
    gc.callbacks.append(self._heard)

  def _heard(self, phase: str, info: dict[str, int]) -> None:
    if phase == 'start':
      self._began = time.perf_counter()
    else:
      self.seconds[info['generation']] += time.perf_counter() - self._began


_gc_pauses = _GcPauses()

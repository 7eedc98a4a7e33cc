"""The training log: each logging interval's losses, learning rate, throughput, padding,
waiting for data and time left, from metrics kept on device until the interval ends."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, Iterator

import numpy as np

from transformer_nmt import sharding
from transformer_nmt.data import batching as data_lib


class Progress:
  """Accumulates step metrics on device and logs them (one host sync per log).

  Time spent outside training (evaluation, saving the best checkpoint), declared with
  `outside_training`, is left out of tokens/s, the elapsed training time and the time left,
  wherever it falls in a logging interval. `data_wait` is the share of the interval's
  training time that the loop spent waiting for batches (`add`'s `waited`).
  """

  def __init__(self, num_steps: int, start: int, wall_before: float = 0.0,
               clock: Callable[[], float] = time.time):
    self.num_steps, self.start_step, self.clock = num_steps, start, clock
    self.pending: list[dict] = []
    self.padding: list[float] = []
    self.waited = 0.0  # seconds waiting for data in the current logging interval
    self.t0 = self.interval_start = clock()
    self.wall0 = self.t0 - wall_before  # wall_s counts earlier runs of a resumed workdir too
    self.paused = 0.0  # seconds outside training in the current logging interval
    self.paused_total = 0.0  # ... since the start

  def add(self, metrics: dict, batches: list[data_lib.Batch], waited: float = 0.0) -> None:
    """One step's device metrics, its host batches, and the seconds it waited for them."""
    self.pending.append(metrics)
    self.waited += waited
    self.padding.extend(data_lib.padding_fraction(b) for b in batches)

  @contextlib.contextmanager
  def outside_training(self) -> Iterator[None]:
    start = self.clock()
    try:
      yield
    finally:
      spent = self.clock() - start
      self.paused += spent
      self.paused_total += spent

  def log(self, step: int) -> dict:
    sums = sharding.local_copy(self.pending)  # the one host sync per logging interval
    tokens = sum(float(m['tokens']) for m in sums)
    real_src = sum(float(m.get('src_tokens', 0.0)) for m in sums)
    now = self.clock()
    trained = now - self.t0 - self.paused_total
    per_step = trained / max(step - self.start_step, 1)
    interval = now - self.interval_start - self.paused
    row = {'train_loss': sum(float(m['loss']) for m in sums) / max(tokens, 1.0),
           'train_nll': sum(float(m['nll']) for m in sums) / max(tokens, 1.0),
           'learning_rate': float(sums[-1]['learning_rate']),
           'grad_norm': float(np.mean([m['grad_norm'] for m in sums])),
           'tokens_per_sec': (tokens + real_src) / max(interval, 1e-9),
           'padding_fraction': float(np.mean(self.padding)),
           'data_wait': self.waited / max(interval, 1e-9),
           'wall_s': now - self.wall0}
    logging.info('step %d/%d | loss %.3f (nll %.3f) | lr %.2e | %.0f tok/s | pad %.0f%% | '
                 'data wait %.1f%% | %s elapsed, %s left', step, self.num_steps,
                 row['train_loss'], row['train_nll'], row['learning_rate'],
                 row['tokens_per_sec'], 100 * row['padding_fraction'], 100 * row['data_wait'],
                 _hms(trained), _hms(per_step * (self.num_steps - step)))
    self.pending, self.padding, self.interval_start, self.paused = [], [], now, 0.0
    self.waited = 0.0
    return row


def _hms(seconds: float) -> str:
  m, s = divmod(int(seconds), 60)
  return f'{m // 60}h{m % 60:02d}m' if m >= 60 else f'{m}m{s:02d}s'

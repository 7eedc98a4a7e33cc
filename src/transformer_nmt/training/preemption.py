"""Stopping a training run cleanly on SIGTERM (preemption) or Ctrl-C, on one host or many.

The signal handler only sets a flag; the loop asks at step boundaries (and evaluation
between its batches) whether to stop, then saves the last completed step and exits with
code 130. Raising from the handler instead would surface wherever Python happens to be, and
is lost there when that is, say, inside a garbage-collection callback.

With several processes, every one must save the same step together (a save that some never
join hangs). JAX's preemption service does that agreement: its notifier catches SIGTERM in
any process and `multihost_utils.reached_preemption_sync_point(step)` then turns True at the
same step in all of them. Ctrl-C in one process is turned into that SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any, Iterator

import jax


class Stopped(KeyboardInterrupt):
  """Raised once a requested stop has saved its checkpoint (programs exit with code 130)."""


class StopRequest:
  """Whether the run has been asked to stop: `watching()` installs the signal handlers for a
  run's life, `should_stop(step)` answers at a step boundary (the same step in every
  process), `requested()` at any moment in this process (e.g. between evaluation batches)."""

  def __init__(self) -> None:
    self.multi_process = jax.process_count() > 1
    self._flag = False

  @contextlib.contextmanager
  def watching(self) -> Iterator[StopRequest]:
    # With several processes, SIGTERM belongs to JAX's preemption notifier.
    signals = (signal.SIGINT,) if self.multi_process else (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, self._on_signal) for s in signals}
    try:
      yield self
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  def _on_signal(self, signum: int, frame: Any) -> None:
    del frame
    if self.multi_process:  # let the preemption service tell every process
      self._flag = True
      signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C: at once
      os.kill(os.getpid(), signal.SIGTERM)
      return
    if self._flag and signum == signal.SIGINT:
      raise KeyboardInterrupt  # a second Ctrl-C: stop now (the loop still saves its state)
    self._flag = True
    logging.info('%s received: stopping after the current step (Ctrl-C again to stop at once)',
                 signal.Signals(signum).name)

  def requested(self) -> bool:
    """This process has been signalled (no agreement with other processes)."""
    return self._flag

  def should_stop(self, step: int) -> bool:
    """At the boundary after `step`: stop now? Every process gets the same answer."""
    if self.multi_process:
      from jax.experimental import multihost_utils
      return multihost_utils.reached_preemption_sync_point(step)
    return self._flag

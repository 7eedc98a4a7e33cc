"""A jax.profiler trace of chosen training steps (`train.profile_steps`)."""

from __future__ import annotations

import logging
import pathlib
from typing import Any, Sequence

import jax

from transformer_nmt import sharding


class Profile:
  """Traces steps [first, first + count) into `directory` (process 0 only: one trace of the
  program every process runs). Open it with TensorBoard's profile plugin:
  `pip install tensorboard-plugin-profile; tensorboard --logdir WORKDIR/profile`."""

  def __init__(self, directory: pathlib.Path, window: Sequence[int]):
    self.directory = directory
    self.first, self.last = (window[0], window[0] + window[1] - 1) if window else (0, -1)
    self.active = False
    self.enabled = bool(window) and sharding.is_leader()

  def before(self, step: int) -> None:
    if self.enabled and step == self.first:
      jax.profiler.start_trace(str(self.directory))
      self.active = True

  def after(self, step: int, state: Any) -> None:
    """Ends the trace after its last step, once that step's work has finished."""
    if self.active and step >= self.last:
      jax.block_until_ready(state)
      self.close()
      logging.info('Profiled steps %d-%d: trace in %s', self.first, self.last, self.directory)

  def close(self) -> None:
    if self.active:
      self.active = False
      jax.profiler.stop_trace()

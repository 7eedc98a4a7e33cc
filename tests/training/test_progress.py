"""Training progress: throughput and time left leave evaluation out, wherever it falls."""

import logging

import numpy as np
import pytest

from transformer_nmt.training.progress import Progress


class Clock:
  def __init__(self, t: float):
    self.t = t

  def __call__(self) -> float:
    return self.t


def _step():
  batch = dict(src=np.ones((2, 4)), tgt_out=np.ones((2, 4)), src_segments=np.ones((2, 4)),
               tgt_segments=np.array([[1, 1, 0, 0], [1, 1, 1, 1]]))
  metrics = dict(loss=np.float32(6.0), nll=np.float32(3.0), tokens=np.float32(6.0),
                 src_tokens=8, grad_norm=np.float32(1.0), learning_rate=np.float32(0.1))
  return metrics, [batch]


def test_progress_leaves_evaluation_out_of_tokens_per_second_and_time_left(caplog):
  clock = Clock(100.0)
  progress = Progress(num_steps=10, start=0, wall_before=50.0, clock=clock)
  progress.add(*_step())
  clock.t += 2  # step 1 trains for 2 s
  with progress.outside_training():  # an evaluation between two logs (eval_every 1, log 2)
    clock.t += 30
  progress.add(*_step(), waited=1.0)  # a second of those 2 s waiting for its batch
  clock.t += 2
  with caplog.at_level(logging.INFO):
    row = progress.log(2)
  assert row['tokens_per_sec'] == pytest.approx(2 * (6 + 8) / 4)  # 4 s of training, not 34
  assert row['train_loss'] == pytest.approx(1.0) and row['train_nll'] == pytest.approx(0.5)
  assert row['padding_fraction'] == pytest.approx(2 / 16)
  assert row['wall_s'] == pytest.approx(50 + 34)  # wall time counts everything
  assert row['data_wait'] == pytest.approx(1 / 4)
  assert 'step 2/10' in caplog.text and '0m04s elapsed, 0m16s left' in caplog.text
  assert 'data wait 25.0%' in caplog.text
  progress.add(*_step())
  clock.t += 1
  row = progress.log(3)
  assert row['tokens_per_sec'] == pytest.approx(14.0) and row['data_wait'] == 0.0  # afresh

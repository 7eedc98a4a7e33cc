import numpy as np
import pytest

from transformer_nmt.training.losses import smoothed_cross_entropy
from transformer_nmt.training.schedules import rsqrt_warmup


def test_smoothed_loss_matches_numpy_reference():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
  targets = np.array([[1, 2, 0], [4, 0, 0]])
  weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  eps, v = 0.1, 5
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  q = np.full((2, 3, 5), eps / v) + (1 - eps) * np.eye(v)[targets]
  per_token = -(q * log_p).sum(-1)
  out = smoothed_cross_entropy(logits, targets, weights, eps)
  assert float(out['tokens']) == 3.0
  assert float(out['loss']) == pytest.approx((per_token * weights).sum(), rel=1e-5)
  nll = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  assert float(out['nll']) == pytest.approx((nll * weights).sum(), rel=1e-5)


def test_padding_does_not_change_loss():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(1, 4, 6)).astype(np.float32)
  targets = np.array([[1, 2, 3, 0]])
  a = smoothed_cross_entropy(logits, targets, np.array([[1, 1, 1, 0]]), 0.1)
  logits[0, 3] += 100.0  # garbage at the padded position
  b = smoothed_cross_entropy(logits, targets, np.array([[1, 1, 1, 0]]), 0.1)
  assert float(a['loss']) == pytest.approx(float(b['loss']))


def test_schedule_values_at_step_1_warmup_and_4x_warmup():
  d, warmup = 512, 4000
  lr = rsqrt_warmup(d, warmup)
  # optax counts updates from 0: count c is the paper's step c + 1.
  assert float(lr(0)) == pytest.approx(d ** -0.5 * 1 * warmup ** -1.5, rel=1e-5)
  assert float(lr(warmup - 1)) == pytest.approx(d ** -0.5 * warmup ** -0.5, rel=1e-5)
  assert float(lr(4 * warmup - 1)) == pytest.approx(d ** -0.5 * (4 * warmup) ** -0.5, rel=1e-5)
  assert float(lr(4 * warmup - 1)) == pytest.approx(float(lr(warmup - 1)) / 2, rel=1e-5)
  assert float(lr(warmup - 1)) > float(lr(warmup - 2)) and float(lr(warmup - 1)) > float(lr(warmup))
  assert float(rsqrt_warmup(d, warmup, multiplier=2.0)(10)) == pytest.approx(2 * float(lr(10)))


def test_cooldown_decays_linearly_to_zero_over_the_last_steps():
  d, warmup, steps, cooldown = 256, 10, 100, 40
  plain, cooled = rsqrt_warmup(d, warmup), rsqrt_warmup(d, warmup, num_steps=steps,
                                                        cooldown_steps=cooldown)
  for count in (0, warmup - 1, steps - cooldown - 1, steps - cooldown):
    assert float(cooled(count)) == pytest.approx(float(plain(count)), rel=1e-6)
  # Update `count` uses paper step count + 1; the factor is (steps - count) / cooldown.
  assert float(cooled(steps - 20)) == pytest.approx(float(plain(steps - 20)) * 20 / 40, rel=1e-6)
  assert float(cooled(steps - 1)) == pytest.approx(float(plain(steps - 1)) / 40, rel=1e-6)
  assert float(cooled(steps)) == 0.0


def test_correct_counts_argmax_hits_on_real_tokens():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(2, 4, 7)).astype(np.float32)
  targets = rng.integers(0, 7, size=(2, 4))
  targets[0, :2] = logits[0, :2].argmax(-1)  # two certain hits; the rest hit by chance
  weights = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
  out = smoothed_cross_entropy(logits, targets, weights, 0.1)
  expected = ((logits.argmax(-1) == targets) * weights).sum()
  assert expected >= 2 and float(out['correct']) == expected

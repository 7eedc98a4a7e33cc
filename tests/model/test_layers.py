import math

import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.model.layers import sinusoidal_positions


def test_interleaved_positions_match_paper_formula():
  d = 8
  pe = np.asarray(sinusoidal_positions(jnp.arange(5), d, 'interleaved'))
  for pos in range(5):
    for i in range(d // 2):
      angle = pos / 10000 ** (2 * i / d)
      assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
      assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


def test_concat_positions_match_tensor2tensor_formula():
  d = 8
  pe = np.asarray(sinusoidal_positions(jnp.arange(5), d, 'concat'))
  for pos in range(5):
    for i in range(d // 2):
      angle = pos * math.exp(-i * math.log(10000.0) / (d // 2 - 1))
      assert pe[pos, i] == pytest.approx(math.sin(angle), abs=1e-6)
      assert pe[pos, d // 2 + i] == pytest.approx(math.cos(angle), abs=1e-6)


def test_positions_restart_per_segment():
  positions = jnp.array([[0, 1, 2, 0, 1]])
  pe = sinusoidal_positions(positions, 4)
  np.testing.assert_allclose(pe[0, 3], pe[0, 0])
  np.testing.assert_allclose(pe[0, 4], pe[0, 1])
  assert pe.shape == (1, 5, 4)

"""The learning-rate schedule of paper eq. 3 as an optax schedule."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def rsqrt_warmup(d_model: int, warmup_steps: int, multiplier: float = 1.0) -> optax.Schedule:
  """lrate = multiplier * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (eq. 3).

  optax passes the number of updates already applied (0 for the first), so the paper's
  step number is `count + 1`: the first update uses step 1, and the peak is at
  step == warmup_steps, i.e. count == warmup_steps - 1.
  """
  def schedule(count: jnp.ndarray) -> jnp.ndarray:
    step = jnp.asarray(count, jnp.float32) + 1.0
    return multiplier * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)
  return schedule

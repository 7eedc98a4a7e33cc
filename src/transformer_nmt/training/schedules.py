"""The learning-rate schedule of paper eq. 3 as an optax schedule."""

from __future__ import annotations

import jax.numpy as jnp
import optax


def rsqrt_warmup(d_model: int, warmup_steps: int, multiplier: float = 1.0, num_steps: int = 0,
                 cooldown_steps: int = 0) -> optax.Schedule:
  """lrate = multiplier * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (eq. 3).

  optax passes the number of updates already applied (0 for the first), so the paper's
  step number is `count + 1`: the first update uses step 1, and the peak is at
  step == warmup_steps, i.e. count == warmup_steps - 1.

  With `cooldown_steps` > 0 (not in the paper) the rate is also scaled down linearly over the
  last `cooldown_steps` of `num_steps` updates, from 1 at update `num_steps - cooldown_steps`
  to 1 / cooldown_steps at the last: a short run ends annealed instead of at eq. 3's still
  high rate.
  """
  def schedule(count: jnp.ndarray) -> jnp.ndarray:
    step = jnp.asarray(count, jnp.float32) + 1.0
    lr = multiplier * d_model ** -0.5 * jnp.minimum(step ** -0.5, step * warmup_steps ** -1.5)
    if cooldown_steps > 0:
      lr = lr * jnp.clip((num_steps - step + 1.0) / cooldown_steps, 0.0, 1.0)
    return lr
  return schedule

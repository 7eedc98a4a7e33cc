"""The decoder cache's cross-attention keys laid out per head, [B, H, S, Dh] (one decoding
step's logits: a matmul per sentence and head, model/one_step.py), against the layout they
replaced, [B, S, H, Dh] with the logits as a multiply and a reduction. Two engines on the same
loaded model, one traced each way, alternating (bench/side_by_side.py): the whole list,
groups of 1-16 lines (requests served one by one) and shuffled calls of 250 lines (a busy
server's batches); prints the fastest round of each, their ratio, and the lines they
translate differently (the logits' dots add in another order).

  python bench/cross_keys.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import jax
import jax.numpy as jnp
import side_by_side
from absl import app

from transformer_nmt.model import attention, one_step, sums


def _step_kv(self: attention.MultiHeadAttention, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  return self.project_kv(x)  # keys [B, S, H, Dh], as the values


def logits_before(q: jax.Array, k: jax.Array, halving: bool = False) -> jax.Array:
  """The logits before: q [N, 1, H, Dh] . k [B, S, H, Dh] multiplied and reduced over Dh
  (`halving`: summed as sums.total adds)."""
  add = sums.total if halving else jnp.sum
  b, s, h, _ = k.shape
  g = q.shape[0] // b
  if g == 1:
    logits = add(q.astype(jnp.float32) * k.astype(jnp.float32), axis=-1)  # [N, S, H]
    return jnp.swapaxes(logits, 1, 2)[:, :, None, :]
  qg = q.reshape((b, g, 1) + q.shape[2:]).astype(jnp.float32)  # [B, G, 1, H, Dh]
  logits = add(qg * k.astype(jnp.float32)[:, None], axis=-1)  # [B, G, S, H]
  return jnp.swapaxes(logits, 2, 3).reshape(q.shape[0], h, 1, s)


def main(_):
  side_by_side.before_and_now(  # _OPTIONS: defined below, as bench/micro.py and tests import this
      _OPTIONS(), [(attention.MultiHeadAttention, {'step_kv': _step_kv}),
                   (one_step, {'one_query_logits': logits_before})],
      'keys [B, S, H, Dh] (before)', 'keys [B, H, S, Dh]')


if __name__ == '__main__':
  _OPTIONS = side_by_side.define_flags(lines=1000, rounds=3, calls=250)
  app.run(main)

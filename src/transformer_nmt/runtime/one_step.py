"""XLA CPU fast paths for one decoding step's attention (one query per row), with the
`model.attention` reference (eq. 1 as einsums) as their specification;
tests/runtime/test_one_step.py checks each against it.

The logits take keys laid out per head, [B, H, S, Dh] (the decoder cache keeps its
cross-attention keys so, transposed once per batch): each sentence and head is then one small
matmul, which YNNPACK runs faster than the elementwise form over [B, S, H, Dh] keys, with
beams and greedy alike. In cross-attention with beams, G consecutive query rows (the beams of
one sentence) share one key and value row, so a sentence's G queries are that matmul's rows. The
weighted values stay an elementwise multiply and a reduction, which fuse into one loop that is
faster on XLA CPU than the dot; reducing a sentence's G rows together reads its values once.
G = 1 keeps its own layout for them, since the grouped one with a unit G axis runs much slower on
XLA CPU. Other backends take the same code. With `halving` (the programs of
decode.batch_invariant) the logits too are a product and a reduction, summed as runtime/sums.py
adds.

Dimension legend: N query rows, B key/value rows (N = B * G), S keys, H heads, Dh head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer_nmt.runtime import sums


def one_query_logits(q: jax.Array, k: jax.Array, halving: bool = False) -> jax.Array:
  """q [N, 1, H, Dh] (already scaled) . k [B, H, S, Dh] (keys per head) -> float32 logits
  [N, H, 1, S]; query row n uses key row n // G. `halving`: sums as sums.total adds."""
  b, h, s, d = k.shape
  qg = q.reshape(b, -1, h, d)  # [B, G, H, Dh]
  if halving:
    logits = sums.total(qg.astype(jnp.float32)[:, :, :, None] * k.astype(jnp.float32)[:, None],
                        axis=-1)  # [B, G, H, S]
  else:
    logits = jnp.einsum('bghd,bhsd->bghs', qg, k, preferred_element_type=jnp.float32)
  return logits.reshape(q.shape[0], h, 1, s)


def one_query_values(probs: jax.Array, v: jax.Array, halving: bool = False) -> jax.Array:
  """probs [N, H, 1, S] @ v [B, S, H, Dh] -> [N, 1, H, Dh] in v's dtype; query row n uses
  value row n // G. `halving`: sums as sums.total adds."""
  add = sums.total if halving else jnp.sum
  if probs.shape[0] == v.shape[0]:
    weights = jnp.swapaxes(probs[:, :, 0, :], 1, 2)[..., None]  # [N, S, H, 1]
    return add(weights * v.astype(jnp.float32), axis=1)[:, None].astype(v.dtype)
  b, s, h, _ = v.shape
  weights = jnp.swapaxes(probs.reshape(b, -1, h, s), 2, 3)[..., None]  # [B, G, S, H, 1]
  out = add(weights * v.astype(jnp.float32)[:, None], axis=2)  # [B, G, H, Dh]
  return out.reshape((probs.shape[0], 1) + out.shape[2:]).astype(v.dtype)

"""XLA CPU fast paths for one decoding step's attention (one query per row), with the
`model.attention` reference (eq. 1 as einsums) as their specification; tests/model/test_one_step.py
checks each against it.

On XLA CPU, batched matrix-vector products (a [1, Dh] query against [S, Dh] keys per head)
run as slow dot kernels; an elementwise multiply and a reduction fuse into one loop that is
faster here (bench/micro.py). In cross-attention with beams, G consecutive query rows (the
beams of one sentence) share one key and value row: reducing them together reads those keys
and values once (bench/micro.py). G = 1 keeps its own layout, since the grouped one with a
unit G axis runs much slower on XLA CPU (bench/RESULTS.md, 'Optimisations tried'). Other
backends take the same code; it is the einsum that is slow on CPUs, not these paths on TPUs.

Dimension legend: N query rows, B key/value rows (N = B * G), S keys, H heads, Dh head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer_nmt.model import sums


def one_query_logits(q: jax.Array, k: jax.Array, halving: bool = False) -> jax.Array:
  """q [N, 1, H, Dh] (already scaled) . k [B, S, H, Dh] -> float32 logits [N, H, 1, S];
  query row n uses key row n // G. `halving`: sums as sums.total adds."""
  add = sums.total if halving else jnp.sum
  b, s, h, _ = k.shape
  g = q.shape[0] // b
  if g == 1:
    logits = add(q.astype(jnp.float32) * k.astype(jnp.float32), axis=-1)  # [N, S, H]
    return jnp.swapaxes(logits, 1, 2)[:, :, None, :]
  qg = q.reshape((b, g, 1) + q.shape[2:]).astype(jnp.float32)  # [B, G, 1, H, Dh]
  logits = add(qg * k.astype(jnp.float32)[:, None], axis=-1)  # [B, G, S, H]
  return jnp.swapaxes(logits, 2, 3).reshape(q.shape[0], h, 1, s)


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

"""Autoregressive decoding over the explicit decoder cache.

Search functions take a `logits_fn(ids_t, cache) -> (logits, cache)` callback, so they work
with any model (or a fixed table in tests). Dimension legend: B batch, L output length, V vocab.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from transformer_nmt.config import ModelConfig
from transformer_nmt.model import Transformer

LogitsFn = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


def greedy_search(logits_fn: LogitsFn, cache: Any, max_lens: jax.Array, *, bos_id: int,
                  eos_id: int, pad_id: int, max_len: int) -> jax.Array:
  """Picks the argmax token at every step until each row has emitted EOS.

  A `lax.while_loop` runs one cached decoder step per iteration and stops as soon as
  every row is finished.

  Args:
    logits_fn: one decoder step, [B] previous ids -> [B, V] logits.
    cache: the decoder cache for `logits_fn` (sized for `max_len` steps).
    max_lens: [B] per-row output limit in tokens (EOS is forced there), <= max_len.
    bos_id, eos_id, pad_id: special ids from the tokenizer.
    max_len: static length L of the output buffer.

  Returns:
    [B, L] ids: each row's tokens, then EOS, then pad_id.
  """
  batch = max_lens.shape[0]
  out = jnp.full((batch, max_len), pad_id, jnp.int32)
  state = (jnp.int32(0), jnp.full((batch,), bos_id, jnp.int32), jnp.zeros((batch,), bool), out,
           cache)

  def cond(state: tuple) -> jax.Array:
    t, _, done, _, _ = state
    return (t < max_len) & ~jnp.all(done)

  def body(state: tuple) -> tuple:
    t, prev, done, out, cache = state
    logits, cache = logits_fn(prev, cache)
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    token = jnp.where(t + 1 >= max_lens, eos_id, token)  # length limit reached: close the row
    token = jnp.where(done, pad_id, token)
    out = out.at[:, t].set(token)
    return t + 1, token, done | (token == eos_id), out, cache

  return jax.lax.while_loop(cond, body, state)[3]


def translate_greedy(cfg: ModelConfig, params: Any, src: jax.Array, src_segments: jax.Array, *,
                     bos_id: int, eos_id: int, pad_id: int, max_extra_len: int = 50) -> jax.Array:
  """Greedy translation of a padded batch: src [B, S] -> [B, S + max_extra_len] ids.

  Each row may produce up to its source length + `max_extra_len` tokens (§6.1).
  """
  model = Transformer(cfg)
  variables = {'params': params}
  max_len = src.shape[1] + max_extra_len
  memory = model.apply(variables, src, src_segments, method=Transformer.encode)
  cache = model.apply(variables, memory, src_segments, max_len, method=Transformer.init_cache)

  def logits_fn(ids_t: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
    return model.apply(variables, ids_t, cache, method=Transformer.decode_step)

  max_lens = jnp.sum(src_segments > 0, axis=1) + max_extra_len
  return greedy_search(logits_fn, cache, max_lens, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                       max_len=max_len)

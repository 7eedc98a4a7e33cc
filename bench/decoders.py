"""Decoders that only benchmarks run, beside the library's cached one (decoding/translate.py):
what the KV cache and the cross-attention K/V reuse are worth, measured by bench/decode.py.

  'no_cross_reuse'  self-attention KV cache, cross-attention K/V recomputed every step;
  'uncached'        the whole target prefix re-run through the decoder every step.

Each is a `translate.Decoder`: (cfg, params, src, src_segments, length) -> (logits_fn, cache),
run by `translate_rows` in one jitted loop per batch over the engine's batch plan.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from transformer_nmt.config import ModelConfig
from transformer_nmt.data import batching as data_lib
from transformer_nmt.decoding.compaction import batch_sizes
from transformer_nmt.decoding.search import LogitsFn
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.decoding.translate import Decoder, cached_decoder, translate
from transformer_nmt.inference import heap
from transformer_nmt.inference.batches import START_ROWS, in_order, strip
from transformer_nmt.model.transformer import Transformer


@flax.struct.dataclass
class PrefixState:
  """For 'uncached' decoding: encoder output and the target prefix so far ([B, L] ids)."""

  memory: jax.Array
  src_segments: jax.Array
  prefix: jax.Array
  t: jax.Array


def uncached(cfg: ModelConfig, params: Any, src: jax.Array, src_segments: jax.Array,
             length: int) -> tuple[LogitsFn, PrefixState]:
  """Every step re-runs the decoder over the whole prefix [B, L] and keeps position t."""
  model, variables = Transformer(cfg), {'params': params}
  memory = model.apply(variables, src, src_segments, method=Transformer.encode)  # [B, S, D]
  prefix = jnp.zeros((memory.shape[0], length), jnp.int32)
  state = PrefixState(memory, src_segments, prefix, jnp.zeros((), jnp.int32))

  def recompute(ids_t: jax.Array, s: PrefixState) -> tuple[jax.Array, PrefixState]:
    prefix = jax.lax.dynamic_update_slice_in_dim(s.prefix, ids_t[:, None], s.t, axis=1)
    logits = model.apply(variables, s.memory, prefix, s.src_segments,
                         method=Transformer.decode)  # [B, L, V], causal: the rest is unused
    return jax.lax.dynamic_index_in_dim(logits, s.t, axis=1, keepdims=False), s.replace(
        prefix=prefix, t=s.t + 1)
  return recompute, state


def no_cross_reuse(cfg: ModelConfig, params: Any, src: jax.Array, src_segments: jax.Array,
                   length: int) -> tuple[LogitsFn, tuple]:
  """The self-attention KV cache, but the cross-attention K/V recomputed from the encoder
  output [B, S, D] at every step."""
  model, variables = Transformer(cfg), {'params': params}
  memory = model.apply(variables, src, src_segments, method=Transformer.encode)
  cache = model.apply(variables, memory, src_segments, length, method=Transformer.init_cache)

  def step(ids_t: jax.Array, c: tuple) -> tuple[jax.Array, tuple]:
    logits, dec = model.apply(variables, ids_t, c[0], c[1], method=Transformer.decode_step)
    return logits, (dec, c[1])
  return step, (cache, memory)


DECODERS: dict[str, Decoder] = {'cached': cached_decoder, 'no_cross_reuse': no_cross_reuse,
                                'uncached': uncached}


def translate_rows(cfg: ModelConfig, params: Any, spec: SearchSpec, rows: Sequence[np.ndarray],
                   decoder: str = 'cached', grow_cache: bool = True, pad_id: int = 0,
                   workers: int = 1) -> list[np.ndarray]:
  """Source id rows ending in EOS -> output ids (without EOS), in the order of `rows`:
  batches of spec.decode.tokens_per_batch padded source tokens (powers-of-two rows, as the
  engine's one-loop path plans them), each decoded in one jitted loop, `workers` batches at
  once, with the C heap trimmed after each on a CPU, as the engine runs its batches. One
  model, a search (not sampling) and one hypothesis per sentence."""
  if isinstance(cfg, tuple) or spec.sampling or spec.n_best > 1:
    raise ValueError('bench/decoders.py decodes one model by search, one hypothesis each')
  if not rows:
    return []
  d = spec.decode
  run = _jitted(cfg, spec, decoder, grow_cache)
  lengths = np.array([len(r) for r in rows])
  grid = data_lib.length_grid(int(lengths.max()), d.max_input_len, d.length_growth)
  sizes = batch_sizes(d.tokens_per_batch, powers_of_two=True)
  plans = data_lib.fill_batches(lengths, grid, d.tokens_per_batch, sizes, min_rows=START_ROWS)

  def decode(i: int) -> np.ndarray:
    ids = np.asarray(run(params, *data_lib.pad_rows(rows, plans[i], pad_id)[:2]))
    if jax.default_backend() == 'cpu':
      heap.release_free_memory(heap.TRIM_AFTER_GROWTH)
    return ids

  out: list[np.ndarray] = [np.zeros(0, np.int32)] * len(rows)
  for plan, ids in zip(plans, in_order(decode, len(plans), workers)):
    for row, example in enumerate(plan.examples):
      out[example] = strip(ids[row], spec.eos_id)
  return out


@functools.lru_cache(maxsize=None)
def _jitted(cfg: ModelConfig, spec: SearchSpec, decoder: str,
            grow_cache: bool) -> Callable[..., jax.Array]:
  return jax.jit(functools.partial(translate, cfg, spec=spec, grow_cache=grow_cache,
                                   decoder=DECODERS[decoder]))

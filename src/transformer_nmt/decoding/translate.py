"""Translate padded source batches with a Transformer: greedy or beam search.

`cache_mode` picks how the decoder step is computed (the last two only for benchmarks):
  'cached'        self-attention KV cache, cross-attention K/V computed once per batch;
  'no_cross_reuse' self-attention KV cache, cross-attention K/V recomputed every step;
  'uncached'      the whole target prefix re-run through the decoder every step.
"""

from __future__ import annotations

from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from transformer_nmt.config import DECODE, ModelConfig
from transformer_nmt.decoding import ensemble
from transformer_nmt.decoding.beam import beam
from transformer_nmt.decoding.compaction import CompactingDecoder
from transformer_nmt.decoding.ensemble import Models
from transformer_nmt.decoding.programs import ProgramStore, StoredJit
from transformer_nmt.decoding.search import LogitsFn, Prefix, Search, greedy, padded_length
from transformer_nmt.model.transformer import Transformer

CACHE_MODES = ('cached', 'no_cross_reuse', 'uncached')


@flax.struct.dataclass
class PrefixState:
  """For 'uncached' decoding: encoder output and the target prefix so far ([B, L] ids)."""

  memory: jax.Array
  src_segments: jax.Array
  prefix: jax.Array
  t: jax.Array


def _decoder(cfg: Models, params: Any, src: jax.Array, src_segments: jax.Array, length: int,
             cache_mode: str) -> tuple[LogitsFn, Any]:
  """(logits_fn, initial cache) for one decoder variant; the cache holds `length` positions."""
  if cache_mode == 'cached':  # the one an ensemble can take
    return ensemble.step_fn(cfg, params), ensemble.start(cfg, params, src, src_segments, length)
  if ensemble.is_ensemble(cfg):
    raise ValueError(f'cache_mode={cache_mode!r} decodes one model; an ensemble needs cached')
  model, variables = Transformer(cfg), {'params': params}
  memory = model.apply(variables, src, src_segments, method=Transformer.encode)  # [B, S, D]
  if cache_mode == 'uncached':
    prefix = jnp.zeros((memory.shape[0], length), jnp.int32)
    state = PrefixState(memory, src_segments, prefix, jnp.zeros((), jnp.int32))

    def recompute(ids_t: jax.Array, s: PrefixState) -> tuple[jax.Array, PrefixState]:
      prefix = jax.lax.dynamic_update_slice_in_dim(s.prefix, ids_t[:, None], s.t, axis=1)
      logits = model.apply(variables, s.memory, prefix, s.src_segments,
                           method=Transformer.decode)  # [B, L, V], causal: the rest is unused
      return jax.lax.dynamic_index_in_dim(logits, s.t, axis=1, keepdims=False), s.replace(
          prefix=prefix, t=s.t + 1)
    return recompute, state

  cache = model.apply(variables, memory, src_segments, length, method=Transformer.init_cache)

  def no_reuse(ids_t: jax.Array, c: tuple) -> tuple[jax.Array, tuple]:
    logits, dec = model.apply(variables, ids_t, c[0], c[1], method=Transformer.decode_step)
    return logits, (dec, c[1])
  return no_reuse, (cache, memory)


def search_for(length: int, *, bos_id: int, eos_id: int, pad_id: int,
               beam_size: int = DECODE.beam_size, alpha: float = DECODE.alpha,
               beam_stop: str = DECODE.beam_stop, temperature: float = DECODE.temperature,
               top_k: int = DECODE.top_k, rng: Optional[jax.Array] = None,
               n_best: int = 1, min_len: int = DECODE.min_len,
               no_repeat_ngram: int = DECODE.no_repeat_ngram) -> Search:
  """The search `translate` runs for outputs of `length` positions: sampling when
  `temperature` > 0, else beam search when `beam_size` > 1 (its `n_best` hypotheses per
  sentence), else greedy."""
  ids = dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, length=length, min_len=min_len,
             no_repeat_ngram=no_repeat_ngram)
  if temperature > 0.0:
    return greedy(temperature=temperature, top_k=top_k, rng=rng, **ids)
  if beam_size > 1:
    return beam(beam_size=beam_size, alpha=alpha, stop=beam_stop, n_best=n_best, **ids)
  return greedy(**ids)


def _max_lens(src_segments: jax.Array, max_extra_len: int, max_len: int = 0,
              prefix: Optional[Prefix] = None) -> jax.Array:
  """[B] output limits in tokens with EOS: source length + `max_extra_len` (§6.1), or prefix
  length + `max_extra_len` if longer; at most `max_len` subwords and EOS when `max_len` > 0,
  but always room for the prefix and EOS. Filler rows (no source tokens; they pad a bucket's
  last batch) end at once: were they left to run to their length limit, every batch would
  decode for the full output length."""
  src_lens = jnp.sum(src_segments > 0, axis=1)
  given = jnp.zeros_like(src_lens) if prefix is None else prefix.lens
  limits = jnp.maximum(src_lens, given) + max_extra_len
  if max_len > 0:
    limits = jnp.minimum(limits, max_len + 1)
  return jnp.where(src_lens > 0, jnp.maximum(limits, given + 1), 1)


def output_length(src_len: int, max_extra_len: int, max_len: int = 0,
                  prefix_len: int = 0) -> int:
  """Static output length of a batch whose sources are padded to `src_len` and prefixes to
  `prefix_len` (the largest `_max_lens` can give)."""
  length = max(src_len, prefix_len) + max_extra_len
  if max_len > 0:
    length = min(length, max_len + 1)
  return max(length, prefix_len + 1)


def as_prefix(ids: Optional[jax.Array], pad_id: int) -> Optional[Prefix]:
  """[B, P] target prefixes padded with `pad_id` (a row of padding: none) -> a Prefix."""
  if ids is None:
    return None
  return Prefix(ids, jnp.sum(ids != pad_id, axis=1))


def translate(cfg: Models, params: Any, src: jax.Array, src_segments: jax.Array, *,
              bos_id: int, eos_id: int, pad_id: int, beam_size: int = DECODE.beam_size,
              alpha: float = DECODE.alpha, max_extra_len: int = DECODE.max_extra_len,
              chunk: int = DECODE.chunk, cache_mode: str = 'cached',
              temperature: float = DECODE.temperature, top_k: int = DECODE.top_k,
              rng: Optional[jax.Array] = None, grow_cache: bool = True,
              beam_stop: str = DECODE.beam_stop, n_best: int = 1,
              min_len: int = DECODE.min_len, max_len: int = DECODE.max_len,
              no_repeat_ngram: int = DECODE.no_repeat_ngram,
              prefix: Optional[jax.Array] = None) -> jax.Array:
  """Translates a padded batch: src [B, S] -> ids [B, S + max_extra_len], in one jittable loop
  (with beam search and `n_best` > 1: [B, N, S + max_extra_len], see beam.result).

  `cfg` and `params` are one model's, or tuples of an ensemble's (decoding/ensemble.py).
  Each row may produce up to its own source length + `max_extra_len` tokens (§6.1). Rows are
  decoded with beam search (`beam_size` > 1, GNMT length penalty `alpha`, rows ending as
  `beam_stop` says: 'bound' or 'k_finished', see beam_search.py), greedily, or, with
  `temperature` > 0 and an `rng`, by sampling (optionally from the `top_k` tokens only).
  With `grow_cache` the self-attention cache starts at 2 chunks and doubles as needed
  (decoding.decode_loop); False keeps it at the full length limit (for benchmarks).
  `min_len`, `max_len` and `no_repeat_ngram` are the output controls of config.DecodeConfig
  (off at 0); with `max_len` the output is at most max_len + 1 long. `prefix` [B, P] (padded
  with `pad_id`) gives the tokens each output must start with; the search continues after.
  Output rows hold the tokens, EOS, then `pad_id`. Jit with the keyword arguments bound.
  `CompactingTranslate` gives the same outputs faster, dropping finished sentences.
  """
  if cache_mode not in CACHE_MODES:
    raise ValueError(f'cache_mode={cache_mode!r}; expected one of {CACHE_MODES}')
  given = as_prefix(prefix, pad_id)
  steps = output_length(src.shape[1], max_extra_len, max_len, 0 if prefix is None else
                        prefix.shape[1])
  length = padded_length(steps, chunk)
  logits_fn, cache = _decoder(cfg, params, src, src_segments, length, cache_mode)
  search = search_for(length, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, beam_size=beam_size,
                      alpha=alpha, beam_stop=beam_stop, temperature=temperature, top_k=top_k,
                      rng=rng, n_best=n_best, min_len=min_len, no_repeat_ngram=no_repeat_ngram)
  return search.run(logits_fn, cache, _max_lens(src_segments, max_extra_len, max_len, given),
                    steps, chunk, grow_cache, given)


class CompactingTranslate:
  """`translate` with the cached decoder, run from the host in chunks of steps that drop
  finished sentences from the batch (compaction.py): same arguments, same outputs (up to
  float rounding in matmuls of other batch sizes), as a numpy array. Sampling draws differ,
  since a row's draws depend on its place in the batch. `store` keeps the compiled programs
  across runs (programs.py)."""

  def __init__(self, cfg: Models, *, bos_id: int, eos_id: int, pad_id: int,
               beam_size: int = DECODE.beam_size, alpha: float = DECODE.alpha,
               max_extra_len: int = DECODE.max_extra_len, chunk: int = DECODE.chunk,
               temperature: float = DECODE.temperature, top_k: int = DECODE.top_k,
               beam_stop: str = DECODE.beam_stop, min_rows: int = 8, n_best: int = 1,
               min_len: int = DECODE.min_len, max_len: int = DECODE.max_len,
               no_repeat_ngram: int = DECODE.no_repeat_ngram,
               store: Optional[ProgramStore] = None):
    self.cfg, self.max_extra_len, self.chunk = cfg, max_extra_len, chunk
    self.max_len = max_len
    self._search = dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, beam_size=beam_size,
                        alpha=alpha, beam_stop=beam_stop, temperature=temperature, top_k=top_k,
                        n_best=n_best, min_len=min_len, no_repeat_ngram=no_repeat_ngram)
    self.decoder = CompactingDecoder(lambda length: search_for(length, **self._search),
                                     lambda params: ensemble.step_fn(cfg, params), chunk,
                                     min_rows, store)
    self._start = StoredJit(self._start_impl, 'start', store, static_argnums=(5,))

  def _start_impl(self, params: Any, src: jax.Array, src_segments: jax.Array,
                  rng: Optional[jax.Array], prefix: Optional[jax.Array],
                  length: int) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
    """Encodes the batch and takes the steps of the first cache stage, 2 chunks
    (Search.begin: a beam search's first step on B rows): (state, max_lens, rows done,
    result), the last two as the decoder's advance program gives them. The first stage's
    steps thus need no advance program of their own (its step is compiled once, here); no
    sentence of test2016 ended within the first chunk, where the decoder would otherwise
    have looked for finished ones (bench/RESULTS.md)."""
    first = self.decoder.cache_lengths(length)[0]
    cache = ensemble.start(self.cfg, params, src, src_segments, first)
    given = as_prefix(prefix, self._search['pad_id'])
    max_lens = _max_lens(src_segments, self.max_extra_len, self.max_len, given)
    search = search_for(length, rng=rng, **self._search)
    state = search.begin(ensemble.step_fn(self.cfg, params), cache, max_lens, first, given)
    return state, max_lens, search.rows_done(state, max_lens), search.result(state)

  def __call__(self, params: Any, src: jax.Array, src_segments: jax.Array,
               rng: Optional[jax.Array] = None, prefix: Optional[jax.Array] = None,
               every_stage: bool = False) -> np.ndarray:
    """src [B, S] -> ids [B, (N,) S + max_extra_len], as `translate` (also for `prefix`);
    `every_stage` runs the batch through every cache stage (CompactingDecoder)."""
    steps = output_length(src.shape[1], self.max_extra_len, self.max_len,
                          0 if prefix is None else prefix.shape[1])
    length = -(-steps // self.chunk) * self.chunk
    state, max_lens, done, result = self._start(params, src, src_segments, rng, prefix, length)
    return self.decoder(params, state, max_lens, length, every_stage,
                        begun=(done, result))[..., :steps]


def translate_greedy(cfg: ModelConfig, params: Any, src: jax.Array, src_segments: jax.Array, *,
                     bos_id: int, eos_id: int, pad_id: int,
                     max_extra_len: int = DECODE.max_extra_len) -> jax.Array:
  """Greedy translation with the cached decoder: src [B, S] -> ids [B, S + max_extra_len]."""
  return translate(cfg, params, src, src_segments, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                   beam_size=1, max_extra_len=max_extra_len)

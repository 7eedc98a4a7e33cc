"""Beam search as the paper used it (§6.1): beam 4, GNMT length penalty with alpha 0.6.

Finished hypotheses are kept while live beams go on. A row stops (`stop`):
  'bound'      once no live beam can beat its best finished hypothesis, even at the row's
               length limit (tensor2tensor; the paper's "terminate early when possible");
  'k_finished' also once it holds K finished hypotheses, whose best is the output (OpenNMT
               and CTranslate2 with patience 1). A deviation: fewer steps, and a hypothesis
               finishing later with a better score is not considered.
The search is pure and jittable and runs on the chunked scan of `decoding.decode_loop`.
Dimension legend: B batch, K beam, L output length, V vocab.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from transformer_nmt.decoding.kernels import REFERENCE, Kernels
from transformer_nmt.decoding.search import (
  BeamCache,
  LogitsFn,
  Prefix,
  Search,
  constrain,
  decode_loop,
  padded_length,
)
from transformer_nmt.decoding.settings import DECODE
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.model.attention import NEG_INF


def length_penalty(length: jax.Array | int, alpha: float) -> jax.Array | np.ndarray:
  """GNMT's lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016); scores are logP / lp. In float32
  either way; a host integer in numpy, so that scoring a hypothesis compiles nothing."""
  xp = np if isinstance(length, (int, np.integer)) else jnp
  return ((xp.float32(5.0) + xp.asarray(length, xp.float32)) / xp.float32(6.0)) ** xp.float32(alpha)


def tile_beams(tree: Any, beam_size: int) -> Any:
  """Repeats every batched leaf [B, ...] -> [B*K, ...] (scalars such as cache indices stay),
  or what a cache with a `tile_beams` method (model.DecoderCache) says needs repeating."""
  if isinstance(tree, BeamCache):
    return tree.tile_beams(beam_size)
  return jax.tree_util.tree_map(
      lambda x: jnp.repeat(x, beam_size, axis=0) if x.ndim else x, tree)


def gather_beams(tree: Any, beam_idx: jax.Array) -> Any:
  """Reorders beams: every batched leaf [B*K', ...] (K' hypotheses per sentence) by beam_idx
  [B, K] of values in [0, K') -> [B*K, ...] (scalars stay). With K' = 1 it tiles each row K
  times, as the first step of a search begun on one hypothesis per sentence needs."""
  batch, k = beam_idx.shape

  def gather(x: jax.Array) -> jax.Array:
    if not x.ndim:
      return x
    xs = x.reshape((batch, -1) + x.shape[1:])  # [B, K', ...]
    idx = beam_idx.reshape((batch, k) + (1,) * (xs.ndim - 2))
    return jnp.take_along_axis(xs, idx, axis=1).reshape((batch * k,) + x.shape[1:])
  return jax.tree_util.tree_map(gather, tree)


@flax.struct.dataclass
class BeamState:
  """t: [] steps taken. seqs: [B, K, L] token ids; logprobs: [B, K] log P of live beams;
  finished: [B, K, L]; scores: [B, K] length-normalised finished scores (NEG_INF: empty);
  cache: decoder cache with leaves [B*K, ...]; prefix: the tokens each output starts with.
  A state begun on one beam (`init_state(one_beam=True)`) has 1 in place of K in seqs,
  logprobs and the cache until its first step."""

  t: jax.Array
  seqs: jax.Array
  logprobs: jax.Array
  finished: jax.Array
  scores: jax.Array
  cache: Any
  prefix: Optional[Prefix] = None


def init_state(cache: Any, batch: int, beam_size: int, length: int, pad_id: int,
               prefix: Optional[Prefix] = None, one_beam: bool = False) -> BeamState:
  """Only beam 0 is live at first, so the first step does not pick K copies of one token.
  With `one_beam` the state holds that beam alone (seqs [B, 1, L], logprobs [B, 1], the
  cache untiled) and the first `step` makes the K beams: the same search, with the first
  decoder step on B rows instead of B*K (as CTranslate2 begins)."""
  live = 1 if one_beam else beam_size
  logprobs = jnp.tile(jnp.array([0.0] + [NEG_INF] * (live - 1), jnp.float32), (batch, 1))
  seqs = jnp.full((batch, live, length), pad_id, jnp.int32)
  # float32, not a weak type: a state with a weak leaf would compile each search step once
  # for the first chunk and again for the rest.
  scores = jnp.full((batch, beam_size), NEG_INF, jnp.float32)
  finished = jnp.full((batch, beam_size, length), pad_id, jnp.int32)
  return BeamState(jnp.int32(0), seqs, logprobs, finished, scores,
                   cache if one_beam else tile_beams(cache, beam_size), prefix)



def step(s: BeamState, logits_fn: LogitsFn, max_lens: jax.Array, *, alpha: float, bos_id: int,
         eos_id: int, stop: str = DECODE.beam_stop, min_len: int = DECODE.min_len,
         no_repeat_ngram: int = DECODE.no_repeat_ngram, kernels: Kernels = REFERENCE
         ) -> BeamState:
  """Extends every live beam by one token, keeping the top K live and top K finished (under
  the output controls of `search.constrain`); a state of one beam per row becomes one of K.
  `kernels`: the logsumexp and top-k it ranks with."""
  batch, width, length = s.seqs.shape  # width: 1 for a state begun on one beam, else K
  k = s.scores.shape[1]
  prev = jnp.where(s.t == 0, bos_id, s.seqs[:, :, jnp.maximum(s.t - 1, 0)])  # [B, width]
  logits, cache = logits_fn(prev.reshape(-1), s.cache)  # [B*width, V]
  at_limit = jnp.repeat(s.t + 1 >= max_lens, width)  # force EOS at each row's length limit
  logits = logits.astype(jnp.float32)
  # The model's own log-probabilities: banned tokens drop out, the others are not renormalised
  # (as in fairseq), so scores stay those of forced decoding.
  lse = kernels.logsumexp(logits, axis=-1, keepdims=True)  # [B*width, 1]
  model_logits = logits
  if min_len or no_repeat_ngram:
    logits = constrain(logits, s.seqs.reshape(batch * width, length), s.t, at_limit,
                       eos_id=eos_id, min_len=min_len, no_repeat_ngram=no_repeat_ngram)
  per_beam = min(2 * k, logits.shape[-1])
  cand_logp, token = _candidates(logits, lse, at_limit, per_beam, eos_id, kernels.top_k)
  if s.prefix is not None:
    cand_logp, token = _forced(s.prefix, s.t, width, model_logits, lse, cand_logp, token)
  total = (s.logprobs[:, :, None] + cand_logp.reshape(batch, width, -1)).reshape(batch, -1)
  if total.shape[1] < 2 * k:  # one beam over fewer than 2K tokens: impossible extensions
    total = jnp.pad(total, ((0, 0), (0, 2 * k - total.shape[1])), constant_values=NEG_INF)
  # 2K: K finishing beams cannot starve the live ones
  cand_logp, cand = jax.lax.top_k(total, 2 * k)  # [B, 2K] over [B, width * 2K]
  cand = jnp.minimum(cand, width * per_beam - 1)  # padding: a real index, with NEG_INF kept
  beam = cand // per_beam
  token = jnp.take_along_axis(token.reshape(batch, -1), cand, axis=1)  # [B, 2K]
  seqs = jnp.take_along_axis(s.seqs, beam[:, :, None], axis=1)
  seqs = jax.lax.dynamic_update_slice_in_dim(seqs, token[:, :, None], s.t, axis=2)  # [B, 2K, L]
  is_eos = token == eos_id
  possible = cand_logp > NEG_INF / 2  # extensions of empty beams are no hypotheses
  live_logp, live = jax.lax.top_k(jnp.where(is_eos, NEG_INF, cand_logp), k)  # [B, K]
  if stop == 'k_finished':  # a row holding K finished hypotheses takes no more
    possible &= (s.scores[:, -1] <= NEG_INF / 2)[:, None]
  new_scores = jnp.where(is_eos & possible, cand_logp / length_penalty(s.t + 1, alpha), NEG_INF)
  scores, keep = jax.lax.top_k(jnp.concatenate([s.scores, new_scores], axis=1), k)
  finished = jnp.take_along_axis(jnp.concatenate([s.finished, seqs], axis=1),
                                 keep[:, :, None], axis=1)
  return BeamState(t=s.t + 1, seqs=jnp.take_along_axis(seqs, live[:, :, None], axis=1),
                   logprobs=live_logp, finished=finished, scores=scores,
                   cache=_reorder(cache, jnp.take_along_axis(beam, live, axis=1)),
                   prefix=s.prefix)


def _candidates(logits: jax.Array, lse: jax.Array, at_limit: jax.Array, n: int,
                eos_id: int, find_top: Callable[[jax.Array, int], tuple[jax.Array, jax.Array]]
                ) -> tuple[jax.Array, jax.Array]:
  """Each beam's n best next tokens and their log-probabilities: [N, V] logits (and their
  [N, 1] logsumexp) -> [N, n] twice.

  The best n extensions of a sentence are among the best n of each of its beams, so the
  search ranks K * n candidates instead of K * V (`find_top`: Kernels.top_k), faster than
  log-softmax and top-k over the whole [B, K * V]. Beams `at_limit` offer only EOS.
  """
  values, token = find_top(logits, n)
  only_eos = jnp.where(jnp.arange(n) == 0, logits[:, eos_id:eos_id + 1], NEG_INF)
  values = jnp.where(at_limit[:, None], only_eos, values)
  return values - lse, jnp.where(at_limit[:, None], eos_id, token).astype(jnp.int32)


def _forced(prefix: Prefix, t: jax.Array, width: int, logits: jax.Array, lse: jax.Array,
            cand_logp: jax.Array, token: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Inside its prefix a beam has one candidate, the given token at the model's own
  log-probability, whatever the output controls: [N, n] candidates (`_candidates` of
  [N, V] logits, [N, 1] logsumexp) -> [N, n] candidates. Set among the n candidates, not
  over the V logits: a prefix costs no pass over the vocabulary."""
  forced, given = (jnp.repeat(x, width) for x in prefix.forced(t))  # [N]
  given_logp = jnp.take_along_axis(logits, given[:, None], axis=1) - lse  # [N, 1]
  first = jnp.arange(cand_logp.shape[1]) == 0  # [n]
  cand_logp = jnp.where(forced[:, None], jnp.where(first, given_logp, NEG_INF), cand_logp)
  return cand_logp, jnp.where(forced[:, None] & first, given[:, None], token)


def _reorder(cache: Any, beam_idx: jax.Array) -> Any:
  """gather_beams over the cache, or over the parts it says differ between beams (a cache
  with a `reorder_beams(gather)` method, such as model.DecoderCache)."""
  gather = lambda tree: gather_beams(tree, beam_idx)  # noqa: E731
  return cache.reorder_beams(gather) if isinstance(cache, BeamCache) else gather(cache)


def rows_done(s: BeamState, max_lens: jax.Array, alpha: float,
              stop: str = DECODE.beam_stop) -> jax.Array:
  """[B] bool: the row's best finished score beats the best any live beam can reach (or,
  with stop='k_finished', the row holds K finished hypotheses). A done row stays done.

  log P only falls as a beam grows, and lp grows with length, so a live beam's best possible
  score is its log P divided by the penalty at the row's length limit.
  """
  best_possible = s.logprobs[:, 0] / length_penalty(max_lens, alpha)
  done = (s.scores[:, 0] >= best_possible) | (s.logprobs[:, 0] <= NEG_INF / 2)
  if stop == 'k_finished':
    done |= s.scores[:, -1] > NEG_INF / 2
  return done


def finalize(s: BeamState) -> tuple[jax.Array, jax.Array]:
  """Best finished hypothesis per row (falls back to the best live one): ids [B, L], score [B]."""
  has_finished = s.scores[:, 0] > NEG_INF / 2
  ids = jnp.where(has_finished[:, None], s.finished[:, 0], s.seqs[:, 0])
  return ids, jnp.where(has_finished, s.scores[:, 0], s.logprobs[:, 0])


def result(s: BeamState, eos_id: int, pad_id: int, n_best: int = 1) -> jax.Array:
  """`finalize`'s ids [B, L] with padding after the first EOS; with `n_best` > 1, the
  best n finished hypotheses [B, N, L], best first (the first as `finalize` picks it). A row
  that finished fewer than N (the search stops a row once no live beam can win) has slots
  of padding only: no EOS, unlike any hypothesis."""
  ids = finalize(s)[0]
  if n_best > 1:
    slots = jnp.where((s.scores[:, :n_best] > NEG_INF / 2)[..., None], s.finished[:, :n_best],
                      pad_id)
    ids = slots.at[:, 0].set(ids)
  is_eos = ids == eos_id
  after_eos = jnp.cumsum(is_eos, axis=-1) - is_eos > 0
  return jnp.where(after_eos, pad_id, ids)


def beam(spec: SearchSpec, length: int) -> Search:
  """Beam search as a `decoding.Search` over outputs of `length` positions (see
  `beam_search`): K = spec.decode.beam_size, its length penalty, stopping rule and output
  controls; its `init` tiles the cache to K beams. With `spec.n_best` > 1 its result is
  [B, N, L] (see `result`)."""
  d, k = spec.decode, spec.decode.beam_size
  return Search(
      k,
      lambda cache, max_lens, prefix=None: init_state(cache, max_lens.shape[0], k, length,
                                                      spec.pad_id, prefix),
      lambda s, logits_fn, max_lens: step(s, logits_fn, max_lens, alpha=d.alpha,
                                          bos_id=spec.bos_id, eos_id=spec.eos_id,
                                          stop=d.beam_stop, min_len=d.min_len,
                                          no_repeat_ngram=d.no_repeat_ngram,
                                          kernels=spec.kernels),
      lambda s, max_lens: rows_done(s, max_lens, d.alpha, d.beam_stop),
      lambda s: result(s, spec.eos_id, spec.pad_id, spec.n_best),
      lambda cache, max_lens, prefix=None: init_state(cache, max_lens.shape[0], k, length,
                                                      spec.pad_id, prefix, one_beam=True))


def beam_search(logits_fn: LogitsFn, cache: Any, max_lens: jax.Array, spec: SearchSpec, *,
                max_len: int, grow_cache: bool = True) -> tuple[jax.Array, jax.Array]:
  """Beam search over `logits_fn` (the cache is tiled to K beams here).

  Args:
    logits_fn: one decoder step, [N] previous ids -> [N, V] logits (N = B*K).
    cache: the decoder cache for B rows, sized for
      `padded_length(max_len, spec.decode.chunk)` steps.
    max_lens: [B] per-row output limit in tokens (source length + 50 in the paper).
    spec: K and the length-penalty exponent (paper: 4 and 0.6), the stopping rule (module
      docstring), the output controls (search.constrain), the special ids, and
      `decode.chunk`: steps per scan between stopping checks.
    max_len: static output length L.
    grow_cache: run over growing caches (see `decoding.decode_loop`).

  Returns:
    ids [B, L] of the best hypothesis (tokens, EOS, then padding) and its score [B].
  """
  chunk = spec.decode.chunk
  search = beam(spec.with_n_best(1), padded_length(max_len, chunk))
  final = decode_loop(lambda s: search.step(s, logits_fn, max_lens),
                      lambda s: jnp.all(search.rows_done(s, max_lens)),
                      search.init(cache, max_lens), max_len, chunk, grow_cache)
  return search.result(final)[:, :max_len], finalize(final)[1]

"""Autoregressive decoding over the explicit decoder cache: the loop, greedy search, sampling.

Search functions take a `logits_fn(ids_t, cache) -> (logits, cache)` callback, so they work
with any model (or a fixed table in tests). The loop runs `lax.scan` over chunks of steps
inside a `lax.while_loop` that stops once every row is finished; `chunk >= max_len` gives a
plain full-length scan. Dimension legend: B batch, L output length, V vocab.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

import flax
import jax
import jax.numpy as jnp

from transformer_nmt.decoding.settings import DECODE
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.model.attention import NEG_INF

LogitsFn = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


class Jit(Protocol):
  """How the decoders compile their programs: `jax.jit` with a name for the program
  (`plain_jit`), or the engine's ProgramStore.jit, which keeps them on disk; both take XLA
  `compiler_options` (the engine's: runtime/compiler.py)."""

  def __call__(self, fn: Callable, name: str, static_argnums: Sequence[int] = (),
               donate_argnums: Sequence[int] = (),
               compiler_options: Optional[dict[str, str]] = None) -> Callable: ...


def plain_jit(fn: Callable, name: str, static_argnums: Sequence[int] = (),
              donate_argnums: Sequence[int] = (),
              compiler_options: Optional[dict[str, str]] = None) -> Callable:
  """`jax.jit`: the programs live as long as the function (`name` is for stores)."""
  del name
  return jax.jit(fn, static_argnums=tuple(static_argnums), donate_argnums=tuple(donate_argnums),
                 compiler_options=compiler_options)


@runtime_checkable
class GrowingCache(Protocol):
  """A decoder cache that can change its number of positions (`decode_loop` grows it in
  stages); model.transformer.DecoderCache is one. Other caches run at their full length.
  `resize` must keep each array's leading part and fill the rest with zeros: on a CPU,
  compaction.resized_on_host redoes it in numpy from the new shapes alone."""

  def resize(self, length: int) -> Any: ...


@runtime_checkable
class BeamCache(Protocol):
  """A decoder cache that says which of its parts differ between the K beams of a sentence
  (model.transformer.DecoderCache: only the self-attention keys and values). Beam search
  tiles and reorders any other cache leaf by leaf."""

  def tile_beams(self, beam_size: int) -> Any: ...

  def reorder_beams(self, gather: Callable[[Any], Any]) -> Any: ...


def decode_loop(step_fn: Callable[[Any], Any], done_fn: Callable[[Any], jax.Array], state: Any,
                num_steps: int, chunk: int = DECODE.chunk, grow_cache: bool = True) -> Any:
  """Applies `step_fn` up to `num_steps` times, checking `done_fn` every `chunk` steps.

  `state` is a struct with a `cache` field. Steps after a state is done must leave its result
  unchanged (the searches below ensure it), since up to `chunk - 1` extra steps run before the
  loop notices. With `grow_cache` and a cache that has `resize(length)` (model.DecoderCache),
  the loop runs in stages over caches of `cache_stages` lengths: attention and beam reordering
  then touch only about twice the positions written so far, not the whole length limit, and
  a later stage runs (and its larger cache is made) only if some row is still unfinished.

  Returns:
    the final state, with `cache=None` (the stages' caches differ in shape).
  """
  chunk = max(1, min(chunk, num_steps))
  num_chunks = -(-num_steps // chunk)
  resizable = grow_cache and isinstance(state.cache, GrowingCache)
  lengths = cache_stages(num_chunks * chunk, chunk) if resizable else [num_chunks * chunk]
  ends = [n // chunk for n in lengths]  # chunks done at the end of each stage

  def run_chunk(carry: tuple[jax.Array, Any]) -> tuple[jax.Array, Any]:
    i, state = carry
    state, _ = jax.lax.scan(lambda s, _: (step_fn(s), None), state, None, length=chunk)
    return i + 1, state

  def run_stage(stage: int, i: jax.Array, state: Any) -> Any:
    if resizable:
      state = state.replace(cache=state.cache.resize(ends[stage] * chunk))
    i, state = jax.lax.while_loop(lambda c: (c[0] < ends[stage]) & ~done_fn(c[1]), run_chunk,
                                  (i, state))
    if stage == len(ends) - 1:
      return state.replace(cache=None)
    return jax.lax.cond(done_fn(state), lambda s: s.replace(cache=None),
                        lambda s: run_stage(stage + 1, i, s), state)

  return run_stage(0, jnp.int32(0), state)


def cache_stages(length: int, chunk: int) -> list[int]:
  """Cache lengths of the stages of `decode_loop`: 2 chunks, doubling, then `length` (a
  multiple of `chunk`) once it is within 1.5x of the next doubling. Each stage compiles its
  own copy of the decoder step, so fewer stages compile faster (e.g. 16, 32, 72)."""
  stages, n = [], 2 * chunk
  while n < length:
    stages.append(n)
    if 3 * n >= length:  # the next doubling would be within 1.5x of the full length
      break
    n *= 2
  return stages + [length]


def padded_length(max_len: int, chunk: int) -> int:
  """Buffer length for `max_len` steps run in whole chunks."""
  chunk = max(1, min(chunk, max_len))
  return -(-max_len // chunk) * chunk


@flax.struct.dataclass
class Prefix:
  """Given first tokens of each output (a target prefix, beam search continues after it):
  ids [B, P] (anything after a row's own prefix), lens [B] (0: no prefix)."""

  ids: jax.Array
  lens: jax.Array

  def forced(self, t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """([B] bool: the row is still inside its prefix at step t, [B] the token it must take)."""
    return t < self.lens, self.ids[:, jnp.minimum(t, self.ids.shape[1] - 1)]


@dataclasses.dataclass(frozen=True)
class Search:
  """A search as the loops that drive it see it: `decode_loop` inside one jit, or
  `compaction.CompactingDecoder` from the host, which drops finished sentences.

  beams: K hypotheses per sentence (1 for greedy); a state's per-sentence leaves are [B, ...]
    and its per-hypothesis leaves [B*K, ...] (`compaction.take_rows` relies on it).
  init(cache, max_lens, prefix=None) -> state, from the decoder cache for B sentences (and
    an optional `Prefix` every output starts with).
  step(state, logits_fn, max_lens) -> state, one more token per live hypothesis.
  rows_done(state, max_lens) -> [B] bool; a done row must stay done and unchanged.
  result(state) -> [B, L] ids: tokens, EOS, then padding ([B, N, L] for an n-best beam).
  init_one(cache, max_lens, prefix=None) -> a state of one hypothesis per sentence, from the
    cache for B sentences, which the first `step` widens to `beams` (see `begin`); None: `init`.
  """

  beams: int
  init: Callable[..., Any]
  step: Callable[[Any, LogitsFn, jax.Array], Any]
  rows_done: Callable[[Any, jax.Array], jax.Array]
  result: Callable[[Any], jax.Array]
  init_one: Optional[Callable[..., Any]] = None

  def begin(self, logits_fn: LogitsFn, cache: Any, max_lens: jax.Array, steps: int,
            prefix: Optional[Prefix] = None) -> Any:
    """The state after the first `steps` (>= 1) steps, jittable. A beam search takes its
    first step on the B sentences alone, since the K beams of each are one until then (the
    decoder step on B rows instead of B*K, as CTranslate2 begins), which saves that step's
    B*(K-1) rows."""
    if self.init_one is None:
      state = self.init(cache, max_lens, prefix)
    else:
      state = self.step(self.init_one(cache, max_lens, prefix), logits_fn, max_lens)
      steps -= 1
    return self.advance(state, logits_fn, max_lens, steps)

  def advance(self, state: Any, logits_fn: LogitsFn, max_lens: jax.Array, steps: int) -> Any:
    """`steps` more steps in one `lax.scan` (jittable)."""
    state, _ = jax.lax.scan(lambda s, _: (self.step(s, logits_fn, max_lens), None), state,
                            None, length=steps)
    return state

  def run(self, logits_fn: LogitsFn, cache: Any, max_lens: jax.Array, num_steps: int,
          chunk: int = DECODE.chunk, grow_cache: bool = True,
          prefix: Optional[Prefix] = None) -> jax.Array:
    """The whole search in one jittable loop (`decode_loop`): [B, (N,) num_steps] ids."""
    final = decode_loop(lambda s: self.step(s, logits_fn, max_lens),
                        lambda s: jnp.all(self.rows_done(s, max_lens)),
                        self.init(cache, max_lens, prefix), num_steps, chunk, grow_cache)
    return self.result(final)[..., :num_steps]


def constrain(logits: jax.Array, ids: jax.Array, t: jax.Array, at_limit: jax.Array, *,
              eos_id: int, min_len: int = 0, no_repeat_ngram: int = 0) -> jax.Array:
  """The output controls (settings.DecodeConfig; all off by default, as in the paper) on the
  logits [N, V] of step t for hypotheses ids [N, L] (tokens before t): EOS is impossible
  before `min_len` subwords, unless the hypothesis is `at_limit` ([N] bool, where EOS is
  forced), and so is every token that would repeat an n-gram of `no_repeat_ngram` subwords."""
  if min_len > 0:
    too_short = (t < min_len) & ~at_limit
    logits = logits.at[:, eos_id].set(jnp.where(too_short, NEG_INF, logits[:, eos_id]))
  if no_repeat_ngram > 0:
    logits = _ban_repeats(logits, ids, t, no_repeat_ngram)
  return logits


def _ban_repeats(logits: jax.Array, ids: jax.Array, t: jax.Array, n: int) -> jax.Array:
  """Sets to NEG_INF each token that follows an earlier occurrence of the hypothesis's last
  n - 1 tokens (fairseq's no_repeat_ngram_size), so no n-gram appears twice."""
  rows, length = ids.shape
  if n - 1 >= length:  # no n-gram fits in the output twice
    return logits
  start = jnp.arange(length)  # where an earlier n-gram starts
  suffix = jax.lax.dynamic_slice_in_dim(ids, jnp.maximum(t - (n - 1), 0), n - 1, axis=1)
  same = jnp.ones((rows, length), bool)
  for k in range(n - 1):  # the n-gram at `start` begins with the current suffix
    same &= jnp.roll(ids, -k, axis=1) == suffix[:, k:k + 1]
  follower = jnp.roll(ids, -(n - 1), axis=1)  # its n-th token
  banned = same & (start + n - 1 < t) & (t >= n - 1)  # an n-gram written before step t
  return logits.at[jnp.arange(rows)[:, None], follower].min(
      jnp.where(banned, NEG_INF, jnp.inf).astype(logits.dtype))


@flax.struct.dataclass
class GreedyState:
  """t: [] steps taken; ids: [B, L] output so far; done: [B]; cache: the model's cache."""

  t: jax.Array
  ids: jax.Array
  done: jax.Array
  cache: Any
  rng: Optional[jax.Array] = None
  prefix: Optional[Prefix] = None


def greedy(spec: SearchSpec, length: int, rng: Optional[jax.Array] = None) -> Search:
  """Greedy decoding, or sampling when `spec.sampling` (temperature, optional top-k; needs
  `rng`), into outputs of `length` positions (see `greedy_search`), under the output
  controls of `constrain`."""
  d, bos_id, eos_id, pad_id = spec.decode, spec.bos_id, spec.eos_id, spec.pad_id

  def init(cache: Any, max_lens: jax.Array, prefix: Optional[Prefix] = None) -> GreedyState:
    if spec.sampling and rng is None:
      raise ValueError('sampling (temperature > 0) needs an rng')
    batch = max_lens.shape[0]
    return GreedyState(jnp.int32(0), jnp.full((batch, length), pad_id, jnp.int32),
                       jnp.zeros((batch,), bool), cache, rng, prefix)

  def step(s: GreedyState, logits_fn: LogitsFn, max_lens: jax.Array) -> GreedyState:
    prev = jnp.where(s.t == 0, bos_id, s.ids[:, jnp.maximum(s.t - 1, 0)])
    logits, cache = logits_fn(prev, s.cache)
    at_limit = s.t + 1 >= max_lens
    if d.min_len or d.no_repeat_ngram:
      logits = constrain(logits, s.ids, s.t, at_limit, eos_id=eos_id, min_len=d.min_len,
                         no_repeat_ngram=d.no_repeat_ngram)
    token = _pick(logits, d.temperature, d.top_k, s.rng, s.t, spec.kernels.top_k)
    if s.prefix is not None:
      forced, given = s.prefix.forced(s.t)
      token = jnp.where(forced, given, token)
    token = jnp.where(at_limit, eos_id, token)  # length limit: close the row
    token = jnp.where(s.done, pad_id, token)
    ids = jax.lax.dynamic_update_slice_in_dim(s.ids, token[:, None], s.t, axis=1)
    return s.replace(t=s.t + 1, ids=ids, done=s.done | (token == eos_id), cache=cache)

  return Search(1, init, step, lambda s, max_lens: s.done, lambda s: s.ids)


def greedy_search(logits_fn: LogitsFn, cache: Any, max_lens: jax.Array, spec: SearchSpec, *,
                  max_len: int, rng: Optional[jax.Array] = None,
                  grow_cache: bool = True) -> jax.Array:
  """Greedy decoding, or sampling when `spec.sampling` (research extra).

  Args:
    logits_fn: one decoder step, [B] previous ids -> [B, V] logits.
    cache: the decoder cache for `logits_fn`, sized for
      `padded_length(max_len, spec.decode.chunk)` steps.
    max_lens: [B] per-row output limit in tokens (EOS is forced there), <= max_len.
    spec: the special ids, `decode.chunk` (steps per `lax.scan` between stopping checks),
      the sampling settings and the output controls (`constrain`).
    max_len: static length L of the output.
    rng: the sampling key (only when sampling).
    grow_cache: run over growing caches (see `decode_loop`); False keeps the full length.

  Returns:
    [B, L] ids: each row's tokens, then EOS, then pad_id.
  """
  chunk = spec.decode.chunk
  search = greedy(spec, padded_length(max_len, chunk), rng)
  return search.run(logits_fn, cache, max_lens, max_len, chunk, grow_cache)


def _pick(logits: jax.Array, temperature: float, top_k: int, rng: Optional[jax.Array],
          t: jax.Array, find_top: Callable[[jax.Array, int], tuple[jax.Array, jax.Array]]
          ) -> jax.Array:
  """argmax (the top 1 of `find_top`, Kernels.top_k: the lowest index on ties), or a sample
  from softmax(logits / temperature) restricted to the top k."""
  if temperature <= 0.0:
    return find_top(logits, 1)[1][:, 0]
  logits = logits.astype(jnp.float32) / temperature
  if top_k > 0:
    kth = find_top(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  token = jax.random.categorical(jax.random.fold_in(rng, t), logits, axis=-1)
  return token.astype(jnp.int32)

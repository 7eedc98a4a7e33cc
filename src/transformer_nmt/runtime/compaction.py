"""Decoding that drops finished sentences from the batch, driven from the host.

A search jitted as one loop (`decoding.Search.run`) steps every row until the last one is
done; in a batch of 5- to 40-token sentences most of the work then goes to rows already
finished. `CompactingDecoder` runs the search `chunk` steps per call and, between calls, reads
which rows are done and gathers the live ones into a smaller batch once one of the ladder
1, 4, 16, 24, 32, 48, 64, ... holds them (CTranslate2 drops finished sentences
after every step). It also grows the self-attention cache in `decoding.cache_stages`. Each
(rows, cache length) pair it meets compiles its own step, so the first batches compile more
than the single loop does; later batches of the same shapes reuse them. A state may come
with the first stage's steps taken (`begun`: CompactingTranslate's start program, below,
takes them). On a CPU, where the state is host memory, the gathers and the cache growth run in
numpy and compile nothing (on other devices each (rows, length) pair compiles a small program
for them).

Dimension legend: B batch (sentences), K beams, L output length.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import numpy as np

from transformer_nmt.decoding import ensemble
from transformer_nmt.decoding.ensemble import Models
from transformer_nmt.decoding.search import Jit, LogitsFn, Search, cache_stages, plain_jit
from transformer_nmt.decoding.settings import DECODE
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.decoding.translate import as_prefix, output_length, output_limits, search_for


def take_rows(tree: Any, rows: jax.Array, batch: int, beams: int) -> Any:
  """Keeps sentences `rows` ([R] indices into B) of a search state: leaves [B, ...] become
  [R, ...], leaves [B*K, ...] (the K hypotheses of each sentence) become [R*K, ...], scalars
  (step counters, cache indices, rng keys) stay."""
  def take(x: jax.Array) -> jax.Array:
    if not x.ndim:
      return x
    if x.shape[0] == batch:
      return x[rows]
    if x.shape[0] == batch * beams:
      return x.reshape((batch, beams) + x.shape[1:])[rows].reshape((-1,) + x.shape[1:])
    raise ValueError(f'leaf of shape {x.shape} is neither per sentence ({batch}) nor per '
                     f'hypothesis ({batch * beams})')
  return jax.tree_util.tree_map(take, tree)


def on_host(tree: Any) -> Any:
  """The tree with its arrays as numpy arrays (XLA:CPU's buffers, viewed without a copy where
  possible); scalars stay JAX arrays."""
  return jax.tree_util.tree_map(lambda x: np.asarray(x) if np.ndim(x) else x, tree)


def resized_on_host(state: Any, resize: Callable[[Any], Any]) -> Any:
  """`resize(state)` for a resize that keeps each changed array's leading part and fills the
  rest with zeros (KVCache.resize), done in numpy: the arrays whose shape changes are copied
  into zeros of their new shape; the others are returned as they are, but an array found
  twice (a search's init may share one between fields) is copied, since a program cannot
  take the same donated buffer twice."""
  shapes = jax.eval_shape(resize, state)
  seen: set[int] = set()

  def grown(x: Any, new: jax.ShapeDtypeStruct) -> Any:
    if np.shape(x) == new.shape:
      if id(x) in seen:
        return np.array(x)
      seen.add(id(x))
      return x
    out = np.zeros(new.shape, new.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(np.shape(x), new.shape))
    out[common] = np.asarray(x)[common]
    return out
  return jax.tree_util.tree_map(grown, state, shapes)


def compacted_size(live: int, rows: int, min_rows: int) -> int:
  """Batch size to continue with: the smallest size of the ladder (`batch_sizes`: 1, 4, 16,
  24, 32, 48, 64, ...; at least `min_rows`) that holds the `live` rows, or `rows` (no
  compaction) when that is no smaller. Batches start at the same sizes, which bounds the
  shapes that compile."""
  size = 1
  while size < max(live, min_rows):
    size = _next_size(size)
  return min(size, rows)


def batch_sizes(limit: int) -> list[int]:
  """The batch sizes that decoding starts and compacts batches at, up to `limit`: 1, 4, 16,
  then powers of two and 1.5x them (24, 32, 48, 64, 96, ...). Few sizes keep the compiled
  shapes to a small grid that every file meets again (programs.py). Below 16 rows the ladder
  steps by 4, which keeps small jobs to three sizes; above, where most of a file's steps
  are taken, by 1.5x and 4/3x, which keeps the rows that padding adds (to a batch, and to
  compaction's live rows) under half of them."""
  sizes, size = [], 1
  while size <= max(limit, 1):
    sizes.append(size)
    size = _next_size(size)
  return sizes


def _next_size(size: int) -> int:
  if size < 16:
    return 4 * size
  return size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3  # 16 24 32 48 64 ...


def _on_one_cpu(state: Any) -> bool:
  """Whether the state's arrays all live on the default device, a CPU. XLA:CPU arrays are
  host memory: numpy gathers and grows them without a compiled program (small programs,
  but many of them in a long run). A state sharded over several devices (evaluation during
  training on a mesh) keeps the programs."""
  default = jax.devices()[0]
  return default.platform == 'cpu' and all(
      x.devices() == {default} for x in jax.tree_util.tree_leaves(state) if hasattr(x, 'devices'))


def _resize(state: Any, n: int) -> Any:
  return state.replace(cache=state.cache.resize(n))


class CompactingDecoder:
  """Runs a `Search` in chunks of steps from the host, dropping finished sentences.

  Args:
    search_of: the search for outputs of a given (static) length L.
    logits_fn_of: parameters -> the decoder step `logits_fn(ids [N], cache) -> ([N, V], cache)`.
    chunk: steps per call; rows are checked and compacted between calls.
    min_rows: never compact below this many rows (the engine's: inference/batches.MIN_ROWS).
    jit: compiles its programs (search.plain_jit, or a ProgramStore's, which keeps them
      across runs).
    host_compaction: gather rows and grow caches in numpy, not in compiled programs; None:
      when every array of the state lives on the default device and that is a CPU.
  """

  def __init__(self, search_of: Callable[[int], Search], logits_fn_of: Callable[[Any], LogitsFn],
               chunk: int = DECODE.chunk, min_rows: int = 1,
               jit: Jit = plain_jit, host_compaction: Optional[bool] = None):
    self.search_of, self.logits_fn_of = search_of, logits_fn_of
    self.host_compaction = host_compaction
    self.chunk, self.min_rows = chunk, min_rows
    # The last finished call's batch size in each chunk (with `begun`, the first entry
    # stands for the first cache stage's steps).
    self.rows_per_chunk: list[int] = []
    # The state is donated: each chunk's state takes the buffers of the one before instead
    # of copying the caches: a lower peak at the same speed.
    self._advance = jit(self._advance_impl, 'advance', static_argnums=(3,),
                        donate_argnums=(1,))
    self._take = jit(take_rows, 'take', static_argnums=(2, 3))
    self._resize = jit(_resize, 'resize', static_argnums=(1,))

  def cache_lengths(self, length: int) -> list[int]:
    """Self-attention cache lengths the decoding of `length` steps goes through; the caller
    makes the first one (a cache of another length is resized first)."""
    return cache_stages(length, self.chunk)

  def _advance_impl(self, params: Any, state: Any, max_lens: jax.Array,
                    length: int) -> tuple[Any, jax.Array, jax.Array]:
    """`chunk` steps -> (state, [B] rows done, each row's result so far). The result comes
    with every chunk, although the host reads it only for rows that leave the batch: a
    program of its own would be one more compiled (or loaded) program per batch shape."""
    search = self.search_of(length)
    state = search.advance(state, self.logits_fn_of(params), max_lens, self.chunk)
    return state, search.rows_done(state, max_lens), search.result(state)

  def __call__(self, params: Any, state: Any, max_lens: jax.Array, length: int,
               every_stage: bool = False,
               begun: Optional[tuple[jax.Array, jax.Array]] = None) -> np.ndarray:
    """Decodes from a fresh `search_of(length).init(...)` state: [B, length] output ids (the
    search's result per sentence, e.g. [B, N, length] for an n-best beam).

    `length` must be a multiple of `chunk`; max_lens [B] <= length are the rows' limits.
    With `every_stage` no row counts as done: the batch keeps its size through every cache
    stage, so that each program a batch of its shape can meet is made (precompilation).
    With `begun` (rows done, result) the state has taken the steps of the first cache
    stage already (`Search.begin`, as CompactingTranslate's start program takes them).
    """
    if length % self.chunk:
      raise ValueError(f'output length {length} is not a multiple of chunk {self.chunk}')
    beams = self.search_of(length).beams
    origin = np.arange(max_lens.shape[0])  # each state row's sentence; -1: a filler row
    out: list[np.ndarray] = [np.zeros(0)] * len(origin)
    stages = iter(self.cache_lengths(length))
    host = self.host_compaction
    if host is None:
      host = _on_one_cpu(state)
    cache_len = 0 if begun is None else next(stages)
    t = cache_len  # steps taken
    sizes: list[int] = []  # a list per call: threads may decode batches at once
    while True:
      if begun is None:
        if t == cache_len:
          cache_len = next(stages)
          state = (resized_on_host(state, functools.partial(_resize, n=cache_len)) if host
                   else self._resize(state, cache_len))
        state, done, result = self._advance(params, state, max_lens, length)
        t += self.chunk
      else:
        (done, result), begun = begun, None
      sizes.append(len(origin))
      done = np.zeros(len(origin), bool) if every_stage else np.asarray(done) | (origin < 0)
      live = np.flatnonzero(~done)
      size = compacted_size(len(live), len(origin), self.min_rows)
      finishing = not len(live) or t >= length  # the searches end every row by `length`
      if finishing or size < len(origin):
        ids = np.asarray(result)
        for row in np.arange(len(origin)) if finishing else np.flatnonzero(done):
          if origin[row] >= 0:
            out[origin[row]] = ids[row]
      if finishing:
        self.rows_per_chunk = sizes
        return np.stack(out)
      if size < len(origin):
        # int32 on the host: jnp.asarray of numpy's int64 would compile a conversion program,
        # the one program a run with every decoding program stored would otherwise compile
        keep = np.concatenate([live, np.full(size - len(live), live[0])]).astype(np.int32)
        state, max_lens = (take_rows(on_host((state, max_lens)), keep, len(origin), beams)
                           if host else
                           self._take((state, max_lens), keep, len(origin), beams))
        origin = np.concatenate([origin[live], np.full(size - len(live), -1)])


class CompactingTranslate:
  """`translate.translate` run from the host in chunks of steps that drop finished sentences
  from the batch (CompactingDecoder): same search, same outputs (up to float rounding in
  matmuls of other batch sizes), as a numpy array. Sampling draws differ, since a row's
  draws depend on its place in the batch. `jit` compiles its programs (plain_jit, or a
  ProgramStore's, which keeps them across runs); batches are never compacted below
  `min_rows` rows. The decoder step is `spec.kernels`'."""

  def __init__(self, cfg: Models, spec: SearchSpec, *, min_rows: int = 1,
               jit: Jit = plain_jit):
    self.cfg, self.spec = cfg, spec
    self.decoder = CompactingDecoder(lambda length: search_for(spec, length),
                                     lambda params: ensemble.step_fn(cfg, params, spec.kernels),
                                     spec.decode.chunk, min_rows, jit)
    self._start = jit(self._start_impl, 'start', static_argnums=(5,))

  def _start_impl(self, params: Any, src: jax.Array, src_segments: jax.Array,
                  rng: Optional[jax.Array], prefix: Optional[jax.Array],
                  length: int) -> tuple[Any, jax.Array, jax.Array, jax.Array]:
    """Encodes the batch and takes the steps of the first cache stage, 2 chunks
    (Search.begin: a beam search's first step on B rows): (state, max_lens, rows done,
    result), the last two as the decoder's advance program gives them. The first stage's
    steps thus need no advance program of their own (its step is compiled once, here); a
    sentence seldom ends within the first chunk, where the decoder would otherwise have looked
    for finished ones."""
    first = self.decoder.cache_lengths(length)[0]
    cache = ensemble.start(self.cfg, params, src, src_segments, first, self.spec.kernels)
    given = as_prefix(prefix, self.spec.pad_id)
    max_lens = output_limits(src_segments, self.spec.decode, given)
    search = search_for(self.spec, length, rng)
    state = search.begin(ensemble.step_fn(self.cfg, params, self.spec.kernels), cache,
                         max_lens, first, given)
    return state, max_lens, search.rows_done(state, max_lens), search.result(state)

  def __call__(self, params: Any, src: jax.Array, src_segments: jax.Array,
               rng: Optional[jax.Array] = None, prefix: Optional[jax.Array] = None,
               every_stage: bool = False) -> np.ndarray:
    """src [B, S] -> ids [B, (N,) S + max_extra_len], as `translate` (also for `prefix`);
    `every_stage` runs the batch through every cache stage (CompactingDecoder)."""
    d = self.spec.decode
    steps = output_length(src.shape[1], d.max_extra_len, d.max_len,
                          0 if prefix is None else prefix.shape[1])
    length = -(-steps // d.chunk) * d.chunk  # whole chunks (the cache stages' unit)
    state, max_lens, done, result = self._start(params, src, src_segments, rng, prefix, length)
    return self.decoder(params, state, max_lens, length, every_stage,
                        begun=(done, result))[..., :steps]

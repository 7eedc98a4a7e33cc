"""The inference engine: a loaded model with its search settings, translating and scoring
lines in length-sorted token-budget batches over fixed shape grids (decode.py, recipe.py's
selection, validation BLEU during training and serving all go through it)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import pathlib
import threading
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from transformer_nmt.data import batching as data_lib
from transformer_nmt.decoding import ensemble
from transformer_nmt.decoding.beam import length_penalty
from transformer_nmt.decoding.mbr import mbr_order
from transformer_nmt.decoding.scoring import Scored, Scorer
from transformer_nmt.decoding.settings import PRECOMPILE_LENGTH, PRECOMPILE_ROWS, DecodeConfig
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.decoding.translate import translate
from transformer_nmt.errors import ConfigError
from transformer_nmt.inference import batches, long_lines
from transformer_nmt.inference.hypotheses import Hypothesis, joined
from transformer_nmt.inference.loading import LATEST, CheckpointChoice, LoadedModel, load_model
from transformer_nmt.inference.program_set import ProgramSet, program_set
from transformer_nmt.runtime import heap
from transformer_nmt.runtime.compaction import CompactingTranslate, batch_sizes
from transformer_nmt.runtime.compiler import compiler_options, kernels
from transformer_nmt.runtime.programs import (
    ProgramStore,
    StoredJit,
    Unprepared,
    identity,
    jit_factory,
)
from transformer_nmt.workdir import Workdir

Progress = Optional[Callable[[int], None]]  # called with the number of sentences just done
# How to make fewer programs, when precompiling nears the limit on memory maps (heap.py)
_FEWER_PROGRAMS = ("precompile's max_rows or max_length: serve.py's --precompile_rows or "
                   '--precompile_length')


class Engine:
  """Translates and scores with one model (or an ensemble) under one set of search settings.

  Lines become source rows (long ones in pieces, long_lines.py), rows are planned into
  batches over a grid of lengths and batch sizes (the same shapes for every input, so the
  compiled programs recur), and each batch runs the compacting, cached decoder
  (runtime/compaction.py's CompactingTranslate; with `decode.compact` off, one jitted loop).

    engine = Engine.load(['runs/base'])             # the run's own decode settings
    engine.translate(['Ein Hund läuft.'])           # -> ['A dog is running.']
    engine.hypotheses(lines)                        # n-best with scores and alignments
    engine.score(sources, targets)                  # forced decoding of given translations
  """

  def __init__(self, model: LoadedModel, decode: Optional[DecodeConfig] = None, *,
               n_best: int = 1, programs: Optional[str | pathlib.Path] = None,
               concurrent_batches: int = 0):
    """`decode` (default: the model's run's settings) is checked here once, with `n_best`
    (<= beam size) hypotheses per sentence kept for `hypotheses`. With `programs` (a
    directory, e.g. Workdir.programs) the compiled programs are kept there and a later
    engine with the same settings calls them without tracing (programs.py); `self.store`
    counts them. `concurrent_batches` batches are decoded at once, each by a thread of its
    own (0: 2 on a CPU, whose cores one batch's small matrices leave partly idle; 1 on an
    accelerator), and a job of one batch is cut into that many (batches.split_for_threads):
    the batches' make-up thus depends on it, which changes a rare translation on a CPU
    unless `decode.batch_invariant`. Every batch carries a target prefix as wide as its
    sources (padding where a line has none), so that lines with and without prefixes, and
    decode.py and serve.py, share one set of programs (docs/decoding.md, "Compiled
    programs")."""
    d = model.decode if decode is None else decode
    tgt = model.tgt_tok
    self.spec = SearchSpec(tgt.bos_id, tgt.eos_id, tgt.pad_id, d, n_best,
                           kernels(d.batch_invariant))
    if concurrent_batches < 0:
      raise ConfigError(f'concurrent_batches={concurrent_batches} must be 0 (automatic) or '
                        'positive')
    self.model, self.decode, self.n_best = model, d, n_best
    self.split_len = d.split_len or int(model.config.get('data', {}).get('max_len',
                                                                          d.max_input_len))
    # what `precompile` is making, and what it made
    self.planned: Optional[ProgramSet] = None
    self.prepared: Optional[ProgramSet] = None
    self._sealed = threading.Event()
    self._lock = threading.Lock()
    self.lines_split = self.sentences_cut = 0  # by long_lines.split, over this engine's life
    # MBR chooses among all the beam's hypotheses; the programs are those of that n-best
    self.mbr = d.mbr if d.beam_size > 1 else 'off'
    searched = self.spec.with_n_best(d.beam_size if self.mbr != 'off' else n_best)
    self._host_state = jax.default_backend() == 'cpu'
    self._computed: tuple[Any, Any] = (None, None)  # (params given, kernels_as_computed)
    self.concurrent_batches = concurrent_batches or (
        min(2, os.cpu_count() or 1) if self._host_state else 1)
    # Sampling only (batch i uses fold_in(rng, i)); a search does not draw, and making keys
    # would compile programs of their own.
    self._rng = jax.random.key(d.seed) if self.spec.sampling else None
    cfg = model.cfg
    self.store = None if programs is None else ProgramStore(programs, identity(
        models=cfg, decode=dataclasses.replace(d, mbr='off'), n_best=searched.n_best,
        tokens=(tgt.bos_id, tgt.eos_id, tgt.pad_id)))
    self._jits: list[StoredJit] = []  # to count their programs (`programs_ready`)
    jit = functools.partial(jit_factory(self.store, self._sealed, self._jits),
                            compiler_options=compiler_options(d.batch_invariant))
    if d.compact:
      self._translate = CompactingTranslate(cfg, searched, min_rows=batches.MIN_ROWS,
                                            jit=jit)
    else:
      self._translate = jit(lambda params, src, segments, rng=None, prefix=None: translate(
          cfg, params, src, segments, searched, rng=rng, prefix=prefix), 'translate')
    self.scorer = Scorer(cfg, bos_id=tgt.bos_id, pad_id=tgt.pad_id,
                         tokens_per_batch=d.tokens_per_batch, max_input_len=d.max_input_len,
                         jit=jit, kernels=self.spec.kernels)

  @classmethod
  def load(cls, workdirs: str | pathlib.Path | Sequence[str | pathlib.Path],
           choice: CheckpointChoice = LATEST, *, dtype: Optional[str] = None,
           programs: bool = False,
           settings: Optional[Callable[[DecodeConfig], DecodeConfig]] = None,
           n_best: int = 1, concurrent_batches: int = 0) -> Engine:
    """The engine of one workdir's model, or of several as an ensemble (loading.load_model:
    the checkpoints of `choice`, `dtype`, and `settings` of the first run's decode section).
    With `programs`, compiled programs and the restored parameters are kept in the first
    workdir's programs directory (as decode.py does), so that a later engine starts
    without compiling."""
    model = load_model(workdirs, choice, dtype=dtype, snapshot=programs, settings=settings)
    first = workdirs if isinstance(workdirs, (str, pathlib.Path)) else workdirs[0]
    return cls(model, n_best=n_best, programs=Workdir(first).programs if programs else None,
               concurrent_batches=concurrent_batches)

  def using(self, params: Any) -> Engine:
    """This engine (its compiled programs too) with other parameters of the same shapes:
    validation BLEU during training translates with each evaluation's parameters."""
    other = copy.copy(self)
    other.model = dataclasses.replace(self.model, params=params)
    return other

  def translate_ids(self, rows: Sequence[np.ndarray], progress: Progress = None,
                    prefixes: Optional[Sequence[np.ndarray]] = None) -> list[np.ndarray]:
    """rows: source ids ending in EOS -> output ids (without EOS), in the order of `rows`;
    each output starts with its row's prefix ids (target ids, no EOS) when given. The
    search's best: `decode.mbr` applies to `translate` and `hypotheses` only."""
    return [best[0] for best in self._search(rows, progress, prefixes)]

  def _search(self, rows: Sequence[np.ndarray], progress: Progress = None,
              prefixes: Optional[Sequence[np.ndarray]] = None) -> list[list[np.ndarray]]:
    """rows -> each row's hypotheses (ids without EOS), best first: 1 to n_best of them."""
    out: list[list[np.ndarray]] = [[np.zeros(0, np.int32)]] * len(rows)
    if not rows:
      return out
    params, d, tgt = self.params_as_computed(), self.decode, self.model.tgt_tok
    if prefixes is None:
      prefixes = [np.zeros(0, np.int32)] * len(rows)
    # A batch's prefixes are as wide as its sources (`padded`)
    lengths = np.array([max(len(r), len(p)) for r, p in zip(rows, prefixes)])
    boundaries = data_lib.length_grid(int(lengths.max()), d.max_input_len)
    # Batch sizes from the compaction ladder (1, 4, 16, 24, 32, ...): few shapes, and the same
    # ones for every file.
    sizes = batch_sizes(d.tokens_per_batch)
    if self.sealed:  # only the shapes precompile made
      self._check_prepared(int(lengths.max()))
      sizes = [n for n in sizes if n <= self.prepared.rows]
    plans = batches.split_for_threads(
        data_lib.fill_batches(lengths, boundaries, d.tokens_per_batch, sizes,
                              min_rows=batches.START_ROWS),
        lengths, boundaries, sizes, self.concurrent_batches)

    def decode(i: int) -> np.ndarray:
      """Batch i's output ids [rows, (N,) L]."""
      src, segments, _ = data_lib.pad_rows(rows, plans[i], self.model.src_tok.pad_id)
      prefix = batches.padded(prefixes, plans[i], tgt.pad_id)
      return self._batch(params, src, segments, i, prefix=prefix)

    # closing: an error below stops the batches not yet started (see batches.in_order)
    with contextlib.closing(batches.in_order(decode, len(plans),
                                             self.concurrent_batches)) as done:
      for plan, ids in zip(plans, done):
        for row, example in enumerate(plan.examples):
          found = ids[row] if ids.ndim == 3 else ids[row][None]
          # An n-best slot without a hypothesis holds no EOS (beam.result); the first has one.
          out[example] = [batches.strip(h, tgt.eos_id) for j, h in enumerate(found)
                          if j == 0 or tgt.eos_id in h]
        if progress is not None:
          progress(len(plan.examples))
    return out

  def params_as_computed(self) -> Any:
    """The parameters as every decoding program takes them: Dense kernels in the compute
    dtype (ensemble.kernels_as_computed), so that stored programs serve every caller alike.
    The cast of the last parameters seen is kept; already cast ones pass unchanged."""
    given, cast = self._computed
    if self.model.params is not given:
      cast = ensemble.kernels_as_computed(self.model.cfg, self.model.params)
      self._computed = (self.model.params, cast)
    return cast

  def _batch(self, params: Any, src: np.ndarray, segments: np.ndarray, index: int,
             **extra: Any) -> np.ndarray:
    """Output ids [rows, (N,) L] of the padded batch src [rows, S] (batch `index` of a call,
    which picks its sampling draws)."""
    rng = None if self._rng is None else jax.random.fold_in(self._rng, index)
    ids = np.asarray(self._translate(params, src, segments, rng=rng, **extra))
    if self._host_state:  # the batch's state, freed by now, was host memory (heap.py)
      heap.release_free_memory(heap.TRIM_AFTER_GROWTH)
    return ids

  def precompile(self, max_rows: int = PRECOMPILE_ROWS,
                 max_length: int = PRECOMPILE_LENGTH, scoring: bool = False,
                 kept_only: bool = True) -> ProgramSet:
    """Makes (compiles, or loads from the store) the programs of every batch that a job of at
    most `max_rows` sentences of at most `max_length` source subwords can meet, with or
    without target prefixes (program_set.py: each size of the rows ladder at each length of
    the grid, through every cache stage). A later engine with the same store then translates
    such a job, or a line typed at a terminal, without compiling. With `scoring`, also the
    forced-decoding programs of `score` and `hypotheses` (scores, n-best, alignments) for as
    many pairs as long as their longest translations. With `kept_only` (decode.py
    --precompile) nothing is made when the store cannot keep it; else (a server's warm-up)
    programs are made in memory all the same. Returns the set, which `prepared` keeps."""
    params, d, src_tok = self.params_as_computed(), self.decode, self.model.src_tok
    wanted = program_set(d, self.scorer, max_rows, max_length, scoring)
    self.planned = wanted
    shapes = wanted.shapes
    if not shapes or (kept_only and self.store is not None and not self.store.writable):
      return wanted  # nothing would be kept: decode.py says so
    extra = {'every_stage': True} if d.compact else {}

    def make(i: int) -> np.ndarray:
      rows, n = shapes[i]
      segments = np.zeros((rows, n), np.int32)
      segments[:, 0] = 1  # a source of EOS alone: only the shape matters
      src = np.where(segments > 0, src_tok.eos_id, src_tok.pad_id).astype(np.int32)
      prefix = np.full((rows, n), self.model.tgt_tok.pad_id, np.int32)
      return self._batch(params, src, segments, i, prefix=prefix, **extra)
    with contextlib.closing(batches.in_order(make, len(shapes),
                                             self.concurrent_batches)) as made:
      for i, _ in enumerate(made):
        heap.check_memory_maps(f'{i + 1} of {len(shapes)} batch shapes', _FEWER_PROGRAMS)
    self.scorer.precompile(params, wanted.score_shapes, src_tok.eos_id)
    heap.check_memory_maps(f'{wanted.programs} programs', _FEWER_PROGRAMS)
    self.prepared = wanted
    return wanted

  @property
  def programs_ready(self) -> int:
    """Programs this engine holds, compiled or loaded (what /health reports during warm-up,
    against `planned`)."""
    return sum(j.programs for j in self._jits)

  def seal(self) -> None:
    """From now on this engine makes no program (compiling, or loading from the store): long
    lines are split into pieces of what `precompile` prepared, batches keep to its rows, and
    a call that would still need another program (a prefix or a pair to score over the
    prepared length) raises `Unprepared`, naming the limit. A server seals its engine once
    warm: every program holds memory and a few hundred memory maps, and a process past the
    kernel's limit on maps dies."""
    if self.prepared is None:
      raise ValueError('seal() needs precompile() first: nothing would be prepared')
    self._sealed.set()

  @property
  def sealed(self) -> bool:
    return self._sealed.is_set()

  def _check_prepared(self, length: int, scoring: bool = False) -> None:
    """Raises Unprepared when a sealed engine would need a row of `length` subwords."""
    limit = self.prepared.score_length if scoring else self.prepared.length
    if length > limit:
      what = 'pair to score' if scoring else 'prefix'
      raise Unprepared(f'a {what} of {length} subwords is over the {limit} this server '
                       'prepared programs for (serve.py --precompile_length)')

  def check_prepared(self, prefixes: Sequence[str] = (),
                     pairs: Sequence[tuple[str, str]] = ()) -> None:
    """Raises Unprepared (naming the limit) when a sealed engine could not take these target
    prefixes or (source, target) pairs to score; sources of any length are split to fit."""
    if not self.sealed:
      return
    given = [p for p in prefixes if p]
    if given:
      self._check_prepared(max(len(ids) for ids in self.model.tgt_tok.encode(given)))
    if pairs:
      src = self.model.src_tok.encode([s for s, _ in pairs])
      tgt = self.model.tgt_tok.encode([t for _, t in pairs])
      self._check_prepared(max(max(len(s), len(t)) + 1 for s, t in zip(src, tgt)), True)

  def _pieces(self, lines: Sequence[str]) -> long_lines.Pieces:
    """`lines` as source pieces (long_lines.py): split past split_len, cut past the longest
    source a sealed engine prepared (else decode.max_input_len); counted."""
    longest = self.prepared.length if self.sealed else self.decode.max_input_len
    found = long_lines.split(self.model.src_tok, lines, self.split_len, longest)
    with self._lock:
      self.lines_split += found.split_lines
      self.sentences_cut += found.cut_sentences
    return found

  def hypotheses(self, lines: Sequence[str], progress: Progress = None,
                 prefixes: Optional[Sequence[str]] = None
                 ) -> list[tuple[list[str], list[Hypothesis]]]:
    """Sentences -> per line (source subwords with EOS, up to n_best hypotheses, best first),
    each hypothesis scored by forced decoding (prefix included). Best is the search's order,
    or with `decode.mbr` the highest expected utility among all the beam's hypotheses
    (mbr.mbr_order). An empty line gives no hypotheses. A line translated in pieces
    (long_lines.py) gives one hypothesis: its pieces' best translations joined
    (see `translate`; with MBR each piece's choice), scores summed, alignments into the
    line."""
    src_tok, tgt_tok = self.model.src_tok, self.model.tgt_tok
    split = self._pieces(lines)
    owner = split.owner
    rows = [np.array(ids + [src_tok.eos_id], np.int32) for ids in split.ids]
    found = self._search(rows, progress, long_lines.prefix_ids(tgt_tok, prefixes, owner))
    pairs = [(rows[p], h) for p, hyps in enumerate(found) for h in hyps]
    eos = np.array([tgt_tok.eos_id], np.int32)
    scored = iter(self.scorer.score_ids(self.params_as_computed(), [s for s, _ in pairs],
                                        [np.concatenate([h, eos]) for _, h in pairs]))
    result: list[tuple[list[str], list[Hypothesis]]] = [([], []) for _ in lines]
    for p, hyps in enumerate(found):
      made = [self._hypothesis(h, next(scored)) for h in hyps]
      if self.mbr != 'off':
        order = mbr_order([h.text for h in made], [h.logprob for h in made], self.mbr)
        made = [made[i] for i in order[:self.n_best]]
      source, kept = result[owner[p]]
      if not kept:
        kept += made  # in the search's order (its own scores, best first)
      else:  # the next piece of a long line: appended to the line's one hypothesis
        kept[0] = joined(kept[0], made[0], len(source), self.decode.alpha)
        del kept[1:]  # the first piece's alternatives do not translate the whole line
      source += src_tok.pieces(rows[p].tolist())
    return result

  def score(self, sources: Sequence[str], targets: Sequence[str]
            ) -> list[tuple[list[str], Hypothesis]]:
    """The model's scores of each target line as the translation of its source line (forced
    decoding; nothing is split or truncated): per line the source subwords with EOS and the
    target as a scored `Hypothesis`."""
    src_tok, tgt_tok = self.model.src_tok, self.model.tgt_tok
    src = [np.array(ids + [src_tok.eos_id], np.int32) for ids in src_tok.encode(sources)]
    tgt = [np.array(ids, np.int32) for ids in tgt_tok.encode(targets)]
    if self.sealed and src:
      self._check_prepared(max(max(len(s), len(t) + 1) for s, t in zip(src, tgt)), True)
    eos = np.array([tgt_tok.eos_id], np.int32)
    scored = self.scorer.score_ids(self.params_as_computed(), src,
                                   [np.concatenate([t, eos]) for t in tgt])
    return [(src_tok.pieces(s.tolist()), self._hypothesis(t, sc, text))
            for s, t, sc, text in zip(src, tgt, scored, targets)]

  def _hypothesis(self, ids: np.ndarray, scored: Scored,
                  text: Optional[str] = None) -> Hypothesis:
    tgt_tok, n = self.model.tgt_tok, len(ids) + 1  # with EOS
    return Hypothesis(tgt_tok.decode([ids.tolist()])[0] if text is None else text,
                      scored.logprob / float(length_penalty(n, self.decode.alpha)),
                      scored.logprob, tgt_tok.pieces(ids.tolist() + [tgt_tok.eos_id]),
                      [float(x) for x in scored.token_logprobs],
                      [int(x) for x in scored.alignment], scored.attention)

  def translate(self, lines: Sequence[str], progress: Progress = None,
                prefixes: Optional[Sequence[str]] = None) -> list[str]:
    """Sentences -> translations; an empty line gives an empty line. With `prefixes` (one
    target text per line, '' for none) each translation starts with its line's prefix. A
    line longer than `split_len` source subwords (decode.split_len: by default the longest
    line the model trained on) is translated in pieces split at sentence ends
    (long_lines.py), which are joined with spaces (the prefix starts the first); how many
    lines were split and sentences cut goes to the log and to `lines_split` and
    `sentences_cut`. With `decode.mbr` each is `hypotheses`' first."""
    if self.mbr != 'off':
      return [hyps[0].text if hyps else '' for _, hyps in
              self.hypotheses(lines, progress, prefixes)]
    src_tok, tgt_tok = self.model.src_tok, self.model.tgt_tok
    split = self._pieces(lines)
    rows = [np.array(ids + [src_tok.eos_id], np.int32) for ids in split.ids]
    outputs = self.translate_ids(rows, progress,
                                 long_lines.prefix_ids(tgt_tok, prefixes, split.owner))
    texts = tgt_tok.decode([o.tolist() for o in outputs])
    result: list[list[str]] = [[] for _ in lines]
    for i, text in zip(split.owner, texts):
      result[i].append(text)
    return [' '.join(part for part in parts if part) for parts in result]

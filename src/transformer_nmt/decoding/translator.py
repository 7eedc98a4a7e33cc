"""Load a trained workdir and translate sentences in length-sorted token-budget batches."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import pathlib
import re
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import jax
import numpy as np

from transformer_nmt.config import (
  DECODE,
  PRECOMPILE_LENGTH,
  PRECOMPILE_ROWS,
  DecodeConfig,
  ModelConfig,
)
from transformer_nmt.data import batching as data_lib
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.decoding import ensemble, heap, snapshots
from transformer_nmt.decoding.beam import length_penalty
from transformer_nmt.decoding.compaction import batch_sizes
from transformer_nmt.decoding.ensemble import Models
from transformer_nmt.decoding.mbr import mbr_order
from transformer_nmt.decoding.programs import ProgramStore, StoredJit, identity
from transformer_nmt.decoding.scoring import Scorer
from transformer_nmt.decoding.translate import CompactingTranslate, translate
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.workdir import Workdir

if TYPE_CHECKING:  # Orbax's import is left to the runs that restore a checkpoint
  from transformer_nmt.checkpoint import Checkpointer


@dataclasses.dataclass
class LoadedModel:
  """A workdir's model config, parameters, tokenizers and which checkpoints they come from."""

  cfg: Models  # a tuple for an ensemble (load_ensemble), as params
  params: Any
  src_tok: Tokenizer
  tgt_tok: Tokenizer
  steps: list[int]
  config: dict  # the resolved training config (config.json)
  decode: DecodeConfig  # the run's decoding settings (its config's decode section)


def load_workdir(workdir: str | pathlib.Path, checkpoint: Optional[int] = None,
                 average_last: int = 0, best: bool = False, ema: bool = True,
                 snapshot: bool = False) -> LoadedModel:
  """Restores parameters from one checkpoint (latest by default) or the mean of the last N;
  with `best`, from the checkpoint of highest validation BLEU (workdir/best) instead. A run
  trained with train.ema_decay gives its moving average of the weights unless `ema` is False.
  With `snapshot`, the restored parameters are also kept in WORKDIR/programs/params, where a
  later call for the same checkpoints reads them without Orbax (snapshots.py).

  The paper averaged the last 5 (base) or 20 (big) checkpoints, written every 10 minutes.
  """
  wd = Workdir(workdir)
  if not wd.config.exists():
    raise DataError(f'{workdir} is not a training workdir (no {wd.config.name})')
  config = wd.read_config()
  cfg, decode = wd.read_model_config(), wd.read_sections().decode
  src_tok, tgt_tok = _tokenizers(wd)
  wd.check_tokenizers({'src': src_tok.fingerprint, 'tgt': tgt_tok.fingerprint})
  if best and (checkpoint is not None or average_last):
    raise ConfigError('--best picks one checkpoint; drop --checkpoint and --average_last')
  directory = wd.checkpoint_dir(best)
  if best and not directory.exists():
    raise DataError(f'{workdir} has no best checkpoint (train.keep_best was off or no '
                    'evaluation has run yet)')
  where = wd.programs if snapshot else None
  steps, params = _restore(directory, where, workdir, checkpoint, average_last, best, ema)
  # On the device once: host arrays would be copied in at every call of a decoding program
  # (10 lines of test2016: 0.48-0.50 GB peak instead of 0.51-0.54 GB, bench/RESULTS.md).
  params = jax.device_put(params)
  _check_vocab(params, cfg, tgt_tok)
  return LoadedModel(cfg, params, src_tok, tgt_tok, steps, config, decode)


def _restore(directory: pathlib.Path, snapshot_root: Optional[pathlib.Path],
             workdir: str | pathlib.Path, checkpoint: Optional[int], average_last: int,
             best: bool, ema: bool) -> tuple[list[int], Any]:
  """(steps, params) from the checkpoints in `directory` (see `load_workdir`), through a
  snapshot under `snapshot_root` when one is given."""
  if snapshot_root is not None:
    steps = _choose_steps(snapshots.step_numbers(directory), workdir, checkpoint, average_last)
    path = snapshots.snapshot_path(snapshot_root, directory, steps, ema)
    params = None if path is None else snapshots.load(path)
    if params is not None:
      return steps, params
  from transformer_nmt.checkpoint import Checkpointer  # Orbax, only to restore
  ckpt = Checkpointer(directory, read_only=True)
  try:
    steps = _choose_steps(ckpt.all_steps(), workdir, checkpoint, average_last)
    if checkpoint is None and average_last <= 1 and not best:  # the latest that reads back
      steps, params = _latest_readable(ckpt, ema)
    else:
      params = average_params([_read_params(ckpt, step, ema) for step in steps])
  finally:
    ckpt.close()
  if snapshot_root is not None:  # steps may differ from the snapshot's: an unreadable latest
    path = snapshots.snapshot_path(snapshot_root, directory, steps, ema)
    if path is not None:
      snapshots.save(path, params)
  return steps, params


def load_ensemble(workdirs: Sequence[str | pathlib.Path], checkpoint: Optional[int] = None,
                  average_last: int = 0, best: bool = False, ema: bool = True,
                  snapshot: bool = False) -> LoadedModel:
  """One workdir's model (`load_workdir`), or several as an ensemble: configs and parameters
  as tuples (decoding/ensemble.py), the first workdir's tokenizers, config and decode
  settings. Members must use the same SentencePiece models, else a DataError names the first
  that differs."""
  models = [load_workdir(w, checkpoint, average_last, best, ema, snapshot) for w in workdirs]
  if len(models) == 1:
    return models[0]
  first = models[0]
  for workdir, m in zip(workdirs[1:], models[1:]):
    for side in ('src', 'tgt'):
      mine, theirs = getattr(m, f'{side}_tok'), getattr(first, f'{side}_tok')
      if mine.fingerprint != theirs.fingerprint:
        raise DataError(f'ensemble member {workdir} has another {side} vocabulary ({mine.path}) '
                        f'than {workdirs[0]} ({theirs.path}); members must share both')
  return dataclasses.replace(first, cfg=tuple(m.cfg for m in models),
                             params=tuple(m.params for m in models),
                             steps=[s for m in models for s in m.steps])


def _read_params(ckpt: Checkpointer, step: int, ema: bool = True) -> Any:
  from transformer_nmt.checkpoint import describe
  try:
    return ckpt.restore_params(step, ema)
  except Exception as e:  # noqa: BLE001 -- Orbax and TensorStore raise many kinds
    raise DataError(f'checkpoint {ckpt.directory / str(step)} is unreadable ({describe(e)}); '
                    'choose another with --checkpoint') from None


def _latest_readable(ckpt: Checkpointer, ema: bool = True) -> tuple[list[int], Any]:
  """([step], params) of the newest checkpoint that reads back, warning about newer ones
  that do not (train.py moves those aside when it next runs)."""
  from transformer_nmt.checkpoint import describe
  errors = []
  for step in reversed(ckpt.all_steps()):
    try:
      return [step], ckpt.restore_params(step, ema)
    except Exception as e:  # noqa: BLE001
      errors.append(f'step {step}: {describe(e)}')
      logging.warning('Checkpoint %s is unreadable (%s); using the one before',
                      ckpt.directory / str(step), describe(e))
  raise DataError(f'no checkpoint in {ckpt.directory} reads back ({errors[0]})')


def _tokenizers(wd: Workdir) -> tuple[Tokenizer, Tokenizer]:
  paths = wd.existing_tokenizer_paths()
  if paths is None:
    raise DataError(f'{wd.root} has no SentencePiece model ({wd.tokenizer_paths(True)[0].name})')
  src = Tokenizer(paths[0])
  return src, src if paths[1] == paths[0] else Tokenizer(paths[1])


def _choose_steps(available: Sequence[int], workdir: pathlib.Path, checkpoint: Optional[int],
                  average_last: int) -> list[int]:
  available = sorted(available)
  if not available:
    raise DataError(f'{workdir} has no checkpoints')
  if checkpoint is not None and average_last:
    raise ConfigError('give either --checkpoint or --average_last, not both')
  if checkpoint is not None:
    if checkpoint not in available:
      raise DataError(f'{workdir} has no checkpoint at step {checkpoint}; available: {available}')
    return [checkpoint]
  if average_last > len(available):
    raise DataError(f'--average_last={average_last} but {workdir} keeps only {len(available)} '
                    f'checkpoints: {available}')
  return available[-max(average_last, 1):]


def average_params(trees: Sequence[Any]) -> Any:
  """Elementwise mean of parameter pytrees (float32)."""
  return jax.tree_util.tree_map(lambda *xs: np.mean(np.stack(xs), axis=0), *trees)


def _in_order(fn: Callable[[int], Any], count: int, workers: int) -> Iterator[Any]:
  """fn(0), fn(1), ..., fn(count - 1) in order, up to `workers` of them computed at once by
  threads: XLA releases the GIL while a program runs, so batches overlap on a CPU's cores."""
  if workers <= 1 or count <= 1:
    yield from map(fn, range(count))
    return
  pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix='decode')
  pending: collections.deque = collections.deque()
  try:
    for i in range(count):  # `workers` batches in flight, also while the caller takes one
      pending.append(pool.submit(fn, i))
      if len(pending) == workers:
        yield pending.popleft().result()
    while pending:
      yield pending.popleft().result()
  finally:  # also when the caller stops early: the batches running end, no new one starts
    for future in pending:
      future.cancel()
    pool.shutdown(wait=True)


# Fewest rows in a batch, also after compaction: fewer cost about as much.
_MIN_ROWS = 8


def _check_vocab(params: Any, cfg: ModelConfig, tok: Tokenizer) -> None:
  table = params['tgt_embed']['embedding']
  if table.shape[0] != tok.vocab_size or cfg.vocab_size != tok.vocab_size:
    raise DataError(f'tokenizer {tok.path} has {tok.vocab_size} pieces but the checkpoint\'s '
                    f'vocabulary has {table.shape[0]}; they do not belong together')


@dataclasses.dataclass(frozen=True)
class Hypothesis:
  """One translation with the model's scores of it (forced decoding, scoring.py).

  tokens, token_logprobs, alignment: one entry per target subword and one for the final EOS;
  alignment holds positions in the source's subwords (`source_tokens`, EOS last)."""

  text: str
  score: float  # logprob / GNMT length penalty (decode.alpha), what beam search ranks by
  logprob: float
  tokens: list[str]
  token_logprobs: list[float]
  alignment: list[int]

  def as_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


class Translator:
  """Translates token-id rows in length buckets (one compile per bucket) and keeps the order."""

  def __init__(self, cfg: Models, src_tok: Tokenizer, tgt_tok: Tokenizer,
               decode: DecodeConfig = DECODE, *, cache_mode: str = 'cached',
               grow_cache: bool = True, n_best: int = 1,
               programs: Optional[str | pathlib.Path] = None, concurrent_batches: int = 0):
    """`decode.compact` drops finished sentences every `decode.chunk` steps
    (translate.CompactingTranslate, 'cached' decoding only); without it each batch runs as one
    jitted loop (translate.translate) that checks every `chunk` steps whether all its rows are
    done. `n_best` (<= beam size) hypotheses per sentence are kept for `hypotheses`.
    With `programs` (a directory, e.g. Workdir.programs) the compiled programs are kept there
    and a later translator with the same settings calls them without tracing (programs.py);
    `self.store` counts them. `concurrent_batches` batches are decoded at once, each by a
    thread of its own (0: 2 on a CPU, whose cores one batch's small matrices leave partly
    idle; 1 on an accelerator); outputs do not depend on it. `cache_mode` and `grow_cache`
    are for measuring the decoder cache (bench/)."""
    d = decode.validate()
    if not 1 <= n_best <= d.beam_size or (n_best > 1 and d.temperature > 0):
      raise ConfigError(f'n_best={n_best} must be between 1 and the beam size {d.beam_size} '
                        '(and 1 when sampling)')
    self.src_tok, self.tgt_tok, self.tokens_per_batch = src_tok, tgt_tok, d.tokens_per_batch
    self.max_input_len, self.alpha, self.n_best = d.max_input_len, d.alpha, n_best
    # MBR chooses among all the beam's hypotheses; the programs are those of that n-best
    self.mbr = d.mbr if d.beam_size > 1 else 'off'
    searched = d.beam_size if self.mbr != 'off' else n_best
    self.length_growth = d.length_growth
    if concurrent_batches < 0:
      raise ConfigError(f'concurrent_batches={concurrent_batches} must be 0 (automatic) or '
                        'positive')
    self._host_state = jax.default_backend() == 'cpu'
    self.cfg = cfg
    self._computed: tuple[Any, Any] = (None, None)  # (params given, kernels_as_computed)
    self.concurrent_batches = concurrent_batches or (
        min(2, os.cpu_count() or 1) if self._host_state else 1)
    # Sampling only (batch i uses fold_in(rng, i)); a search does not draw, and making keys
    # would compile programs of their own.
    self._rng = jax.random.key(d.seed) if d.temperature > 0 else None
    search = dict(bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id, pad_id=tgt_tok.pad_id,
                  beam_size=d.beam_size, alpha=d.alpha, max_extra_len=d.max_extra_len,
                  chunk=d.chunk, temperature=d.temperature, top_k=d.top_k, beam_stop=d.beam_stop,
                  n_best=searched, min_len=d.min_len, max_len=d.max_len,
                  no_repeat_ngram=d.no_repeat_ngram)
    self.compact = d.compact and cache_mode == 'cached'
    self.store = None if programs is None else ProgramStore(programs, identity(
        models=cfg, decode=dataclasses.replace(d, mbr='off'), n_best=searched,
        cache_mode=cache_mode, grow_cache=grow_cache,
        tokens=(tgt_tok.bos_id, tgt_tok.eos_id, tgt_tok.pad_id)))
    if self.compact:
      self._translate = CompactingTranslate(cfg, **search, min_rows=_MIN_ROWS, store=self.store)
    else:
      self._translate = StoredJit(functools.partial(translate, cfg, cache_mode=cache_mode,
                                                    grow_cache=grow_cache, **search),
                                  'translate', self.store)
    self.scorer = Scorer(cfg, bos_id=tgt_tok.bos_id, pad_id=tgt_tok.pad_id,
                         tokens_per_batch=d.tokens_per_batch, max_input_len=d.max_input_len,
                         length_growth=d.length_growth, store=self.store)

  def translate_ids(self, params: Any, rows: Sequence[np.ndarray],
                    progress: Optional[Callable[[int], None]] = None,
                    prefixes: Optional[Sequence[np.ndarray]] = None) -> list[np.ndarray]:
    """rows: source ids ending in EOS -> output ids (without EOS), in the order of `rows`;
    each output starts with its row's prefix ids (target ids, no EOS) when given. The
    search's best: `decode.mbr` applies to `translate_lines` and `hypotheses` only."""
    return [best[0] for best in self._search(params, rows, progress, prefixes)]

  def _search(self, params: Any, rows: Sequence[np.ndarray],
              progress: Optional[Callable[[int], None]] = None,
              prefixes: Optional[Sequence[np.ndarray]] = None) -> list[list[np.ndarray]]:
    """rows -> each row's hypotheses (ids without EOS), best first: 1 to n_best of them."""
    out: list[list[np.ndarray]] = [[np.zeros(0, np.int32)]] * len(rows)
    if not rows:
      return out
    params = self.as_computed(params)
    lengths = np.array([len(r) for r in rows])
    boundaries = data_lib.length_grid(int(lengths.max()), self.max_input_len, self.length_growth)
    # Batch sizes from the compaction ladder (at least 8 rows; the one-loop path: powers of
    # two): few shapes, and the same ones for every file.
    sizes = batch_sizes(self.tokens_per_batch, powers_of_two=not self.compact)
    plans = data_lib.fill_batches(lengths, boundaries, self.tokens_per_batch, sizes,
                                  min_rows=_MIN_ROWS)
    eos = self.tgt_tok.eos_id

    def decode(i: int) -> np.ndarray:
      """Batch i's output ids [rows, (N,) L]."""
      src, segments, _ = data_lib.pad_rows(rows, plans[i], self.src_tok.pad_id)
      given = ({} if prefixes is None else
               {'prefix': _padded(prefixes, plans[i], self.tgt_tok.pad_id)})
      return self._batch(params, src, segments, i, **given)

    # closing: an error below stops the batches not yet started (see _in_order)
    with contextlib.closing(_in_order(decode, len(plans), self.concurrent_batches)) as batches:
      for plan, ids in zip(plans, batches):
        for row, example in enumerate(plan.examples):
          found = ids[row] if ids.ndim == 3 else ids[row][None]
          # An n-best slot without a hypothesis holds no EOS (beam.result); the first has one.
          out[example] = [_strip(h, eos) for j, h in enumerate(found) if j == 0 or eos in h]
        if progress is not None:
          progress(len(plan.examples))
    return out

  def as_computed(self, params: Any) -> Any:
    """The parameters as every decoding program takes them: Dense kernels in the compute
    dtype (ensemble.kernels_as_computed), so that stored programs serve every caller alike.
    The cast of the last parameters given is kept; already cast ones pass unchanged."""
    given, cast = self._computed
    if params is not given:
      cast = ensemble.kernels_as_computed(self.cfg, params)
      self._computed = (params, cast)
    return cast

  def _batch(self, params: Any, src: np.ndarray, segments: np.ndarray, index: int,
             **extra: Any) -> np.ndarray:
    """Output ids [rows, (N,) L] of the padded batch src [rows, S] (batch `index` of a call,
    which picks its sampling draws)."""
    rng = None if self._rng is None else jax.random.fold_in(self._rng, index)
    ids = np.asarray(self._translate(params, src, segments, rng=rng, **extra))
    if self._host_state:  # the batch's state, freed by now, was host memory (heap.py)
      heap.release_free_memory()
    return ids

  def precompile(self, params: Any, max_rows: int = PRECOMPILE_ROWS,
                 max_length: int = PRECOMPILE_LENGTH) -> int:
    """Makes (compiles, or loads from the store) the decoding programs of every batch that a
    job of at most `max_rows` sentences of at most `max_length` source subwords can meet:
    each batch size from 8 (the fewest rows a batch has) to `max_rows` at each length of the
    grid up to `max_length`, through every cache stage. A later translator with the same
    store then translates such a job, or a line typed at a terminal, without compiling.
    Returns the number of batch shapes."""
    params = self.as_computed(params)
    lengths = [n for n in data_lib.length_grid(1, self.max_input_len, self.length_growth)
               if n <= max_length]
    sizes = [n for n in batch_sizes(self.tokens_per_batch) if _MIN_ROWS <= n <= max_rows]
    shapes = [(rows, n) for n in lengths for rows in sizes if rows * n <= self.tokens_per_batch]
    extra = {'every_stage': True} if self.compact else {}

    def make(i: int) -> Optional[np.ndarray]:
      if self.store is not None and not self.store.writable:
        return None  # nothing would be kept: decode.py says so once the calls end
      rows, n = shapes[i]
      segments = np.zeros((rows, n), np.int32)
      segments[:, 0] = 1  # a source of EOS alone: only the shape matters
      src = np.where(segments > 0, self.src_tok.eos_id, self.src_tok.pad_id).astype(np.int32)
      return self._batch(params, src, segments, i, **extra)
    with contextlib.closing(_in_order(make, len(shapes), self.concurrent_batches)) as made:
      for _ in made:
        pass
    return len(shapes)

  def hypotheses(self, params: Any, lines: Sequence[str],
                 progress: Optional[Callable[[int], None]] = None,
                 prefixes: Optional[Sequence[str]] = None
                 ) -> list[tuple[list[str], list[Hypothesis]]]:
    """Sentences -> per line (source subwords with EOS, up to n_best hypotheses, best first),
    each hypothesis scored by forced decoding (prefix included). Best is the search's order,
    or with `decode.mbr` the highest expected utility among all the beam's hypotheses
    (mbr.mbr_order). An empty line gives no hypotheses. A line longer than
    `decode.max_input_len` tokens gives one hypothesis: its pieces' best translations joined
    (see `translate_lines`; with MBR each piece's choice), scores summed, alignments into the
    line."""
    pieces, owner = self._split(lines)
    rows = [np.array(ids + [self.src_tok.eos_id], np.int32) for ids in pieces]
    found = self._search(params, rows, progress, self._prefix_ids(prefixes, owner))
    pairs = [(rows[p], h) for p, hyps in enumerate(found) for h in hyps]
    eos = np.array([self.tgt_tok.eos_id], np.int32)
    scored = iter(self.scorer.score_ids(self.as_computed(params), [s for s, _ in pairs],
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
        kept[0] = _joined(kept[0], made[0], len(source), self.alpha)
        del kept[1:]  # the first piece's alternatives do not translate the whole line
      source += self.src_tok.pieces(rows[p].tolist())
    return result

  def score(self, params: Any, sources: Sequence[str], targets: Sequence[str]
            ) -> list[tuple[list[str], Hypothesis]]:
    """The model's scores of each target line as the translation of its source line (forced
    decoding; nothing is split or truncated): per line the source subwords with EOS and the
    target as a scored `Hypothesis`."""
    src = [np.array(ids + [self.src_tok.eos_id], np.int32)
           for ids in self.src_tok.encode(sources)]
    tgt = [np.array(ids, np.int32) for ids in self.tgt_tok.encode(targets)]
    eos = np.array([self.tgt_tok.eos_id], np.int32)
    scored = self.scorer.score_ids(self.as_computed(params), src,
                                   [np.concatenate([t, eos]) for t in tgt])
    return [(self.src_tok.pieces(s.tolist()), self._hypothesis(t, sc, text))
            for s, t, sc, text in zip(src, tgt, scored, targets)]

  def _hypothesis(self, ids: np.ndarray, scored: Any, text: Optional[str] = None) -> Hypothesis:
    n = len(ids) + 1  # with EOS
    return Hypothesis(self.tgt_tok.decode([ids.tolist()])[0] if text is None else text,
                      scored.logprob / float(length_penalty(n, self.alpha)), scored.logprob,
                      self.tgt_tok.pieces(ids.tolist() + [self.tgt_tok.eos_id]),
                      [float(x) for x in scored.token_logprobs],
                      [int(x) for x in scored.alignment])

  def translate_lines(self, params: Any, lines: Sequence[str],
                      progress: Optional[Callable[[int], None]] = None,
                      prefixes: Optional[Sequence[str]] = None) -> list[str]:
    """Sentences -> translations; an empty line gives an empty line. With `prefixes` (one
    target text per line, '' for none) each translation starts with its line's prefix. A
    line longer than `decode.max_input_len` tokens is translated in pieces (see `_pieces`),
    which are joined with spaces (the prefix starts the first); how many lines were split or
    truncated goes to the log. With `decode.mbr` each is `hypotheses`' first."""
    if self.mbr != 'off':
      return [hyps[0].text if hyps else '' for _, hyps in
              self.hypotheses(params, lines, progress, prefixes)]
    pieces, owner = self._split(lines)
    rows = [np.array(ids + [self.src_tok.eos_id], np.int32) for ids in pieces]
    outputs = self.translate_ids(params, rows, progress, self._prefix_ids(prefixes, owner))
    texts = self.tgt_tok.decode([o.tolist() for o in outputs])
    result: list[list[str]] = [[] for _ in lines]
    for i, text in zip(owner, texts):
      result[i].append(text)
    return [' '.join(part for part in parts if part) for parts in result]

  def _prefix_ids(self, prefixes: Optional[Sequence[str]], owner: Sequence[int]
                  ) -> Optional[list[np.ndarray]]:
    """Each piece's target prefix ids: its line's prefix for a line's first piece, else none."""
    if prefixes is None:
      return None
    ids = self.tgt_tok.encode(list(prefixes))
    return [np.array(ids[line] if p == 0 or owner[p - 1] != line else [], np.int32)
            for p, line in enumerate(owner)]

  def _split(self, lines: Sequence[str]) -> tuple[list[list[int]], list[int]]:
    """The source ids of every non-empty line, long lines in pieces (`_pieces`), and the
    line each piece belongs to; how many lines were split or truncated goes to the log."""
    keep = [i for i, line in enumerate(lines) if line.strip()]
    pieces: list[list[int]] = []
    owner: list[int] = []
    split = truncated = 0
    for i, ids in zip(keep, self.src_tok.encode([lines[i] for i in keep])):
      parts, cut = self._pieces(lines[i], ids)
      split, truncated = split + (len(parts) > 1), truncated + cut
      pieces += parts
      owner += [i] * len(parts)
    if split or truncated:
      logging.warning('%d line(s) over decode.max_input_len=%d tokens translated in pieces split '
                      'at sentence ends; %d sentence(s) truncated to that length', split,
                      self.max_input_len, truncated)
    return pieces, owner

  def _pieces(self, line: str, ids: list[int]) -> tuple[list[list[int]], int]:
    """A line's source ids in pieces of at most max_input_len - 1 tokens (EOS follows): whole
    sentences packed greedily, a sentence longer than that truncated. Returns the pieces and
    how many sentences were truncated."""
    limit = self.max_input_len - 1
    if len(ids) <= limit:
      return [ids], 0
    pieces: list[list[int]] = [[]]
    truncated = 0
    for sentence in self.src_tok.encode(_SENTENCE_END.split(line.strip())):
      if len(sentence) > limit:
        sentence, truncated = sentence[:limit], truncated + 1
      if len(pieces[-1]) + len(sentence) > limit:
        pieces.append([])
      pieces[-1] += sentence
    return [p for p in pieces if p], truncated


_SENTENCE_END = re.compile(r'(?<=[.!?;:\u3002\uff01\uff1f])\s+')  # after . ! ? ; : and CJK ones


def _padded(prefixes: Sequence[np.ndarray], plan: data_lib.BatchPlan, pad_id: int) -> np.ndarray:
  """The plan's rows' prefixes as [rows, P], padded with `pad_id`; P is rounded up to a
  multiple of 8, so that few shapes compile."""
  width = -(-max([len(prefixes[i]) for i in plan.examples] + [1]) // 8) * 8
  out = np.full((plan.rows, width), pad_id, np.int32)
  for row, i in enumerate(plan.examples):
    out[row, :len(prefixes[i])] = prefixes[i]
  return out


def _joined(first: Hypothesis, then: Hypothesis, offset: int, alpha: float) -> Hypothesis:
  """Two pieces' translations of one line as one hypothesis; `then`'s alignment shifted by
  the `offset` source subwords before its piece."""
  logprob = first.logprob + then.logprob
  tokens = first.tokens + then.tokens
  return Hypothesis(' '.join(t for t in (first.text, then.text) if t),
                    logprob / float(length_penalty(len(tokens), alpha)), logprob, tokens,
                    first.token_logprobs + then.token_logprobs,
                    first.alignment + [a + offset for a in then.alignment])


def _strip(ids: np.ndarray, eos_id: int) -> np.ndarray:
  ends = np.flatnonzero(ids == eos_id)
  return ids[:ends[0]] if len(ends) else ids

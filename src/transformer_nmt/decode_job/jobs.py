"""A translation job as decode.py runs it: load the engine, then translate a file (or stdin)
block by block into an output (text or JSON lines with n-best hypotheses and scores), score
given translations, resume an interrupted job, store the programs of later jobs
(--precompile), score against references and plot attention. Every check of the options
comes before the model loads."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import sys
import time
from typing import Any, Callable, Iterator, Optional

from transformer_nmt.cli import CompileCounter
from transformer_nmt.decode_job import job_io
from transformer_nmt.decoding import ensemble
from transformer_nmt.decoding.settings import (
  DECODE,
  PRECOMPILE_LENGTH,
  PRECOMPILE_ROWS,
  DecodeConfig,
)
from transformer_nmt.errors import DataError
from transformer_nmt.inference.engine import Engine
from transformer_nmt.inference.hypotheses import Hypothesis
from transformer_nmt.inference.loading import LoadedModel
from transformer_nmt.inference.options import ModelOptions, with_overrides

Write = Callable[[list[str], str], None]  # (a block of input lines, their output text)


@dataclasses.dataclass(frozen=True)
class DecodeJob:
  """What to translate, with which model and settings, and where the results go (decode.py's
  flags of the same names say what each does)."""

  model: ModelOptions
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # DecodeConfig options
  input: str = '-'
  output: str = '-'
  reference: Optional[str] = None
  score_reference: Optional[str] = None
  prefix: Optional[str] = None
  format: str = 'text'  # or 'jsonl'
  n_best: int = 1
  resume: bool = False
  buffer_lines: int = 0
  precompile: bool = False
  precompile_rows: int = PRECOMPILE_ROWS
  precompile_length: int = PRECOMPILE_LENGTH
  tokenized_bleu: bool = False
  plot_attention: Optional[str] = None
  plot_sentences: int = 3

  def check(self) -> None:
    """Options that are out of range or do not go together, in one line, before any work."""
    if self.n_best < 1:
      raise DataError(f'--n_best={self.n_best} must be at least 1')
    if self.plot_sentences < 0:
      raise DataError(f'--plot_sentences={self.plot_sentences} must be 0 or positive')
    if self.n_best > 1 and self.format != 'jsonl':
      raise DataError(f'--n_best={self.n_best} needs --format jsonl (text is one line per input)')
    if self.precompile and (not self.model.programs or self.output != '-' or self.resume
                            or self.score_reference or self.plot_attention):
      raise DataError('--precompile stores programs and writes no translations: it takes none '
                      'of --noprograms, --output, --resume, --score_reference, --plot_attention')
    for name in ('precompile_rows', 'precompile_length'):
      if getattr(self, name) < 0:
        raise DataError(f'--{name}={getattr(self, name)} must be 0 or positive')
    if self.resume and (self.output == '-' or self.reference or self.score_reference
                        or self.prefix):
      raise DataError('--resume continues an --output file, and not with --reference, '
                      '--score_reference or --prefix (they read the input whole)')
    if self.plot_attention and len(self.model.workdirs) > 1:
      raise DataError('--plot_attention shows one model; give one --workdir')
    if self.score_reference and (self.reference or self.n_best > 1 or self.plot_attention
                                 or self.prefix):
      raise DataError('--score_reference scores given translations: it takes none of '
                      '--reference, --n_best, --plot_attention, --prefix')

  def check_counts(self) -> None:
    """The block and thread counts, once the files read whole are read."""
    if self.buffer_lines < 0:
      raise DataError(f'--buffer_lines={self.buffer_lines} must be 0 (automatic) or positive')
    if self.model.concurrent_batches < 0:
      raise DataError(f'--concurrent_batches={self.model.concurrent_batches} must be 0 '
                      '(automatic) or positive')

  def check_n_best(self, decode: DecodeConfig) -> None:
    """--n_best against the run's search (SearchSpec checks the same, naming no flag)."""
    if self.n_best > decode.beam_size:
      raise DataError(f'--n_best={self.n_best} must be at most the beam size '
                      f'({decode.beam_size})')
    if self.n_best > 1 and decode.temperature > 0:
      raise DataError(f'--n_best={self.n_best}: sampling (--temperature) gives one hypothesis')


def run(job: DecodeJob) -> None:
  """Checks the job, holds its output, loads the engine and does the job."""
  job.model.limit_heaps(compiling=job.precompile)
  job_io.check_streams(job.input, job.output, not job.precompile, bool(job.reference))
  job_io.check_output(job.output, {'--input': job.input, '--reference': job.reference,
                                   '--score_reference': job.score_reference,
                                   '--prefix': job.prefix}, job.model.workdirs)
  job.check()
  with job_io.held(job.output):
    _run(job)


def _run(job: DecodeJob) -> None:
  whole, beside = _read_whole(job)
  job.check_counts()
  blocks = iter([whole]) if whole is not None else job_io.input_blocks(job.input,
                                                                       job.buffer_lines)
  with_overrides(DECODE, job.overrides)  # a bad flag fails before the model loads
  compiles = CompileCounter()
  model = job.model.load(job.overrides)
  print(header(model), file=sys.stderr)
  job.check_n_best(model.decode)
  engine = Engine(model, n_best=job.n_best, concurrent_batches=job.model.concurrent_batches,
                  programs=job.model.program_dir())
  if job.score_reference:
    _score_reference(job, engine, whole, beside['score_reference'])
    return
  if job.precompile:
    blocks = _precompile_small_jobs(job, engine, blocks)
  progress = job_io.Progress(len(whole) if whole is not None else None, job.input != '-')
  t0 = time.time()
  keep = None if whole is not None else (job.plot_sentences if job.plot_attention else 0)
  count, tokens, kept = _write(job, engine, blocks, progress, keep, beside.get('prefix'))
  seconds = max(time.time() - t0, 1e-9)
  stored = '' if engine.store is None else f', {engine.store.loaded} stored programs loaded'
  print(f'{count} sentences in {seconds:.1f} s (compilation included): '
        f'{count / seconds:.1f} sentences/s, {tokens / seconds:.0f} target tokens/s; '
        f'{compiles.summary()}{stored}', file=sys.stderr)
  if job.precompile:
    _report_precompiled(engine)
  if job.reference:
    _score([h for _, h in kept], beside['reference'], job.tokenized_bleu)
  if job.plot_attention:
    from transformer_nmt.plots import plot_cross_attention
    lines, hyps = [s for s, _ in kept], [h for _, h in kept]
    for path in plot_cross_attention(engine.model, lines, hyps, job.plot_attention,
                                     job.plot_sentences):
      print(f'wrote {path}', file=sys.stderr)


def header(model: LoadedModel) -> str:
  """The stderr line saying what translates: members, checkpoints, search, precision."""
  d = model.decode
  search = (f'sampling at temperature {d.temperature}, top-k {d.top_k}' if d.temperature > 0
            else f'beam {d.beam_size}, alpha {d.alpha}, stop {d.beam_stop}' +
            (f', MBR {d.mbr}' if d.mbr != 'off' and d.beam_size > 1 else ''))
  cfgs = model.cfg if ensemble.is_ensemble(model.cfg) else [model.cfg]
  members = f'ensemble of {len(cfgs)} models, ' if len(cfgs) > 1 else ''
  return f'{members}checkpoint step(s) {model.steps}, {search}, {ensemble.dtypes(model.cfg)}'


def _read_whole(job: DecodeJob) -> tuple[Optional[list[str]], dict[str, list[str]]]:
  """Scoring and prefixes need every line: the input read whole (None when none of them is
  asked for) and each of --reference, --score_reference, --prefix by name, line counts
  checked before any work."""
  whole, beside = None, {}
  for name in ('reference', 'score_reference', 'prefix'):
    path = getattr(job, name)
    if path:
      whole = job_io.read(job.input) if whole is None else whole
      beside[name] = job_io.read(path)
      if len(beside[name]) != len(whole):
        raise DataError(f'--{name}={path} has {len(beside[name])} lines but the input has '
                        f'{len(whole)}')
  return whole, beside


def _write(job: DecodeJob, engine: Engine, blocks: Iterator[list[str]],
           progress: job_io.Progress, keep: Optional[int], prefixes: Optional[list[str]]
           ) -> tuple[int, int, list[tuple[str, str]]]:
  """The blocks translated into the output: through OUTPUT.partial with `resume`, nowhere
  with `precompile`, else atomically (see `_translate_blocks` for what it returns)."""
  if job.resume:
    from transformer_nmt.decode_job import outputs
    with outputs.resume(job.output, resume_settings(job, engine)) as partial:
      if partial.done:
        print(f'resuming after the {partial.done} lines in {outputs.partial_path(job.output)}',
              file=sys.stderr)
      return _translate_blocks(job, engine, partial.skip(blocks), progress, keep,
                               partial.written)
  sink = open(os.devnull, 'w', encoding='utf-8') if job.precompile else None
  with contextlib.closing(sink) if sink else job_io.output(job.output) as out:
    def write(_: list[str], text: str) -> None:
      out.write(text)
      out.flush()  # a block's translations are out before the next block is read
    return _translate_blocks(job, engine, blocks, progress, keep, write, prefixes)


def resume_settings(job: DecodeJob, engine: Engine) -> dict[str, Any]:
  """What decides the translations, as --resume's record keeps it: a partial written with
  other settings is refused (outputs.resume)."""
  cfgs = engine.model.cfg if ensemble.is_ensemble(engine.model.cfg) else [engine.model.cfg]
  return {'workdirs': [str(pathlib.Path(w).resolve()) for w in job.model.workdirs],
          'checkpoint_steps': engine.model.steps, 'best': job.model.choice.best,
          'ema': job.model.choice.ema,
          'dtypes': [c.dtype for c in cfgs], 'decode': dataclasses.asdict(engine.decode),
          'format': job.format, 'n_best': job.n_best}


def _translate_blocks(job: DecodeJob, engine: Engine, blocks: Iterator[list[str]],
                      progress: job_io.Progress, keep: Optional[int], write: Write,
                      prefixes: Optional[list[str]] = None
                      ) -> tuple[int, int, list[tuple[str, str]]]:
  """Translates block after block, handing each block and its translations' text to `write`
  before the next block is read (`prefixes`: one per line, with a single block). Returns the
  sentence and target-token counts and the first `keep` (source, translation) pairs (all
  with None: for scoring)."""
  count = tokens = 0
  kept: list[tuple[str, str]] = []
  for block in blocks:
    if job.format == 'jsonl':
      found = engine.hypotheses(block, progress, prefixes)
      hyps = [h[0].text if h else '' for _, h in found]
      write(block, ''.join(json_line(source, h) for source, h in found))
    else:
      hyps = engine.translate(block, progress, prefixes)
      write(block, ''.join(h + '\n' for h in hyps))
    count += len(block)
    tokens += sum(len(ids) + 1 for ids in engine.model.tgt_tok.encode([h for h in hyps if h]))
    room = len(block) if keep is None else max(keep - len(kept), 0)
    kept += list(zip(block, hyps))[:room]
  return count, tokens, kept


def _precompile_small_jobs(job: DecodeJob, engine: Engine, blocks: Iterator[list[str]]
                           ) -> Iterator[list[str]]:
  """--precompile's first part: the programs of small jobs and of lines typed at a terminal
  (Engine.precompile). Returns the input's blocks still to compile for, none when the input
  is a terminal (nobody is going to type the validation set)."""
  t0 = time.time()
  made = engine.precompile(job.precompile_rows, job.precompile_length)
  print(f'{made.programs} programs ({len(made.shapes)} batch shapes) of jobs of up to '
        f'{made.rows} sentences of up to {made.length} subwords made in '
        f'{time.time() - t0:.1f} s', file=sys.stderr)
  return iter([]) if job.input == '-' and sys.stdin.isatty() else blocks


def _report_precompiled(engine: Engine) -> None:
  """--precompile's last line, or an error when nothing could be stored."""
  store = engine.store
  if not store.writable:
    raise DataError(f'--precompile: the programs could not be stored in {store.root} (see the '
                    'warning above)')
  print(f'{store.saved} programs compiled and stored in {store.directory} ({store.loaded} '
        'were there already)', file=sys.stderr)


def json_line(source: list[str], hypotheses: list[Hypothesis]) -> str:
  """One line of --format jsonl: the source's subwords and the hypotheses."""
  return json.dumps({'source_tokens': source,
                     'hypotheses': [h.as_json() for h in hypotheses]}, ensure_ascii=False) + '\n'


def _score_reference(job: DecodeJob, engine: Engine, sources: list[str],
                     targets: list[str]) -> None:
  """Writes the model's scores of `targets` as translations of `sources` (forced decoding)."""
  t0 = time.time()
  scored = engine.score(sources, targets)
  with job_io.output(job.output) as out:
    for source, hyp in scored:
      out.write(f'{hyp.logprob:.6f}\t{hyp.score:.6f}\n' if job.format == 'text' else
                json_line(source, [hyp]))
  print(f'scored {len(scored)} sentence pairs in {time.time() - t0:.1f} s', file=sys.stderr)


def _score(hyps: list[str], refs: list[str], tokenized: bool) -> None:
  from transformer_nmt import metrics
  bleu, signature = metrics.corpus_bleu(hyps, refs)
  chrf, chrf_signature = metrics.corpus_chrf(hyps, refs)
  print(f'sacreBLEU {bleu:.2f}  {signature}\nchrF {chrf:.2f}  {chrf_signature}')
  if tokenized:
    print(f'tokenized BLEU (paper-style: 13a tokens + compound splitting; not sacreBLEU) '
          f'{metrics.tokenized_bleu(hyps, refs):.2f}')


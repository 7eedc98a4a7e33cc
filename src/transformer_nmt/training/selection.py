"""After training: pick checkpoint and length penalty on the validation set, score test sets,
and append a row to a markdown results table (what recipe.py runs)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import pathlib
import platform
from typing import Callable, Optional, Sequence

import jax

from transformer_nmt.checkpoint import Checkpointer
from transformer_nmt.config import DataConfig
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.files import write_atomically
from transformer_nmt.inference import CheckpointChoice, Engine, LoadedModel, load_workdir
from transformer_nmt.metrics import corpus_bleu, corpus_chrf
from transformer_nmt.workdir import Workdir

Log = Callable[[str], None]


@dataclasses.dataclass
class Scored:
  """sacreBLEU and chrF of one system output, with the signatures that say how."""

  bleu: float
  chrf: float
  signature: str
  chrf_signature: str
  hypotheses: list[str]


def score(engine: Engine, sources: Sequence[str], references: Sequence[str]) -> Scored:
  """Translates `sources` and scores them (cased, detokenised) against `references`."""
  hyps = engine.translate(sources)
  bleu, signature = corpus_bleu(hyps, references)
  chrf, chrf_signature = corpus_chrf(hyps, references)
  return Scored(bleu, chrf, signature, chrf_signature, hyps)


@dataclasses.dataclass
class Selection:
  """The chosen checkpoint(s) and search settings, with the validation BLEU that chose them."""

  model: LoadedModel
  checkpoint: str  # 'latest', 'average of last N', 'best' or 'EMA'
  beam_size: int
  alpha: float
  mbr: str  # decode.mbr: 'off' or the utility of the minimum Bayes risk choice
  valid_bleu: float
  valid_sentences: int
  table: list[tuple[str, str, float]]  # (checkpoint, search, validation BLEU) of every trial


Loader = Callable[[], LoadedModel]
RAW = CheckpointChoice(ema=False)  # the latest checkpoint's raw weights


def checkpoint_candidates(workdir: str | os.PathLike,
                          average_last: int) -> list[tuple[str, Loader]]:
  """(label, loader) for the latest checkpoint and the average of the last N, with the raw
  weights; the best one, with the weights its validation BLEU was measured on (the moving
  average when the run kept one, as training evaluates it); and 'EMA' (the latest
  checkpoint's moving average of the weights) when the run kept one (train.ema_decay)."""
  candidates = [('latest', lambda: load_workdir(workdir, RAW))]
  steps = Checkpointer(Workdir(workdir).checkpoints, read_only=True)
  available = steps.all_steps()  # finished saves only, not a killed run's temporaries
  has_ema = bool(available) and steps.has_ema(available[-1])
  steps.close()
  n = min(average_last, len(available))
  if n > 1:
    average = CheckpointChoice(average_last=n, ema=False)
    candidates.append((f'average of last {n}', lambda: load_workdir(workdir, average)))
  if Workdir(workdir).best.exists():
    candidates.append(('best', lambda: load_workdir(workdir, CheckpointChoice(best=True))))
  if has_ema:
    candidates.append(('EMA', lambda: load_workdir(workdir)))
  return candidates


def select(workdir: str | os.PathLike, sources: Sequence[str], references: Sequence[str], *,
           decode: DecodeConfig, alphas: Sequence[float], average_last: int,
           log: Log, programs: Optional[str | os.PathLike] = None, mbr: Sequence[str] = ()
           ) -> tuple[Selection, Engine]:
  """Chooses on validation data only: first the checkpoint (greedy BLEU, which is cheap), then
  the length penalty alpha for beam search of `decode.beam_size` on that checkpoint, then
  whether the minimum Bayes risk choice with a utility in `mbr` (decode.mbr) does better at
  the best alpha (greedy if none of these beats it). `decode` gives the other search
  settings. With `programs` (the workdir's Workdir.programs) the beam search with `decode`'s
  own alpha and MBR setting keeps its compiled programs there: when `decode` is the
  workdir's own section, they are the ones decode.py calls by default, so that its first run
  need not compile them.

  Returns the selection and an engine of the chosen model and search settings.
  """
  table: list[tuple[str, str, float]] = []
  beam_size = decode.beam_size
  greedy: Optional[Engine] = None  # compiled once, shared by every candidate
  best: Optional[tuple[float, str, LoadedModel]] = None
  for label, load in checkpoint_candidates(workdir, average_last):
    model = load()
    greedy = greedy.using(model.params) if greedy else Engine(
        model, dataclasses.replace(decode, beam_size=1, temperature=0.0))
    bleu = score(greedy, sources, references).bleu
    log(f'validation: {label} (steps {model.steps}), greedy: BLEU {bleu:.2f}')
    table.append((label, 'greedy', bleu))
    if best is None or bleu > best[0]:
      best = (bleu, label, model)
  assert best is not None and greedy is not None  # load_workdir raises without checkpoints
  greedy_bleu, label, model = best
  chosen: tuple[float, Optional[DecodeConfig], Engine] = (greedy_bleu, None,
                                                          greedy.using(model.params))

  def trial(search: DecodeConfig) -> float:
    nonlocal chosen
    engine = Engine(model, search, programs=programs if (search.alpha, search.mbr) == (
        decode.alpha, decode.mbr) else None)
    bleu = score(engine, sources, references).bleu
    name = f'beam {beam_size}, alpha {search.alpha}' + (
        f', MBR {search.mbr}' if search.mbr != 'off' else '')
    log(f'validation: {label}, {name}: BLEU {bleu:.2f}')
    table.append((label, name, bleu))
    if bleu > chosen[0]:
      chosen = (bleu, search, engine)
    return bleu

  beams = [dataclasses.replace(decode, alpha=a, temperature=0.0, mbr='off') for a in alphas]
  scores = [trial(search) for search in beams]
  for utility in mbr if beams else ():
    trial(dataclasses.replace(beams[scores.index(max(scores))], mbr=utility))
  bleu, search, engine = chosen
  k, alpha, how = (1, 0.0, 'off') if search is None else (beam_size, search.alpha, search.mbr)
  return Selection(model, label, k, alpha, how, bleu, len(sources), table), engine


TextPairs = tuple[list[str], list[str]]  # (sources, references)


def eval_sets(d: DataConfig, workdir: pathlib.Path
              ) -> tuple[TextPairs, list[tuple[str, TextPairs]]]:
  """The validation pairs and the named test sets (data.test_*, data.extra_test_*), read
  before any training so that a missing file fails early."""
  from transformer_nmt.data import batching as data_lib
  from transformer_nmt.data import corpus as corpus_lib
  corpus = corpus_lib.read_corpus(d, workdir)
  tests = []
  if corpus.test is not None:
    name = pathlib.Path(d.test_tgt).stem if d.source == 'text' else 'test'
    tests.append((name, corpus.test[:2]))
  for src, tgt in zip(d.extra_test_src, d.extra_test_tgt):
    sources, refs, stats = data_lib.read_parallel(src, tgt)
    if stats.empty:
      logging.info('%s: %d pairs with an empty side skipped', src, stats.empty)
    tests.append((pathlib.Path(tgt).stem, (sources, refs)))
  return corpus.valid[:2], tests


def score_tests(engine: Engine, workdir: pathlib.Path,
                tests: Sequence[tuple[str, TextPairs]]) -> list[tuple[str, Scored]]:
  """Each test set translated and scored; its translations kept in the workdir."""
  scored = []
  for name, (sources, refs) in tests:
    s = score(engine, sources, refs)
    logging.info('%s: sacreBLEU %.2f  chrF %.2f  [%s]', name, s.bleu, s.chrf, s.signature)
    out = Workdir(workdir).hypotheses(name)
    out.parent.mkdir(exist_ok=True)
    write_atomically(out, ''.join(h + '\n' for h in s.hypotheses))
    scored.append((name, s))
  return scored


def direction(d: DataConfig) -> str:
  """'en→de' from the training files' suffixes (the results table's column)."""
  if d.source == 'demo':
    return 'en→de (demo)'
  src, tgt = (pathlib.Path(p).suffix.lstrip('.') for p in (d.train_src, d.train_tgt))
  return f'{src}→{tgt}' if src and tgt else 'n/a'


def selection_json(selection: Selection, tests: Sequence[tuple[str, Scored]]) -> str:
  """The record of a recipe run (the workdir's recipe/selection.json): what was chosen on
  validation, every trial, and the test-set scores with their signatures."""
  return json.dumps(
      {'checkpoint': selection.checkpoint, 'steps': selection.model.steps,
       'beam_size': selection.beam_size, 'alpha': selection.alpha, 'mbr': selection.mbr,
       'valid_bleu': selection.valid_bleu, 'trials': selection.table,
       'tests': {name: {'bleu': s.bleu, 'chrf': s.chrf, 'signature': s.signature,
                        'chrf_signature': s.chrf_signature} for name, s in tests}}, indent=2)


def machine() -> str:
  """CPU model and core count, or the accelerator, for the hardware column."""
  backend = jax.default_backend()
  if backend != 'cpu':
    return f'{jax.device_count()}× {jax.devices()[0].device_kind}'
  name = platform.processor() or platform.machine()
  try:
    for line in pathlib.Path('/proc/cpuinfo').read_text().splitlines():
      if line.startswith('model name'):
        name = line.split(':', 1)[1].strip()
        break
  except OSError:
    pass
  return f'{os.cpu_count()}-core CPU ({name})'


def hours(seconds: Optional[float]) -> str:
  if not seconds:
    return 'n/a'
  m = int(round(seconds / 60))
  return f'{m // 60}h{m % 60:02d}m'


_COLUMNS = ('date', 'config', 'direction', 'steps', 'train wall', 'hardware',
            'checkpoint, search (chosen on valid)', 'valid BLEU', 'test sets: sacreBLEU / chrF',
            'plots', 'sacreBLEU signature')
_ALIGN = ('---', '---', '---', '---:', '---:', '---', '---', '---:', '---', '---', '---')
INTRO = """# Translation results

Rows are appended by `recipe.py` (see README): each trains a config, chooses the checkpoint and
the beam-search length penalty on the validation set only, then decodes the test sets. Scores
are sacreBLEU (cased, detokenised, 13a tokenisation, with its signature) and chrF.
"""
RESULTS_HEADER = f"| {' | '.join(_COLUMNS)} |\n| {' | '.join(_ALIGN)} |\n"


def results_row(*, config: str, direction: str, steps: int, train_seconds: Optional[float],
                selection: Selection, tests: Sequence[tuple[str, Scored]],
                plots: Sequence[str]) -> str:
  """One markdown table row (see RESULTS_HEADER)."""
  search = ('greedy' if selection.beam_size == 1
            else f'beam {selection.beam_size}, α {selection.alpha:g}' +
            (f', MBR {selection.mbr}' if selection.mbr != 'off' else ''))
  scores = ('; '.join(f'{name}: **{s.bleu:.2f}** / {s.chrf:.2f}' for name, s in tests)
            or 'not decoded')
  links = ' '.join(f'[{pathlib.Path(p).stem}]({p})' for p in plots)
  cells = [datetime.date.today().isoformat(), f'`{config}`', direction, str(steps),
           hours(train_seconds), machine(), f'{selection.checkpoint}, {search}',
           f'{selection.valid_bleu:.2f} ({selection.valid_sentences} sent.)', scores, links,
           f'`{tests[0][1].signature}`' if tests else '']
  return '| ' + ' | '.join(cells) + ' |\n'


def append_row(path: str | os.PathLike, row: str, intro: str = INTRO) -> None:
  """Appends `row` to the table at the end of `path`, creating the file with `intro` first.

  The file is rewritten through a temporary file, so it is never left half-written.
  """
  path = pathlib.Path(path)
  text = path.read_text(encoding='utf-8') if path.exists() else intro + '\n' + RESULTS_HEADER
  if not text.endswith('\n'):
    text += '\n'
  path.parent.mkdir(parents=True, exist_ok=True)
  write_atomically(path, text + row)

"""Metric logging (metrics.jsonl + TensorBoard) and corpus BLEU via sacreBLEU."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
from typing import Mapping, Sequence

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from transformer_nmt.workdir import Workdir


class MetricWriter:
  """Appends one JSON object per call to `metrics.jsonl` and mirrors scalars to TensorBoard."""

  def __init__(self, workdir: str | os.PathLike, enabled: bool = True):
    self.path = Workdir(workdir).metrics
    self.enabled = enabled
    self._tb = None
    if enabled and self.path.exists() and self.path.stat().st_size:
      with self.path.open('rb+') as f:  # a run killed mid-row left it unfinished: end it
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b'\n':
          f.write(b'\n')
    if enabled:
      from tensorboardX import SummaryWriter  # imported lazily: only the writer needs it
      self._tb = SummaryWriter(str(Workdir(workdir).tensorboard))

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    row = {'step': int(step), **{k: float(v) for k, v in scalars.items()}}
    with self.path.open('a', encoding='utf-8') as f:
      f.write(json.dumps(row) + '\n')
    for key, value in scalars.items():
      self._tb.add_scalar(key, float(value), int(step))
    self._tb.flush()

  def last(self, key: str, max_step: int) -> float:
    """The latest value of `key` logged at or before `max_step` (0.0 if none)."""
    rows = [r for r in read_metrics(self.path) if key in r and r['step'] <= max_step]
    return rows[-1][key] if rows else 0.0

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
  """The rows of a metrics.jsonl in file order ([] if it does not exist).

  A resumed run may log a step again. A damaged line (cut short by a crash, not UTF-8, not a
  JSON object, or without an integer `step`) is skipped, and the skipped lines are counted in
  one warning: resume, plots and recipe.py go on with the rows that are whole.
  """
  path = pathlib.Path(path)
  if not path.exists():
    return []
  rows, damaged = [], []
  for number, raw in enumerate(path.read_bytes().splitlines(), 1):
    try:
      row = json.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError):
      row = None
    if isinstance(row, dict) and isinstance(row.get('step'), int):
      rows.append(row)
    elif raw.strip():
      damaged.append(number)
  if damaged:
    logging.warning('%s: skipped %d damaged line(s) (line %s%s)', path, len(damaged),
                    damaged[0], ', ...' if len(damaged) > 1 else '')
  return rows


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """sacreBLEU (cased, 13a tokenisation) of detokenised hypotheses against one reference each.

  Returns:
    (score in [0, 100], sacreBLEU signature string).
  """
  bleu = sacrebleu.metrics.BLEU()
  score = bleu.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(bleu.get_signature())


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """sacreBLEU's chrF (character n-gram F-score): (score, signature)."""
  chrf = sacrebleu.metrics.CHRF()
  score = chrf.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(chrf.get_signature())


def _split_compounds(line: str) -> str:
  # tensor2tensor's get_ende_bleu.sh: "a-b" -> "a ##AT##-##AT## b" before multi-bleu.perl
  return re.sub(r'(\S)-(\S)', r'\1 ##AT##-##AT## \2', line)


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
  """Paper-style tokenized BLEU: 13a-tokenised text with compound splitting, then BLEU on tokens.

  This approximates the tokenizer.perl + compound-splitting recipe behind the paper's
  numbers; it is not comparable with sacreBLEU and is reported under its own name.
  """
  tok = Tokenizer13a()
  hyps = [_split_compounds(tok(h)) for h in hypotheses]
  refs = [_split_compounds(tok(r)) for r in references]
  return sacrebleu.metrics.BLEU(tokenize='none', force=True).corpus_score(hyps, [refs]).score

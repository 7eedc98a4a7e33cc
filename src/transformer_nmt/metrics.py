"""Metric logging (metrics.jsonl + TensorBoard) and corpus BLEU via sacreBLEU."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Mapping, Sequence

import sacrebleu


class MetricWriter:
  """Appends one JSON object per call to `metrics.jsonl` and mirrors scalars to TensorBoard."""

  def __init__(self, workdir: str | os.PathLike, enabled: bool = True):
    self.path = pathlib.Path(workdir) / 'metrics.jsonl'
    self.enabled = enabled
    self._tb = None
    if enabled:
      from tensorboardX import SummaryWriter  # imported lazily: only the writer needs it
      self._tb = SummaryWriter(str(pathlib.Path(workdir) / 'tensorboard'))

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.enabled:
      return
    row = {'step': int(step), **{k: float(v) for k, v in scalars.items()}}
    with self.path.open('a', encoding='utf-8') as f:
      f.write(json.dumps(row) + '\n')
    for key, value in scalars.items():
      self._tb.add_scalar(key, float(value), int(step))
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
  """sacreBLEU (cased, 13a tokenisation) of detokenised hypotheses against one reference each.

  Returns:
    (score in [0, 100], sacreBLEU signature string).
  """
  bleu = sacrebleu.metrics.BLEU()
  score = bleu.corpus_score(list(hypotheses), [list(references)])
  return score.score, str(bleu.get_signature())

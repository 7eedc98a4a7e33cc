"""Validation loss and BLEU over whole datasets, batched by length and returned in file order."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np

from transformer_nmt.config import ModelConfig
from transformer_nmt.data import batching as data_lib
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.decoding.settings import DECODE, DecodeConfig
from transformer_nmt.inference import Engine, LoadedModel
from transformer_nmt.metrics import corpus_bleu
from transformer_nmt.model.transformer import Transformer
from transformer_nmt.training.preemption import Stopped
from transformer_nmt.training.steps import eval_step


class EvaluationInterrupted(Stopped):
  """An evaluation given up between batches because the run was asked to stop (a Stopped:
  where nothing catches it, the program exits with code 130)."""


@dataclasses.dataclass
class Evaluator:
  """Jitted evaluation functions for one model config, compiled once per bucket shape."""

  cfg: ModelConfig
  label_smoothing: float
  tokenizer: Tokenizer  # target side
  src_tokenizer: Tokenizer
  decode: DecodeConfig = DECODE  # its length limit and batch size; the search is greedy
  # Asked between batches: True gives up with EvaluationInterrupted (a run asked to stop).
  interrupted: Callable[[], bool] = lambda: False

  def __post_init__(self) -> None:
    self._eval_step = jax.jit(functools.partial(eval_step, apply_fn=Transformer(self.cfg).apply,
                                                label_smoothing=self.label_smoothing))
    # greedy: keeps evaluation during training cheap
    greedy = dataclasses.replace(self.decode, beam_size=1, temperature=0.0)
    self.engine = Engine(LoadedModel(self.cfg, None, self.src_tokenizer, self.tokenizer,
                                     decode=greedy))

  def _check(self) -> None:
    if self.interrupted():
      raise EvaluationInterrupted

  def loss(self, params: Any, data: data_lib.ParallelData) -> dict:
    """Token-mean smoothed loss, NLL, perplexity and accuracy over every example of `data`."""
    totals: dict[str, float] = {}
    for plan in data_lib.plan_batches(data.lengths, data.boundaries, self.decode.tokens_per_batch):
      self._check()
      sums = jax.device_get(self._eval_step(params, data_lib.collate(data, plan)))
      for k, v in sums.items():
        totals[k] = totals.get(k, 0.0) + float(v)
    n = max(totals.get('tokens', 0.0), 1.0)
    return {'loss': totals.get('loss', 0.0) / n, 'nll': totals.get('nll', 0.0) / n,
            'perplexity': float(np.exp(totals.get('nll', 0.0) / n)),
            'accuracy': totals.get('correct', 0.0) / n}

  def translate(self, params: Any, data: data_lib.ParallelData) -> list[str]:
    """Translations of every example, in the order of `data`."""
    outputs = self.engine.using(params).translate_ids(data.src, lambda _: self._check())
    return self.tokenizer.decode([o.tolist() for o in outputs])

  def bleu(self, params: Any, data: data_lib.ParallelData,
           references: Sequence[str]) -> tuple[float, list[str], str]:
    """(sacreBLEU score, hypotheses, signature) of the translations against references."""
    hyps = self.translate(params, data)
    refs = [references[i] for i in data.index]
    score, signature = corpus_bleu(hyps, refs)
    return score, hyps, signature


def subset(data: data_lib.ParallelData, n: int) -> data_lib.ParallelData:
  """The first n examples (all when n <= 0)."""
  if n <= 0 or n >= len(data):
    return data
  return dataclasses.replace(data, src=data.src[:n], tgt=data.tgt[:n], index=data.index[:n])

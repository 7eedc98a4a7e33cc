"""PNG plots: learning curves from metrics.jsonl, encoder-decoder attention heatmaps."""

from __future__ import annotations

import pathlib
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from transformer_nmt.model.transformer import Transformer, last_cross_attention


def cross_attention(model: Any, src_ids: Sequence[int], tgt_ids: Sequence[int]) -> np.ndarray:
  """Head-averaged encoder-decoder attention of the last decoder layer, [T, S].

  Teacher-forces the model on (source, translation); row t is the attention while predicting
  target token t (the translation ends in EOS), columns are source tokens (ending in EOS).
  """
  src = jnp.array([list(src_ids)], jnp.int32)
  tgt_in = jnp.array([[model.tgt_tok.bos_id] + list(tgt_ids)[:-1]], jnp.int32)  # shifted right
  _, state = Transformer(model.cfg).apply({'params': model.params}, src, tgt_in,
                                          mutable=['intermediates'])
  weights = last_cross_attention(model.cfg, state['intermediates'])  # [1, H, T, S]
  return np.asarray(weights[0].mean(axis=0))


def plot_cross_attention(model: Any, lines: Sequence[str], hyps: Sequence[str],
                         out_dir: str | pathlib.Path, count: int = 3) -> list[pathlib.Path]:
  """Writes attention_<i>.png for the first `count` non-empty input lines; returns the paths."""
  plt = _pyplot()
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = []
  for i, (line, hyp) in enumerate(zip(lines, hyps)):
    if len(paths) >= count:
      break
    if not line:
      continue
    src_ids = model.src_tok.encode([line])[0] + [model.src_tok.eos_id]
    tgt_ids = model.tgt_tok.encode([hyp])[0] + [model.tgt_tok.eos_id]
    weights = cross_attention(model, src_ids, tgt_ids)
    fig, ax = plt.subplots(figsize=(0.45 * len(src_ids) + 2, 0.4 * len(tgt_ids) + 1.5))
    ax.imshow(weights, cmap='viridis', aspect='auto', vmin=0.0)
    ax.set_xticks(range(len(src_ids)), model.src_tok.pieces(src_ids), rotation=90)
    ax.set_yticks(range(len(tgt_ids)), model.tgt_tok.pieces(tgt_ids))
    ax.set_xlabel('source subwords')
    ax.set_ylabel('target subwords')
    ax.set_title(f'sentence {i + 1}: encoder-decoder attention (last layer, mean of heads)',
                 fontsize=9)
    fig.tight_layout()
    path = out_dir / f'attention_{i + 1}.png'
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
  return paths


def _pyplot() -> Any:
  import matplotlib
  matplotlib.use('Agg')  # files only, no display
  import matplotlib.pyplot as plt
  return plt


def series(rows: Sequence[Mapping[str, float]], key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of `key`, sorted by step; a step logged twice (resume) keeps its last."""
  by_step = {int(r['step']): float(r[key]) for r in rows if key in r}
  steps = sorted(by_step)
  return steps, [by_step[s] for s in steps]


CURVES = (('loss (label-smoothed)', ('train_loss', 'eval_loss')),
          ('NLL per token', ('train_nll', 'eval_nll')),
          ('validation BLEU (greedy)', ('eval_bleu',)),
          ('learning rate', ('learning_rate',)))


def plot_learning_curves(rows: Sequence[Mapping[str, float]], path: str | pathlib.Path,
                         title: str = '') -> pathlib.Path:
  """Writes one PNG with loss, NLL, validation BLEU and learning rate against steps."""
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(CURVES), figsize=(4.2 * len(CURVES), 3.4))
  for ax, (name, keys) in zip(axes, CURVES):
    for key in keys:
      steps, values = series(rows, key)
      if steps:
        ax.plot(steps, values, marker='o' if len(steps) < 30 else None, markersize=3,
                label=key)
    ax.set_title(name, fontsize=10)
    ax.set_xlabel('step')
    ax.grid(alpha=0.3)
    if len(keys) > 1 and ax.lines:
      ax.legend(fontsize=8)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path

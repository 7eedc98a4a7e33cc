"""Encoder-decoder attention heatmaps (PNG) for translated sentences."""

from __future__ import annotations

import pathlib
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from transformer_nmt.model import Transformer


def cross_attention(model: Any, src_ids: Sequence[int], tgt_ids: Sequence[int]) -> np.ndarray:
  """Head-averaged encoder-decoder attention of the last decoder layer, [T, S].

  Teacher-forces the model on (source, translation); row t is the attention while predicting
  target token t (the translation ends in EOS), columns are source tokens (ending in EOS).
  """
  src = jnp.array([list(src_ids)], jnp.int32)
  tgt_in = jnp.array([[model.tgt_tok.bos_id] + list(tgt_ids)[:-1]], jnp.int32)  # shifted right
  _, state = Transformer(model.cfg).apply({'params': model.params}, src, tgt_in,
                                          mutable=['intermediates'])
  last = state['intermediates'][f'decoder_layers_{model.cfg.num_layers - 1}']
  weights = last['cross_attention']['attention_weights'][0]  # [1, H, T, S]
  return np.asarray(weights[0].mean(axis=0))


def plot_cross_attention(model: Any, lines: Sequence[str], hyps: Sequence[str],
                         out_dir: str | pathlib.Path, count: int = 3) -> list[pathlib.Path]:
  """Writes attention_<i>.png for the first `count` non-empty input lines; returns the paths."""
  import matplotlib
  matplotlib.use('Agg')  # files only, no display
  import matplotlib.pyplot as plt

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

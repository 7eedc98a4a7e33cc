"""The on-disk layout of a run: the one place that names the files of a workdir.

  WORKDIR/config.json        the resolved config, with the model config as trained
  WORKDIR/spm.model          the joint SentencePiece model (spm.src.model and spm.tgt.model
                             when data.joint_vocab=False)
  WORKDIR/checkpoints/<step> Orbax checkpoints, the last train.keep_checkpoints kept
  WORKDIR/best/<step>        the checkpoint of best validation BLEU (train.keep_best)
  WORKDIR/metrics.jsonl      one JSON object per logged step
  WORKDIR/tensorboard/       TensorBoard event files
  WORKDIR/compile_cache/     JAX's persistent compilation cache
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Optional

from transformer_nmt.files import write_atomically


class Workdir:
  """Paths of one workdir, and reading and writing its config."""

  def __init__(self, root: str | os.PathLike):
    self.root = pathlib.Path(root)

  def __repr__(self) -> str:
    return f'Workdir({str(self.root)!r})'

  @property
  def config(self) -> pathlib.Path:
    return self.root / 'config.json'

  @property
  def checkpoints(self) -> pathlib.Path:
    return self.root / 'checkpoints'

  @property
  def best(self) -> pathlib.Path:
    return self.root / 'best'

  @property
  def metrics(self) -> pathlib.Path:
    return self.root / 'metrics.jsonl'

  @property
  def tensorboard(self) -> pathlib.Path:
    return self.root / 'tensorboard'

  @property
  def compile_cache(self) -> pathlib.Path:
    return self.root / 'compile_cache'

  def checkpoint_dir(self, best: bool = False) -> pathlib.Path:
    return self.best if best else self.checkpoints

  def tokenizer_paths(self, joint: bool) -> tuple[pathlib.Path, pathlib.Path]:
    """(source, target) SentencePiece model paths: one shared file for a joint vocabulary."""
    if joint:
      return self.root / 'spm.model', self.root / 'spm.model'
    return self.root / 'spm.src.model', self.root / 'spm.tgt.model'

  def existing_tokenizer_paths(self) -> Optional[tuple[pathlib.Path, pathlib.Path]]:
    """The tokenizer files this workdir holds (joint first), or None."""
    for joint in (True, False):
      paths = self.tokenizer_paths(joint)
      if all(p.exists() for p in paths):
        return paths
    return None

  def read_config(self) -> dict[str, Any]:
    return json.loads(self.config.read_text(encoding='utf-8'))

  def write_config(self, resolved: dict[str, Any]) -> None:
    write_atomically(self.config, json.dumps(resolved, indent=2, default=list))

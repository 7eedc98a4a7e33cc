"""train.init_from: a new run that starts from the weights of an earlier one (fine-tuning).

Only the weights come over (the moving average when the earlier run kept one, as decode.py
would use): the optimizer's moments, the step, the learning-rate schedule, the data position
and the dropout key start afresh, as with fairseq's --finetune-from-model or Marian's
--pretrained-model. E.g. a many-to-one model fine-tuned on one of its source languages.
"""

from __future__ import annotations

import contextlib
import logging
import pathlib
from typing import Any, Iterator

import jax
import ml_collections
import numpy as np

from transformer_nmt.checkpoint import Checkpointer
from transformer_nmt.config import model_config_from_dict
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.model.transformer import init_params
from transformer_nmt.workdir import TOKENIZERS, Workdir


def check_init_from(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError or DataError, naming the option, unless train.init_from (when set) is
  a workdir with a checkpoint whose parameters fit this run's model, trained with the
  SentencePiece model data.spm_model gives. Reads files only: call it before any write."""
  source = config.train.init_from
  if not source:
    return
  with _latest_checkpoint(source) as (ckpt, step):
    theirs = _shapes(ckpt.param_shapes(step))
  data = config.data
  if not (data.joint_vocab and data.spm_model):
    raise ConfigError(f'train.init_from={source} needs the SentencePiece model that run was '
                      f'trained with: set data.spm_model={pathlib.Path(source) / "spm.model"} '
                      '(with data.joint_vocab=True)')
  tok = Tokenizer(data.spm_model)
  wd = Workdir(source)
  stored = (wd.read_config().get(TOKENIZERS) if wd.config.exists() else None) or {}
  if any(stored.get(side) not in (None, tok.fingerprint) for side in ('src', 'tgt')):
    raise DataError(f'data.spm_model={data.spm_model} is not the SentencePiece model '
                    f'train.init_from={source} was trained with ({tok.fingerprint}, trained '
                    f'with {stored.get("tgt")})')
  model_cfg = model_config_from_dict(config.model, vocab_size=tok.vocab_size,
                                     src_vocab_size=tok.vocab_size)
  mine = _shapes(jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0))))
  differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
  if differ:
    raise ConfigError(f'train.init_from={source}: its parameters do not fit this model '
                      f'({len(differ)} differ, e.g. {differ[0]}: {theirs.get(differ[0])} there, '
                      f'{mine.get(differ[0])} here); set model.* as that run had them')


def start_from(state: Any, source: str) -> Any:
  """`state` (fresh, placed on its devices) with the parameters, and the moving average when
  it keeps one, of `source`'s latest checkpoint, placed like the ones they replace."""
  with _latest_checkpoint(source) as (ckpt, step):
    host = ckpt.restore_params(step, ema=True)
    which = 'moving average' if ckpt.has_ema(step) else 'weights'
  # Every process holds the whole host copy and gives each of its devices its slice.
  place = lambda x, like: jax.make_array_from_callback(  # noqa: E731
      x.shape, like.sharding, lambda index: np.asarray(x[index], like.dtype))
  params = jax.tree_util.tree_map(place, host, state.params)
  ema = None if state.ema is None else jax.tree_util.tree_map(place, host, state.ema)
  logging.info('Starting from the %s of %s at step %d (train.init_from); optimizer, step and '
               'data start afresh', which, source, step)
  return state.replace(params=params, ema=ema)


@contextlib.contextmanager
def _latest_checkpoint(source: str) -> Iterator[tuple[Checkpointer, int]]:
  """(its checkpoints, read only; its latest step), or DataError when it has none."""
  checkpoints = Workdir(source).checkpoints
  if not checkpoints.is_dir():
    raise DataError(f'train.init_from={source}: no checkpoint in {checkpoints}')
  ckpt = Checkpointer(checkpoints, read_only=True)
  try:
    step = ckpt.latest_step()
    if step is None:
      raise DataError(f'train.init_from={source}: no checkpoint in {checkpoints}')
    yield ckpt, step
  finally:
    ckpt.close()


def _shapes(tree: Any) -> dict[str, tuple]:
  return {jax.tree_util.keystr(path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

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
from typing import Any, Iterator, Optional

import jax
import jax.numpy as jnp

from transformer_nmt.checkpoint import Checkpointer, describe
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.files import write_atomically
from transformer_nmt.model.transformer import init_params
from transformer_nmt.typed_config import Sections, model_config_from_dict
from transformer_nmt.workdir import Workdir


def check_init_from(config: Sections) -> None:
  """Raises ConfigError or DataError, naming the option, unless train.init_from (when set) is
  a workdir with a checkpoint whose parameters fit this run's model, trained with the
  SentencePiece model data.spm_model gives. Reads files only: call it before any write."""
  source = config.train.init_from
  if not source:
    return
  with _latest_checkpoint(source) as (ckpt, step):
    theirs = _shapes(ckpt.param_shapes(step))
  data = config.data
  tokenizers = imported_tokenizers(source)
  if tokenizers is not None and not data.spm_model:
    joint = tokenizers[0].path == tokenizers[1].path
    if data.joint_vocab != joint:
      which = 'one SentencePiece model' if joint else 'source and target SentencePiece models'
      raise ConfigError(f'train.init_from={source} has {which} with a piece table: set '
                        f'data.joint_vocab={joint}')
    _check_shapes(config, source, theirs, *tokenizers)
    return
  if not (data.joint_vocab and data.spm_model):
    given = Workdir(source).tokenizer_paths(joint=True)[0]
    raise ConfigError(f'train.init_from={source} needs the SentencePiece model that run was '
                      f'trained with: set data.spm_model={given} (with data.joint_vocab=True)'
                      if given.exists() else f'train.init_from={source}: that run has no joint '
                      f'SentencePiece model ({given.name}); only runs with one can be started from')
  tok = Tokenizer(data.spm_model)
  check_tokenizers(source, {'src': tok.fingerprint, 'tgt': tok.fingerprint},
                   f'data.spm_model={data.spm_model}')
  _check_shapes(config, source, theirs, tok, tok)


def imported_tokenizers(source: str) -> Optional[tuple[Tokenizer, Tokenizer]]:
  """The (source, target) tokenizers of a run whose tokenizers have a piece table (an
  imported Marian model), or None. A new run with data.spm_model='' takes those
  (`copy_tokenizers`)."""
  wd = Workdir(source)
  table, paths = wd.tokenizer_table(), wd.existing_tokenizer_paths()
  if table is None or paths is None:
    return None
  return Tokenizer(paths[0], table), Tokenizer(paths[1], table)


def copy_tokenizers(source: str, workdir: pathlib.Path) -> None:
  """Copies the SentencePiece models and piece table of `source` (see `imported_tokenizers`)
  into a new run's `workdir` that has no tokenizers yet; nothing otherwise."""
  theirs, mine = Workdir(source), Workdir(workdir)
  paths, table = theirs.existing_tokenizer_paths(), theirs.tokenizer_table()
  if paths is None or table is None or mine.existing_tokenizer_paths() is not None:
    return
  for path in {*paths, table}:
    write_atomically(mine.root / path.name, path.read_bytes())
  logging.info('Using the SentencePiece models and piece table of %s (train.init_from)', source)


def _check_shapes(config: Sections, source: str, theirs: dict[str, tuple], src_tok: Tokenizer,
                  tgt_tok: Tokenizer) -> None:
  """ConfigError unless this run's model (with these tokenizers) has `theirs` shapes."""
  model_cfg = model_config_from_dict(config.model, vocab_size=tgt_tok.vocab_size,
                                     src_vocab_size=src_tok.vocab_size)
  mine = _shapes(jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0))))
  differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
  if differ:
    raise ConfigError(f'train.init_from={source}: its parameters do not fit this model '
                      f'({len(differ)} differ, e.g. {differ[0]}: {theirs.get(differ[0])} there, '
                      f'{mine.get(differ[0])} here); set model.* as that run had them')


def check_tokenizers(source: str, fingerprints: dict[str, str], what: str) -> None:
  """DataError unless the tokenizers with these {'src', 'tgt'} fingerprints (`what` names
  them) are the ones train.init_from=`source` was trained with (its config.json keeps them)."""
  try:
    stored = Workdir(source).trained_tokenizers()
  except DataError as e:
    raise DataError(f'train.init_from={source}: {e}') from None
  for side, fingerprint in fingerprints.items():
    theirs = stored.get(side)
    if theirs is not None and theirs != fingerprint:
      raise DataError(f'{what} is not the {side} SentencePiece model train.init_from={source} '
                      f'was trained with ({fingerprint}, trained with {theirs})')


def start_from(state: Any, source: str) -> Any:
  """`state` (fresh, placed on its devices) with the parameters, and the moving average when
  it keeps one, of `source`'s latest checkpoint, read into the shardings of the ones they
  replace."""
  with _latest_checkpoint(source) as (ckpt, step):
    try:
      params = ckpt.restore_params_like(step, state.params, ema=True)
    except Exception as e:  # noqa: BLE001 -- Orbax and TensorStore raise many kinds
      raise DataError(f'train.init_from={source}: checkpoint {ckpt.directory / str(step)} '
                      f'does not read back ({describe(e)})') from None
    which = 'moving average' if ckpt.has_ema(step) else 'weights'
  # The average starts as a copy: one buffer in two places of a donated state is donated twice.
  ema = None if state.ema is None else jax.tree_util.tree_map(jnp.copy, params)
  logging.info('Starting from the %s of %s at step %d (train.init_from); optimizer, step and '
               'data start afresh', which, source, step)
  return state.replace(params=params, ema=ema)


def has_checkpoint(workdir: str | pathlib.Path) -> bool:
  """Whether `workdir` holds a saved step (Orbax names each step's directory by its number;
  an unfinished save is still under a temporary name)."""
  checkpoints = Workdir(workdir).checkpoints
  return checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())


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

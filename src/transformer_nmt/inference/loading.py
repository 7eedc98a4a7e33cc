"""A workdir's model as the engine serves it: its config, parameters (one checkpoint, the
mean of the last N, the best by validation BLEU, the moving average), tokenizers, and several
workdirs as an ensemble."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import jax
import numpy as np

from transformer_nmt.config import ModelConfig
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.decoding import ensemble
from transformer_nmt.decoding.ensemble import Models
from transformer_nmt.decoding.settings import DECODE, DecodeConfig
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.runtime import host_cpu, snapshots
from transformer_nmt.workdir import Workdir

if TYPE_CHECKING:  # Orbax's import is left to the runs that restore a checkpoint
  from transformer_nmt.checkpoint import Checkpointer


@dataclasses.dataclass(frozen=True)
class CheckpointChoice:
  """Which weights of a workdir: one checkpoint `step` (default: the latest that reads back),
  the mean of the `average_last` N (the paper averaged the last 5 for base, 20 for big,
  written every 10 minutes), or with `best` the checkpoint of highest validation BLEU; of a
  run trained with train.ema_decay its moving average of the weights unless `ema` is False.
  Checked when made: a ConfigError names the flags that do not go together."""

  step: Optional[int] = None
  average_last: int = 0
  best: bool = False
  ema: bool = True

  def __post_init__(self) -> None:
    if self.average_last < 0:
      raise ConfigError(f'--average_last={self.average_last} must be 0 or positive')
    if self.best and (self.step is not None or self.average_last):
      raise ConfigError('--best picks one checkpoint; drop --checkpoint and --average_last')
    if self.step is not None and self.average_last:
      raise ConfigError('give either --checkpoint or --average_last, not both')

  @property
  def latest(self) -> bool:
    """The newest checkpoint that reads back (no step, average or best asked for)."""
    return self.step is None and self.average_last <= 1 and not self.best


LATEST = CheckpointChoice()


@dataclasses.dataclass
class LoadedModel:
  """A workdir's model config, parameters, tokenizers and which checkpoints they come from."""

  cfg: Models  # a tuple for an ensemble (load_ensemble), as params
  params: Any  # the parameter pytree (a tuple of them for an ensemble)
  src_tok: Tokenizer
  tgt_tok: Tokenizer
  steps: list[int] = dataclasses.field(default_factory=list)
  config: dict = dataclasses.field(default_factory=dict)  # the resolved config (config.json)
  decode: DecodeConfig = DECODE  # the run's decoding settings (its config's decode section)


def load_workdir(workdir: str | pathlib.Path, choice: CheckpointChoice = LATEST,
                 snapshot: bool = False) -> LoadedModel:
  """The parameters `choice` names (`CheckpointChoice`; default: the latest checkpoint), the
  run's config, tokenizers and decode settings. With `snapshot`, the restored parameters are
  also kept in WORKDIR/programs/params, where a later call for the same checkpoints reads
  them without Orbax (snapshots.py). The model computes in the run's model.dtype, except
  where `default_dtype` says float32.
  """
  wd = Workdir(workdir)
  if not wd.config.exists():
    raise DataError(f'{workdir} is not a training workdir (no {wd.config.name})')
  config = wd.read_config()
  cfg, decode = wd.read_model_config(), wd.read_sections().decode
  cfg = ensemble.with_dtype(cfg, default_dtype(cfg))
  src_tok, tgt_tok = _tokenizers(wd)
  wd.check_tokenizers({'src': src_tok.fingerprint, 'tgt': tgt_tok.fingerprint})
  directory = wd.checkpoint_dir(choice.best)
  if choice.best and not directory.exists():
    raise DataError(f'{workdir} has no best checkpoint (train.keep_best was off or no '
                    'evaluation has run yet)')
  where = wd.programs if snapshot else None
  steps, params = _restore(directory, where, workdir, choice)
  # On the device once: host arrays would be copied in at every call of a decoding program,
  # raising a short job's peak memory.
  params = jax.device_put(params)
  _check_vocab(params, cfg, tgt_tok)
  return LoadedModel(cfg, params, src_tok, tgt_tok, steps, config, decode)


def _restore(directory: pathlib.Path, snapshot_root: Optional[pathlib.Path],
             workdir: str | pathlib.Path, choice: CheckpointChoice) -> tuple[list[int], Any]:
  """(steps, params) from the checkpoints in `directory` (see `load_workdir`), through a
  snapshot under `snapshot_root` when one is given."""
  if snapshot_root is not None:
    steps = _choose_steps(snapshots.step_numbers(directory), workdir, choice)
    path = snapshots.snapshot_path(snapshot_root, directory, steps, choice.ema)
    params = None if path is None else snapshots.load(path)
    if params is not None:
      return steps, params
  from transformer_nmt.checkpoint import Checkpointer  # Orbax, only to restore
  ckpt = Checkpointer(directory, read_only=True)
  try:
    steps = _choose_steps(ckpt.all_steps(), workdir, choice)
    if choice.latest:  # the latest that reads back
      steps, params = _latest_readable(ckpt, choice.ema)
    else:
      params = average_params([_read_params(ckpt, step, choice.ema) for step in steps])
  finally:
    ckpt.close()
  if snapshot_root is not None:  # steps may differ from the snapshot's: an unreadable latest
    path = snapshots.snapshot_path(snapshot_root, directory, steps, choice.ema)
    if path is not None:
      snapshots.save(path, params)
  return steps, params


def load_ensemble(workdirs: Sequence[str | pathlib.Path], choice: CheckpointChoice = LATEST,
                  snapshot: bool = False) -> LoadedModel:
  """One workdir's model (`load_workdir`), or several as an ensemble: configs and parameters
  as tuples (decoding/ensemble.py), the first workdir's tokenizers, config and decode
  settings. Members must use the same SentencePiece models, else a DataError names the first
  that differs."""
  models = [load_workdir(w, choice, snapshot) for w in workdirs]
  if len(models) == 1:
    return models[0]
  first = models[0]
  for workdir, m in zip(workdirs[1:], models[1:]):
    for side in ('src', 'tgt'):
      mine, theirs = getattr(m, f'{side}_tok'), getattr(first, f'{side}_tok')
      if mine.fingerprint != theirs.fingerprint:
        raise DataError(f'ensemble member {workdir} has another {side} vocabulary ({mine.path}) '
                        f'than {workdirs[0]} ({theirs.path}); members must share both')
  return dataclasses.replace(first, cfg=tuple(m.cfg for m in models),
                             params=tuple(m.params for m in models),
                             steps=[s for m in models for s in m.steps])


def load_model(workdirs: str | pathlib.Path | Sequence[str | pathlib.Path],
               choice: CheckpointChoice = LATEST, *, dtype: Optional[str] = None,
               snapshot: bool = False,
               settings: Optional[Callable[[DecodeConfig], DecodeConfig]] = None
               ) -> LoadedModel:
  """`load_ensemble` of one workdir or several, computing in `dtype` (default: as
  `load_workdir` gives the checkpoints of `choice`) with the Dense kernels already cast to it
  (ensemble.kernels_as_computed: only that copy stays in memory), and `settings` of the first
  run's decode section (default: as it is) as the model's decode settings."""
  if isinstance(workdirs, (str, pathlib.Path)):
    workdirs = [workdirs]
  model = load_ensemble(workdirs, choice, snapshot)
  cfg = ensemble.with_dtype(model.cfg, dtype)
  decode = model.decode if settings is None else settings(model.decode)
  return dataclasses.replace(model, cfg=cfg, decode=decode,
                             params=ensemble.kernels_as_computed(cfg, model.params))


def default_dtype(cfg: Models) -> Optional[str]:
  """The compute dtype decoding takes when none is asked for: the run's model.dtype (None),
  except float32 for a bfloat16 model on a CPU without bfloat16 instructions
  (host_cpu.has_bfloat16), where decoding in float32 is faster."""
  if ('bfloat16' not in ensemble.dtypes(cfg) or jax.default_backend() != 'cpu'
      or host_cpu.has_bfloat16() is not False):
    return None
  return 'float32'


def _read_params(ckpt: Checkpointer, step: int, ema: bool = True) -> Any:
  from transformer_nmt.checkpoint import describe
  try:
    return ckpt.restore_params(step, ema)
  except Exception as e:  # noqa: BLE001 -- Orbax and TensorStore raise many kinds
    raise DataError(f'checkpoint {ckpt.directory / str(step)} is unreadable ({describe(e)}); '
                    'choose another with --checkpoint') from None


def _latest_readable(ckpt: Checkpointer, ema: bool = True) -> tuple[list[int], Any]:
  """([step], params) of the newest checkpoint that reads back, warning about newer ones
  that do not (train.py moves those aside when it next runs)."""
  from transformer_nmt.checkpoint import describe
  errors = []
  for step in reversed(ckpt.all_steps()):
    try:
      return [step], ckpt.restore_params(step, ema)
    except Exception as e:  # noqa: BLE001
      errors.append(f'step {step}: {describe(e)}')
      logging.warning('Checkpoint %s is unreadable (%s); using the one before',
                      ckpt.directory / str(step), describe(e))
  raise DataError(f'no checkpoint in {ckpt.directory} reads back ({errors[0]})')


def _tokenizers(wd: Workdir) -> tuple[Tokenizer, Tokenizer]:
  paths = wd.existing_tokenizer_paths()
  if paths is None:
    raise DataError(f'{wd.root} has no SentencePiece model ({wd.tokenizer_paths(True)[0].name})')
  table = wd.tokenizer_table()
  src = Tokenizer(paths[0], table)
  return src, src if paths[1] == paths[0] else Tokenizer(paths[1], table)


def _choose_steps(available: Sequence[int], workdir: pathlib.Path,
                  choice: CheckpointChoice) -> list[int]:
  available = sorted(available)
  if not available:
    raise DataError(f'{workdir} has no checkpoints')
  if choice.step is not None:
    if choice.step not in available:
      raise DataError(f'{workdir} has no checkpoint at step {choice.step}; available: '
                      f'{available}')
    return [choice.step]
  if choice.average_last > len(available):
    raise DataError(f'--average_last={choice.average_last} but {workdir} keeps only '
                    f'{len(available)} checkpoints: {available}')
  return available[-max(choice.average_last, 1):]


def average_params(trees: Sequence[Any]) -> Any:
  """Elementwise mean of parameter pytrees (float32)."""
  return jax.tree_util.tree_map(lambda *xs: np.mean(np.stack(xs), axis=0), *trees)


def _check_vocab(params: Any, cfg: ModelConfig, tok: Tokenizer) -> None:
  table = params['tgt_embed']['embedding']
  if table.shape[0] != tok.vocab_size or cfg.vocab_size != tok.vocab_size:
    raise DataError(f'tokenizer {tok.path} has {tok.vocab_size} pieces but the checkpoint\'s '
                    f'vocabulary has {table.shape[0]}; they do not belong together')

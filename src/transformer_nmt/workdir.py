"""The on-disk layout of a run: the one place that names the files of a workdir.

  WORKDIR/config.json        the resolved config, with the model config as trained
  WORKDIR/lock               held by the train.py that runs on the workdir (an OS file lock)
  WORKDIR/spm.model          the joint SentencePiece model (spm.src.model and spm.tgt.model
                             when data.joint_vocab=False)
  WORKDIR/vocab.json         an imported Marian model's piece table: the ids of both
                             SentencePiece models' pieces (data/tokenizer.py, import_marian.py)
  WORKDIR/checkpoints/<step> Orbax checkpoints, the last train.keep_checkpoints kept, each
                             with checksums.json once its save has finished; unreadable ones
                             are moved to checkpoints/quarantine/<step>
  WORKDIR/best/<step>        the checkpoint of best validation BLEU (train.keep_best)
  WORKDIR/metrics.jsonl      one JSON object per logged step
  WORKDIR/tensorboard/       TensorBoard event files
  WORKDIR/compile_cache/     JAX's persistent compilation cache
  WORKDIR/programs/          decode.py's compiled programs (runtime/programs.py), and in
                             programs/params/ snapshots of restored parameters (snapshots.py)
  WORKDIR/demo_data/         the generated demo corpus (data.source='demo')
  WORKDIR/data_cache/        the encoded training split (data/cache.py), unless
                             data.cache_dir names another directory
  WORKDIR/recipe/            recipe.py's test-set translations (<test set>.hyp) and its
                             choice on validation (selection.json)
  WORKDIR/plots/             plot.py's PNGs (unless told otherwise)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import pathlib
from typing import Any, Iterator, Optional

from transformer_nmt.config import ModelConfig
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.files import write_atomically
from transformer_nmt.stored_config import migrate, model_config_as_trained
from transformer_nmt.typed_config import Sections, sections

RESOLVED_MODEL = 'resolved_model'  # config.json's entry for the ModelConfig as trained
TOKENIZERS = 'tokenizers'  # ... and for the fingerprints of the tokenizers it was trained with
CHECKSUMS = 'checksums.json'  # in each checkpoint step directory, once its save has finished


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
  def profile(self) -> pathlib.Path:
    """jax.profiler traces (train.profile_steps), for TensorBoard's profile plugin."""
    return self.root / 'profile'

  @property
  def compile_cache(self) -> pathlib.Path:
    return self.root / 'compile_cache'

  @property
  def programs(self) -> pathlib.Path:
    """decode.py's compiled programs, loaded by later runs without tracing (programs.py)."""
    return self.root / 'programs'

  @property
  def demo_data(self) -> pathlib.Path:
    return self.root / 'demo_data'

  @property
  def data_cache(self) -> pathlib.Path:
    return self.root / 'data_cache'

  @property
  def recipe(self) -> pathlib.Path:
    return self.root / 'recipe'

  def hypotheses(self, test_set: str) -> pathlib.Path:
    """recipe.py's translation of a test set."""
    return self.recipe / f'{test_set}.hyp'

  @property
  def selection(self) -> pathlib.Path:
    return self.recipe / 'selection.json'

  @property
  def plots(self) -> pathlib.Path:
    return self.root / 'plots'

  @contextlib.contextmanager
  def lock(self) -> Iterator[None]:
    """Holds the workdir for one training run: an OS file lock on WORKDIR/lock, which the
    kernel releases when the process ends however it ends (kill -9 leaves no stale lock).

    Raises DataError naming the process that holds it, or why the workdir cannot be used. A
    workdir that the lock created is removed again when the run fails before writing into it.
    """
    created = not self.root.exists()
    try:
      self.root.mkdir(parents=True, exist_ok=True)
      handle = open(self.root / 'lock', 'a+', encoding='utf-8')
    except OSError as e:
      raise DataError(f'cannot use {self.root} as a workdir: {e.strerror or e}') from None
    try:
      try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or 'unknown'
        raise DataError(f'{self.root} is in use by another training run (PID {holder}); wait '
                        'for it to finish or use another --workdir') from None
      handle.seek(0)
      handle.truncate()
      handle.write(f'{os.getpid()}\n')
      handle.flush()
      try:
        yield
      except BaseException:
        if created:  # e.g. a data error: leave no empty workdir behind
          (self.root / 'lock').unlink(missing_ok=True)
          with contextlib.suppress(OSError):
            self.root.rmdir()  # only if nothing else was written
        raise
    finally:
      handle.close()  # closing releases the lock

  def own_paths(self) -> list[pathlib.Path]:
    """Every file and directory of the layout above (whether it exists yet or not)."""
    return [self.config, self.root / 'lock', *self.tokenizer_paths(True),
            *self.tokenizer_paths(False), self.piece_table, self.checkpoints, self.best,
            self.metrics, self.tensorboard, self.profile, self.compile_cache, self.programs,
            self.demo_data, self.data_cache, self.recipe, self.plots]

  def owns(self, path: str | os.PathLike) -> bool:
    """Whether `path` is one of this workdir's files or lies in one of its directories
    (symbolic and hard links followed): a program's output there would damage the run
    (decode.py --output WORKDIR/spm.model destroyed the tokenizer)."""
    target = pathlib.Path(path).resolve()
    for own in self.own_paths():
      own = own.resolve()
      if target == own or own in target.parents:
        return True
      with contextlib.suppress(OSError):  # another name of the same file
        if own.is_file() and target.is_file() and os.path.samefile(own, target):
          return True
    return False

  def checkpoint_dir(self, best: bool = False) -> pathlib.Path:
    return self.best if best else self.checkpoints

  def tokenizer_paths(self, joint: bool) -> tuple[pathlib.Path, pathlib.Path]:
    """(source, target) SentencePiece model paths: one shared file for a joint vocabulary."""
    if joint:
      return self.root / 'spm.model', self.root / 'spm.model'
    return self.root / 'spm.src.model', self.root / 'spm.tgt.model'

  @property
  def piece_table(self) -> pathlib.Path:
    """An imported Marian model's piece table (data/tokenizer.py's PieceTable)."""
    return self.root / 'vocab.json'

  def tokenizer_table(self) -> Optional[pathlib.Path]:
    """The piece table the tokenizers of this workdir use, or None (SentencePiece's ids)."""
    return self.piece_table if self.piece_table.exists() else None

  def existing_tokenizer_paths(self) -> Optional[tuple[pathlib.Path, pathlib.Path]]:
    """The tokenizer files this workdir holds (joint first), or None."""
    for joint in (True, False):
      paths = self.tokenizer_paths(joint)
      if all(p.exists() for p in paths):
        return paths
    return None

  def read_config(self) -> dict[str, Any]:
    try:
      stored = json.loads(self.config.read_text(encoding='utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise DataError(f'{self.config} is damaged: {e}') from None
    if not isinstance(stored, dict):
      raise DataError(f'{self.config} is damaged: not a JSON object')
    return stored

  def read_sections(self) -> Sections:
    """The typed sections of the run's config (options of older versions under their new
    names; options added since at their defaults)."""
    stored = self.read_config()
    for entry in (RESOLVED_MODEL, TOKENIZERS):  # the program's entries, not config sections
      stored.pop(entry, None)
    try:
      return sections(migrate(stored))
    except ConfigError as e:  # a hand-edited file: name it
      raise DataError(f'{self.config}: {e}') from None

  def read_model_config(self) -> ModelConfig:
    """The model as trained (vocabulary sizes included)."""
    try:
      return model_config_as_trained(self.read_config()[RESOLVED_MODEL])
    except (KeyError, ConfigError) as e:
      raise DataError(f'{self.config} has no usable {RESOLVED_MODEL!r} entry ({e})') from None

  def trained_tokenizers(self) -> dict[str, str]:
    """The {'src', 'tgt'} fingerprints of the tokenizers this run was trained with, as
    config.json keeps them; {} without a config or from before fingerprints were kept."""
    stored = self.read_config().get(TOKENIZERS) if self.config.exists() else None
    return stored if isinstance(stored, dict) else {}

  def check_tokenizers(self, fingerprints: Optional[dict[str, str]] = None) -> None:
    """Refuses tokenizer files that are not the ones this run's checkpoints were trained with
    (config.json keeps their fingerprints): missing ones, with `fingerprints` None (before a
    new tokenizer would be trained), or ones whose fingerprints differ."""
    if not (self.config.exists() and self.checkpoints.exists()):
      return
    stored = self.trained_tokenizers()
    if not stored:  # a workdir from before fingerprints were kept
      return
    if fingerprints is None:
      if self.existing_tokenizer_paths() is None:
        raise DataError(f'{self.root} holds checkpoints trained with a SentencePiece model '
                        f'that is gone ({self.tokenizer_paths(True)[0].name} or the '
                        f'.src/.tgt pair); put it back, or use a new workdir')
      return
    for side, fingerprint in fingerprints.items():
      if stored.get(side) != fingerprint:
        raise DataError(f'the {side} SentencePiece model in {self.root} is not the one its '
                        f'checkpoints were trained with ({fingerprint}, trained with '
                        f'{stored.get(side)}); put the original back, or use a new workdir')

  def write_config(self, config: dict[str, Any], model: ModelConfig,
                   tokenizers: Optional[dict[str, str]] = None) -> None:
    """Writes config.json: the experiment config, the model config as trained and the
    fingerprints of its tokenizers ({'src': ..., 'tgt': ...})."""
    resolved = {**config, RESOLVED_MODEL: dataclasses.asdict(model),
                **({TOKENIZERS: tokenizers} if tokenizers else {})}
    write_atomically(self.config, json.dumps(resolved, indent=2, default=list))

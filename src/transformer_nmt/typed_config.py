"""A config made into its typed sections once, where a program starts.

The programs read an ml_collections ConfigDict (configs/*.py and --config.* flags) or a
workdir's config.json; `validate_config` (or `sections`, for a stored config) turns it into a
`Sections` of the frozen dataclasses of config.py, refusing unknown options, values of the
wrong type or out of range and options that do not go together. The library takes those
typed sections, never the ConfigDict.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from transformer_nmt.config import (
  MOVED,
  SECTIONS,
  DataConfig,
  EvalConfig,
  ModelConfig,
  TrainConfig,
  default_config,
)
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Sections:
  """The typed sections of an experiment config (the model's stays a mapping until the
  tokenizer fixes the vocabulary: `model_config_from_dict`)."""

  model: Mapping[str, Any]
  data: DataConfig
  train: TrainConfig
  eval: EvalConfig
  decode: DecodeConfig

  def to_dict(self) -> dict[str, Any]:
    """The experiment config as config.json stores it: {section: {option: value}}, the model
    section as given, the others with every option (what `default_config()` holds); sections
    and options in sorted order, as a ConfigDict's `to_dict()` gives them."""
    typed = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
    return {name: dict(sorted(values.items()))
            for name, values in sorted({'model': dict(self.model), **typed}.items())}


def sections(config: Mapping[str, Any]) -> Sections:
  """Typed, validated sections of a config (ConfigDict or dict; missing sections and options
  take their defaults). Raises ConfigError naming an unknown or bad option."""
  config = as_dict(config)
  check_sections(config, default_config().to_dict())
  typed = {}
  for name, cls in SECTIONS.items():
    values = {k: tuple(v) if isinstance(v, list) else v
              for k, v in config.get(name, {}).items()}
    typed[name] = cls(**values).validate()
  model = dict(config.get('model', {}))
  model_config_from_dict(model, vocab_size=1, src_vocab_size=1)  # checks the values
  return Sections(model=model, **typed)


def validate_config(config: Mapping[str, Any]) -> Sections:
  """Rejects unknown keys, wrong types, out-of-range values and options that do not go
  together, before anything is written; returns the typed sections."""
  s = sections(config)
  rows = max(s.data.max_len, s.data.pack_length)
  if s.data.tokens_per_batch < rows:
    raise ConfigError(f'data.tokens_per_batch={s.data.tokens_per_batch} is less than one row of '
                      f'{rows} tokens (data.max_len or data.pack_length): no batch could hold '
                      'the longest pairs')
  # Unless a piece table gives both sides one vocabulary: an imported Marian model's, which
  # train.init_from brings (training/loop.py checks it once the tokenizers are known).
  if (not s.data.joint_vocab and s.model.get('share_embeddings', True)
      and not s.train.init_from):
    raise ConfigError('data.joint_vocab=False gives source and target their own vocabularies; '
                      'it needs model.share_embeddings=False')
  return s


def as_dict(config: Mapping[str, Any]) -> dict[str, Any]:
  """A ConfigDict (its `to_dict()`, nested) or a mapping as a plain dict."""
  to_dict = getattr(config, 'to_dict', None)  # a ConfigDict, without importing ml_collections
  return to_dict() if callable(to_dict) else dict(config)


def model_config_from_dict(section: Mapping[str, Any], **overrides: Any) -> ModelConfig:
  """Builds a validated ModelConfig from a config's `model` section.

  Args:
    section: the `model` section (a mapping, e.g. `Sections.model`); unknown keys are an error.
    **overrides: values set by the program, e.g. `vocab_size` from the tokenizer.
  """
  values = dict(section)
  values.update(overrides)
  known = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(values) - known)
  if unknown:
    raise ConfigError(f'unknown model option(s) {unknown}; valid: {sorted(known)}')
  return ModelConfig(**values).validate()


def check_sections(config: Mapping[str, Any], schema: Mapping[str, Mapping[str, Any]]) -> None:
  """Rejects unknown sections/keys and values of the wrong type.

  Args:
    config: the whole experiment config.
    schema: section name -> {key: default value} from the reference config.
  """
  for section, values in config.items():
    if section not in schema:
      raise ConfigError(f'unknown config section {section!r}; valid: {sorted(schema)}')
    if not isinstance(values, Mapping):
      raise ConfigError(f'config section {section!r} must be a mapping of options, not '
                        f'{values!r}')
    for key, value in dict(values).items():
      moved = MOVED.get(f'{section}.{key}')
      if moved:
        raise ConfigError(f'{section}.{key} is now {moved}')
      if key not in schema[section]:
        raise ConfigError(f'unknown option {section}.{key}; valid: {sorted(schema[section])}')
      default = schema[section][key]
      if default is not None and not same_kind(default, value):
        raise ConfigError(f'{section}.{key}={value!r} should be of type {type(default).__name__}')


def same_kind(default: Any, value: Any) -> bool:
  """Whether `value` may stand where `default` does (an int for a float; never a bool for a
  number, a float for a count or a string for a list)."""
  if isinstance(default, bool) or isinstance(value, bool):
    return isinstance(default, bool) == isinstance(value, bool)
  if isinstance(default, int):  # counts and sizes: a float would slip past every check
    return isinstance(value, int)
  if isinstance(default, float):
    return isinstance(value, (int, float))
  if isinstance(default, (list, tuple)):
    return isinstance(value, (list, tuple))
  return isinstance(value, type(default))

"""The config.json of workdirs written by older versions, read as a current one.

Options that moved are read under their new names, retired ones are dropped, and model options
added since a workdir was written take the values it trained with, so that an old run still
decodes and resumes as it trained.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from transformer_nmt.config import MOVED, ModelConfig
from transformer_nmt.errors import ConfigError
from transformer_nmt.typed_config import as_dict, same_kind

# Options that no longer exist: a stored config drops them, so that a workdir written while
# they existed still reads. decode.source_multiple padded the decoder's sources and was
# withdrawn; decode.length_growth gave way to one grid of lengths for every run (the bounded
# program set, docs/decoding.md); model.halving_sums, the batch-invariant CPU programs' sums,
# is the runtime's choice now (runtime/network.py), not the model's.
RETIRED = ('decode.source_multiple', 'decode.length_growth',
           'model.halving_sums')

# Model options added after workdirs had been written, at the values those workdirs trained
# with: a config.json without the key describes a run that had that value.
MODEL_BEFORE_OPTION = {'remat': False, 'float32_logits': True, 'dropout_bits': 32,
                       'source_word_dropout': 0.0, 'target_word_dropout': 0.0,
                       'num_encoder_layers': 0, 'num_decoder_layers': 0, 'activation': 'relu',
                       'attention_bias': False, 'scale_embeddings': True,
                       'final_logits_bias': False}


def model_as_trained(resolved: Mapping[str, Any]) -> dict[str, Any]:
  """A workdir's stored ModelConfig fields (config.json's resolved model) with the options
  added since it was written at the values it trained with, and retired ones dropped."""
  retired = {name.split('.')[1] for name in RETIRED if name.startswith('model.')}
  return {key: value for key, value in {**MODEL_BEFORE_OPTION, **resolved}.items()
          if key not in retired}


def model_config_as_trained(resolved: Any) -> ModelConfig:
  """The ModelConfig of a workdir's config.json (its resolved model, `model_as_trained`),
  each value's type and range checked: a hand-edited or damaged file is refused here in one
  line (ConfigError naming the option), not by a TypeError deep inside a program."""
  if not isinstance(resolved, Mapping):
    raise ConfigError(f'not a mapping of model options: {resolved!r}')
  values = model_as_trained(resolved)
  defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(values) - set(defaults))
  if unknown:
    raise ConfigError(f'unknown model option(s) {unknown}')
  for key, value in values.items():
    if not same_kind(defaults[key], value):
      raise ConfigError(f'model.{key}={value!r} should be of type {type(defaults[key]).__name__}')
  return ModelConfig(**values).validate()


def migrate(config: Mapping[str, Any]) -> dict[str, Any]:
  """A stored config (an older workdir's config.json) with moved options under their new
  names and retired ones dropped, so that it reads as a current one."""
  config = {name: dict(values) if isinstance(values, Mapping) else values
            for name, values in as_dict(config).items()}
  for old, new in MOVED.items():
    (old_section, old_key), (new_section, new_key) = old.split('.'), new.split('.')
    section = config.get(old_section)
    if isinstance(section, dict) and old_key in section:
      config.setdefault(new_section, {})[new_key] = config[old_section].pop(old_key)
  for retired in RETIRED:
    section, key = retired.split('.')
    if isinstance(config.get(section), dict):
      config[section].pop(key, None)
  return config

"""Model hyperparameters as one frozen (hashable) dataclass, and config validation.

Experiment knobs live in `configs/*.py` as ConfigDicts; at the boundary the `model`
section becomes a `ModelConfig`, which can be a static jit argument.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from transformer_nmt.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Transformer hyperparameters (paper §3, Table 3).

  Deviations from the paper are named options: `norm_position='pre'` and
  `positional_encoding='concat'` are the tensor2tensor variants, and the
  attention/ReLU dropouts default to 0 as in the paper (tensor2tensor uses 0.1).
  """

  vocab_size: int = 0  # filled from the tokenizer; target vocab when not shared
  src_vocab_size: int = 0  # only used when share_embeddings is False
  num_layers: int = 6  # N, for both encoder and decoder
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8
  residual_dropout: float = 0.1  # P_drop on each sublayer output (§5.4)
  embedding_dropout: float = 0.1  # P_drop on embeddings + positions (§5.4)
  attention_dropout: float = 0.0  # on attention probabilities (tensor2tensor)
  relu_dropout: float = 0.0  # after the FFN's ReLU (tensor2tensor)
  norm_position: str = 'post'  # 'post': paper LayerNorm(x + Sublayer(x)); 'pre': t2t
  layer_norm_epsilon: float = 1e-6
  positional_encoding: str = 'interleaved'  # paper's sin/cos interleaving, or 'concat'
  share_embeddings: bool = True  # one source/target embedding over a joint vocabulary
  tie_output: bool = True  # target embedding = pre-softmax projection (§3.4)
  dtype: str = 'float32'  # compute dtype; parameters always stay float32
  float32_logits: bool = True  # bfloat16 mode: False rounds the logits to bfloat16 (memory)
  remat: bool = False  # recompute each layer's activations in the backward pass (memory)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def src_vocab(self) -> int:
    return self.vocab_size if self.share_embeddings else self.src_vocab_size

  def validate(self) -> ModelConfig:
    """Raises ConfigError naming the option when a value is out of range."""
    _check(self.d_model > 0 and self.d_ff > 0 and self.num_layers > 0 and self.num_heads > 0,
           'model.d_model, model.d_ff, model.num_layers and model.num_heads must be positive')
    _check(self.d_model % self.num_heads == 0,
           f'model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}')
    for name in ('residual_dropout', 'embedding_dropout', 'attention_dropout', 'relu_dropout'):
      rate = getattr(self, name)
      _check(0.0 <= rate < 1.0, f'model.{name}={rate} must be in [0, 1)')
    _check(self.norm_position in ('post', 'pre'),
           f"model.norm_position={self.norm_position!r} must be 'post' or 'pre'")
    _check(self.positional_encoding in ('interleaved', 'concat'),
           f'model.positional_encoding={self.positional_encoding!r} must be '
           "'interleaved' or 'concat'")
    _check(self.dtype in ('float32', 'bfloat16'),
           f"model.dtype={self.dtype!r} must be 'float32' or 'bfloat16'")
    _check(self.layer_norm_epsilon > 0, 'model.layer_norm_epsilon must be positive')
    _check(self.d_model % 2 == 0, 'model.d_model must be even for sinusoidal positions')
    return self


def _check(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def model_config_from_dict(section: Mapping[str, Any], **overrides: Any) -> ModelConfig:
  """Builds a validated ModelConfig from a config's `model` section.

  Args:
    section: the `model` ConfigDict (or any mapping); unknown keys are an error.
    **overrides: values set by the program, e.g. `vocab_size` from the tokenizer.
  """
  values = dict(section)
  values.update(overrides)
  known = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(values) - known)
  _check(not unknown, f'unknown model option(s) {unknown}; valid: {sorted(known)}')
  return ModelConfig(**values).validate()


def check_sections(config: Mapping[str, Any], schema: Mapping[str, Mapping[str, Any]]) -> None:
  """Rejects unknown sections/keys and values of the wrong type.

  Args:
    config: the whole experiment config.
    schema: section name -> {key: default value} from the reference config.
  """
  for section, values in config.items():
    _check(section in schema, f'unknown config section {section!r}; valid: {sorted(schema)}')
    for key, value in dict(values).items():
      _check(key in schema[section],
             f'unknown option {section}.{key}; valid: {sorted(schema[section])}')
      default = schema[section][key]
      if default is not None and value is not None and not _same_kind(default, value):
        raise ConfigError(f'{section}.{key}={value!r} should be of type {type(default).__name__}')


def _same_kind(default: Any, value: Any) -> bool:
  if isinstance(default, bool) or isinstance(value, bool):
    return isinstance(default, bool) == isinstance(value, bool)
  if isinstance(default, (int, float)):
    return isinstance(value, (int, float))
  if isinstance(default, (list, tuple)):
    return isinstance(value, (list, tuple))
  return isinstance(value, type(default))

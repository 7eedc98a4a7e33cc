"""stored_config: the config.json of older workdirs read as a current one."""

import pytest

from transformer_nmt.errors import ConfigError
from transformer_nmt.stored_config import MODEL_BEFORE_OPTION, migrate, model_config_as_trained
from transformer_nmt.typed_config import validate_config


def test_stored_configs_of_older_runs_are_migrated():
  old = {'eval': {'bleu_sentences': 10, 'max_extra_len': 7, 'tokens_per_batch': 256},
         'train': {'num_steps': 5}}
  new = migrate(old)
  assert new['eval'] == {'bleu_sentences': 10}
  assert new['decode'] == {'max_extra_len': 7, 'tokens_per_batch': 256}
  assert old['eval']['max_extra_len'] == 7  # the input is left alone
  assert validate_config(new).decode.max_extra_len == 7


def test_a_stored_config_with_a_retired_option_still_reads():
  old = {'decode': {'source_multiple': 64, 'length_growth': 1.5, 'chunk': 4}}
  assert migrate(old) == {'decode': {'chunk': 4}}
  assert validate_config(migrate(old)).decode.chunk == 4
  with pytest.raises(ConfigError, match='unknown option decode.source_multiple'):
    validate_config(old)  # a config being written, not read back, is still told
  with pytest.raises(ConfigError, match='unknown option decode.length_growth'):
    validate_config({'decode': {'length_growth': 2.0}})
  # a workdir written while the model held the CPU runtime's halving sums
  stored = dict(model_config_as_trained({'vocab_size': 24}).__dict__, halving_sums=True)
  assert model_config_as_trained(stored).vocab_size == 24
  with pytest.raises(ConfigError, match='halving_sums'):
    validate_config({'model': {'halving_sums': True}})  # a new config may not set it


def test_model_options_added_later_say_what_older_workdirs_trained_with():
  """A ModelConfig field added after workdirs were written must be in MODEL_BEFORE_OPTION,
  at the value a config.json without it implies; otherwise train.py refuses to resume every
  older workdir ('None there') and decode.py cannot read its model."""
  import dataclasses

  from transformer_nmt.config import ModelConfig
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  assert fields - set(MODEL_BEFORE_OPTION) == {
      'attention_dropout', 'd_ff', 'd_model', 'dtype', 'embedding_dropout', 'layer_norm_epsilon',
      'norm_position', 'num_heads', 'num_layers', 'positional_encoding', 'relu_dropout',
      'residual_dropout', 'share_embeddings', 'src_vocab_size', 'tie_output', 'vocab_size'}
  defaults = ModelConfig()
  assert all(hasattr(defaults, name) for name in MODEL_BEFORE_OPTION)


def test_a_stored_model_config_is_checked_value_by_value():
  """config.json's resolved model, edited by hand: a string for a number used to fail deep in
  a program with a TypeError (issue 52 #11)."""
  import dataclasses

  from transformer_nmt.config import ModelConfig
  stored = dataclasses.asdict(ModelConfig(vocab_size=100, num_heads=4, d_model=32, d_ff=64))
  assert model_config_as_trained(stored).num_heads == 4
  with pytest.raises(ConfigError, match="model.num_heads='4' should be of type int"):
    model_config_as_trained({**stored, 'num_heads': '4'})
  with pytest.raises(ConfigError, match='is not divisible by model.num_heads=3'):
    model_config_as_trained({**stored, 'num_heads': 3})
  with pytest.raises(ConfigError, match=r"unknown model option\(s\) \['heads'\]"):
    model_config_as_trained({**stored, 'heads': 4})
  with pytest.raises(ConfigError, match='not a mapping of model options'):
    model_config_as_trained([1, 2])

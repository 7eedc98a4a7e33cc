"""The workdir layout and atomic writes."""

import json
import os

import pytest

from transformer_nmt.config import ModelConfig
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.files import atomic_output, write_atomically
from transformer_nmt.workdir import Workdir


def test_workdir_names_every_file(tmp_path):
  wd = Workdir(tmp_path)
  assert wd.config == tmp_path / 'config.json' and wd.metrics == tmp_path / 'metrics.jsonl'
  assert wd.checkpoint_dir() == tmp_path / 'checkpoints'
  assert wd.checkpoint_dir(best=True) == tmp_path / 'best'
  assert wd.compile_cache.parent == wd.tensorboard.parent == tmp_path
  joint, separate = wd.tokenizer_paths(True), wd.tokenizer_paths(False)
  assert joint[0] == joint[1] and separate[0] != separate[1]
  assert wd.existing_tokenizer_paths() is None
  for path in separate:
    path.write_bytes(b'x')
  assert wd.existing_tokenizer_paths() == separate
  joint[0].write_bytes(b'x')
  assert wd.existing_tokenizer_paths() == joint  # a joint model wins
  model = ModelConfig(vocab_size=100, d_model=8, num_heads=2)
  data = {'extra_test_src': ('a.de', 'b.de'), 'extra_test_tgt': ('a.en', 'b.en')}
  wd.write_config({'model': {'d_model': 8}, 'data': data}, model,
                  {'src': 'sha256:0 pieces:100', 'tgt': 'sha256:0 pieces:100'})
  stored = wd.read_config()
  assert stored['model'] == {'d_model': 8}
  assert stored['data'] == {k: list(v) for k, v in data.items()}
  assert json.loads(wd.config.read_text())['resolved_model']['vocab_size'] == 100
  assert wd.read_model_config() == model
  typed = wd.read_sections()  # typed, with every option the stored config leaves out
  assert typed.data.extra_test_src == ('a.de', 'b.de') and typed.decode == DecodeConfig()
  assert typed.data.extra_test_tgt == ('a.en', 'b.en')
  assert typed.model == {'d_model': 8}


def test_config_of_an_older_run_reads_with_moved_options(tmp_path):
  wd = Workdir(tmp_path)
  wd.config.write_text(json.dumps({'eval': {'max_extra_len': 9}, 'resolved_model': {}}))
  assert wd.read_sections().decode.max_extra_len == 9


def test_atomic_output_replaces_only_on_success(tmp_path):
  path = tmp_path / 'out.txt'
  write_atomically(path, 'old\n')
  with pytest.raises(RuntimeError):
    with atomic_output(path) as f:
      f.write('half')
      raise RuntimeError('disk full')
  assert path.read_text() == 'old\n'  # untouched, and no temporary file left beside it
  assert os.listdir(tmp_path) == ['out.txt']
  write_atomically(path, b'\x00bytes')
  assert path.read_bytes() == b'\x00bytes' and oct(path.stat().st_mode & 0o777) == '0o644'


def test_workdirs_from_before_an_option_resume_with_the_value_they_trained_with(tmp_path):
  """A config.json written before model.dropout_bits (and remat, float32_logits) existed
  describes a run with 32-bit dropout draws: train.py resumes it with dropout_bits=32 and
  refuses the new default 16, naming both values; decode.py reads it as trained."""
  import dataclasses

  from transformer_nmt.errors import ConfigError
  from transformer_nmt.training.loop import _check_and_write_config
  from transformer_nmt.typed_config import sections
  wd = Workdir(tmp_path)
  model = ModelConfig(vocab_size=100, d_model=8, num_heads=2)
  stored = dataclasses.asdict(model)
  for added in ('dropout_bits', 'remat', 'float32_logits', 'source_word_dropout',
                'target_word_dropout'):
    del stored[added]
  wd.config.write_text(json.dumps({'resolved_model': stored}), encoding='utf-8')
  wd.checkpoints.mkdir()
  assert wd.read_model_config() == dataclasses.replace(model, dropout_bits=32)
  config = sections({'model': {'d_model': 8}})
  with pytest.raises(ConfigError, match="dropout_bits 32 there, 16 now"):
    _check_and_write_config(config, model, tmp_path, {})
  _check_and_write_config(config, dataclasses.replace(model, dropout_bits=32), tmp_path, {})
  assert wd.read_config()['resolved_model']['dropout_bits'] == 32

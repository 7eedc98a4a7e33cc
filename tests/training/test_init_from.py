"""train.init_from: a new run starting from an earlier run's weights (fine-tuning)."""

import re

import jax
import jax.flatten_util
import numpy as np
import pytest

from transformer_nmt.checkpoint import Checkpointer
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.model.transformer import init_params
from transformer_nmt.training import loop
from transformer_nmt.training.init_from import check_init_from
from transformer_nmt.typed_config import validate_config
from transformer_nmt.workdir import Workdir


def _config(source, **train):
  from configs import tiny
  config = tiny.get_config()
  config.data.update(demo_sizes=(200, 10, 10), spm_model=str(source / 'spm.model'))
  config.train.update(**{**dict(num_steps=2, eval_every=1000, log_every=1, checkpoint_every=2,
                                init_from=str(source)), **train})
  config.eval.update(bleu_sentences=0)
  return config


def _weights(workdir, step, ema=True):
  ckpt = Checkpointer(workdir / 'checkpoints', read_only=True)
  try:
    return jax.flatten_util.ravel_pytree(ckpt.restore_params(step, ema))[0]
  finally:
    ckpt.close()


@pytest.mark.slow
def test_a_run_starts_from_the_earlier_runs_weights_with_a_fresh_optimizer(tiny_workdir,
                                                                           tmp_path, caplog):
  """Two steps at a learning rate below 1e-10 leave the weights where the source run left
  them, far from the initial weights the run would otherwise have had: they came over. The
  new run counts its own steps from 0 (its checkpoint is step 2, not 22), and its moving
  average starts from them too. A resumed run ignores train.init_from: the source may be
  gone by then."""
  import logging
  import shutil
  source = tmp_path / 'source'
  shutil.copytree(tiny_workdir, source)
  before = _weights(source, 20)
  tuned = tmp_path / 'tuned'
  with caplog.at_level(logging.INFO):
    loop.train_and_evaluate(validate_config(_config(source, learning_rate_multiplier=1e-9,
                                                    ema_decay=0.5)), str(tuned))
  assert 'Starting from the weights of' in caplog.text
  ckpt = Checkpointer(tuned / 'checkpoints', read_only=True)
  assert ckpt.all_steps() == [2]
  ckpt.close()
  np.testing.assert_allclose(_weights(tuned, 2, ema=False), before, atol=1e-6)
  np.testing.assert_allclose(_weights(tuned, 2, ema=True), before, atol=1e-6)
  model_cfg = Workdir(tuned).read_model_config()  # what the run would have started from
  fresh = jax.flatten_util.ravel_pytree(init_params(model_cfg, jax.random.fold_in(
      jax.random.key(0), 0)))[0]
  assert np.abs(fresh - before).max() > 0.1
  shutil.rmtree(source)
  resumed = _config(source, learning_rate_multiplier=1e-9, ema_decay=0.5, num_steps=4)
  # from its own step 2, not the gone source
  loop.train_and_evaluate(validate_config(resumed), str(tuned))
  np.testing.assert_allclose(_weights(tuned, 4, ema=False), before, atol=1e-6)


def test_a_source_that_does_not_fit_is_refused_before_anything_is_written(tiny_workdir,
                                                                         tmp_path):
  """Also on a rerun whose first attempt failed before its first checkpoint (an empty
  checkpoints/ then): only a saved step makes a run a resumed one."""
  import shutil
  no_tokenizer = tmp_path / 'separate'
  shutil.copytree(tiny_workdir / 'checkpoints', no_tokenizer / 'checkpoints')
  cases = [(_config(tmp_path / 'nowhere'), DataError, 'no checkpoint in')]
  no_spm = _config(tiny_workdir)
  no_spm.data.spm_model = ''
  cases.append((no_spm, ConfigError, f'set data.spm_model={tiny_workdir / "spm.model"}'))
  separate = _config(no_tokenizer)
  separate.data.spm_model = ''
  cases.append((separate, ConfigError, 'that run has no joint SentencePiece model (spm.model)'))
  wider = _config(tiny_workdir)
  wider.model.d_ff = 128
  cases.append((wider, ConfigError, 'its parameters do not fit this model'))
  check_init_from(validate_config(_config(tiny_workdir)))  # one that fits
  for config, error, message in cases:
    workdir = tmp_path / 'tuned'
    with pytest.raises(error, match=re.escape(message)):
      loop.prepare(validate_config(config), workdir)
    assert not workdir.exists()
    (workdir / 'checkpoints').mkdir(parents=True)
    with pytest.raises(error, match=re.escape(message)):
      loop.prepare(validate_config(config), workdir)
    assert [p.name for p in workdir.iterdir()] == ['checkpoints']
    shutil.rmtree(workdir)


def test_a_damaged_source_checkpoint_is_one_error(tiny_workdir, tmp_path):
  import shutil
  source = tmp_path / 'source'
  shutil.copytree(tiny_workdir, source)
  array = max((source / 'checkpoints' / '20').rglob('*'), key=lambda p: p.stat().st_size)
  array.write_bytes(b'0' * array.stat().st_size)
  with pytest.raises(DataError, match=r'train.init_from=.*checkpoint .*20 does not read back'):
    loop.train_and_evaluate(validate_config(_config(source)), str(tmp_path / 'tuned'))


def test_another_sentencepiece_model_is_refused(tiny_workdir, tmp_path):
  """A tokenizer of another run (here: one trained on other text) is not the source's."""
  from transformer_nmt.data.tokenizer import train_tokenizer
  other = tmp_path / 'other.model'
  train_tokenizer([f'line {n} of other text' for n in range(200)], other, vocab_size=40,
                  model_type='unigram', max_sentences=1000)
  config = _config(tiny_workdir)
  config.data.spm_model = str(other)
  with pytest.raises(DataError, match='is not the src SentencePiece model train.init_from='):
    check_init_from(validate_config(config))
  # A workdir left by an attempt that failed before its first checkpoint keeps the
  # tokenizer it trained or copied then, whatever data.spm_model now says.
  workdir = tmp_path / 'tuned'
  workdir.mkdir()
  (workdir / 'spm.model').write_bytes(other.read_bytes())
  with pytest.raises(DataError, match=f'the SentencePiece model in {workdir} is not the src'):
    loop.prepare(validate_config(_config(tiny_workdir)), workdir)


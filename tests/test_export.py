"""The CTranslate2 export reproduces our model: per-token log-probabilities of the same
(source, target) pairs agree, for pre- and post-LN, both position variants and an encoder
deeper than the decoder."""

import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

from transformer_nmt.data.tokenizer import Tokenizer, train_tokenizer
from transformer_nmt.model.transformer import Transformer, init_params

ctranslate2 = pytest.importorskip('ctranslate2')


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
  lines = [f'the {w} number {n} is here' for n in range(60) for w in ('red', 'big', 'old')]
  path = tmp_path_factory.mktemp('spm') / 'spm.model'
  train_tokenizer(lines, path, vocab_size=60, model_type='unigram')
  return Tokenizer(path)


@pytest.mark.parametrize('norm, positions, depths', [('pre', 'interleaved', (0, 0)),
                                                     ('post', 'concat', (0, 0)),
                                                     ('pre', 'interleaved', (3, 1))])
def test_export_scores_match_ours(tiny_cfg, tokenizer, tmp_path, norm, positions, depths):
  from transformer_nmt.export import export
  cfg = dataclasses.replace(tiny_cfg, vocab_size=tokenizer.vocab_size, norm_position=norm,
                            positional_encoding=positions, num_encoder_layers=depths[0],
                            num_decoder_layers=depths[1])
  params = init_params(cfg, jax.random.key(3))
  export(cfg, params, tokenizer, tokenizer, tmp_path / 'ct2')
  src = tokenizer.encode(['the red number 7 is here'])[0] + [tokenizer.eos_id]
  tgt = tokenizer.encode(['the old number 12'])[0] + [tokenizer.eos_id]
  logits = Transformer(cfg).apply({'params': params}, jnp.array([src]),
                                  jnp.array([[tokenizer.bos_id] + tgt[:-1]]))
  ours = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits[0])), np.array(tgt)[:, None],
                            axis=1)[:, 0]
  translator = ctranslate2.Translator(str(tmp_path / 'ct2'), device='cpu')
  theirs = translator.score_batch([tokenizer.pieces(src)], [tokenizer.pieces(tgt[:-1])])[0]
  np.testing.assert_allclose(theirs.log_probs, ours, atol=2e-4)


def test_export_command_refuses_a_non_empty_output(tmp_path):
  (tmp_path / 'out').mkdir()
  (tmp_path / 'out' / 'x').write_text('keep me')
  result = subprocess.run([sys.executable, 'export_ctranslate2.py', '--workdir',
                           str(tmp_path / 'none'), '--out', str(tmp_path / 'out')], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and 'is not empty' in result.stderr
  assert (tmp_path / 'out' / 'x').read_text() == 'keep me'


def test_an_export_that_fails_midway_leaves_nothing_and_a_rerun_works(tiny_cfg, tokenizer,
                                                                      tmp_path, monkeypatch):
  """A full disk while the model is written (issue 52): no half-written directory, no
  temporary one, nothing that makes the rerun refuse; the rerun writes the whole model."""
  import errno

  from transformer_nmt import cli
  from transformer_nmt.export import export
  cfg = dataclasses.replace(tiny_cfg, vocab_size=tokenizer.vocab_size)
  params = init_params(cfg, jax.random.key(3))
  real_save = ctranslate2.specs.TransformerSpec.save

  def full_disk(spec, path):
    real_save(spec, path)  # the files are there, then the disk fills
    raise OSError(errno.ENOSPC, 'No space left on device', f'{path}/model.bin')
  monkeypatch.setattr(ctranslate2.specs.TransformerSpec, 'save', full_disk)
  out = tmp_path / 'models' / 'ct2'
  with pytest.raises(OSError) as failure:
    export(cfg, params, tokenizer, tokenizer, out)
  assert not out.exists() and list((tmp_path / 'models').iterdir()) == []
  message = cli.file_system_error(failure.value)
  assert message.startswith('no space left on the disk') and 'resume' not in message
  monkeypatch.setattr(ctranslate2.specs.TransformerSpec, 'save', real_save)
  export(cfg, params, tokenizer, tokenizer, out)
  assert sorted(p.name for p in out.iterdir())[:2] == ['config.json', 'model.bin']

"""The CTranslate2 export reproduces our model: per-token log-probabilities of the same
(source, target) pairs agree, for pre- and post-LN, both position variants and an encoder
deeper than the decoder; every quantization export_ctranslate2.py offers exports and
translates."""

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


@pytest.mark.slow
@pytest.mark.parametrize('norm, positions, depths', [('pre', 'interleaved', (0, 0)),
                                                     ('post', 'concat', (0, 0)),
                                                     ('pre', 'interleaved', (3, 1))])
def test_export_scores_match_ours(tiny_cfg, tokenizer, tmp_path, norm, positions, depths):
  from transformer_nmt.interop.ctranslate2 import export
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
  from transformer_nmt.interop.ctranslate2 import export
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


@pytest.fixture(scope='module')
def trained(tiny_workdir, tmp_path_factory):
  """The tiny trained workdir's model, 8 test pairs as pieces, and CTranslate2's float32
  log-probabilities of them from its export."""
  from transformer_nmt.inference import load_workdir
  from transformer_nmt.interop.ctranslate2 import export
  model = load_workdir(tiny_workdir)
  data = tiny_workdir / 'demo_data'
  src = [model.src_tok.pieces(r + [model.src_tok.eos_id]) for r in
         model.src_tok.encode((data / 'test.en').read_text().splitlines()[:8])]
  tgt = [model.tgt_tok.pieces(r) for r in
         model.tgt_tok.encode((data / 'test.de').read_text().splitlines()[:8])]
  out = tmp_path_factory.mktemp('ct2') / 'float32'
  export(model.cfg, model.params, model.src_tok, model.tgt_tok, out)
  return model, src, tgt, out, _log_probs(out, src, tgt)


def _log_probs(model_dir, src, tgt) -> np.ndarray:
  translator = ctranslate2.Translator(str(model_dir), device='cpu')
  return np.concatenate([r.log_probs for r in translator.score_batch(src, tgt)])


# How far each type's log-probabilities may be from float32's (measured: int8 and int16
# 0.017, bfloat16 0.0044, float16 0.00044).
TOLERANCE = {'int8': 0.1, 'int8_float32': 0.1, 'int16': 0.1, 'float16': 0.005, 'bfloat16': 0.03}


@pytest.mark.parametrize('quantization', TOLERANCE)
def test_every_offered_quantization_exports_and_translates(trained, tmp_path, quantization):
  """int8, int8_float32 and int16 were quantized by CTranslate2 in place in our read-only
  arrays (a traceback); each now writes narrower weights that CTranslate2 translates and
  scores with, close to float32."""
  from transformer_nmt.interop.ctranslate2 import QUANTIZATIONS, export
  assert set(TOLERANCE) == set(QUANTIZATIONS)
  model, src, tgt, float32_dir, float32 = trained
  out = tmp_path / quantization
  export(model.cfg, model.params, model.src_tok, model.tgt_tok, out, quantization)
  assert (out / 'model.bin').stat().st_size < 0.8 * (float32_dir / 'model.bin').stat().st_size
  np.testing.assert_allclose(_log_probs(out, src, tgt), float32, atol=TOLERANCE[quantization])
  translator = ctranslate2.Translator(str(out), device='cpu')
  found = translator.translate_batch(src, beam_size=2, max_decoding_length=6)
  vocabulary = set(model.tgt_tok.pieces(range(model.tgt_tok.vocab_size)))
  assert len(found) == len(src)
  assert all(0 < len(r.hypotheses[0]) <= 6 and set(r.hypotheses[0]) <= vocabulary
             for r in found)


def test_a_quantization_whose_package_is_missing_is_one_line_exit_2(tmp_path):
  """bfloat16 needs torch (CTranslate2 converts with it): hidden here, the program refuses
  in one line naming it, before loading anything, and writes nothing."""
  hidden = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path('export_ctranslate2.py', run_name='__main__')")
  result = subprocess.run([sys.executable, '-c', hidden, 'export_ctranslate2.py', '--workdir',
                           str(tmp_path / 'none'), '--out', str(tmp_path / 'out'),
                           '--quantization', 'bfloat16'], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and 'Traceback' not in result.stderr, result.stderr[-2000:]
  assert '--quantization=bfloat16 needs torch' in errors[0] and 'pip install torch' in errors[0]
  assert not (tmp_path / 'out').exists()

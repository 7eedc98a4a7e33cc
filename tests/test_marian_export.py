"""The newer OPUS-MT generation's import (separate vocabularies, untied output layers) and
export_marian.py (marian_export.py) against transformers' MarianMTModel and MarianTokenizer.

Tiny random Marian models of each variant are built with transformers and fitted for a few
steps (test_marian.build_marian); a model of ours is built in-process with Marian's options
and its own SentencePiece model. Nothing is downloaded. Skipped without torch and
transformers.
"""

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from conftest import ROOT, shared_compile_cache  # noqa: E402
from test_marian import DE, EN, MAX_NEW, _padded, assert_logits_match, build_marian  # noqa: E402

from transformer_nmt.decoding.settings import DecodeConfig  # noqa: E402

# Close to the fitted lines, so that outputs end rather than repeat to the limit in near
# ties, where float32 rounding on either side may choose the other token.
LINES = ['I have 3 cats and 4 dogs .', 'the house is red .', 'a man walks .',
         'we see 12 birds in the park and 7 cats .', 'I have 7 cats and 8 dogs .',
         'I have 21 cats and 22 dogs .', 'a man walks in the park .',
         'we see two small birds .', 'I have 12 cats .', 'the man is in the house .']
VARIANTS = {'shared': (True, True), 'separate': (False, True),
            'separate_untied': (False, False), 'shared_untied': (True, False)}


@pytest.fixture(scope='module', params=list(VARIANTS))
def variant(request, tmp_path_factory):
  """(name, checkpoint directory, its workdir imported, the workdir loaded, transformers'
  model of the checkpoint)."""
  from transformer_nmt.inference import load_workdir
  from transformer_nmt.interop.marian import import_checkpoint
  root = tmp_path_factory.mktemp(request.param)
  directory = build_marian(root / 'opus-mt', *VARIANTS[request.param])
  import_checkpoint(directory, root / 'run')
  return (request.param, directory, root / 'run', load_workdir(root / 'run'),
          transformers.MarianMTModel.from_pretrained(directory).eval())


def _source_rows(loaded) -> list[np.ndarray]:
  tok = loaded.src_tok
  return [np.array(ids + [tok.eos_id], np.int32) for ids in tok.encode(LINES)]


def _logits_match(loaded, hf_model) -> None:
  assert_logits_match(loaded, hf_model, _source_rows(loaded), loaded.tgt_tok.encode(DE[:10]))


def _search(loaded, hf_model, beam: int, **generate) -> tuple[list, list]:
  """Our engine's and transformers' outputs (ids before EOS) on LINES, alpha 0 and
  length_penalty 0 (the two length penalties agree only there), both at most MAX_NEW tokens
  with the last an EOS. `generate`: transformers' settings beyond its generation config."""
  from transformer_nmt.inference.engine import Engine
  rows = _source_rows(loaded)
  engine = Engine(loaded, DecodeConfig(beam_size=beam, alpha=0.0, max_extra_len=MAX_NEW,
                                       max_len=MAX_NEW - 1))
  ours = [r.tolist() for r in engine.translate_ids(rows)]
  src, mask = _padded(rows, loaded.src_tok.pad_id)
  with torch.no_grad():
    out = hf_model.generate(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                            max_new_tokens=MAX_NEW, do_sample=False, **generate).numpy()
  eos = loaded.tgt_tok.eos_id
  theirs = [[int(i) for i in row[1:]] for row in out]  # after the start token, to the EOS
  return ours, [row[:row.index(eos)] if eos in row else row for row in theirs]


@pytest.mark.slow
def test_each_variant_imports_with_its_options_and_tables(variant):
  name, directory, workdir, loaded, _ = variant
  share, tie = VARIANTS[name]
  cfg = loaded.cfg
  assert (cfg.share_embeddings, cfg.tie_output) == (share and tie, tie)
  if name.startswith('separate'):  # the source's table is the larger (both sides' pieces)
    assert cfg.src_vocab > cfg.vocab_size
    assert loaded.src_tok.table.index == json.loads((directory / 'vocab.json').read_text())
    assert loaded.tgt_tok.table.index == json.loads(
        (directory / 'target_vocab.json').read_text())
  hf_tok = transformers.MarianTokenizer.from_pretrained(directory)
  assert hf_tok(LINES)['input_ids'] == [r.tolist() for r in _source_rows(loaded)]
  assert hf_tok(text_target=DE[:10])['input_ids'] == [
      ids + [loaded.tgt_tok.eos_id] for ids in loaded.tgt_tok.encode(DE[:10])]


@pytest.mark.slow
def test_each_variant_gives_transformers_logits_and_outputs(variant):
  """Logits within 1e-4; greedy outputs identical on 10 sentences, beam-4 ones too where
  transformers' beam search finds the likeliest (`_same_or_better`)."""
  name, _, _, loaded, hf_model = variant
  if name == 'shared':
    pytest.skip('the older layout: tests/test_marian.py')
  _logits_match(loaded, hf_model)
  ours, theirs = _search(loaded, hf_model, 1, num_beams=1)
  assert ours == theirs and len({len(o) for o in ours}) > 1  # outputs of several lengths
  ours, theirs = _search(loaded, hf_model, 4, num_beams=4, length_penalty=0.0,
                         early_stopping=False)
  _same_or_better(loaded, hf_model, ours, theirs, at_least=5)


def _same_or_better(loaded, hf_model, ours: list, theirs: list, at_least: int) -> None:
  """Beam outputs: the same, or ours of higher log-probability by transformers' own model.
  Where outputs run to the length limit, both force EOS, but transformers scores it as
  certain (log-probability 0) where ours keeps the model's own; and transformers' beam search
  can miss a hypothesis that ours keeps (seen with the untied variants: each output that
  differed was the likelier one). `at_least` outputs must be the same."""
  same = sum(o == t for o, t in zip(ours, theirs))
  assert same >= at_least, (same, ours, theirs)
  rows, start, eos = _source_rows(loaded), loaded.tgt_tok.bos_id, loaded.tgt_tok.eos_id
  for row, o, t in zip(rows, ours, theirs):
    if o != t:
      assert _logprob(hf_model, row, start, o + [eos]) > _logprob(hf_model, row, start,
                                                                   t + [eos]), (o, t)


def _logprob(hf_model, source: np.ndarray, start: int, target: list[int]) -> float:
  """log P(target | source) by transformers' model (teacher forcing)."""
  with torch.no_grad():
    logits = hf_model(input_ids=torch.tensor(source[None].astype(np.int64)),
                      decoder_input_ids=torch.tensor([[start] + target[:-1]])).logits[0]
  return float(torch.log_softmax(logits, -1)[torch.arange(len(target)), target].sum())


def _tensors(directory: pathlib.Path) -> dict:
  from transformer_nmt.interop.marian import read_tensors
  return read_tensors(directory)


@pytest.mark.slow
def test_import_then_export_gives_the_original_tensors_and_files(variant, tmp_path,
                                                                 monkeypatch):
  """Every tensor that transformers saved comes back equal, under its name; the tokenizer
  files are the original's; both load offline in transformers. (transformers unties a
  shared table's copies with tie_word_embeddings false: that model comes back with separate
  tables, the same ones, and without the unused shared one.)"""
  from transformer_nmt.interop.marian_export import export_model
  name, directory, _, loaded, hf_model = variant
  out = tmp_path / 'exported'
  export_model(loaded.cfg, loaded.params, loaded.src_tok, loaded.tgt_tok, loaded.decode, out)
  original, exported = _tensors(directory), _tensors(out)
  if name == 'shared_untied':
    del original['model.shared.weight']
  assert sorted(exported) == sorted(original)
  for key, value in original.items():
    assert exported[key].dtype == value.dtype and np.array_equal(exported[key], value), key
  names = ['source.spm', 'target.spm', 'vocab.json'] + (
      ['target_vocab.json'] if name.startswith('separate') else [])
  for file in names:
    ours, theirs = (out / file).read_bytes(), (directory / file).read_bytes()
    assert (json.loads(ours) == json.loads(theirs)) if file.endswith('.json') else ours == theirs
  config, before = (json.loads((d / 'config.json').read_text()) for d in (out, directory))
  keys = ['vocab_size', 'decoder_vocab_size', 'tie_word_embeddings', 'd_model', 'pad_token_id',
          'eos_token_id', 'decoder_start_token_id', 'activation_function', 'scale_embedding',
          'max_position_embeddings'] + ([] if name == 'shared_untied'
                                        else ['share_encoder_decoder_embeddings'])
  assert {k: config[k] for k in keys} == {k: before[k] for k in keys}
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  reloaded = transformers.MarianMTModel.from_pretrained(out).eval()
  _logits_match(loaded, reloaded)
  hf_tok = transformers.MarianTokenizer.from_pretrained(out)
  assert hf_tok.separate_vocabs == name.startswith('separate')
  assert hf_tok(LINES)['input_ids'] == [r.tolist() for r in _source_rows(loaded)]


def _our_workdir(root: pathlib.Path, decode: dict | None = None, **options) -> pathlib.Path:
  """A workdir of ours (no Marian in it): a joint SentencePiece model trained here on EN + DE
  (pad 0, unk 1, bos 2, eos 3), a random model with Marian's options (and `options`) at step
  0, and a config whose decode section has `decode`."""
  import dataclasses

  import jax

  from transformer_nmt.checkpoint import Checkpointer
  from transformer_nmt.config import PROGRAM_SET, ModelConfig, default_config
  from transformer_nmt.data.tokenizer import train_tokenizer
  from transformer_nmt.model.transformer import init_params
  from transformer_nmt.typed_config import sections
  from transformer_nmt.workdir import Workdir
  wd = Workdir(root)
  root.mkdir(parents=True)
  tok = train_tokenizer(EN + DE, wd.tokenizer_paths(True)[0], vocab_size=60,
                        model_type='unigram')
  cfg = ModelConfig(**{
      'vocab_size': tok.vocab_size, 'src_vocab_size': tok.vocab_size, 'num_layers': 2,
      'num_decoder_layers': 1, 'd_model': 16, 'd_ff': 32, 'num_heads': 2,
      'positional_encoding': 'halves', 'layer_norm_epsilon': 1e-5, 'activation': 'relu',
      **options}).validate()
  params = jax.tree_util.tree_map(np.asarray, init_params(cfg, jax.random.key(1)))
  config = default_config()
  config.model.update({k: v for k, v in dataclasses.asdict(cfg).items() if k not in PROGRAM_SET})
  config.decode.update(decode or {})
  wd.write_config(sections(config).to_dict(), cfg, {'src': tok.fingerprint,
                                                     'tgt': tok.fingerprint})
  ckpt = Checkpointer(wd.checkpoints, keep=1)
  try:
    ckpt.save_params(0, params)
  finally:
    ckpt.close()
  return root


@pytest.mark.slow
def test_a_model_of_ours_goes_to_transformers_with_its_search_settings(tmp_path, monkeypatch):
  """No attention biases, no final logits bias, SentencePiece's own ids (the decoder starting
  from bos): logits within 1e-4, and transformers' generate with only the exported
  generation config (beam 3, length_penalty 0 for alpha 0) gives decode.py's engine's
  outputs, greedy too. MarianTokenizer cuts text into the same ids."""
  from transformer_nmt.inference import load_workdir
  from transformer_nmt.interop.marian_export import export_model
  workdir = _our_workdir(tmp_path / 'run', decode={'beam_size': 3, 'alpha': 0.0})
  loaded = load_workdir(workdir)
  assert not loaded.cfg.attention_bias and loaded.tgt_tok.bos_id != loaded.tgt_tok.pad_id
  export_model(loaded.cfg, loaded.params, loaded.src_tok, loaded.tgt_tok, loaded.decode,
               tmp_path / 'hf')
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  hf_model = transformers.MarianMTModel.from_pretrained(tmp_path / 'hf').eval()
  assert (hf_model.generation_config.num_beams, hf_model.generation_config.length_penalty) == (
      3, 0.0)
  _logits_match(loaded, hf_model)
  ours, theirs = _search(loaded, hf_model, 1, num_beams=1)
  assert ours == theirs and len({tuple(o) for o in ours}) > 1
  ours, theirs = _search(loaded, hf_model, 3)  # the generation config's settings
  assert theirs == _search(loaded, hf_model, 3, num_beams=3, length_penalty=0.0,
                           early_stopping=False)[1]
  _same_or_better(loaded, hf_model, ours, theirs, at_least=0)  # a random model's run long
  hf_tok = transformers.MarianTokenizer.from_pretrained(tmp_path / 'hf')
  assert hf_tok(LINES)['input_ids'] == [r.tolist() for r in _source_rows(loaded)]
  rows = [r[:-1].tolist() for r in _source_rows(loaded)]
  assert loaded.tgt_tok.decode(rows) == hf_tok.batch_decode(rows, skip_special_tokens=True)


@pytest.mark.parametrize('options, says', [
    ({'norm_position': 'pre'}, "model.norm_position='pre'"),
    ({'positional_encoding': 'interleaved'}, "model.positional_encoding='interleaved'"),
    ({'layer_norm_epsilon': 1e-6}, 'model.layer_norm_epsilon=1e-06')])
def test_options_marian_lacks_are_refused_by_name(options, says):
  from transformer_nmt.config import ModelConfig
  from transformer_nmt.interop.marian_export import MarianError, check_exportable
  cfg = ModelConfig(positional_encoding='halves', layer_norm_epsilon=1e-5)
  check_exportable(cfg)
  with pytest.raises(MarianError, match=re.escape(says)):
    check_exportable(ModelConfig(**{'positional_encoding': 'halves',
                                    'layer_norm_epsilon': 1e-5, **options}))


def test_export_marian_py_refuses_a_pre_ln_model_in_one_line(tmp_path):
  workdir = _our_workdir(tmp_path / 'run', norm_position='pre')
  out = tmp_path / 'out' / 'hf'
  result = subprocess.run([sys.executable, 'export_marian.py', '--workdir', str(workdir),
                           '--out', str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and "model.norm_position='pre'" in errors[0], result.stderr[-2000:]
  assert 'Traceback' not in result.stderr and not out.parent.exists()


def _params(run: pathlib.Path, step: int) -> dict:
  from transformer_nmt.checkpoint import Checkpointer
  ckpt = Checkpointer(run / 'checkpoints', read_only=True)
  try:
    return ckpt.restore_params(step)
  finally:
    ckpt.close()


def _worked_example() -> list[str]:
  """The shell commands of docs/training.md's round trip, joined across backslashes."""
  text = (ROOT / 'docs' / 'training.md').read_text()
  section = text[text.index('### Round trip with transformers'):]
  block = section[section.index('```bash\n') + 8:]
  block = block[:block.index('```')]
  return [line for line in block.replace('\\\n', ' ').splitlines()
          if line.strip() and not line.startswith('#')]


@pytest.mark.slow
def test_the_worked_round_trip_of_the_docs_runs(tmp_path):
  """docs/training.md's commands, on a tiny random OPUS-MT model in place of the download
  and a few lines of text, with a few steps of fine-tuning: each succeeds, and transformers
  loads the export and translates with it. configs/finetune.py:W takes W's model options and
  tokenizers (copied, piece table and all); a few steps at a small learning rate move its
  parameters a little from W's (a fresh start would be far from them)."""
  commands = _worked_example()
  assert commands[0].startswith('hf download Helsinki-NLP/')
  build_marian(tmp_path / 'opus-mt-en-de')
  for lang, lines in (('en', EN), ('de', DE)):
    for split in ('train', 'valid'):
      (tmp_path / f'{split}.{lang}').write_text('\n'.join(lines) + '\n')
  (tmp_path / 'runs').mkdir()
  for line in ['ln -s ' + ' '.join(str(ROOT / p) for p in ('configs', 'train.py',
                                                           'import_marian.py',
                                                           'export_marian.py')) + ' .',
               *commands[1:]]:
    if line.startswith('python train.py'):  # seconds, not the example's thousands of steps
      line += (' --config.train.num_steps=2 --config.train.warmup_steps=1'
               ' --config.train.cooldown_steps=0 --config.train.eval_every=2'
               ' --config.train.checkpoint_every=2 --config.eval.bleu_sentences=0'
               ' --config.data.tokens_per_batch=512'
               ' --config.train.learning_rate_multiplier=0.01')  # a small move, checked below
    result = subprocess.run(line, shell=True, cwd=tmp_path,
                            env={**shared_compile_cache(), 'HF_HUB_OFFLINE': '1'},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (line, result.stderr[-3000:])
    if line.startswith('python train.py'):
      assert 'Starting from the weights of' in result.stderr
  imported, tuned = tmp_path / 'runs' / 'opus_en_de', tmp_path / 'runs' / 'opus_tuned'
  for name in ('spm.src.model', 'spm.tgt.model', 'vocab.json'):
    assert (tuned / name).read_bytes() == (imported / name).read_bytes()
  before, after = _params(imported, 0), _params(tuned, 2)
  assert after['final_logits_bias'].shape == before['final_logits_bias'].shape
  moved = np.abs(after['encoder_layers_0']['ffn']['wi']['kernel']
                 - before['encoder_layers_0']['ffn']['wi']['kernel']).max()
  assert 0 < moved < 0.05
  assert (tmp_path / 'opus-mt-en-de-tuned' / 'model.safetensors').exists()
  assert result.stdout.startswith("['") and result.stdout.strip() != "['']", result.stdout

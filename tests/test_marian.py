"""import_marian.py and its library (marian.py) against Hugging Face's MarianMTModel.

A tiny random Marian model (2+2 layers, d_model 16, swish, a nonzero final logits bias) is
built once with transformers and saved with save_pretrained (safetensors), with SentencePiece
models trained here on a few lines and a vocab.json arranged as Marian's: '</s>' 0, '<unk>' 1,
'<pad>' last. Nothing is downloaded. Skipped without torch and transformers.
"""

import io
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from conftest import ROOT  # noqa: E402

from transformer_nmt.decoding.settings import DecodeConfig  # noqa: E402

EN = [f'I have {n} cats and {n + 1} dogs .' for n in range(30)] + [
    'the house is red .', 'a man walks in the park .', 'we see two small birds .']
DE = [f'Ich habe {n} Katzen und {n + 1} Hunde .' for n in range(30)] + [
    'das Haus ist rot .', 'ein Mann geht im Park .', 'wir sehen zwei kleine Vögel .']
MAX_NEW = 30  # tokens generated at most, EOS included
LINES = ['I have 3 cats and 4 dogs .', 'the house is red .', 'a man walks .',
         'we see 12 birds in the park and 7 cats .']


def _spm(lines: list[str], path: pathlib.Path) -> list[str]:
  """A tiny SentencePiece model laid out as Marian's (eos '</s>' 0, '<unk>' 1); its pieces."""
  import sentencepiece as spm
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=40, model_type='unigram',
      eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, hard_vocab_limit=False, minloglevel=2)
  path.write_bytes(model.getvalue())
  sp = spm.SentencePieceProcessor(model_file=str(path))
  return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def build_marian(out: pathlib.Path, share: bool = True, tie: bool = True) -> pathlib.Path:
  """A Marian checkpoint directory: config.json, model.safetensors, source/target.spm,
  vocab.json; `share` false: the source's table (both sides' pieces) and target_vocab.json
  (the target's, smaller) with tokenizer_config.json's separate_vocabs; `tie` false: an
  output layer of its own."""
  out.mkdir(parents=True)
  src, tgt = _spm(EN, out / 'source.spm'), _spm(DE, out / 'target.spm')
  special = ['</s>', '<unk>']
  pieces = special + sorted(set(src + tgt) - set(special)) + ['<pad>']
  (out / 'vocab.json').write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
  target = pieces if share else special + sorted(set(tgt) - set(special)) + ['<pad>']
  if not share:
    (out / 'target_vocab.json').write_text(json.dumps({p: i for i, p in enumerate(target)}))
    (out / 'tokenizer_config.json').write_text(json.dumps({'separate_vocabs': True}))
  pad = len(target) - 1
  torch.manual_seed(0)
  config = transformers.MarianConfig(
      vocab_size=len(pieces), decoder_vocab_size=len(target), d_model=16, encoder_layers=2,
      decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
      encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=128, pad_token_id=pad,
      decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
      activation_function='swish', scale_embedding=True,
      share_encoder_decoder_embeddings=share, tie_word_embeddings=tie)
  model = transformers.MarianMTModel(config)
  if not tie:  # started as the tied table, it fits as fast; the steps then part them
    with torch.no_grad():
      model.lm_head.weight.copy_(model.model.decoder.embed_tokens.weight)
  _fit(model, out, pieces, target, 60 if tie else 200)  # a random model repeats one token
  with torch.no_grad():  # every part of the model shows in the outputs
    model.final_logits_bias.normal_(0.0, 0.1)
  model.save_pretrained(out)
  assert (out / 'model.safetensors').exists()
  return out


@pytest.fixture(scope='module')
def marian_dir(tmp_path_factory) -> pathlib.Path:
  """The older OPUS-MT's layout: one vocabulary, one shared and tied table."""
  return build_marian(tmp_path_factory.mktemp('marian') / 'opus-mt-tiny')


def _fit(model, directory: pathlib.Path, pieces: list[str], target: list[str],
         steps: int = 60) -> None:
  """A few Adam steps of `model` on EN -> DE (seconds), so that its outputs end."""
  import sentencepiece as spm

  def ids(name: str, lines: list[str], table: list[str], fill: int):
    index = {p: i for i, p in enumerate(table)}
    sp = spm.SentencePieceProcessor(model_file=str(directory / name))
    rows = [[index.get(p, 1) for p in sp.encode(line, out_type=str)] + [0] for line in lines]
    return torch.tensor(_padded([np.array(r) for r in rows], fill)[0])

  pad = len(pieces) - 1
  src, labels = ids('source.spm', EN, pieces, pad), ids('target.spm', DE, target, -100)
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
  model.train()
  for _ in range(steps):
    loss = model(input_ids=src, attention_mask=(src != pad).long(), labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
  model.eval()


@pytest.fixture(scope='module')
def hf_model(marian_dir):
  return transformers.MarianMTModel.from_pretrained(marian_dir).eval()


@pytest.fixture(scope='module')
def workdir(marian_dir, tmp_path_factory) -> pathlib.Path:
  from transformer_nmt.interop.marian import import_checkpoint
  out = tmp_path_factory.mktemp('imported') / 'run'
  import_checkpoint(marian_dir, out)
  return out


@pytest.fixture(scope='module')
def loaded(workdir):
  from transformer_nmt.inference import load_workdir
  return load_workdir(workdir)


def _source_rows(loaded) -> list[np.ndarray]:
  tok = loaded.src_tok
  return [np.array(ids + [tok.eos_id], np.int32) for ids in tok.encode(LINES)]


def _padded(rows: list[np.ndarray], pad: int) -> tuple[np.ndarray, np.ndarray]:
  """[B, L] ids padded with `pad`, and [B, L] 1/0 for real tokens."""
  width = max(len(r) for r in rows)
  ids = np.full((len(rows), width), pad, np.int64)
  for i, r in enumerate(rows):
    ids[i, :len(r)] = r
  return ids, (np.arange(width) < np.array([len(r) for r in rows])[:, None]).astype(np.int64)


@pytest.mark.slow
def test_the_workdir_has_the_marian_options_and_piece_table(workdir, loaded):
  cfg = loaded.cfg
  assert (cfg.activation, cfg.attention_bias, cfg.final_logits_bias, cfg.positional_encoding,
          cfg.scale_embeddings, cfg.layer_norm_epsilon) == ('swish', True, True, 'halves',
                                                             True, 1e-5)
  table = json.loads((workdir / 'vocab.json').read_text())
  tok = loaded.tgt_tok
  assert (tok.eos_id, tok.unk_id, tok.pad_id, tok.bos_id) == (0, 1, len(table) - 1,
                                                              len(table) - 1)
  assert tok.vocab_size == cfg.vocab_size == len(table)
  import sentencepiece as spm
  pieces = spm.SentencePieceProcessor(model_file=str(workdir / 'spm.tgt.model')).encode(
      'Ich habe 3 Katzen .', out_type=str)
  ids = tok.encode(['Ich habe 3 Katzen .'])[0]
  assert ids == [table[p] for p in pieces] and tok.pieces(ids) == pieces
  assert tok.decode([ids + [tok.eos_id, 5]]) == ['Ich habe 3 Katzen .']


def test_the_fine_tuning_config_has_the_imported_model(workdir, loaded):
  """configs/finetune.py:W gives aot_compile.py (which has no tokenizers) the model as
  imported: its options and its vocabulary size."""
  from transformer_nmt.accelerators.aot import _model_config
  from transformer_nmt.typed_config import validate_config
  sys.path.insert(0, str(ROOT / 'configs'))
  import finetune
  assert _model_config(validate_config(finetune.get_config(str(workdir)))) == loaded.cfg


@pytest.mark.slow
def test_logits_match_transformers_on_a_padded_batch(loaded, hf_model):
  targets = loaded.tgt_tok.encode(['Ich habe 3 Katzen', 'das Haus',
                                   'ein Mann geht im Park und wir sehen Vögel'])
  assert_logits_match(loaded, hf_model, _source_rows(loaded), targets + targets[:1])


def assert_logits_match(loaded, hf_model, sources: list[np.ndarray],
                        targets: list[list[int]]) -> None:
  """Teacher-forced logits [B, T, V] of a padded batch (sources with their EOS, targets
  without) agree within 1e-4 with transformers', and vary."""
  from transformer_nmt.model.transformer import Transformer
  tok = loaded.tgt_tok
  src, src_mask = _padded(sources, loaded.src_tok.pad_id)
  tgt_in, tgt_mask = _padded([np.array([tok.bos_id] + t) for t in targets], tok.pad_id)
  with torch.no_grad():
    theirs = hf_model(input_ids=torch.tensor(src), attention_mask=torch.tensor(src_mask),
                      decoder_input_ids=torch.tensor(tgt_in),
                      decoder_attention_mask=torch.tensor(tgt_mask)).logits.numpy()
  ours = np.asarray(Transformer(loaded.cfg).apply(
      {'params': loaded.params}, src.astype(np.int32), tgt_in.astype(np.int32),
      src_mask.astype(np.int32), tgt_mask.astype(np.int32)))
  real = tgt_mask.astype(bool)
  assert ours.shape == theirs.shape
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=1e-4)
  assert np.ptp(theirs[real].argmax(-1)) > 0  # not a constant model


def _hf_generate(hf_model, rows: list[np.ndarray], pad: int, **settings) -> list[list[int]]:
  src, mask = _padded(rows, pad)
  with torch.no_grad():
    out = hf_model.generate(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                            max_new_tokens=MAX_NEW, do_sample=False, **settings).numpy()
  return [[int(i) for i in row[1:] if i != pad and i != 0] for row in out]


# Hugging Face's beam search divides a hypothesis's log-probability by length^length_penalty,
# ours by GNMT's ((5 + length) / 6)^alpha: with length_penalty 0 and alpha 0 both rank by the
# log-probability alone, and early_stopping=False stops, as decode.beam_stop='bound' does,
# once no live beam can beat the finished ones.
@pytest.mark.slow
@pytest.mark.parametrize('beam', [1, 4])
def test_search_outputs_match_transformers_generate(loaded, hf_model, beam):
  from transformer_nmt.inference.engine import Engine
  rows = _source_rows(loaded)
  # Both stop at MAX_NEW tokens, the last an EOS (transformers: forced_eos_token_id).
  engine = Engine(loaded, DecodeConfig(beam_size=beam, alpha=0.0, max_extra_len=MAX_NEW,
                                       max_len=MAX_NEW - 1))
  ours = [r.tolist() for r in engine.translate_ids(rows)]
  theirs = _hf_generate(hf_model, rows, loaded.tgt_tok.pad_id, num_beams=beam,
                        length_penalty=0.0, early_stopping=False)
  assert ours == theirs
  assert len({len(o) for o in ours}) > 1  # outputs of several lengths


@pytest.mark.slow
def test_the_engine_n_best_scores_and_the_server_work_on_the_imported_model(loaded):
  """What decode.py --n_best, scoring and serve.py call: n-best hypotheses scored by forced
  decoding with the piece table's ids, and the HTTP API answering the engine's texts."""
  from fastapi.testclient import TestClient

  from transformer_nmt.inference.engine import Engine
  from transformer_nmt.serving.server import make_app
  engine = Engine(loaded, DecodeConfig(beam_size=2, alpha=0.0, max_extra_len=MAX_NEW,
                                       max_len=MAX_NEW - 1), n_best=2)
  texts = engine.translate(LINES)
  assert any(texts)
  for line, text, (source, hyps) in zip(LINES, texts, engine.hypotheses(LINES)):
    assert hyps[0].text == text and 1 <= len(hyps) <= 2
    assert source[-1] == '</s>' and hyps[0].tokens[-1] == '</s>'
    (_, scored), = engine.score([line], [text])
    assert scored.logprob == pytest.approx(hyps[0].logprob, abs=1e-4)
  with TestClient(make_app(engine)) as client:
    body = client.post('/v1/translate', json={'text': LINES, 'n_best': 2}).json()
  assert [t['text'] for t in body['translations']] == texts


@pytest.mark.slow
def test_ctranslate2_export_of_the_workdir_translates_alike(workdir, loaded, hf_model, tmp_path):
  ctranslate2 = pytest.importorskip('ctranslate2')
  out = tmp_path / 'ct2'
  result = subprocess.run([sys.executable, 'export_ctranslate2.py', '--workdir', str(workdir),
                           '--out', str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  translator = ctranslate2.Translator(str(out))
  tok = loaded.src_tok
  sources = [tok.pieces(r.tolist()) for r in _source_rows(loaded)]
  pad = loaded.tgt_tok.pad_id
  for beam in (1, 4):
    found = translator.translate_batch(sources, beam_size=beam, length_penalty=0.0,
                                       max_decoding_length=MAX_NEW - 1)  # EOS not counted
    ct2 = [[loaded.tgt_tok.table.index[p] for p in r.hypotheses[0]] for r in found]
    assert ct2 == _hf_generate(hf_model, _source_rows(loaded), pad, num_beams=beam,
                               length_penalty=0.0, early_stopping=False)


def _import(source: pathlib.Path, workdir: pathlib.Path) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, 'import_marian.py', '--from', str(source),
                         '--workdir', str(workdir)], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)


def _damage(directory: pathlib.Path, case: str) -> str:
  """Damages a copy of the checkpoint; returns what the error must say."""
  if case == 'truncated':
    data = (directory / 'model.safetensors').read_bytes()
    (directory / 'model.safetensors').write_bytes(data[:len(data) // 2])
    return 'model.safetensors is damaged or truncated'
  if case == 'no_spm':
    (directory / 'target.spm').unlink()
    return 'has no target.spm'
  if case == 'vocab':
    table = json.loads((directory / 'vocab.json').read_text())
    last = len(table) - 2  # the last piece before '<pad>' goes: one piece fewer than
    table = {p: i for p, i in table.items() if i != last}  # config.json's vocab_size
    table['<pad>'] = last
    (directory / 'vocab.json').write_text(json.dumps(table))
    return 'vocab.json does not match config.json'
  config = json.loads((directory / 'config.json').read_text())
  config['model_type'] = 'bart'
  (directory / 'config.json').write_text(json.dumps(config))
  return "model_type 'bart' is not a Marian model"


@pytest.mark.parametrize('case', ['truncated', 'no_spm', 'vocab', 'model_type'])
def test_a_bad_checkpoint_is_one_line_exit_2_and_nothing_written(marian_dir, tmp_path, case):
  broken = tmp_path / 'broken'
  shutil.copytree(marian_dir, broken)
  message = _damage(broken, case)
  workdir = tmp_path / 'out' / 'run'
  result = _import(broken, workdir)
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
  assert not workdir.exists()
  assert not any((tmp_path / 'out').iterdir()) if (tmp_path / 'out').exists() else True


def test_unsupported_variants_are_refused_by_name():
  from transformer_nmt.interop.marian import MarianError, model_config
  base = dict(model_type='marian', vocab_size=10, d_model=8, encoder_layers=1,
              decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
              encoder_ffn_dim=16, decoder_ffn_dim=16, pad_token_id=9,
              decoder_start_token_id=9, activation_function='swish')
  assert model_config(base).activation == 'swish'
  # The newer generation's options are ours: separate tables of their own sizes, an output
  # layer of its own; tie_word_embeddings false unties a shared table's copies too.
  for change, shapes in (({'share_encoder_decoder_embeddings': False,
                           'decoder_vocab_size': 12}, (False, True, 10, 12)),
                         ({'share_encoder_decoder_embeddings': False,
                           'tie_word_embeddings': False}, (False, False, 10, 10)),
                         ({'tie_word_embeddings': False}, (False, False, 10, 10))):
    cfg = model_config({**base, **change})
    assert (cfg.share_embeddings, cfg.tie_output, cfg.src_vocab, cfg.vocab_size) == shapes
  for change, says in (({'normalize_before': True}, 'normalize_before=True'),
                       ({'normalize_embedding': True}, 'normalize_embedding=True'),
                       ({'activation_function': 'gelu_new'}, "activation_function='gelu_new'"),
                       ({'decoder_vocab_size': 12}, 'decoder_vocab_size=12 differs'),
                       ({'tie_word_embeddings': 'no'}, "tie_word_embeddings='no'"),
                       ({'decoder_ffn_dim': 32}, 'encoder_ffn_dim=16 differs')):
    with pytest.raises(MarianError, match=says.replace('(', r'\(').replace(')', r'\)')):
      model_config({**base, **change})


def test_piece_table_decoding_matches_marian_tokenizer(marian_dir, loaded):
  """Text of ids as transformers' MarianTokenizer gives it with skip_special_tokens: '<unk>'
  dropped (SentencePiece alone writes ' ⁇ '), the other language's pieces spaced alike."""
  hf = transformers.MarianTokenizer(str(marian_dir / 'source.spm'),
                                    str(marian_dir / 'target.spm'), str(marian_dir / 'vocab.json'))
  tok = loaded.tgt_tok
  rng = np.random.default_rng(0)
  rows = []
  for _ in range(60):
    row = rng.integers(2, tok.vocab_size - 1, size=int(rng.integers(1, 12))).tolist()
    for _ in range(int(rng.integers(0, 3))):
      row.insert(int(rng.integers(0, len(row) + 1)), tok.unk_id)
    rows.append(row + [tok.eos_id])
  assert sum(tok.unk_id in row for row in rows) > 20
  assert tok.decode(rows) == [hf.decode(row, skip_special_tokens=True) for row in rows]
  assert not any('⁇' in text for text in tok.decode(rows))


def _weights(hf_model, directory: pathlib.Path, form: str, dtype: str, learned: bool) -> None:
  """The model's tensors, stored position tables included (older checkpoints keep them), as
  `form` in `dtype`; `learned`: tables moved off the sinusoids as training would."""
  torch.manual_seed(1)
  state = {k: v.to(getattr(torch, dtype)).clone() for k, v in hf_model.state_dict().items()}
  assert 'model.encoder.embed_positions.weight' in state
  if learned:
    for key in ('model.encoder.embed_positions.weight', 'model.decoder.embed_positions.weight'):
      state[key] += 0.05 * torch.randn_like(state[key])
  directory.mkdir()
  if form == 'pytorch_model.bin':
    torch.save(state, directory / form)
  else:
    from safetensors.torch import save_file
    save_file(state, str(directory / form))


@pytest.mark.parametrize('form, dtype', [('pytorch_model.bin', 'float16'),
                                         ('pytorch_model.bin', 'bfloat16'),
                                         ('model.safetensors', 'bfloat16')])
def test_half_precision_weights_with_sinusoid_tables_import(hf_model, loaded, tmp_path, form,
                                                             dtype):
  """float16 rounds the stored sinusoids by up to 4.9e-4, bfloat16 by 3.9e-3: accepted as
  the sinusoids; the same tables moved by training are still refused as learned."""
  from transformer_nmt.interop.marian import MarianError, convert, read_tensors
  _weights(hf_model, tmp_path / 'sinusoids', form, dtype, learned=False)
  params = convert(read_tensors(tmp_path / 'sinusoids'), loaded.cfg)
  stored = hf_model.model.shared.weight.detach().to(getattr(torch, dtype)).float().numpy()
  table = params['tgt_embed']['embedding']
  assert table.dtype == np.float32 and np.array_equal(table, stored)
  _weights(hf_model, tmp_path / 'learned', form, dtype, learned=True)
  with pytest.raises(MarianError, match='learned positions are not supported'):
    convert(read_tensors(tmp_path / 'learned'), loaded.cfg)


class _Code:
  """Unpickled, it would call print: what a pickle that holds code looks like."""

  def __reduce__(self):
    return print, ('this ran',)


@pytest.mark.parametrize('case', ['code', 'garbage'])
def test_a_pickle_that_is_not_tensors_is_refused_in_our_words(hf_model, tmp_path, case):
  """torch's refusal (cut to a line) read as advice to turn weights_only off: never given."""
  from transformer_nmt.interop.marian import MarianError, read_tensors
  if case == 'code':
    torch.save({**hf_model.state_dict(), 'extra': _Code()}, tmp_path / 'pytorch_model.bin')
  else:
    (tmp_path / 'pytorch_model.bin').write_bytes(b'garbage' * 100)
  with pytest.raises(MarianError) as refused:
    read_tensors(tmp_path)
  message = str(refused.value)
  assert '\n' not in message and 'weights_only' not in message
  assert str(tmp_path / 'pytorch_model.bin') in message
  if case == 'code':
    assert 'objects other than tensors' in message and 'refused for safety' in message
    assert 'model.safetensors' in message
  else:
    assert 'damaged or not a PyTorch state dict' in message


@pytest.mark.parametrize('case', ['parent_is_a_file', 'proc'])
def test_a_workdir_that_cannot_be_made_is_refused_by_name(marian_dir, tmp_path, case):
  from transformer_nmt.interop.marian import MarianError, import_checkpoint
  if case == 'parent_is_a_file':
    (tmp_path / 'file').write_text('keep me')
    workdir, says = tmp_path / 'file' / 'run', f'{tmp_path / "file"} is a file'
  else:
    workdir, says = pathlib.Path('/proc/run'), 'cannot create it in /proc'
  with pytest.raises(MarianError) as refused:
    import_checkpoint(marian_dir, workdir)
  assert str(refused.value).startswith(f'--workdir={workdir}: ') and says in str(refused.value)
  if case == 'parent_is_a_file':
    assert (tmp_path / 'file').read_text() == 'keep me'


@pytest.mark.parametrize('when', ['before_writing', 'copying'])
def test_a_full_disk_is_named_for_the_workdir(marian_dir, tmp_path, monkeypatch, when):
  """Too little space is refused before writing; ENOSPC while writing (shutil names the file
  it copies, the user's checkpoint) is reported for the workdir. Nothing is left."""
  import errno

  from transformer_nmt.interop.marian import MarianError, import_checkpoint
  if when == 'before_writing':
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, 'disk_usage', lambda path: real(path)._replace(free=10_000))
  else:
    def full(source, destination, **_):
      raise OSError(errno.ENOSPC, 'No space left on device', str(source))
    monkeypatch.setattr(shutil, 'copyfile', full)
  workdir = tmp_path / 'out' / 'run'
  with pytest.raises(MarianError) as refused:
    import_checkpoint(marian_dir, workdir)
  message = str(refused.value)
  assert message.startswith(f'no space left on the disk of --workdir={workdir}: ')
  assert str(marian_dir) not in message
  assert ('0.0 MB are free' if when == 'before_writing' else 'filled while writing') in message
  assert list((tmp_path / 'out').iterdir()) == []


# Run as import_marian.py with one event injected while it writes the checkpoint (or, for
# 'imports', while it imports its libraries): deterministic, where a real signal's timing is not.
_INJECT = '''
import errno, os, runpy, signal, sys
case, source, workdir = sys.argv[1:]
if case == 'imports':
  class Stop:
    def find_spec(self, name, path=None, target=None):
      if name == 'transformer_nmt':
        raise KeyboardInterrupt
  sys.meta_path.insert(0, Stop())
elif case == 'ENOSPC':  # Orbax's own writes fail in its threads, as on a full disk
  from orbax.checkpoint._src.path import async_path
  async def full(path, data):
    raise OSError(errno.ENOSPC, 'No space left on device', str(path))
  async_path.write_text = async_path.write_bytes = full
else:
  from transformer_nmt.checkpoint import Checkpointer
  save = Checkpointer.save_params
  def stopped(self, step, params):
    os.kill(os.getpid(), getattr(signal, case))
    save(self, step, params)
  Checkpointer.save_params = stopped
sys.argv = ['import_marian.py', '--from', source, '--workdir', workdir]
runpy.run_path('import_marian.py', run_name='__main__')
'''


@pytest.mark.parametrize('case, code, says', [
    ('imports', 130, 'error: interrupted'),
    ('SIGINT', 130, 'error: interrupted; nothing was written to --workdir='),
    ('SIGTERM', 130, 'error: terminated (SIGTERM); nothing was written to --workdir='),
    ('ENOSPC', 2, 'error: no space left on the disk of --workdir='),
    ('SIGKILL', -9, None)])
def test_a_stop_while_importing_is_one_line_and_leaves_no_partial_workdir(
    marian_dir, tmp_path, case, code, says):
  """Each ends in one line without a traceback (or Orbax's logging) and removes the partial
  workdir; SIGKILL cannot be handled and leaves it, and the next import removes it (its
  process is gone) but not one whose process lives."""
  from transformer_nmt.interop.marian import import_checkpoint
  workdir = tmp_path / 'out' / 'run'
  result = subprocess.run([sys.executable, '-c', _INJECT, case, str(marian_dir), str(workdir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == code, result.stderr[-2000:]
  assert 'Traceback' not in result.stderr and '[process=' not in result.stderr, result.stderr
  left = sorted(p.name for p in (tmp_path / 'out').iterdir()) if workdir.parent.exists() else []
  if case != 'SIGKILL':
    errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
    assert len(errors) == 1 and says in errors[0], result.stderr[-2000:]
    assert left == []
    return
  assert len(left) == 1 and left[0].startswith('.run.') and left[0].endswith('.partial')
  host_and_rest = left[0].split('@', 1)[1]
  living = workdir.parent / f'.run.{os.getpid()}@{host_and_rest}'  # this process: alive
  living.mkdir()
  import_checkpoint(marian_dir, workdir)
  assert sorted(p.name for p in workdir.parent.iterdir()) == [living.name, 'run']

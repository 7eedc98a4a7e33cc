import importlib

import pytest

from transformer_nmt.config import default_config
from transformer_nmt.decoding.settings import DECODE
from transformer_nmt.errors import ConfigError
from transformer_nmt.typed_config import model_config_from_dict, sections, validate_config

CONFIGS = ['base', 'big', 'small', 'demo', 'tiny']


@pytest.mark.parametrize('name', CONFIGS)
def test_every_config_validates(name):
  validate_config(importlib.import_module(f'configs.{name}').get_config())


def test_paper_table3_values():
  from configs import base, big
  b, g = base.get_config(), big.get_config()
  assert (b.model.num_layers, b.model.d_model, b.model.d_ff, b.model.num_heads) == (6, 512, 2048, 8)
  assert b.model.residual_dropout == b.model.embedding_dropout == 0.1
  assert (g.model.d_model, g.model.d_ff, g.model.num_heads, g.model.residual_dropout) == (
      1024, 4096, 16, 0.3)
  assert (b.train.adam_b1, b.train.adam_b2, b.train.adam_eps) == (0.9, 0.98, 1e-9)
  assert b.model.norm_position == 'post' and b.model.positional_encoding == 'interleaved'


def _base():
  from configs import base
  return base.get_config()


@pytest.mark.parametrize('mutate, message', [
    (lambda c: c.model.update(num_heads=7), 'not divisible'),
    (lambda c: c.model.update(attention_dropout=1.0), 'attention_dropout=1.0 must be in'),
    (lambda c: c.model.update(target_word_dropout=-0.1),
     'model.target_word_dropout=-0.1 must be in'),
    (lambda c: c.model.update(positional_encoding='learned'), 'positional_encoding'),
    (lambda c: c.model.update(dropout_bits=8), 'model.dropout_bits=8 must be 16 or 32'),
    (lambda c: c.model.update(num_decoder_layers=-1),
     r'model.num_decoder_layers=-1 must be 0 \(model.num_layers\) or positive'),
    (lambda c: c.model.update(dtype='float16'), 'model.dtype'),
    (lambda c: c.train.update(num_steps=0), 'train.num_steps=0 must be positive'),
    (lambda c: c.data.update(tokens_per_batch=-5), 'data.tokens_per_batch=-5'),
    (lambda c: c.data.update(extra_train_src=('a.fr', 'a.cs'), extra_train_tgt=('a.en',)),
     'data.extra_train_src and data.extra_train_tgt pair up one to one, but list 2 and 1 files'),
    (lambda c: c.data.update(extra_train_src=('a.fr',), extra_train_tgt=('',)),
     'data.extra_train_src and data.extra_train_tgt list an empty file name'),
    (lambda c: c.data.update(extra_test_src=('t.de',), extra_test_tgt=()),
     'data.extra_test_src and data.extra_test_tgt pair up one to one, but list 1 and 0 files'),
    (lambda c: c.data.update(source='tfds', extra_train_src=('a.fr',), extra_train_tgt=('a.en',)),
     "data.extra_train_src needs data.source='text'"),
    (lambda c: c.train.update(typo_key=1), 'unknown option train.typo_key'),
    (lambda c: c.update(extra={'a': 1}), "unknown config section 'extra'"),
    (lambda c: c.decode.update(beam_size=0), 'decode.beam_size=0 must be positive'),
    (lambda c: c.decode.update(beam_stop='never'), "decode.beam_stop='never' must be one of"),
    (lambda c: c.decode.update(max_extra_len=-1), 'decode.max_extra_len'),
    (lambda c: c.decode.update(mbr='ter'), r"decode.mbr='ter' must be one of \['off', 'bleu'"),
    (lambda c: c.decode.update(mbr='chrf', temperature=0.7),
     "decode.mbr='chrf' chooses among beam search hypotheses: it needs decode.temperature=0"),
    (lambda c: c.eval.update(max_extra_len=50), 'eval.max_extra_len is now decode.max_extra_len'),
    (lambda c: c.data.update(source='csv'), "data.source='csv' must be"),
    (lambda c: c.data.update(pack_length=8, max_len=16), 'data.pack_length=8 must be 0'),
    (lambda c: c.data.update(joint_vocab=False), 'needs model.share_embeddings=False'),
])
def test_bad_values_name_the_option(mutate, message):
  c = _base()
  with c.unlocked():
    mutate(c)
  with pytest.raises(ConfigError, match=message):
    validate_config(c)


def test_wrong_types_name_the_option():
  c = _base()
  with c.ignore_type():  # a hand-built config file can bypass ConfigDict's own type check
    c.train.warmup_steps = 'many'
  with pytest.raises(ConfigError, match='train.warmup_steps=.many. should be of type int'):
    validate_config(c)


def test_model_config_rejects_unknown_keys():
  with pytest.raises(ConfigError, match='unknown model option'):
    model_config_from_dict({'d_modle': 512})


def test_defaults_are_the_papers_and_every_section_is_there():
  c = default_config()
  assert sorted(c) == ['data', 'decode', 'eval', 'model', 'train']
  assert 'vocab_size' not in c.model  # the tokenizer decides it
  assert (c.model.num_layers, c.model.d_model, c.model.d_ff, c.model.num_heads) == (6, 512, 2048,
                                                                                     8)
  assert (DECODE.beam_size, DECODE.alpha, DECODE.max_extra_len) == (4, 0.6, 50)  # paper §6.1
  assert c.train.warmup_steps == 4000 and c.train.label_smoothing == 0.1  # eq. 3, §5.4
  assert validate_config(c).data.tfds_splits == ('train', 'validation', 'test')


@pytest.mark.parametrize('section, value, message', [
    ('decode', {'beam_size': 2.5}, 'decode.beam_size=2.5 should be of type int'),
    ('decode', {'chunk': None}, 'decode.chunk=None should be of type int'),
    ('eval', None, "config section 'eval' must be a mapping"),
])
def test_stored_configs_with_bad_values_are_refused(section, value, message):
  with pytest.raises(ConfigError, match=message):
    validate_config({section: value})


def test_typed_sections_carry_overrides():
  c = _base()
  c.decode.update(beam_size=8, chunk=2)
  c.data.update(bucket_boundaries=[8, 16])
  typed = validate_config(c)
  assert (typed.decode.beam_size, typed.decode.chunk) == (8, 2)
  assert typed.data.bucket_boundaries == (8, 16) and typed.train.num_steps == 100_000


@pytest.mark.parametrize('option, value, message', [
    ('alpha', float('nan'), 'decode.alpha=nan must be a finite number, 0 or more'),
    ('alpha', float('inf'), 'decode.alpha=inf must be a finite number'),
    ('alpha', -0.5, 'decode.alpha=-0.5 must be a finite number, 0 or more'),
    ('temperature', float('nan'), 'decode.temperature=nan must be a finite number'),
    ('temperature', float('inf'), 'decode.temperature=inf must be a finite number'),
    ('beam_size', -4, 'decode.beam_size=-4 must be positive'),
    ('max_extra_len', -1, r'decode.max_extra_len=-1 must be 0 \(off\) or positive'),
    ('top_k', -1, r'decode.top_k=-1 must be 0 \(off\) or positive'),
    ('no_repeat_ngram', -2, r'decode.no_repeat_ngram=-2 must be 0 \(off\) or positive'),
    ('seed', 2 ** 40, r'decode.seed=1099511627776 must be below 2\*\*31'),
    ('beam_size', 2 ** 31, r'decode.beam_size=2147483648 must be below 2\*\*31'),
])
def test_every_numeric_decoding_option_is_checked(option, value, message):
  """NaN slips past every comparison and inf past every upper bound: both ran every line to
  its length limit and exited 0 (issue 52 #12)."""
  import dataclasses
  with pytest.raises(ConfigError, match=message):
    dataclasses.replace(DECODE, **{option: value})  # checked when made


@pytest.mark.parametrize('sizes', [(-1, 5, 5), (0, 5, 5), (10, 5), (10, 5, 5.5)])
def test_demo_sizes_are_three_counts(sizes):
  c = _base()
  c.data.demo_sizes = sizes
  with pytest.raises(ConfigError, match='data.demo_sizes=.* must be three counts of demo pairs'):
    validate_config(c)


@pytest.mark.parametrize('name', CONFIGS)
def test_typed_sections_give_back_the_config_as_config_json_stores_it(name):
  """train.py writes Sections.to_dict() into config.json where it wrote config.to_dict():
  the same JSON for every config file."""
  import json
  config = importlib.import_module(f'configs.{name}').get_config()
  typed = validate_config(config)
  assert json.dumps(typed.to_dict(), default=list) == json.dumps(config.to_dict(), default=list)
  assert sections(typed.to_dict()) == typed

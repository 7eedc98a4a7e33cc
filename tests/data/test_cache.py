"""data.cache: the encoded training split is stored once and mapped by later starts; a changed
corpus or tokenizer is encoded again, a damaged entry is rebuilt with a warning."""

import logging
import pathlib

import numpy as np
import pytest

from configs import tiny
from transformer_nmt.data import cache
from transformer_nmt.data import corpus as corpus_lib
from transformer_nmt.errors import DataError
from transformer_nmt.typed_config import sections


@pytest.fixture
def setup(parallel_files, tmp_path):
  c = tiny.get_config()
  c.data.update(source='text', train_src=str(parallel_files[0]), train_tgt=str(parallel_files[1]),
                valid_src=str(parallel_files[0]), valid_tgt=str(parallel_files[1]),
                vocab_size=60, max_len=20)
  d = sections(c).data
  corpus = corpus_lib.read_corpus(d, tmp_path)
  toks = corpus_lib.tokenizers(d, corpus, tmp_path)
  return c, toks, tmp_path / 'cache'


def _train(c, toks, directory, forbid_text=False):
  d = sections(c).data
  corpus = corpus_lib.read_corpus(d, pathlib.Path('unused: text files are named'))
  if forbid_text:
    corpus.read_train = lambda: pytest.fail('the training text was read')
  return corpus_lib.encode_train(d, corpus, *toks, directory)


def _same(a, b):
  assert [x.tolist() for x in a.src] == [x.tolist() for x in b.src]
  assert [x.tolist() for x in a.tgt] == [x.tolist() for x in b.tgt]
  assert a.index.tolist() == b.index.tolist() and a.stats == b.stats
  assert a.boundaries == b.boundaries


def _entries(directory):
  return sorted(p.name for p in directory.iterdir())


def test_first_start_stores_later_ones_map_without_reading_text(setup):
  c, toks, directory = setup
  plain = _train(c, toks, None)  # no cache: encoded from the text
  assert plain.stats.too_long > 0 and plain.stats.empty == 1  # max_len 20 drops some
  first = _train(c, toks, directory)
  _same(first, plain)
  assert len(_entries(directory)) == 1
  again = _train(c, toks, directory, forbid_text=True)
  _same(again, plain)
  assert isinstance(again.src.ids, np.memmap) and again.src.ids.dtype == np.uint16


def test_a_changed_corpus_or_tokenizer_is_encoded_again(setup, parallel_files, tmp_path):
  c, toks, directory = setup
  before = _train(c, toks, directory)
  with open(parallel_files[0], 'a') as f, open(parallel_files[1], 'a') as g:
    f.write('I have 9 .\n')
    g.write('Ich habe 9 .\n')
  grown = _train(c, toks, directory)
  assert len(grown) == len(before) + 1 and len(_entries(directory)) == 2
  c.data.spm_model_type = 'bpe'  # another tokenizer
  (tmp_path / 'other').mkdir()
  d = sections(c).data
  other = corpus_lib.tokenizers(d, corpus_lib.read_corpus(d, tmp_path), tmp_path / 'other')
  assert other[0].fingerprint != toks[0].fingerprint
  _train(c, other, directory)
  assert len(_entries(directory)) == 3
  c.data.max_len = 28  # another length limit keeps other pairs
  assert len(_train(c, toks, directory)) > len(grown) and len(_entries(directory)) == 4


def _truncate(path):
  path.write_bytes(path.read_bytes()[:-7])


def _bad_header(path):
  raw = bytearray(path.read_bytes())
  raw[:6] = b'NOTNPY'
  path.write_bytes(bytes(raw))


def _other_lengths(path):
  np.save(path, np.arange(5, dtype=np.int64))


def _flipped_id(path):
  raw = bytearray(path.read_bytes())
  raw[-3] ^= 1  # a valid file whose content changed: only the checksum tells
  path.write_bytes(bytes(raw))


@pytest.mark.parametrize('name,damage', [('src_ids.npy', _truncate),
                                         ('tgt_offsets.npy', _bad_header),
                                         ('src_offsets.npy', _other_lengths),
                                         ('tgt_ids.npy', _flipped_id),
                                         ('manifest.json', _truncate)])
def test_a_damaged_entry_is_rebuilt_with_one_warning(setup, caplog, name, damage):
  c, toks, directory = setup
  good = _train(c, toks, None)  # not the entry's mapping, which the damage below changes
  _train(c, toks, directory)
  (entry,) = directory.iterdir()
  damage(entry / name)
  with caplog.at_level(logging.WARNING):
    rebuilt = _train(c, toks, directory)
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and 'damaged' in warnings[0].getMessage()
  _same(rebuilt, good)
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    _same(_train(c, toks, directory, forbid_text=True), good)  # the rebuilt entry is used
  assert not caplog.records


def test_an_unwritable_cache_directory_is_one_clear_error(setup):
  c, toks, directory = setup
  directory.write_text('a file, not a directory')
  with pytest.raises(DataError, match='data.cache_dir'):
    _train(c, toks, directory)


def test_an_entry_is_complete_or_absent(setup, monkeypatch):
  c, toks, directory = setup
  monkeypatch.setattr(cache.np, 'save', lambda *a, **k: (_ for _ in ()).throw(OSError(28, 'full')))
  with pytest.raises(DataError, match='cannot write'):
    _train(c, toks, directory)
  assert _entries(directory) == []  # no half-written entry, no temporary left behind

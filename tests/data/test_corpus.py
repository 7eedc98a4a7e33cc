"""Reading the configured corpora: the demo generator and Multi30k (skipped without ../shared)."""

import pytest
from conftest import SHARED_DATA

from configs import small, tiny
from transformer_nmt.data import corpus as corpus_lib
from transformer_nmt.errors import ConfigError
from transformer_nmt.typed_config import sections


def test_demo_source_generates_and_reads(tmp_path):
  c = tiny.get_config()
  corpus = corpus_lib.read_corpus(sections(c).data, tmp_path)
  assert len(corpus.train[0]) == 400 and len(corpus.valid[0]) == 20 and len(corpus.test[0]) == 20
  assert (tmp_path / 'demo_data' / 'train.de').exists()


def test_text_source_needs_file_paths(tmp_path):
  c = small.get_config()
  c.data.train_src = ''
  with pytest.raises(ConfigError, match='data.train_src is empty'):
    corpus_lib.read_corpus(sections(c).data, tmp_path)


@pytest.mark.skipif(not (SHARED_DATA / 'multi30k' / 'train.en').exists(),
                    reason='../shared/data/multi30k is not present')
def test_small_config_reads_multi30k(tmp_path):
  c = small.get_config()
  for key in ('train_src', 'train_tgt', 'valid_src', 'valid_tgt', 'test_src', 'test_tgt'):
    c.data[key] = str(SHARED_DATA / 'multi30k' / c.data[key].rsplit('/', 1)[-1])
  corpus = corpus_lib.read_corpus(sections(c).data, tmp_path)
  src, tgt, stats = corpus.train
  assert stats.lines == 29000 and stats.kept + stats.empty == 29000
  assert len(src) == len(tgt) == stats.kept
  assert corpus.valid[2].lines == 1014 and corpus.test[2].lines == 1000
  assert all(line == line.strip() for line in src[:2000])  # stray spaces are stripped


def test_separate_vocabularies_train_two_models(tmp_path):
  c = tiny.get_config()
  c.data.joint_vocab = False
  d = sections(c).data
  corpus = corpus_lib.read_corpus(d, tmp_path)
  src_tok, tgt_tok = corpus_lib.tokenizers(d, corpus, tmp_path)
  assert (tmp_path / 'spm.src.model').exists() and (tmp_path / 'spm.tgt.model').exists()
  assert src_tok.path != tgt_tok.path
  de_only = (set(tgt_tok.pieces(range(tgt_tok.vocab_size)))
             - set(src_tok.pieces(range(src_tok.vocab_size))))
  assert any('ü' in p or 'ä' in p or 'zig' in p for p in de_only)  # German-only subwords


def test_extra_training_pairs_follow_the_main_ones(tmp_path):
  """data.extra_train_*: appended in order, counted, and in SentencePiece's training text."""
  c = tiny.get_config()
  main = corpus_lib.read_corpus(sections(c).data, tmp_path)
  (tmp_path / 'more.fr').write_text('le chat noir\n\nle garçon rouge\n', encoding='utf-8')
  (tmp_path / 'more.de').write_text('die schwarze Katze\nleer\ndas rote Haus\n', encoding='utf-8')
  c.data.update(source='text', extra_train_src=(str(tmp_path / 'more.fr'),),
                extra_train_tgt=(str(tmp_path / 'more.de'),),
                **{f'{split}_{side}': str(tmp_path / 'demo_data' / f'{split}.{lang}')
                   for split in ('train', 'valid', 'test') for side, lang in (('src', 'en'),
                                                                             ('tgt', 'de'))})
  d = sections(c).data
  src, tgt, stats = corpus_lib.read_corpus(d, tmp_path).train
  n = len(main.train[0])
  assert src[:n] == main.train[0] and tgt[:n] == main.train[1]
  assert src[n:] == ['le chat noir', 'le garçon rouge']
  assert tgt[n:] == ['die schwarze Katze', 'das rote Haus']
  assert (stats.lines, stats.kept, stats.empty) == (n + 3, n + 2, 1)
  with_extra, _ = corpus_lib.tokenizers(d, corpus_lib.read_corpus(d, tmp_path), tmp_path)
  (tmp_path / 'main').mkdir()
  without, _ = corpus_lib.tokenizers(d, main, tmp_path / 'main')
  # 'ç' occurs only in the extra pairs: a piece of its own, not the unknown id.
  assert without.unk_id in without.encode(['garçon'])[0]
  assert with_extra.unk_id not in with_extra.encode(['garçon'])[0]

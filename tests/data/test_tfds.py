"""data.source='tfds' with tfds.testing.mock_data: no download, no TensorFlow."""

import dataclasses
import json

import pytest

tfds = pytest.importorskip('tensorflow_datasets')

from configs import tiny  # noqa: E402
from transformer_nmt.data import tfds as tfds_data  # noqa: E402
from transformer_nmt.errors import ConfigError, DataError  # noqa: E402
from transformer_nmt.training import loop as trainer  # noqa: E402
from transformer_nmt.typed_config import sections, validate_config  # noqa: E402


def tfds_config(**data):
  c = tiny.get_config()
  settings = dict(source='tfds', tfds_name='wmt14_translate/de-en', src_lang='de',
                  tgt_lang='en', vocab_size=60, max_len=48)
  c.data.update({**settings, **data})
  c.train.update(num_steps=4, log_every=2, eval_every=4, checkpoint_every=4)
  c.eval.update(bleu_sentences=4)
  return c


@pytest.mark.slow
def test_train_on_mock_wmt14_de_to_en(tmp_path):
  with tfds.testing.mock_data(num_examples=24):
    trainer.train_and_evaluate(validate_config(tfds_config()), str(tmp_path / 'run'))
  metrics = (tmp_path / 'run' / 'metrics.jsonl').read_text()
  rows = [json.loads(line) for line in metrics.splitlines()]
  assert [r['step'] for r in rows if 'train_loss' in r] == [2, 4]
  assert {'eval_loss', 'eval_bleu', 'valid_bleu', 'test_bleu'} <= set(rows[-1])
  assert (tmp_path / 'run' / 'checkpoints' / '4').is_dir()
  assert (tmp_path / 'run' / 'spm.model').exists()


def test_each_process_reads_its_own_share_of_the_training_split():
  c = tfds_config(tfds_name='wmt17_translate/de-en')
  with tfds.testing.mock_data(num_examples=10):
    d = sections(c).data
    whole = tfds_data.read_split(d, 'train')
    shares = [tfds_data.read_split(d, 'train', shard=(i, 3)) for i in range(3)]
    first = tfds_data.read_split(d, 'train', limit=4)
  assert [len(s[0]) for s in shares] == [3, 3, 4]
  assert first[0] == whole[0][:4]
  assert sum((s[0] for s in shares), []) == whole[0]  # disjoint, in order, nothing lost
  assert sum((s[1] for s in shares), []) == whole[1]


def test_bad_tfds_settings_give_clear_errors(tmp_path):
  with tfds.testing.mock_data(num_examples=4):
    with pytest.raises(ConfigError, match=r"features \['de', 'en'\]"):
      tfds_data.read_split(sections(tfds_config(src_lang='fr')).data, 'train')
  with pytest.raises(DataError, match='tfds build wmt14_translate'):
    tfds_data.read_split(sections(tfds_config(tfds_data_dir=str(tmp_path))).data, 'train')


def test_a_process_share_is_encoded_once_then_mapped(tmp_path):
  from transformer_nmt.data import corpus as corpus_lib
  c = tfds_config(max_train_examples=12)
  directory = tmp_path / 'cache'
  with tfds.testing.mock_data(num_examples=16):
    d = sections(c).data
    corpus = corpus_lib.read_corpus(d, tmp_path)
    toks = corpus_lib.tokenizers(d, corpus, tmp_path)
    first = corpus_lib.encode_train(d, corpus, *toks, directory)
    again = corpus_lib.read_corpus(d, tmp_path)
    again.read_train = lambda: pytest.fail('the training split was read')
    mapped = corpus_lib.encode_train(d, again, *toks, directory)
    assert [x.tolist() for x in mapped.tgt] == [x.tolist() for x in first.tgt]
    d = dataclasses.replace(d, max_train_examples=8)  # another share of the split: another entry
    fewer = corpus_lib.encode_train(d, corpus_lib.read_corpus(d, tmp_path), *toks, directory)
    ident = tfds_data.split_identity(d, 'train', 8, (1, 4))[0]
  assert len(fewer.index) < len(first.index) and len(list(directory.iterdir())) == 2
  assert ident['tfds'] == 'wmt14_translate/de-en/1.0.0' and ident['shard'] == [1, 4]


def test_a_share_is_read_and_encoded_a_chunk_at_a_time(tmp_path, monkeypatch):
  """Encoding a tfds share into the cache never holds its text whole: the share is read in
  chunks (data/cache.py's CHUNK examples), with the same pairs and counts as a whole read."""
  from transformer_nmt.data import cache
  from transformer_nmt.data import corpus as corpus_lib
  c = tfds_config(max_train_examples=15)
  monkeypatch.setattr(cache, 'CHUNK', 4)
  with tfds.testing.mock_data(num_examples=16):
    d = sections(c).data
    whole = tfds_data.read_split(d, 'train', 15, (0, 1))
    chunks = list(tfds_data.read_chunks(d, 'train', 15, (0, 1), size=4))
    corpus = corpus_lib.read_corpus(d, tmp_path)
    toks = corpus_lib.tokenizers(d, corpus, tmp_path)  # trained on the text read whole
    read_whole = corpus_lib.encode_train(d, corpus, *toks, tmp_path / 'a')
    streamed_corpus = corpus_lib.read_corpus(d, tmp_path)
    streamed_corpus.read_train = lambda: pytest.fail('the training split was read whole')
    streamed = corpus_lib.encode_train(d, streamed_corpus, *toks, tmp_path / 'b')
  assert [len(src) for src, _, _ in chunks][:3] == [4, 4, 4] and len(chunks) == 4
  assert sum((src for src, _, _ in chunks), []) == whole[0]
  assert sum((tgt for _, tgt, _ in chunks), []) == whole[1]
  assert sum(s.lines for _, _, s in chunks) == whole[2].lines == 15
  assert [x.tolist() for x in streamed.src] == [x.tolist() for x in read_whole.src]
  assert [x.tolist() for x in streamed.tgt] == [x.tolist() for x in read_whole.tgt]
  assert streamed.index.tolist() == read_whole.index.tolist()
  assert (streamed.stats.lines, streamed.stats.kept, streamed.stats.empty) == (
      read_whole.stats.lines, read_whole.stats.kept, read_whole.stats.empty)

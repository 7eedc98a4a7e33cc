"""From a config's `data` section (DataConfig) to tokenised datasets: read (or generate) text,
load or train SentencePiece in the workdir, encode and bucket."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import shutil
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from transformer_nmt import sharding
from transformer_nmt.config import DataConfig
from transformer_nmt.data import batching as data_lib
from transformer_nmt.data import cache
from transformer_nmt.data.tokenizer import Tokenizer, train_tokenizer
from transformer_nmt.errors import ConfigError
from transformer_nmt.workdir import Workdir

Lines = tuple[list[str], list[str], data_lib.ReadStats]


@dataclasses.dataclass
class Corpus:
  """Raw text of each split; `test` is None when no test files are configured.

  The training text is read when first asked for (`train`): a start that maps the encoded
  pairs from the cache (data/cache.py) with a tokenizer already trained never reads it.
  `train_files`: what identifies the text (`cache.file_identity` of its files; for tfds the
  dataset, this process's share and the split's files); empty: no cache.
  `host_sharded`: this process holds only its own share of the training split (tfds with
  several processes), so its batches are its own rows of the global batch.
  `train_chunks`: the training text a chunk at a time (tfds), so that encoding it into the
  cache never holds it whole; None: `train` is encoded.
  """

  read_train: Callable[[], Lines]
  valid: Lines
  test: Optional[Lines]
  host_sharded: bool = False
  train_files: Callable[[], list[dict]] = list
  train_chunks: Optional[Callable[[], Iterator[Lines]]] = None
  _train: Optional[Lines] = dataclasses.field(default=None, repr=False)

  @property
  def train(self) -> Lines:
    if self._train is None:
      self._train = self.read_train()
    return self._train


def _paths(data_cfg: DataConfig, split: str) -> tuple[str, str]:
  return getattr(data_cfg, f'{split}_src'), getattr(data_cfg, f'{split}_tgt')


def read_corpus(data_cfg: DataConfig, workdir: pathlib.Path) -> Corpus:
  """Reads the configured files (generating the demo corpus first for source='demo')."""
  if data_cfg.source == 'tfds':
    return _read_tfds(data_cfg)
  if data_cfg.source == 'demo':
    from transformer_nmt.data import demo as demo_data  # only the demo needs the generator
    if sharding.is_leader():  # one writer; the other processes read its files
      demo_data.write_demo_corpus(Workdir(workdir).demo_data, *data_cfg.demo_sizes, seed=0)
    sharding.barrier('demo corpus written')
    paths = {split: (str(Workdir(workdir).demo_data / f'{split}.en'),
                     str(Workdir(workdir).demo_data / f'{split}.de'))
             for split in ('train', 'valid', 'test')}
  elif data_cfg.source == 'text':
    paths = {split: _paths(data_cfg, split) for split in ('train', 'valid', 'test')}
    for split in ('train', 'valid'):
      for side, path in zip(('src', 'tgt'), paths[split]):
        if not path:
          raise ConfigError(f'data.{split}_{side} is empty: give the {split} file, e.g. '
                            f'--config.data.{split}_{side}=PATH')
  else:
    raise ConfigError(f"data.source={data_cfg.source!r} must be 'text', 'tfds' or 'demo'")
  test = paths['test'] if all(paths['test']) else None
  # read later (see Corpus): the file names are taken now, from the config as it is now
  train = [paths['train'], *zip(data_cfg.extra_train_src, data_cfg.extra_train_tgt)]
  # the demo corpus is written anew at every start: only its content tells a change
  by_content = data_cfg.source == 'demo'
  return Corpus(read_train=lambda: _read_train(train),
                valid=data_lib.read_parallel(*paths['valid']),
                test=data_lib.read_parallel(*test) if test else None,
                train_files=lambda: [cache.file_identity(f, by_content)
                                     for pair in train for f in pair])


def _read_train(pairs: list[tuple[str, str]]) -> Lines:
  """The training pairs of train_* followed by those of each extra_train_* pair of files."""
  src, tgt, stats = data_lib.read_parallel(*pairs[0])
  for extra in pairs[1:]:
    more_src, more_tgt, more = data_lib.read_parallel(*extra)
    logging.info('Training pairs from %s and %s: %d kept of %d (%d with an empty side)',
                 *extra, more.kept, more.lines, more.empty)
    src, tgt = src + more_src, tgt + more_tgt
    stats = data_lib.ReadStats(lines=stats.lines + more.lines, kept=stats.kept + more.kept,
                               empty=stats.empty + more.empty)
  return src, tgt, stats


def _read_tfds(data_cfg: DataConfig) -> Corpus:
  import jax

  from transformer_nmt.data import tfds as tfds_data
  train, valid, test = data_cfg.tfds_splits
  share = (data_cfg.max_train_examples, (jax.process_index(), jax.process_count()))
  return Corpus(  # data_cfg is frozen: what is read later (see Corpus) is what it says now
      read_train=lambda: tfds_data.read_split(data_cfg, train, *share),
      valid=tfds_data.read_split(data_cfg, valid),
      test=tfds_data.read_split(data_cfg, test) if test else None,
      host_sharded=share[1][1] > 1,
      train_files=lambda: tfds_data.split_identity(data_cfg, train, *share),
      train_chunks=lambda: tfds_data.read_chunks(data_cfg, train, *share, size=cache.CHUNK))


def tokenizers(data_cfg: DataConfig, corpus: Corpus,
               workdir: pathlib.Path) -> tuple[Tokenizer, Tokenizer]:
  """(source, target) tokenizers: reused from the workdir, copied from data.spm_model, or trained.

  A joint vocabulary is one model trained on source and target text (paper §5.1); otherwise
  each side gets its own model. Only process 0 trains; the others load its files.
  """
  trained: list = []
  sharding.on_leader(lambda: trained.append(_tokenizers(data_cfg, corpus, workdir)))
  return trained[0] if trained else _tokenizers(data_cfg, corpus, workdir)


def _tokenizers(data_cfg: DataConfig, corpus: Corpus,
                workdir: pathlib.Path) -> tuple[Tokenizer, Tokenizer]:
  src_path, tgt_path = Workdir(workdir).tokenizer_paths(data_cfg.joint_vocab)
  table = Workdir(workdir).tokenizer_table()  # an imported model's (train.init_from copies it)
  if data_cfg.joint_vocab:
    tok = _load_or_train(data_cfg, src_path, lambda: corpus.train[0] + corpus.train[1],
                         data_cfg.spm_model, table)
    return tok, tok
  if data_cfg.spm_model:
    raise ConfigError('data.spm_model gives one shared model; it needs data.joint_vocab=True')
  return (_load_or_train(data_cfg, src_path, lambda: corpus.train[0], '', table),
          _load_or_train(data_cfg, tgt_path, lambda: corpus.train[1], '', table))


def _load_or_train(data_cfg: DataConfig, path: pathlib.Path,
                   text: Callable[[], list[str]], given: str,
                   table: Optional[pathlib.Path] = None) -> Tokenizer:
  """The model at `path` (with the workdir's piece table, if any); else a copy of `given`;
  else one trained on `text()`."""
  if path.exists():
    logging.info('Reusing SentencePiece model %s', path)
    return Tokenizer(path, table)
  if given:
    Tokenizer(given)  # fail with a clear message before copying anything
    shutil.copyfile(given, path)
    return Tokenizer(path)
  lines = text()
  logging.info('Training SentencePiece (%s, up to %d pieces) on %d lines -> %s',
               data_cfg.spm_model_type, data_cfg.vocab_size, len(lines), path)
  tok = train_tokenizer(lines, path, vocab_size=data_cfg.vocab_size,
                        model_type=data_cfg.spm_model_type,
                        max_sentences=data_cfg.spm_max_sentences)
  if tok.vocab_size < data_cfg.vocab_size:  # vocab_size is a soft limit for small corpora
    logging.warning('SentencePiece made %d pieces, fewer than data.vocab_size=%d: the text has '
                    'no more; the model uses %d', tok.vocab_size, data_cfg.vocab_size,
                    tok.vocab_size)
  return tok


def encode(lines: Lines, src_tok: Tokenizer, tgt_tok: Tokenizer, data_cfg: DataConfig,
           train: bool) -> data_lib.ParallelData:
  """Tokenises one split; only the training split drops pairs over data.max_len."""
  src, tgt, stats = lines
  stats = dataclasses.replace(stats)
  boundaries = list(data_cfg.bucket_boundaries) if train and data_cfg.bucket_boundaries else None
  return data_lib.encode_parallel(src, tgt, src_tok, tgt_tok, stats=stats, boundaries=boundaries,
                                  max_len=data_cfg.max_len if train else None)


def encode_train(data_cfg: DataConfig, corpus: Corpus, src_tok: Tokenizer,
                 tgt_tok: Tokenizer, directory: Optional[pathlib.Path]) -> data_lib.ParallelData:
  """The training split encoded, through the cache in `directory` (data/cache.py) when given
  and the text comes from files: mapped when an entry matches, else encoded and stored.
  Process 0 writes the entry first; the others then map it (or, when their cache directory
  is not the same one, write their own)."""
  files = corpus.train_files() if directory is not None else []
  if not files:
    return encode(corpus.train, src_tok, tgt_tok, data_cfg, train=True)
  key = cache.cache_key(files, src_tok, tgt_tok, data_cfg.max_len)
  if corpus.train_chunks is not None and corpus._train is None:  # not read whole before
    encode_text = lambda: _encode_streamed(corpus.train_chunks(), src_tok, tgt_tok,
                                           data_cfg.max_len)
  else:
    encode_text = lambda: cache.encode(*corpus.train, src_tok, tgt_tok, data_cfg.max_len)
  mine: list[cache.Encoded] = []
  sharding.on_leader(lambda: mine.append(cache.load_or_encode(directory, key, encode_text)))
  found = mine[0] if mine else cache.load_or_encode(directory, key, encode_text)
  boundaries = (list(data_cfg.bucket_boundaries) if data_cfg.bucket_boundaries
                else data_lib.bucket_boundaries(data_cfg.max_len))
  return data_lib.ParallelData(found.src, found.tgt, found.index, tgt_tok.pad_id, tgt_tok.bos_id,
                               boundaries, dataclasses.replace(found.stats))


def _encode_streamed(chunks: Iterator[Lines], src_tok: Tokenizer, tgt_tok: Tokenizer,
                     max_len: int) -> cache.Encoded:
  """`cache.encode_chunks` of a reader's chunks, their read counts summed as they pass."""
  stats = data_lib.ReadStats()

  def counted() -> Iterator[tuple[list[str], list[str]]]:
    for src, tgt, part in chunks:
      stats.lines += part.lines
      stats.empty += part.empty
      yield src, tgt
  return cache.encode_chunks(counted(), stats, src_tok, tgt_tok, max_len)


def sampled_epochs(text: Callable[[], Lines], src_tok: Tokenizer, tgt_tok: Tokenizer,
                   data_cfg: DataConfig,
                   seed: int) -> Callable[[int], data_lib.ParallelData]:
  """Subword regularisation (data.spm_alpha > 0): epoch -> the training split segmented by
  SentencePiece sampling, the same for the same (seed, epoch), another for another epoch.
  Pairs that the sampled segmentation makes longer than data.max_len are left out of that
  epoch (counted in the log). Validation and test text is never sampled. `text()` is
  called at the first epoch (in the thread that builds batches, data/prefetch.py).

  The text is sampled `cache.CHUNK` pairs at a time, chunk k > 0 seeded by (seed, epoch, k),
  so that only one chunk's id lists are held at once; the first chunk keeps the seed
  (seed, epoch) of the unchunked sampling before it, so that smaller corpora (Multi30k)
  are segmented as they were."""
  boundaries = (list(data_cfg.bucket_boundaries) if data_cfg.bucket_boundaries
                else data_lib.bucket_boundaries(data_cfg.max_len))

  def epoch_data(epoch: int) -> data_lib.ParallelData:
    def sampled(tok: Tokenizer, lines: Sequence[str], side: str, chunk: int) -> list[list[int]]:
      state = np.random.SeedSequence([seed, epoch] + ([chunk] if chunk else [])).generate_state(2)
      return tok.sample(lines, seed=int(state[int(side == 'tgt')]), alpha=data_cfg.spm_alpha,
                        nbest=data_cfg.spm_nbest)
    src, tgt, stats = text()
    found = cache.encode(src, tgt, stats, src_tok, tgt_tok, data_cfg.max_len, sampled)
    data = data_lib.ParallelData(found.src, found.tgt, found.index, tgt_tok.pad_id,
                                 tgt_tok.bos_id, boundaries, found.stats)
    logging.info('Epoch %d: training pairs segmented anew by subword sampling (%d kept, %d '
                 'over data.max_len)', epoch, data.stats.kept, data.stats.too_long)
    return data
  return epoch_data

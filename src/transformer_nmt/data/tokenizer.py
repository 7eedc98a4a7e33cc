"""SentencePiece subword tokenizer: training on parallel text, and id <-> text conversion.

Special ids are fixed at training time (pad 0, unk 1, bos 2, eos 3) and always read back
from the model, never assumed by other modules.
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import random
from typing import Iterable, Sequence

import sentencepiece as spm

from transformer_nmt.errors import DataError
from transformer_nmt.files import write_atomically


class Tokenizer:
  """A loaded SentencePiece model with the ids the model and decoders need."""

  def __init__(self, path: str | os.PathLike):
    self.path = pathlib.Path(path)
    try:
      self._sp = spm.SentencePieceProcessor(model_file=str(self.path))
    except (OSError, RuntimeError) as e:
      raise DataError(f'cannot load SentencePiece model {self.path}: {e}') from None
    if self._sp.pad_id() < 0:
      raise DataError(f'SentencePiece model {self.path} has no padding id; train it with pad_id=0')

  @property
  def fingerprint(self) -> str:
    """What identifies this model: a hash of its file and its number of pieces. Stored with
    a run (config.json), so that a resumed run or a decoder notices a different model."""
    digest = hashlib.sha256(self.path.read_bytes()).hexdigest()[:16]
    return f'sha256:{digest} pieces:{self.vocab_size}'

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def pad_id(self) -> int:
    return self._sp.pad_id()

  @property
  def unk_id(self) -> int:
    return self._sp.unk_id()

  @property
  def bos_id(self) -> int:
    return self._sp.bos_id()

  @property
  def eos_id(self) -> int:
    return self._sp.eos_id()

  def encode(self, lines: Sequence[str]) -> list[list[int]]:
    """Sentences -> subword ids (no BOS/EOS)."""
    return self._sp.encode(list(lines), out_type=int, num_threads=os.cpu_count() or 1)

  def sample(self, lines: Sequence[str], alpha: float, nbest: int, seed: int) -> list[list[int]]:
    """Sentences -> one sampled segmentation each (subword regularisation; for a BPE model,
    BPE-dropout with probability `alpha`), the same for the same seed. One thread: with
    several, SentencePiece's per-thread generators would make the result depend on timing."""
    spm.set_random_generator_seed(seed)
    return self._sp.encode(list(lines), out_type=int, enable_sampling=True, alpha=alpha,
                           nbest_size=nbest, num_threads=1)

  def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
    """Subword ids -> detokenised sentences; ids from EOS on are dropped."""
    return self._sp.decode([_until_eos(row, self.eos_id, self.pad_id) for row in ids])

  def pieces(self, ids: Sequence[int]) -> list[str]:
    """Subword strings for a row of ids (for attention plots and debugging)."""
    return [self._sp.id_to_piece(int(i)) for i in ids]


def _until_eos(row: Iterable[int], eos_id: int, pad_id: int) -> list[int]:
  out = []
  for i in row:
    i = int(i)
    if i == eos_id:
      break
    if i != pad_id:
      out.append(i)
  return out


def train_tokenizer(lines: Sequence[str], path: str | os.PathLike, *, vocab_size: int,
                    model_type: str = 'unigram', character_coverage: float = 1.0,
                    max_sentences: int = 1_000_000, seed: int = 0) -> Tokenizer:
  """Trains SentencePiece on (a seeded sample of) `lines` and writes the model atomically.

  `vocab_size` is a soft limit (hard_vocab_limit=False) so small corpora still train.
  """
  if not any(line.strip() for line in lines):
    raise DataError(f'no text to train the SentencePiece model {path} on: every training line '
                    'is empty')
  if len(lines) > max_sentences:
    lines = random.Random(seed).sample(list(lines), max_sentences)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
      model_type=model_type, character_coverage=character_coverage, pad_id=0, unk_id=1,
      bos_id=2, eos_id=3, hard_vocab_limit=False, num_threads=os.cpu_count() or 1,
      minloglevel=2)
  write_atomically(path, model.getvalue())
  return Tokenizer(path)

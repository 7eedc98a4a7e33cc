"""SentencePiece subword tokenizer: training on parallel text, and id <-> text conversion.

Special ids are fixed at training time (pad 0, unk 1, bos 2, eos 3) and always read back
from the model, never assumed by other modules.

An imported Marian model (import_marian.py) has a piece table instead: its source and target
SentencePiece models cut text into pieces, and one shared table (Marian's vocab.json,
{piece: id}) gives their ids, with eos '</s>', unk '<unk>' and pad '<pad>' wherever the table
puts them (eos 0 and pad last in OPUS-MT); such a decoder starts from the padding id. A model with
separate source and target vocabularies (Marian's vocab.json and target_vocab.json) has one
table per SentencePiece model in one file, each under the hash of its model (`PieceTable`),
so that both sides' tokenizers read the workdir's one vocab.json and find their own.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import random
import re
from typing import Iterable, Optional, Sequence

import sentencepiece as spm

from transformer_nmt.errors import DataError
from transformer_nmt.files import write_atomically

# SentencePiece encodes a list of lines on threads it starts for each call: for a few lines
# starting them costs more than the encoding itself, and serve.py's event loop encodes each
# request's sentences this way. Below this many lines each line is encoded alone.
THREADED_LINES = 64


class Tokenizer:
  """A loaded SentencePiece model with the ids the model and decoders need; with a piece
  table (`table`: a JSON file {piece: id}) the ids are the table's (module docstring)."""

  def __init__(self, path: str | os.PathLike, table: Optional[str | os.PathLike] = None):
    self.path = pathlib.Path(path)
    try:
      self._sp = spm.SentencePieceProcessor(model_file=str(self.path))
    except (OSError, RuntimeError) as e:
      raise DataError(f'cannot load SentencePiece model {self.path}: {e}') from None
    self.table = None if table is None else PieceTable(table, self.path)
    if self.table is None and self._sp.pad_id() < 0:
      raise DataError(f'SentencePiece model {self.path} has no padding id; train it with pad_id=0')

  @property
  def fingerprint(self) -> str:
    """What identifies this model: a hash of its file (and piece table) and its number of
    pieces. Stored with a run (config.json), so that a resumed run or a decoder notices a
    different model."""
    data = self.path.read_bytes() + (self.table.path.read_bytes() if self.table else b'')
    digest = hashlib.sha256(data).hexdigest()[:16]
    return f'sha256:{digest} pieces:{self.vocab_size}'

  @property
  def vocab_size(self) -> int:
    return len(self.table.pieces) if self.table else self._sp.get_piece_size()

  @property
  def pad_id(self) -> int:
    return self.table.pad_id if self.table else self._sp.pad_id()

  @property
  def unk_id(self) -> int:
    return self.table.unk_id if self.table else self._sp.unk_id()

  @property
  def bos_id(self) -> int:
    """The decoder's first input: SentencePiece's BOS, or with a piece table the padding id
    (Marian's decoder_start_token_id)."""
    return self.table.pad_id if self.table else self._sp.bos_id()

  @property
  def eos_id(self) -> int:
    return self.table.eos_id if self.table else self._sp.eos_id()

  def encode(self, lines: Sequence[str]) -> list[list[int]]:
    """Sentences -> subword ids (no BOS/EOS)."""
    if self.table:
      return [self.table.encode(line, self._sp) for line in lines]
    if len(lines) < THREADED_LINES:  # one line at a time: no threads to start
      return [self._sp.encode(line, out_type=int) for line in lines]
    return self._sp.encode(list(lines), out_type=int, num_threads=os.cpu_count() or 1)

  def sample(self, lines: Sequence[str], alpha: float, nbest: int, seed: int) -> list[list[int]]:
    """Sentences -> one sampled segmentation each (subword regularisation; for a BPE model,
    BPE-dropout with probability `alpha`), the same for the same seed. One thread: with
    several, SentencePiece's per-thread generators would make the result depend on timing."""
    spm.set_random_generator_seed(seed)
    out_type = str if self.table else int
    rows = self._sp.encode(list(lines), out_type=out_type, enable_sampling=True, alpha=alpha,
                           nbest_size=nbest, num_threads=1)
    return [self.table.piece_ids(row) for row in rows] if self.table else rows

  def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
    """Subword ids -> detokenised sentences; ids from EOS on are dropped."""
    rows = [_until_eos(row, self.eos_id, self.pad_id) for row in ids]
    if self.table:
      return [self.table.decode(row, self._sp) for row in rows]
    return self._sp.decode(rows)

  def pieces(self, ids: Sequence[int]) -> list[str]:
    """Subword strings for a row of ids (for attention plots and debugging)."""
    if self.table:
      return [self.table.pieces[int(i)] for i in ids]
    return [self._sp.id_to_piece(int(i)) for i in ids]


class PieceTable:
  """A JSON file {piece: id} (Marian's vocab.json) whose ids are 0..V-1, each once, with the
  pieces '</s>' (eos), '<unk>' and '<pad>'. Raises DataError naming the file otherwise.

  Or one such table per SentencePiece model, {key(model): {piece: id}, ...} (separate
  vocabularies, `write_tables`): then the one of `model` is read.
  """

  SPECIAL = ('</s>', '<unk>', '<pad>')

  def __init__(self, path: str | os.PathLike, model: Optional[str | os.PathLike] = None):
    self.path = pathlib.Path(path)
    try:
      table = json.loads(self.path.read_text(encoding='utf-8'))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
      raise DataError(f'cannot read the piece table {self.path}: {e}') from None
    if isinstance(table, dict) and table and all(isinstance(t, dict) for t in table.values()):
      key = None if model is None else self.key(model)
      if key not in table:
        raise DataError(f'piece table {self.path} has no table for the SentencePiece model '
                        f'{model} ({key}); it holds {sorted(table)}')
      table = table[key]
    if not (isinstance(table, dict) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in table.values())):
      raise DataError(f'piece table {self.path} is not a JSON object of piece: id')
    if sorted(table.values()) != list(range(len(table))):
      raise DataError(f'piece table {self.path}: its ids are not 0..{len(table) - 1}, each once')
    missing = [p for p in self.SPECIAL if p not in table]
    if missing:
      raise DataError(f'piece table {self.path} lacks the special piece(s) {missing}')
    self.index: dict[str, int] = table
    self.pieces = [''] * len(table)  # id -> piece
    for piece, i in table.items():
      self.pieces[i] = piece
    self.eos_id, self.unk_id, self.pad_id = (table[p] for p in self.SPECIAL)

  @staticmethod
  def key(model: str | os.PathLike) -> str:
    """What a table of several names a SentencePiece model by: its file's hash."""
    return 'sha256:' + hashlib.sha256(pathlib.Path(model).read_bytes()).hexdigest()

  @staticmethod
  def write_tables(path: str | os.PathLike,
                   tables: Sequence[tuple[str | os.PathLike, dict[str, int]]]) -> None:
    """Writes one file of a table {piece: id} per SentencePiece model, [(model, table)]."""
    keys = [PieceTable.key(model) for model, _ in tables]
    if len(set(keys)) < len(keys):  # the same model twice: no key could tell the tables apart
      raise DataError(f'{path}: the SentencePiece models {[str(m) for m, _ in tables]} are one '
                      'model with several tables')
    write_atomically(path, json.dumps(dict(zip(keys, (t for _, t in tables))),
                                      ensure_ascii=False))

  def piece_ids(self, pieces: Sequence[str]) -> list[int]:
    """Pieces -> ids; a piece the table lacks is unk (as Marian's tokenizer maps it)."""
    return [self.index.get(p, self.unk_id) for p in pieces]

  def encode(self, line: str, sp: spm.SentencePieceProcessor) -> list[int]:
    """A line -> ids: a leading target-language tag ('>>deu<<', multilingual Marian models)
    whole when the table has it, then the pieces of the rest."""
    match = _TAG.match(line)
    if match and match.group(1) in self.index:
      return [self.index[match.group(1)]] + self.piece_ids(
          sp.encode(line[match.end():], out_type=str))
    return self.piece_ids(sp.encode(line, out_type=str))

  def decode(self, ids: Sequence[int], sp: spm.SentencePieceProcessor) -> str:
    """Ids (no eos or pad) -> text as transformers' MarianTokenizer gives it with
    skip_special_tokens: '<unk>' dropped (SentencePiece would write ' ⁇ '), and the word
    marks of pieces `sp` lacks (the other language's, in a shared table) made spaces."""
    text = sp.decode_pieces([self.pieces[i] for i in ids if i != self.unk_id])
    return text.replace('\u2581', ' ').strip()


_TAG = re.compile(r'(>>\S+?<<)\s*')



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

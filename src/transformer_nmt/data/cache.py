"""Tokenise once: the encoded training split kept as flat id arrays, memory-mapped by later
starts (fairseq-preprocess's idea; .npy files, so NumPy alone reads them).

An entry is a directory `train-<digest>/` of the cache directory, the digest being a hash
of its key: the tokenizers' fingerprints, the training files' identity (path, size and
modification time, or their content's hash) and data.max_len. A changed corpus or tokenizer
gives another key, so it is encoded again. An entry is written into a temporary directory
and renamed when complete; on reading, its manifest, shapes, dtypes, checksums and offsets
are checked, and one that fails is encoded again with a warning, never used.

  manifest.json           the key, the counts of ReadStats, each array's dtype, shape, CRC-32
  {src,tgt}_ids.npy       [tokens] every pair's ids (EOS included) end to end; uint16 when
                          the vocabulary fits, else int32
  {src,tgt}_offsets.npy   [pairs + 1] int64: pair i is ids[offsets[i]:offsets[i + 1]]
  index.npy               [pairs] int64: the pair's position among the kept input lines
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import shutil
import tempfile
import zlib
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from transformer_nmt.data import batching as data_lib
from transformer_nmt.data.ragged import Ragged, concatenate
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.errors import DataError

FORMAT = 1  # raised whenever the layout above changes: older entries are then misses
ARRAYS = ('src_ids', 'src_offsets', 'tgt_ids', 'tgt_offsets', 'index')
CHUNK = 50_000  # pairs encoded at a time: the id lists of one chunk are all Python holds


@dataclasses.dataclass
class Encoded:
  """The encoded training pairs (`Ragged`, possibly memory-mapped) and what reading kept."""

  src: Ragged
  tgt: Ragged
  index: np.ndarray  # [pairs] int64
  stats: data_lib.ReadStats


def file_identity(path: str, by_content: bool = False) -> dict:
  """What tells a training file from a changed one: its size and modification time, or with
  `by_content` a hash of its bytes (files rewritten identically at each start: the demo)."""
  p = pathlib.Path(path).resolve()
  try:
    if by_content:
      return {'path': str(p), 'sha256': hashlib.sha256(p.read_bytes()).hexdigest()}
    stat = p.stat()
  except OSError as e:
    raise DataError(f'{path}: cannot read ({e.strerror})') from None
  return {'path': str(p), 'size': stat.st_size, 'mtime_ns': stat.st_mtime_ns}


def cache_key(files: Sequence[dict], src_tok: Tokenizer, tgt_tok: Tokenizer,
              max_len: int) -> dict:
  """The key of an entry: everything the encoded pairs depend on."""
  return {'format': FORMAT, 'files': list(files), 'src_tokenizer': src_tok.fingerprint,
          'tgt_tokenizer': tgt_tok.fingerprint, 'max_len': max_len}


def entry_dir(directory: pathlib.Path, key: dict) -> pathlib.Path:
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
  return directory / f'train-{digest}'


def load(directory: pathlib.Path, key: dict) -> Optional[Encoded]:
  """The entry of `key`, memory-mapped; None if there is none or it is damaged (warned)."""
  entry = entry_dir(directory, key)
  if not entry.exists():
    return None
  try:
    return _checked(entry, key)
  except (OSError, ValueError, KeyError, TypeError) as e:
    logging.warning('Encoded training data in %s is damaged (%s); encoding the text again',
                    entry, e)
    return None


def _checked(entry: pathlib.Path, key: dict) -> Encoded:
  """Reads and verifies an entry; raises ValueError (or OSError) on any inconsistency."""
  manifest = json.loads((entry / 'manifest.json').read_text())
  if manifest['key'] != key:
    raise ValueError('its manifest holds another key')
  arrays = {}
  for name in ARRAYS:
    expected = manifest['arrays'][name]
    a = np.load(entry / f'{name}.npy', mmap_mode='r', allow_pickle=False)
    if str(a.dtype) != expected['dtype'] or list(a.shape) != expected['shape']:
      raise ValueError(f'{name}.npy is {a.dtype} {list(a.shape)}, its manifest says '
                       f'{expected["dtype"]} {expected["shape"]}')
    if _crc32(a) != expected['crc32']:
      raise ValueError(f'{name}.npy does not match its checksum')
    arrays[name] = a
  pairs = len(arrays['index'])
  sides = []
  for side in ('src', 'tgt'):
    ids, offsets = arrays[f'{side}_ids'], np.asarray(arrays[f'{side}_offsets'])
    if (len(offsets) != pairs + 1 or offsets[0] != 0 or offsets[-1] != len(ids)
        or np.any(np.diff(offsets) <= 0)):
      raise ValueError(f'{side}_offsets.npy does not describe {pairs} pairs in {len(ids)} ids')
    sides.append(Ragged(ids, offsets))
  return Encoded(*sides, arrays['index'], data_lib.ReadStats(**manifest['stats']))


def _crc32(a: np.ndarray, block: int = 1 << 24) -> int:
  """CRC-32 of an array's bytes, read in blocks of `block` bytes (mapped arrays stay mapped)."""
  flat, crc = a.reshape(-1).view(np.uint8), 0
  for start in range(0, len(flat), block):
    crc = zlib.crc32(flat[start:start + block], crc)
  return crc


# (tokenizer, lines, side, chunk) -> ids of each line: the canonical segmentation, or a
# sampled one seeded by the side and the chunk (`corpus.sampled_epochs`)
Segmenter = Callable[[Tokenizer, Sequence[str], str, int], list[list[int]]]


def canonical(tok: Tokenizer, lines: Sequence[str], side: str, chunk: int) -> list[list[int]]:
  """SentencePiece's one segmentation of each line."""
  del side, chunk
  return tok.encode(lines)


def encode(src_lines: Sequence[str], tgt_lines: Sequence[str], stats: data_lib.ReadStats,
           src_tok: Tokenizer, tgt_tok: Tokenizer, max_len: int,
           segment: Segmenter = canonical) -> Encoded:
  """Encodes the pairs CHUNK at a time, dropping (and counting) those over max_len tokens:
  Python's id lists exist for one chunk at a time (WMT14's 4.5M pairs at once would take
  gigabytes)."""
  chunks = ((src_lines[start:start + CHUNK], tgt_lines[start:start + CHUNK])
            for start in range(0, len(src_lines), CHUNK))
  return encode_chunks(chunks, dataclasses.replace(stats), src_tok, tgt_tok, max_len, segment)


def encode_chunks(chunks: Iterable[tuple[Sequence[str], Sequence[str]]],
                  stats: data_lib.ReadStats, src_tok: Tokenizer, tgt_tok: Tokenizer,
                  max_len: int, segment: Segmenter = canonical) -> Encoded:
  """`encode` of pairs that arrive in chunks (e.g. read from tfds a chunk at a time, so that
  the text is never held whole); chunk k is segmented with `segment(..., k)`. `stats` is
  the read's, updated in place (pairs over max_len, pairs kept): a reader that counts as it
  goes may fill in the rest while the chunks are consumed."""
  stats.too_long = 0
  sides: dict[str, list[Ragged]] = {'src': [], 'tgt': []}
  index, start = [], 0
  for chunk, (src_lines, tgt_lines) in enumerate(chunks):
    ids = [segment(tok, lines, side, chunk)
           for tok, lines, side in ((src_tok, src_lines, 'src'), (tgt_tok, tgt_lines, 'tgt'))]
    part = data_lib.parallel_ids(*ids, src_tok, tgt_tok, max_len=max_len, stats=stats)
    sides['src'].append(_narrow(part.src, src_tok))
    sides['tgt'].append(_narrow(part.tgt, tgt_tok))
    index.append(part.index + start)
    start += len(src_lines)
  index_all = np.concatenate(index) if index else np.zeros(0, np.int64)
  stats.kept = len(index_all)
  return Encoded(concatenate(sides['src']), concatenate(sides['tgt']), index_all, stats)


def _narrow(r: Ragged, tok: Tokenizer) -> Ragged:
  """Ids as uint16 when the vocabulary allows: half the bytes to store, map and page in."""
  dtype = np.uint16 if tok.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
  return Ragged(r.ids.astype(dtype), r.offsets)


def store(directory: pathlib.Path, key: dict, encoded: Encoded) -> None:
  """Writes the entry of `key` (atomically: a complete directory, renamed into place)."""
  entry = entry_dir(directory, key)
  directory.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f'.{entry.name}.', suffix='.tmp', dir=directory))
  try:
    arrays = {'src_ids': encoded.src.ids, 'src_offsets': encoded.src.offsets,
              'tgt_ids': encoded.tgt.ids, 'tgt_offsets': encoded.tgt.offsets,
              'index': encoded.index}
    described = {}
    for name, a in arrays.items():
      np.save(tmp / f'{name}.npy', a, allow_pickle=False)
      described[name] = {'dtype': str(a.dtype), 'shape': list(a.shape), 'crc32': _crc32(a)}
    manifest = {'key': key, 'stats': dataclasses.asdict(encoded.stats), 'arrays': described}
    (tmp / 'manifest.json').write_text(json.dumps(manifest, indent=1))
    for f in tmp.iterdir():  # on disk before the rename makes the entry visible
      with open(f, 'rb') as handle:
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o755)
    if entry.exists():  # a damaged entry, found so by `load`
      shutil.rmtree(entry)
    try:
      os.rename(tmp, entry)
    except OSError:
      if not entry.is_dir():  # else another process wrote the same entry first: use that
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def load_or_encode(directory: pathlib.Path, key: dict,
                   encode_text: Callable[[], Encoded]) -> Encoded:
  """The entry of `key`, written first from `encode_text()` when missing or damaged."""
  found = load(directory, key)
  if found is not None:
    logging.info('Training pairs mapped from %s', entry_dir(directory, key))
    return found
  logging.info('Encoding the training text into %s', entry_dir(directory, key))
  try:
    store(directory, key, encode_text())
  except OSError as e:
    raise DataError(f'cannot write the encoded training data to {directory} ({e.strerror}); '
                    'set data.cache_dir to a writable directory, or data.cache=False') from None
  found = load(directory, key)
  if found is None:
    raise DataError(f'the encoded training data just written to {directory} cannot be read back')
  return found

"""Parallel text from tensorflow-datasets (WMT14/WMT17 and other translate builders).

Reads through `tfds.data_source` (random access to prepared ArrayRecord files), which needs no
TensorFlow; preparing the WMT datasets once (`tfds build wmt14_translate/de-en`) does. With
several processes each one reads only its own even share of the training split.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any, Iterator

from transformer_nmt.config import DataConfig
from transformer_nmt.data import batching as data_lib
from transformer_nmt.errors import ConfigError, DataError


def _tfds() -> Any:
  try:
    import tensorflow_datasets as tfds
    import tensorflow_datasets.translate  # noqa: F401  registers the WMT builders without TF
  except ImportError:
    raise ConfigError("data.source='tfds' needs tensorflow-datasets: "
                      'pip install "tensorflow-datasets>=4.9.10,<5"') from None
  return tfds


def _as_text(value: Any) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def split_identity(data_cfg: DataConfig, split: str, limit: int = 0,
                   shard: tuple[int, int] = (0, 1)) -> list[dict]:
  """What tells this share of a split from another or a changed one (the key of its encoded
  pairs in data/cache.py): the dataset's name and version, the share, and the size and
  modification time of the split's prepared files (when they are local files)."""
  from transformer_nmt.data import cache
  info = _source(data_cfg, split).dataset_info
  directory = pathlib.Path(str(info.data_dir))
  prefix = f'{info.name}-{split}.'
  files = sorted(p for p in directory.glob(f'{prefix}*')) if directory.is_dir() else []
  return [{'tfds': info.full_name, 'split': split, 'limit': limit, 'shard': list(shard),
           'data_dir': str(directory)}] + [cache.file_identity(str(f)) for f in files]


def _source(data_cfg: DataConfig, split: str) -> Any:
  """tfds's random-access reader of one split; a DataError says how to prepare it."""
  tfds = _tfds()
  try:
    return tfds.data_source(data_cfg.tfds_name, split=split,
                            data_dir=data_cfg.tfds_data_dir or None)
  except Exception as e:  # not prepared, unknown name or split: tfds raises many kinds
    raise DataError(f'cannot read tfds {data_cfg.tfds_name!r} split {split!r}: '
                    f'{type(e).__name__}: {str(e).splitlines()[0][:300]} (prepare it once '
                    f'with: tfds build {data_cfg.tfds_name.split("/")[0]})') from None


def read_split(data_cfg: DataConfig, split: str, limit: int = 0,
               shard: tuple[int, int] = (0, 1)) -> tuple[list[str], list[str], data_lib.ReadStats]:
  """(source lines, target lines, stats) of one split; pairs with an empty side are skipped
  and counted, newlines inside a sentence become spaces.

  `limit` > 0 keeps the first `limit` examples. `shard` = (index, count) reads only the
  index-th of `count` contiguous, even shares (random access: nothing else is read).
  """
  src: list[str] = []
  tgt: list[str] = []
  stats = data_lib.ReadStats()
  for part_src, part_tgt, part in read_chunks(data_cfg, split, limit, shard):
    src += part_src
    tgt += part_tgt
    stats.lines, stats.kept, stats.empty = (stats.lines + part.lines, stats.kept + part.kept,
                                            stats.empty + part.empty)
  logging.info('tfds %s[%s] share %d/%d: %d pairs (%d with an empty side skipped)',
               data_cfg.tfds_name, split, shard[0] + 1, shard[1], stats.kept, stats.empty)
  return src, tgt, stats


def read_chunks(data_cfg: DataConfig, split: str, limit: int = 0, shard: tuple[int, int] = (0, 1),
                size: int = 50_000
                ) -> Iterator[tuple[list[str], list[str], data_lib.ReadStats]]:
  """`read_split`'s share `size` examples at a time, each chunk with its own stats: what
  encoding it into the cache (data/cache.py) holds as text at once, not the whole share."""
  source = _source(data_cfg, split)
  n = len(source) if not limit else min(limit, len(source))
  index, count = shard
  begin, end = index * n // count, (index + 1) * n // count
  for start in range(begin, end, size):
    src, tgt = [], []
    stop = min(start + size, end)
    for i in range(start, stop):
      example = source[i]
      if data_cfg.src_lang not in example or data_cfg.tgt_lang not in example:
        raise ConfigError(f'{data_cfg.tfds_name} has features {sorted(example)}; set '
                          'data.src_lang and data.tgt_lang to two of them')
      s, t = (' '.join(_as_text(example[lang]).split())
              for lang in (data_cfg.src_lang, data_cfg.tgt_lang))
      if s and t:
        src.append(s)
        tgt.append(t)
    yield src, tgt, data_lib.ReadStats(lines=stop - start, kept=len(src),
                                       empty=stop - start - len(src))

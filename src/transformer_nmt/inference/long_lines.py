"""Lines longer than decode.max_input_len: translated in pieces split at sentence ends."""

from __future__ import annotations

import logging
import re
from typing import Optional, Sequence

import numpy as np

from transformer_nmt.data.tokenizer import Tokenizer

_SENTENCE_END = re.compile(r'(?<=[.!?;:\u3002\uff01\uff1f])\s+')  # after . ! ? ; : and CJK ones


def split(tok: Tokenizer, lines: Sequence[str], max_input_len: int
          ) -> tuple[list[list[int]], list[int]]:
  """The source ids of every non-empty line, long lines in pieces (`pieces`), and the line
  each piece belongs to; how many lines were split or truncated goes to the log."""
  keep = [i for i, line in enumerate(lines) if line.strip()]
  parts_of: list[list[int]] = []
  owner: list[int] = []
  split_lines = truncated = 0
  for i, ids in zip(keep, tok.encode([lines[i] for i in keep])):
    parts, cut = pieces(tok, lines[i], ids, max_input_len)
    split_lines, truncated = split_lines + (len(parts) > 1), truncated + cut
    parts_of += parts
    owner += [i] * len(parts)
  if split_lines or truncated:
    logging.warning('%d line(s) over decode.max_input_len=%d tokens translated in pieces split '
                    'at sentence ends; %d sentence(s) truncated to that length', split_lines,
                    max_input_len, truncated)
  return parts_of, owner


def pieces(tok: Tokenizer, line: str, ids: list[int], max_input_len: int
           ) -> tuple[list[list[int]], int]:
  """A line's source ids in pieces of at most max_input_len - 1 tokens (EOS follows): whole
  sentences packed greedily, a sentence longer than that truncated. Returns the pieces and
  how many sentences were truncated."""
  limit = max_input_len - 1
  if len(ids) <= limit:
    return [ids], 0
  out: list[list[int]] = [[]]
  truncated = 0
  for sentence in tok.encode(_SENTENCE_END.split(line.strip())):
    if len(sentence) > limit:
      sentence, truncated = sentence[:limit], truncated + 1
    if len(out[-1]) + len(sentence) > limit:
      out.append([])
    out[-1] += sentence
  return [p for p in out if p], truncated


def prefix_ids(tok: Tokenizer, prefixes: Optional[Sequence[str]], owner: Sequence[int]
               ) -> Optional[list[np.ndarray]]:
  """Each piece's target prefix ids: its line's prefix for a line's first piece, else none."""
  if prefixes is None:
    return None
  ids = tok.encode(list(prefixes))
  return [np.array(ids[line] if p == 0 or owner[p - 1] != line else [], np.int32)
          for p, line in enumerate(owner)]

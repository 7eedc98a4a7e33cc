"""Lines longer than the model was trained on: translated in pieces split at sentence ends.

A model trained on lines of at most `data.max_len` subwords ends its output early on a much
longer line (a 49-sentence line came back as its first sentence), so such a line is split:

1. a line of at most `split_len` source subwords (EOS included) is one piece;
2. a longer line is cut after sentence ends (. ! ? ; : and their CJK forms, then white
   space), and its sentences are packed greedily into pieces of at most `split_len`;
3. a sentence longer than that stays whole up to `max_len` subwords (the longest source the
   engine takes: decode.max_input_len, or the longest prepared length of a server); past it,
   it is cut into consecutive pieces of `max_len`, which is counted as a cut: nothing is
   dropped, but a sentence cut mid-way may translate worse.

The pieces' translations are joined with spaces (inference/engine.py)."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Optional, Sequence

import numpy as np

from transformer_nmt.data.tokenizer import Tokenizer

_SENTENCE_END = re.compile(r'(?<=[.!?;:\u3002\uff01\uff1f])\s+')  # after . ! ? ; : and CJK ones


@dataclasses.dataclass(frozen=True)
class Pieces:
  """The source ids of each piece (no EOS), the input line each belongs to, how many lines
  were split and how many sentences were cut mid-way (rule 3 above)."""

  ids: list[list[int]]
  owner: list[int]
  split_lines: int = 0
  cut_sentences: int = 0


def split(tok: Tokenizer, lines: Sequence[str], split_len: int, max_len: int) -> Pieces:
  """Every non-empty line's source ids in pieces (`pieces`); the counts go to the log."""
  keep = [i for i, line in enumerate(lines) if line.strip()]
  parts_of: list[list[int]] = []
  owner: list[int] = []
  split_lines = cut = 0
  for i, ids in zip(keep, tok.encode([lines[i] for i in keep])):
    parts, cut_here = pieces(tok, lines[i], ids, split_len, max_len)
    split_lines, cut = split_lines + (len(parts) > 1), cut + cut_here
    parts_of += parts
    owner += [i] * len(parts)
  if split_lines:
    logging.warning('%d line(s) over %d source subwords translated in pieces split at sentence '
                    'ends; %d sentence(s) over %d subwords cut into pieces mid-sentence',
                    split_lines, min(split_len, max_len), cut, max_len)
  return Pieces(parts_of, owner, split_lines, cut)


def pieces(tok: Tokenizer, line: str, ids: list[int], split_len: int, max_len: int
           ) -> tuple[list[list[int]], int]:
  """A line's source ids in pieces of at most split_len - 1 tokens (EOS follows), whole
  sentences packed greedily; a sentence of more than max_len - 1 tokens in consecutive
  pieces of that many. Returns the pieces and how many sentences were cut."""
  limit, longest = min(split_len, max_len) - 1, max_len - 1
  if len(ids) <= limit:
    return [ids], 0
  out: list[list[int]] = [[]]
  cut = 0
  for sentence in tok.encode(_SENTENCE_END.split(line.strip())):
    if len(out[-1]) + len(sentence) > limit:
      out.append([])
    if len(sentence) <= longest:
      out[-1] += sentence
      continue
    cut += 1
    out += [sentence[i:i + longest] for i in range(0, len(sentence), longest)]
    out.append([])  # the next sentence starts a piece of its own
  return [p for p in out if p], cut


def prefix_ids(tok: Tokenizer, prefixes: Optional[Sequence[str]], owner: Sequence[int]
               ) -> Optional[list[np.ndarray]]:
  """Each piece's target prefix ids: its line's prefix for a line's first piece, else none."""
  if prefixes is None:
    return None
  ids = tok.encode(list(prefixes))
  return [np.array(ids[line] if p == 0 or owner[p - 1] != line else [], np.int32)
          for p, line in enumerate(owner)]

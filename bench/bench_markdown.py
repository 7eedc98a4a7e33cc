"""Writes a benchmark's table into bench/RESULTS.md, replacing only that benchmark's section."""

import pathlib

from transformer_nmt.files import write_atomically


def write_section(path: pathlib.Path, name: str, text: str) -> None:
  """Replaces the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` (appends the
  section when it is missing), through a temporary file."""
  begin, end = f'<!-- {name}:begin -->', f'<!-- {name}:end -->'
  old = path.read_text(encoding='utf-8') if path.exists() else '# Benchmark results\n'
  block = f'{begin}\n{text}{end}'
  if begin in old and end in old:
    new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
  else:
    new = old.rstrip('\n') + '\n\n' + block + '\n'
  write_atomically(path, new)

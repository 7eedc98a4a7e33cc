"""Writes a benchmark's table into bench/RESULTS.md, replacing only that benchmark's section."""

import os
import pathlib
import platform


def machine() -> str:
  """'2 cores, AMD EPYC' (the CPU model from /proc/cpuinfo where there is one)."""
  model = platform.processor() or platform.machine()
  try:
    for line in open('/proc/cpuinfo', encoding='utf-8'):
      if line.startswith('model name'):
        model = line.split(':', 1)[1].strip()
        break
  except OSError:
    pass
  return f'{os.cpu_count()} cores, {model}'


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
  tmp = path.with_suffix('.tmp')
  tmp.write_text(new, encoding='utf-8')
  tmp.replace(path)

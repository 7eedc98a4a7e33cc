"""What the benchmarks share: the line that dates a table (date, machine, command), writing a
table into its section of bench/RESULTS.md, reading a run's metrics.jsonl, and exporting a
workdir to CTranslate2 with export_ctranslate2.py.

The scripts beside this file use the project as a user does: its programs (train.py,
decode.py, serve.py, export_ctranslate2.py, import_marian.py) and the names `transformer_nmt`
exports, nothing private and nothing patched (tests/test_bench_api.py), so that a change
inside the engine leaves them running.
"""

import datetime
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def machine() -> str:
  """CPU model and core count, or the accelerator JAX computes on."""
  import jax
  if jax.default_backend() != 'cpu':
    return f'{jax.device_count()}x {jax.devices()[0].device_kind}'
  name = platform.processor() or platform.machine()
  try:
    for line in pathlib.Path('/proc/cpuinfo').read_text().splitlines():
      if line.startswith('model name'):
        name = line.split(':', 1)[1].strip()
        break
  except OSError:
    pass
  return f'{os.cpu_count()}-core CPU ({name})'


def stamp(details: str = '') -> str:
  """'DATE, MACHINE[, details]. Command: `python bench/SCRIPT ARGS`': the first line of every
  table this suite writes."""
  command = shlex.join([f'bench/{pathlib.Path(sys.argv[0]).name}', *sys.argv[1:]])
  extra = f', {details}' if details else ''
  return f'{datetime.date.today().isoformat()}, {machine()}{extra}. Command: `python {command}`'


def write_section(path: str | os.PathLike, name: str, text: str) -> None:
  """Replaces the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` of `path` (appends
  the section when it is missing), through a temporary file in the same directory."""
  path = pathlib.Path(path)
  begin, end = f'<!-- {name}:begin -->', f'<!-- {name}:end -->'
  old = path.read_text(encoding='utf-8') if path.exists() else '# Benchmark results\n'
  block = f'{begin}\n{text.rstrip()}\n{end}'
  if begin in old and end in old:
    new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
  else:
    new = old.rstrip('\n') + '\n\n' + block + '\n'
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
  with os.fdopen(fd, 'w', encoding='utf-8') as f:
    f.write(new)
  os.replace(tmp, path)


def read_metrics(path: str | os.PathLike) -> list[dict]:
  """The rows of a run's metrics.jsonl that are whole JSON objects with a step, in file order;
  damaged lines (a killed run's last line, bytes that are not UTF-8) are skipped, as train.py
  skips them."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  rows = []
  for raw in path.read_bytes().splitlines():
    try:
      row = json.loads(raw.decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError):
      continue
    if isinstance(row, dict) and isinstance(row.get('step'), int):
      rows.append(row)
  return rows


def export_ctranslate2(workdir: str | os.PathLike, out: str | os.PathLike) -> None:
  """The workdir's model (the weights load_workdir gives) as a CTranslate2 model directory in
  `out` (new or empty), written by export_ctranslate2.py."""
  result = subprocess.run([sys.executable, 'export_ctranslate2.py', '--workdir', str(workdir),
                           '--out', str(out)], cwd=ROOT, capture_output=True, text=True)
  if result.returncode:
    raise RuntimeError(f'export_ctranslate2.py failed: {result.stderr.strip()[-2000:]}')

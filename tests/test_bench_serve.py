"""bench/serve.py end to end on the tiny model: serve.py and the CTranslate2 baseline behind
the same server code, each started, loaded and stopped; every answer compared with the
engine's translation of its line. Slow: each test starts servers that compile their
programs (a minute or more)."""

import dataclasses
import os
import subprocess
import sys

import pytest
from conftest import ROOT, shared_compile_cache

from transformer_nmt import Engine

pytestmark = pytest.mark.slow


def test_bench_serve_loads_both_servers_and_checks_answers(tiny_workdir, loaded, tmp_path):
  pytest.importorskip('ctranslate2')
  lines = (tiny_workdir / 'demo_data' / 'test.en').read_text().splitlines()[:40]
  engine = Engine(loaded, dataclasses.replace(loaded.decode, beam_size=2))
  (tmp_path / 'in.en').write_text('\n'.join(lines) + '\n')
  (tmp_path / 'ref.de').write_text('\n'.join(engine.translate(lines)) + '\n')
  result = subprocess.run(
      [sys.executable, 'bench/serve.py', '--workdir', str(tiny_workdir), '--input',
       str(tmp_path / 'in.en'), '--reference', str(tmp_path / 'ref.de'), '--beam_size', '2',
       '--servers', 'ours,ctranslate2', '--clients', '3', '--seconds', '1',
       '--serve_flags', '--noprograms --precompile_rows=8 --precompile_length=8'],
      cwd=ROOT, env=shared_compile_cache(dict(os.environ, JAX_PLATFORMS='cpu')),
      capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {tuple(cell.strip() for cell in line.split('|')[1:3]): line.split('|')
          for line in result.stdout.splitlines() if line.startswith('| ours')
          or line.startswith('| ctranslate2')}
  for server in ('ours', 'ctranslate2'):
    for phase in ('1 client, 1 sentence', '3 clients, 1-16 sentences'):
      cells = rows[(server, phase)]
      assert int(cells[3]) > 0 and cells[4].strip() == '0', cells  # requests; none failed
    assert f'{server}: exit code 0 after SIGTERM' in result.stdout
  header = next(line.split('|') for line in result.stdout.splitlines()
                if line.startswith('| server |'))
  column = {name.strip(): i for i, name in enumerate(header)}
  for p in ('1 client, 1 sentence', '3 clients, 1-16 sentences'):
    assert rows[('ours', p)][column['not as decode.py']].strip() == '0'
    # time in batches / phase time, up to 2 with serve.py's two batches in flight
    assert 0 < float(rows[('ours', p)][column['busy']]) < 2.5
  assert 'ours / ctranslate2 sentences/s' in result.stdout


def test_bench_serve_alternates_rounds_between_servers_kept_up(tiny_workdir, tmp_path):
  lines = (tiny_workdir / 'demo_data' / 'test.en').read_text().splitlines()[:40]
  (tmp_path / 'in.en').write_text('\n'.join(lines) + '\n')
  result = subprocess.run(
      [sys.executable, 'bench/serve.py', '--workdir', str(tiny_workdir), '--input',
       str(tmp_path / 'in.en'), '--beam_size', '2', '--servers', 'ours,ours_unbatched',
       '--clients', '3', '--seconds', '1', '--rounds', '2',
       '--serve_flags', '--noprograms --precompile_rows=8 --precompile_length=8'],
      cwd=ROOT, env=shared_compile_cache(dict(os.environ, JAX_PLATFORMS='cpu')),
      capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [line.split('|') for line in result.stdout.splitlines()
          if line.startswith('| ours')]
  phases = [(cells[1].strip(), cells[2].strip()) for cells in rows]
  # the rounds in turn, each server loaded once per round; no other phase (the rows are
  # printed as each phase ends, then again in the final table)
  assert phases[:4] == [(server, f'round {r}: 3 clients, 1-16 sentences')
                        for r in (1, 2) for server in ('ours', 'ours_unbatched')], phases
  assert all(int(cells[3]) > 0 and cells[4].strip() == '0' for cells in rows), rows
  ratios = [line for line in result.stdout.splitlines()
            if 'ours / ours_unbatched sentences/s by round:' in line]
  assert ratios and len(ratios[0].split('x, ')) == 2 and 'median' in ratios[0], ratios
  for server in ('ours', 'ours_unbatched'):
    assert f'{server}: exit code 0 after SIGTERM' in result.stdout

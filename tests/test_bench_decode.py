"""bench/decode.py on the tiny model: its table has CTranslate2 in float32 and in int8 beside
ours, on the same lines, each with its BLEU against the references."""

import os
import subprocess
import sys

import pytest
from conftest import ROOT, shared_compile_cache


@pytest.mark.slow
def test_decode_table_has_ctranslate2_float32_and_int8_with_bleu(tiny_workdir, tmp_path):
  pytest.importorskip('ctranslate2')
  data = tiny_workdir / 'demo_data'
  result = subprocess.run(
      [sys.executable, 'bench/decode.py', '--workdir', str(tiny_workdir), '--input',
       str(data / 'test.en'), '--reference', str(data / 'test.de'), '--max_sentences', '8',
       '--beams', '1', '--variants', 'cached', '--markdown', str(tmp_path / 'RESULTS.md')],
      cwd=ROOT, env=shared_compile_cache(dict(os.environ, JAX_PLATFORMS='cpu')),
      capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  text = (tmp_path / 'RESULTS.md').read_text()
  header = next(line for line in text.splitlines() if line.startswith('| variant |'))
  column = {name.strip(): i for i, name in enumerate(header.split('|'))}
  rows = {line.split('|')[1].strip(): line.split('|') for line in text.splitlines()
          if line.startswith('| cached |') or line.startswith('| CTranslate2')}
  assert set(rows) == {'cached', 'CTranslate2 float32', 'CTranslate2 int8'}, text
  for cells in rows.values():
    assert float(cells[column['sentences/s']]) > 0
    assert 0 <= float(cells[column['BLEU']]) <= 100
  assert '8 sentences from' in text and 'Command: `python bench/decode.py' in text
  assert 'cached is' in text and 'as fast as CTranslate2 int8' in text

"""The README's library example runs as written, and its commands match CI."""

import re

import pytest
from conftest import ROOT


def _python_blocks(text: str) -> list[str]:
  return re.findall(r'```python\n(.*?)```', text, flags=re.S)


@pytest.mark.slow
def test_readme_library_example_runs(capsys):
  blocks = _python_blocks((ROOT / 'README.md').read_text())
  assert blocks, 'README has no python example'
  exec(compile(blocks[0], 'README.md', 'exec'), {})  # noqa: S102 - our own documentation
  out = capsys.readouterr().out
  assert 'loss per token' in out
  assert '(1, 3, 100) (1, 15)' in out


def test_readme_test_command_is_what_ci_runs():
  readme = (ROOT / 'README.md').read_text()
  ci = (ROOT / '.ci' / 'run').read_text()
  command = 'pip install -r requirements-dev.txt -e . && ruff check . && python -m pytest -q'
  assert command in readme
  assert 'python -m pytest -q -m "not slow"' in readme  # the fast tier
  assert ('pip install -q -r requirements-dev.txt -e . && ruff check . && python -m pytest -q'
          in ci)
  # users who only train or translate install requirements.txt: no test tools, no libtpu
  assert 'pytest' not in (ROOT / 'requirements.txt').read_text()
  assert '-r requirements.txt' in (ROOT / 'requirements-dev.txt').read_text()
  assert 'python train.py --config configs/demo.py --workdir demo_run' in readme


@pytest.mark.slow
def test_readme_engine_example_runs(tiny_workdir, capsys):
  """The README's second example, on the tiny trained workdir instead of demo_run."""
  block = _python_blocks((ROOT / 'README.md').read_text())[1]
  assert "Engine.load(['demo_run']" in block
  exec(compile(block.replace("'demo_run'", repr(str(tiny_workdir))), 'README.md', 'exec'), {})  # noqa: S102
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith('[') and len(out) >= 3
  assert out[-1].startswith('log P(reference) = -') and out[-1].endswith(' subwords')


def test_every_relative_link_of_the_docs_resolves():
  broken = []
  for page in [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]:
    for target in re.findall(r'\]\(([^)\s]+)\)', page.read_text()):
      if not re.match(r'^(https?:|#|mailto:)', target) and \
          not (page.parent / target.split('#')[0]).exists():
        broken.append(f'{page.name}: {target}')
  assert broken == []

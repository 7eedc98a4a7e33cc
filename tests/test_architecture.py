"""docs/ARCHITECTURE.md's map of the package names every module the package has."""

import re

from conftest import ROOT

PACKAGE = ROOT / 'src' / 'transformer_nmt'


def _mapped() -> set[str]:
  """The modules the map's tree names, as paths relative to the package."""
  text = (ROOT / 'docs' / 'ARCHITECTURE.md').read_text()
  tree = text.split('```')[1]
  names, subpackage = set(), ''
  for line in tree.splitlines():
    indent = len(line) - len(line.lstrip())
    folder = re.match(r'\s+(\w+)/\s', line + ' ')
    if indent == 2 and folder:
      subpackage = folder[1] + '/'
      continue
    if indent == 2:
      subpackage = ''
    if indent in (2, 4):  # deeper lines continue a description
      words = line.strip().split('  ')[0] if indent == 2 else line.strip().split(' ')[0]
      names |= {subpackage + n for n in re.findall(r'\b\w+\.py\b', words)}
  return names


def test_every_module_is_on_the_map():
  modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob('*.py')
             if p.name != '__init__.py'}
  assert modules - _mapped() == set(), 'modules missing from docs/ARCHITECTURE.md'
  named = _mapped() - {'__init__.py'}  # the package's exports, named on the map too
  assert named - modules == set(), 'docs/ARCHITECTURE.md names modules that do not exist'


def test_the_package_root_holds_at_most_twelve_modules():
  """Everything else lives in a subpackage named for its layer (docs/ARCHITECTURE.md)."""
  root = sorted(p.name for p in PACKAGE.glob('*.py') if p.name != '__init__.py')
  assert len(root) <= 12, root

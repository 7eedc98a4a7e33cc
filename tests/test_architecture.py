"""docs/ARCHITECTURE.md's map of the package names every module the package has."""

import ast
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


def _imports_and_names(path) -> tuple[set[str], set[str]]:
  """The modules a source file imports and the dotted names it reads (`os.environ`, ...)."""
  tree = ast.parse(path.read_text())
  imported, names = set(), set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      imported |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      imported |= {node.module} | {f'{node.module}.{alias.name}' for alias in node.names}
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
      names.add(f'{node.value.id}.{node.attr}')
  return imported, names


# What makes a module depend on where it runs: the environment, the backend, the host.
_ENVIRONMENT = {'os.environ', 'os.getenv', 'jax.default_backend', 'jax.devices',
                'platform.machine', 'platform.processor'}


def test_the_paper_and_the_search_import_no_runtime_and_read_no_environment():
  """model/ (the paper) and decoding/ (pure search over decoding.Kernels) know nothing of
  runtime/ (backend speed-ups), of the layers above them, or of the environment: a runtime
  plugs in through the Kernels an engine chooses."""
  above = ('transformer_nmt.runtime', 'transformer_nmt.inference', 'transformer_nmt.serving',
           'transformer_nmt.decode_job', 'transformer_nmt.training', 'transformer_nmt.interop',
           'transformer_nmt.accelerators')
  for layer in ('model', 'decoding'):
    for path in sorted((PACKAGE / layer).glob('*.py')):
      imported, names = _imports_and_names(path)
      wrong = sorted(m for m in imported if m.startswith(above) or m == 'os')
      assert not wrong, f'{path.relative_to(PACKAGE)} imports {wrong}'
      assert not names & _ENVIRONMENT, f'{path.relative_to(PACKAGE)} reads {names & _ENVIRONMENT}'
      text = path.read_text()
      assert 'XLA_FLAGS' not in text and 'YNNPACK' not in text.upper(), path

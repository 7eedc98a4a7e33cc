"""bench/ runs on the public API, so that a change inside the engine leaves the benchmarks
running: from transformer_nmt a script imports only what a module lists in `__all__`
(transformer_nmt, transformer_nmt.inference, transformer_nmt.serving), never a private name,
and it patches nothing of the library: no attribute of a transformer_nmt module, class or
object is assigned, no private method of a transformer_nmt class is overridden, no attribute
is set by name (setattr), and neither unittest.mock nor pytest's monkeypatch is used. Code in
string constants (the `python -c` jobs) is checked alike. The checker is tested on small cases
of each kind first."""

import ast
import importlib

import pytest
from conftest import ROOT

BENCH = ROOT / 'bench'
PACKAGE = 'transformer_nmt'


def exports(module: str) -> set[str] | None:
  """The names `module` lists in `__all__`, or None when it lists none."""
  found = getattr(importlib.import_module(module), '__all__', None)
  return None if found is None else set(found)


def _root(node: ast.AST) -> str | None:
  """The name an attribute chain or call starts from: `a` of `a.b.c` or `a(x).b`."""
  while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
    node = node.func if isinstance(node, ast.Call) else node.value
  return node.id if isinstance(node, ast.Name) else None


def _names_in(node: ast.AST) -> set[str]:
  """Every name `node` mentions."""
  return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def violations(source: str, where: str = '<bench>') -> list[str]:
  """What in `source` (a bench script) uses transformer_nmt other than through its exports,
  or patches it."""
  tree = ast.parse(source)
  found: list[str] = []
  ours: set[str] = set()  # names bound to transformer_nmt modules, names or what they made
  modules: dict[str, str] = {}  # local name -> transformer_nmt module imported whole

  def bad(node: ast.AST, why: str) -> None:
    found.append(f'{where}:{getattr(node, "lineno", "?")}: {why}')

  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[0] == PACKAGE:
      listed = exports(node.module)
      for alias in node.names:
        if alias.name.startswith('_'):
          bad(node, f'imports the private name {node.module}.{alias.name}')
        elif listed is None:
          bad(node, f'imports {alias.name} from {node.module}, which exports nothing (no '
                    '__all__)')
        elif alias.name not in listed:
          bad(node, f'imports {node.module}.{alias.name}, which {node.module} does not export')
        ours.add(alias.asname or alias.name)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split('.')[0] == PACKAGE:
          if exports(alias.name) is None:
            bad(node, f'imports {alias.name}, which exports nothing (no __all__)')
          local = alias.asname or alias.name.split('.')[0]
          modules[local] = alias.name if alias.asname else PACKAGE
          ours.add(local)
        elif alias.name in ('unittest.mock', 'mock'):
          bad(node, f'imports {alias.name}: bench/ patches nothing')
    if isinstance(node, ast.ImportFrom) and node.module in ('unittest.mock', 'unittest', 'mock'):
      if node.module != 'unittest' or any(a.name == 'mock' for a in node.names):
        bad(node, f'imports from {node.module}: bench/ patches nothing')

  # What is made from transformer_nmt's names counts as theirs: `engine = Engine(...)`,
  # `model = load_workdir(...)`, `tok = model.src_tok`.
  changed = True
  while changed:
    changed = False
    for node in ast.walk(tree):
      if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and \
          _root(node.value) in ours:
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
          if isinstance(target, ast.Name) and target.id not in ours:
            ours.add(target.id)
            changed = True

  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
        node.value.id in modules:
      listed = exports(modules[node.value.id]) or set()
      if node.attr.startswith('_') or node.attr not in listed:
        bad(node, f'uses {modules[node.value.id]}.{node.attr}, which is not exported')
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
      targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                 else [node.target])
      for target in targets:
        for sub in ast.walk(target):
          if not isinstance(sub, ast.Attribute):
            continue
          if sub.attr.startswith('_') and not sub.attr.startswith('__'):
            bad(sub, f'sets the private attribute {sub.attr}')
          elif _root(sub) in ours:
            bad(sub, f'sets {ast.unparse(sub)}, an attribute of transformer_nmt or of what it '
                     'made')
    if isinstance(node, ast.Call):
      called = ast.unparse(node.func)
      if called in ('setattr', 'delattr', 'object.__setattr__'):
        bad(node, f'{called}: bench/ sets no attribute by name (a patch in the making)')
      if called.endswith('patch') or called.endswith('patch.object') or \
          called.startswith('monkeypatch.'):
        bad(node, f'{called}: bench/ patches nothing')
    if isinstance(node, ast.Name) and node.id == 'monkeypatch':
      bad(node, 'monkeypatch: bench/ patches nothing')
    if isinstance(node, ast.ClassDef) and any(_names_in(base) & ours for base in node.bases):
      for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
            item.name.startswith('_') and not item.name.startswith('__'):
          bad(item, f'{node.name} overrides the private method {item.name} of a '
                    'transformer_nmt class')
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
        'import' in node.value:
      try:
        inner = ast.parse(node.value)
      except SyntaxError:
        continue
      if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(inner)):
        found += violations(node.value, f'{where}:{node.lineno} (code in a string)')
  return found


@pytest.mark.parametrize('source,expected', [
    ('from transformer_nmt import Engine, load_workdir\n', []),
    ('from transformer_nmt.serving import make_app\n', []),
    ('from transformer_nmt.inference.engine import Engine\n', ['exports nothing']),
    ('from transformer_nmt.decoding.translate import _cached\n', ['private name']),
    ('from transformer_nmt.inference import Prepared\n', ['does not export']),
    ('import transformer_nmt\nx = transformer_nmt.training.selection.machine()\n',
     ['not exported']),
    ('import transformer_nmt.data.batching as b\n', ['exports nothing']),
    ('from transformer_nmt import Engine\nengine = Engine(m)\nengine.concurrent_batches = 1\n',
     ['an attribute of transformer_nmt']),
    ('import some_module\nsome_module.engine._translate = None\n', ['private attribute']),
    ('from transformer_nmt import Engine\nEngine.translate = lambda *a: []\n',
     ['an attribute of transformer_nmt']),
    ('from transformer_nmt import Engine\nsetattr(Engine, "translate", None)\n', ['setattr']),
    ('from unittest import mock\n', ['patches nothing']),
    ('import unittest.mock\nwith unittest.mock.patch("transformer_nmt.x"): pass\n',
     ['patches nothing', 'patches nothing']),
    ('from transformer_nmt import Engine\nclass E(Engine):\n  def _pieces(self): pass\n',
     ['private method']),
    ('from transformer_nmt import Engine\nclass E(Engine):\n  def translate(self): pass\n', []),
    ('JOB = """\nfrom transformer_nmt.accelerators import gpu_target\n"""\n', ['code in a string']),
    ("JOB = 'import sys, jax; print(jax.devices())'\n", []),
])
def test_the_checker_finds_each_kind(source, expected):
  found = violations(source)
  assert len(found) == len(expected), found
  for line, why in zip(found, expected):
    assert why in line, found


def test_bench_scripts_use_only_the_public_api():
  scripts = sorted(BENCH.glob('*.py'))
  assert len(scripts) <= 10, [p.name for p in scripts]  # the suite's size (issue 74)
  found = [v for path in scripts for v in violations(path.read_text(encoding='utf-8'),
                                                      f'bench/{path.name}')]
  assert not found, '\n'.join(found)

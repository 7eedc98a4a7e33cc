"""Shared fixtures: CPU only, a tiny model config, a small parallel text."""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import atexit  # noqa: E402
import pathlib  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

from transformer_nmt.config import ModelConfig  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / 'shared' / 'data'

# One persistent compilation cache per test process (each pytest-xdist worker), shared by its
# own compiles and the train.py, recipe.py and decode.py runs its tests start with
# shared_compile_cache(), so that a program compiled once is loaded by every later process
# that meets it. Only one process at a time uses it (a worker waits for the runs it starts):
# JAX writes its entries without a lock (a lock comes with a size limit, whose every write
# scans the whole directory), and a read that met a half-written entry would compile again.
COMPILE_CACHE = pathlib.Path(tempfile.mkdtemp(prefix='transformer_nmt_tests_cache_'))
atexit.register(shutil.rmtree, COMPILE_CACHE, ignore_errors=True)

# The key that signs stored programs (runtime/programs.py) lives in the user's config
# directory: the suite keeps its own rather than writing to the home directory.
if 'XDG_CONFIG_HOME' not in os.environ:
  os.environ['XDG_CONFIG_HOME'] = tempfile.mkdtemp(prefix='transformer_nmt_tests_config_')
  atexit.register(shutil.rmtree, os.environ['XDG_CONFIG_HOME'], ignore_errors=True)


def shared_compile_cache(env: dict | None = None) -> dict:
  """`env` (default: this process's environment) with the suite's compilation cache."""
  return dict(os.environ if env is None else env, JAX_COMPILATION_CACHE_DIR=str(COMPILE_CACHE))


def _compile_into_the_shared_cache() -> None:
  import jax
  jax.config.update('jax_compilation_cache_dir', str(COMPILE_CACHE))
  # not the many programs of single operations, which compile faster than they are stored
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.1)


_compile_into_the_shared_cache()


@pytest.fixture(scope='module')
def without_compile_cache():
  """This process compiles without the persistent cache while a module runs: for engines
  that keep their programs in a store, which does not keep what the cache supplied
  (runtime/programs.py)."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  jax.config.update('jax_enable_compilation_cache', False)
  compilation_cache.reset_cache()
  yield
  jax.config.update('jax_enable_compilation_cache', True)
  compilation_cache.reset_cache()


@pytest.fixture(scope='session')
def tiny_cfg() -> ModelConfig:
  return ModelConfig(vocab_size=24, num_layers=2, d_model=32, d_ff=64, num_heads=4,
                     residual_dropout=0.0, embedding_dropout=0.0)


@pytest.fixture
def parallel_files(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  """20 aligned sentence pairs (English numbers -> German), one with an empty side."""
  en = [f'I have {n} cats' + ' and dogs' * (n % 4) + ' .' for n in range(1, 20)] + ['']
  de = [f'Ich habe {n} Katzen' + ' und Hunde' * (n % 4) + ' .' for n in range(1, 20)] + ['leer']
  src, tgt = tmp_path / 'p.en', tmp_path / 'p.de'
  src.write_text('\n'.join(en) + '\n', encoding='utf-8')
  tgt.write_text('\n'.join(de) + '\n', encoding='utf-8')
  return src, tgt


def _train_tiny(workdir: pathlib.Path) -> None:
  import subprocess
  import sys
  result = subprocess.run([sys.executable, 'train.py', '--config', 'configs/tiny.py',
                           '--workdir', str(workdir)], cwd=ROOT, env=shared_compile_cache(),
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope='session')
def tiny_workdir(tmp_path_factory, worker_id) -> pathlib.Path:
  """A workdir trained for 20 steps on the tiny config (checkpoints at steps 10 and 20).

  Trained once per test session: under pytest-xdist the first worker to ask trains it in the
  session's shared temporary directory (the others wait on a lock), and each worker gets a
  copy of its own, since tests write into it (decode.py keeps its programs there)."""
  import fcntl
  own = tmp_path_factory.mktemp('tiny') / 'run'
  if worker_id == 'master':  # no xdist: nothing to share
    _train_tiny(own)
    return own
  shared = tmp_path_factory.getbasetemp().parent  # this session's, shared by its workers
  with open(shared / 'tiny_run.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (shared / 'tiny_run.done').exists():
      _train_tiny(shared / 'tiny_run')
      (shared / 'tiny_run.done').touch()
  shutil.copytree(shared / 'tiny_run', own, symlinks=True)
  return own


@pytest.fixture(scope='module')
def loaded(tiny_workdir):
  """The tiny trained workdir's model, tokenizers and settings (decoding tests)."""
  from transformer_nmt.inference import load_workdir
  return load_workdir(tiny_workdir)


@pytest.fixture(scope='session')
def noisy_engine(tiny_workdir):
  """An engine (beam 2, n-best 2, at most 8 target subwords) on the tiny model's weights with
  strong noise: the model trained 20 steps says '' to everything, these weights something
  else for each line, so that a line answered for another would show. One per session: the
  server and page tests share its compiled programs."""
  import dataclasses

  import jax

  from transformer_nmt.inference import Engine, load_workdir
  loaded = load_workdir(tiny_workdir)
  leaves, tree = jax.tree.flatten(loaded.params)
  keys = jax.random.split(jax.random.key(0), len(leaves))
  noisy = jax.tree.unflatten(tree, [x + 2.0 * jax.random.normal(k, x.shape, x.dtype)
                                    for x, k in zip(leaves, keys)])
  settings = dataclasses.replace(loaded.decode, beam_size=2, max_len=8)
  return Engine(dataclasses.replace(loaded, params=noisy), settings, n_best=2)


@pytest.fixture(scope='module')
def lines(tiny_workdir) -> list[str]:
  """The first lines of the tiny workdir's English test set."""
  return (tiny_workdir / 'demo_data' / 'test.en').read_text().splitlines()[:8]

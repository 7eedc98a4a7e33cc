"""Compiled decoding programs kept on disk (runtime/programs.py): a second engine with
the same settings calls them without compiling; stale, damaged and unwritable stores do not
stop a translation; donated arguments stay donated through the store."""

import concurrent.futures
import dataclasses
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.decoding import ensemble
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.errors import ConfigError
from transformer_nmt.inference import Engine
from transformer_nmt.runtime import heap, programs
from transformer_nmt.runtime.programs import ProgramStore, StoredJit, identity

pytestmark = pytest.mark.usefixtures('without_compile_cache')  # stores programs
SETTINGS = DecodeConfig(beam_size=2, max_extra_len=4)


class Compiles:
  """Counts XLA compilations while active (JAX's monitoring events)."""

  def __init__(self):
    self.count, self.active = 0, False
    jax.monitoring.register_event_duration_secs_listener(self._on)

  def _on(self, event, duration, **_):
    self.count += self.active and event == '/jax/core/compile/backend_compile_duration'

  def __enter__(self):
    self.count, self.active = 0, True
    return self

  def __exit__(self, *_):
    self.active = False


@pytest.fixture(scope='module')
def compiles():
  return Compiles()


def _engine(loaded, directory, decode=SETTINGS, **kw):
  return Engine(loaded, decode, programs=directory, **kw)


@pytest.fixture(scope='module')
def stored(loaded, lines, tmp_path_factory):
  """A program directory filled by one translation, and that translation's outputs."""
  directory = tmp_path_factory.mktemp('programs')
  first = _engine(loaded, directory)
  out = first.translate(lines)
  assert first.store.saved > 0 and first.store.loaded == 0
  return directory, out, first.store.saved


@pytest.mark.slow
def test_a_second_engine_loads_every_program_and_compiles_none(loaded, lines, stored,
                                                               compiles):
  directory, out, saved = stored
  again = _engine(loaded, directory)
  with compiles:
    assert again.translate(lines) == out
  assert compiles.count == 0
  assert again.store.loaded == saved and again.store.saved == 0
  plain = Engine(loaded, SETTINGS)  # jax.jit only
  assert plain.store is None and plain.translate(lines) == out


@pytest.mark.slow
def test_float32_and_cast_kernels_share_the_stored_programs(loaded, lines, tmp_path, compiles):
  """A bfloat16 model's programs take its Dense kernels in bfloat16 whoever calls them:
  programs stored by a translation given the float32 parameters (recipe.py) serve one given
  the kernels cast ahead (decode.py), with nothing compiled."""
  cfg = ensemble.with_dtype(loaded.cfg, 'bfloat16')
  half = dataclasses.replace(loaded, cfg=cfg)  # its parameters: the float32 ones
  make = lambda: Engine(half, SETTINGS, programs=tmp_path)  # noqa: E731
  out = make().translate(lines[:3])
  again = make()
  with compiles:
    assert again.using(ensemble.kernels_as_computed(cfg, loaded.params)).translate(
        lines[:3]) == out
  assert compiles.count == 0 and again.store.loaded > 0

@pytest.mark.slow
def test_other_settings_get_their_own_programs_with_a_notice(loaded, lines, stored, caplog):
  directory, _, saved = stored
  with caplog.at_level(logging.WARNING):
    other = _engine(loaded, directory, DecodeConfig(beam_size=1, max_extra_len=4))
  assert f'The {saved} compiled programs in' in caplog.text and 'another decode' in caplog.text
  other.translate(lines[:2])
  assert other.store.loaded == 0 and other.store.saved > 0
  assert other.store.directory != _engine(loaded, directory).store.directory


def test_a_damaged_program_is_compiled_again(loaded, lines, stored, tmp_path, caplog):
  directory, out, _ = stored
  copy = tmp_path / 'programs'
  copy.mkdir()
  for sub in directory.iterdir():
    (copy / sub.name).mkdir()
    for f in sub.iterdir():
      (copy / sub.name / f.name).write_bytes(f.read_bytes())
  again = _engine(loaded, copy)
  victim = sorted(again.store.directory.glob('start-*.program'))[0]
  victim.write_bytes(b'not a program')
  with caplog.at_level(logging.WARNING):
    assert again.translate(lines) == out
  assert f'Stored program {victim} is not signed' in caplog.text
  assert again.store.saved == 1 and victim.read_bytes() != b'not a program'


class _Planted:
  """A pickle that runs code when loaded: touches `marker`."""

  def __init__(self, marker):
    self.marker = str(marker)

  def __reduce__(self):
    return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def _copy_store(directory, into):
  into.mkdir()
  for sub in directory.iterdir():
    (into / sub.name).mkdir()
    for f in sub.iterdir():
      (into / sub.name / f.name).write_bytes(f.read_bytes())
  return into


@pytest.mark.slow
@pytest.mark.parametrize('signed_by', ['nobody', 'another user'])
def test_a_planted_pickle_is_never_loaded(loaded, lines, stored, tmp_path, caplog, monkeypatch,
                                          signed_by):
  """A workdir's programs run no code of whoever wrote them: a pickle that would touch a
  file, unsigned or signed with another user's key, is compiled again, never unpickled."""
  import pickle
  directory, out, _ = stored
  copy = _copy_store(directory, tmp_path / 'programs')
  again = _engine(loaded, copy)
  marker = tmp_path / 'code_ran'
  payload = pickle.dumps(_Planted(marker))
  assert not marker.exists()
  victims = sorted(again.store.directory.glob('*.program'))
  other_key = bytes(range(32))
  for victim in victims:
    victim.write_bytes(payload if signed_by == 'nobody' else programs.sign(other_key, payload))
  with caplog.at_level(logging.WARNING):
    assert again.translate(lines) == out
  assert not marker.exists()
  assert caplog.text.count('is not signed with this user') == len(victims)
  assert again.store.loaded == 0 and again.store.saved == len(victims)
  pickle.loads(payload)  # the payload does run code when unpickled: the test means something
  assert marker.exists()


def test_the_signing_key_is_private_and_outside_the_workdir(stored):
  path = programs.key_path()
  assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_bytes()) == 32
  assert stored[0] not in path.parents
  key = programs.signing_key()
  assert programs.verified(key, programs.sign(key, b'x')) == b'x'
  assert programs.verified(key, programs.sign(key, b'x')[:-1] + b'y') is None


@pytest.mark.slow
def test_an_unwritable_store_warns_once_and_translates(loaded, lines, stored, tmp_path, caplog):
  _, out, _ = stored
  blocked = tmp_path / 'programs'
  blocked.write_text('a file where the directory would go')  # fails for root too
  engine = _engine(loaded, blocked)
  with caplog.at_level(logging.WARNING):
    assert engine.translate(lines) == out
  assert caplog.text.count('Not keeping compiled programs') == 1
  assert not engine.store.writable and engine.store.saved == 0


def test_stored_jit_keys_on_shapes_dtypes_and_static_arguments(tmp_path, compiles):
  store = ProgramStore(tmp_path, identity(test='keys'))
  fn = StoredJit(lambda x, n: x * n, 'scale', store, static_argnums=(1,))
  assert float(fn(jnp.ones(3), 2)[0]) == 2.0
  assert float(fn(jnp.ones(3), 3)[0]) == 3.0  # another static value: another program
  assert fn(np.ones(4, np.int32), 2).dtype == jnp.int32  # another shape and dtype
  assert store.saved == 3
  later = ProgramStore(tmp_path, identity(test='keys'))
  again = StoredJit(lambda x, n: x * n, 'scale', later, static_argnums=(1,))
  with compiles:
    assert float(again(jnp.ones(3), 3)[1]) == 3.0
  assert later.loaded == 1 and compiles.count == 0


def test_threads_asking_for_one_new_program_build_it_once(tmp_path, compiles):
  store = ProgramStore(tmp_path, identity(test='threads'))
  fn = StoredJit(lambda x: jnp.cumsum(x) * 2, 'cumsum', store)
  x = jnp.arange(5.0)
  with compiles, concurrent.futures.ThreadPoolExecutor(4) as pool:
    outs = list(pool.map(lambda _: np.asarray(fn(x)), range(8)))
  assert compiles.count == 1 and store.saved == 1
  assert all(np.array_equal(o, [0, 2, 6, 12, 20]) for o in outs)


def test_donated_arguments_are_reused_by_compiled_and_stored_programs(tmp_path, compiles):
  """The decoder's state is donated (compaction.py): a program compiled here and the same
  program read back from the store both take over the donated buffers."""
  store = ProgramStore(tmp_path, identity(test='donate'))
  fn = StoredJit(lambda x, y: (x + y, y), 'add', store, donate_argnums=(0,))
  x, y = jnp.arange(4.0), jnp.ones(4)
  np.testing.assert_array_equal(fn(x, y)[0], [1, 2, 3, 4])
  assert x.is_deleted() and not y.is_deleted()
  again = StoredJit(lambda x, y: (x + y, y), 'add', ProgramStore(tmp_path, identity(
      test='donate')), donate_argnums=(0,))
  x = jnp.arange(4.0)
  with compiles:
    np.testing.assert_array_equal(again(x, y)[0], [1, 2, 3, 4])
  assert again.store.loaded == 1 and compiles.count == 0
  assert x.is_deleted() and not y.is_deleted()


@pytest.mark.slow
def test_precompiled_small_jobs_translate_without_compiling(loaded, lines, tmp_path, compiles):
  """Engine.precompile makes exactly the program set of jobs of up to 4 rows (batches of 1
  and 4) at each grid length that up to max_length needs, through every cache stage: later
  jobs of such batches (the 8 lines run as two batches of 4) compile nothing and give the
  outputs of an engine that compiled."""
  assert max(len(ids) + 1 for ids in loaded.src_tok.encode(lines)) <= 40
  decode = DecodeConfig(beam_size=2, max_extra_len=20, min_len=14)  # past the first stage
  first = _engine(loaded, tmp_path, decode)
  made = first.precompile(max_rows=4, max_length=40)
  assert made.shapes == ((1, 16), (4, 16), (1, 32), (4, 32), (1, 64), (4, 64))
  # per shape a start program and an advance program per later cache stage: outputs of up
  # to 36, 52 and 84 steps pass caches of 12, 36 / 12, 24, 54 / 12, 24, 48, 84
  assert made.programs == 2 * (2 + 3 + 4) == first.store.saved == first.programs_ready
  jobs = [lines[:1], lines[2:5], lines]
  again = _engine(loaded, tmp_path, decode)
  rows, batch = [], again._batch

  def counted(params, src, *rest, **kw):  # the rows of each batch the jobs run
    rows.append(len(src))
    return batch(params, src, *rest, **kw)
  again._batch = counted
  with compiles:
    got = [again.translate(job) for job in jobs]
  # as few rows as hold the job's lines (batches.START_ROWS); the 8 lines, one batch, run as
  # one batch of 4 per decoding thread (batches.split_for_threads)
  assert rows == [1, 4, 4, 4] and again.concurrent_batches == 2
  assert len(again._translate.decoder.rows_per_chunk) > 2  # a stage after the first 2 chunks
  assert compiles.count == 0 and again.store.saved == 0 and again.store.loaded > 0
  with compiles:  # the engine that compiled them, calling them as compiled
    assert got == [first.translate(job) for job in jobs]
  assert compiles.count == 0
  assert _engine(loaded, tmp_path / 'none').precompile(max_rows=0).programs == 0


def test_the_code_identity_is_the_code_the_process_imported(tmp_path):
  """A process whose package files change on disk after it started (an edit, an upgrade
  during a long recipe.py run) keeps filing its programs under the code it runs."""
  package = tmp_path / 'transformer_nmt'
  shutil.copytree(pathlib.Path(programs.__file__).resolve().parents[1], package,
                  ignore=shutil.ignore_patterns('__pycache__'))
  imported = programs.files_hash(package)
  edit_then_ask = (  # it edits only the copy it was given, never the tree under test
      'import pathlib, sys\n'
      'from transformer_nmt.runtime import programs\n'
      'root = pathlib.Path(programs.__file__).resolve().parents[1]\n'
      'assert root == pathlib.Path(sys.argv[1]).resolve(), root\n'
      "edited = root / 'model' / 'attention.py'\n"
      "edited.write_text(edited.read_text() + '\\n# edited while the process runs\\n')\n"
      "print(programs.identity()['code'], programs.files_hash(root))\n")
  env = dict(os.environ, PYTHONPATH=str(tmp_path), JAX_PLATFORMS='cpu')
  run = subprocess.run([sys.executable, '-c', edit_then_ask, str(package)], env=env,
                       capture_output=True, text=True, timeout=300, check=True)
  code, on_disk = run.stdout.split()
  assert code == imported and on_disk != imported


@pytest.mark.slow
def test_precompile_stops_near_the_limit_on_memory_maps(loaded, monkeypatch):
  """Past heap.MAPS_SHARE of vm.max_map_count, precompiling stops after the program that got
  there with a ConfigError that names the limit and how to make fewer programs (more programs
  would crash the process); below it, it goes on."""
  engine = Engine(loaded, SETTINGS)
  monkeypatch.setattr(heap, 'memory_maps', lambda: (899, 1000))
  assert engine.precompile(max_rows=1, max_length=8).shapes == ((1, 16),)
  monkeypatch.setattr(heap, 'memory_maps', lambda: (901, 1000))
  with pytest.raises(ConfigError, match=r'^901 memory maps in use of the 1000 .*'
                     r'vm.max_map_count\) after 1 of 2 batch shapes: .*--precompile_length\)$'):
    engine.precompile(max_rows=1, max_length=32)

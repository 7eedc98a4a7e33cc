"""Compiled decoding programs kept on disk, so that a later run calls them without tracing.

JAX's persistent compilation cache spares a rerun the compiler, but not the Python tracing
and lowering that compute its key, for each of the programs a beam search meets. A
`ProgramStore` keeps each compiled program's executable (jax.experimental.serialize_executable)
in a directory, and a `StoredJit` (used like `jax.jit`) looks a call's argument shapes up there
before it traces anything.

A store's programs are only valid for the jax, backend, XLA flags, package code and model and
search settings they were built with; these form its identity, and its directory is named
after their hash. Programs built for another identity are left alone (a one-line notice
names what differs), a program that does not load is compiled again, and a store that
cannot be written is used read-only: the store does not stop a translation. The one
exception: a stored program that fails while running after it took its donated inputs
(StoredJit's donate_argnums) ends the run with a DataError that names the store to delete.

Deserialising an executable can run arbitrary code (jax serialises it as a pickle), and
workdirs are shared and served. So every stored file carries an HMAC-SHA256 of its contents
under a key kept outside any workdir (`key_path`: the user's config directory, created on
first use, readable by its owner only), and a file is unpickled only when its tag checks
out: a file planted or changed by anyone without the key (or written under another user's
key) is compiled again with one warning, never loaded.

On XLA:CPU (jax 0.10.2) an executable that JAX's persistent compilation cache supplied
serialises without some of its kernels ('Function ... not found' when a later run calls it),
so a program the cache supplied is not stored: use one or the other (decode.py does).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import pathlib
import pickle
import platform
import secrets
import threading
from typing import Any, Callable, Optional, Sequence

import flax
import jax
import jaxlib
from jax import monitoring
from jax.experimental import serialize_executable

from transformer_nmt.errors import DataError
from transformer_nmt.files import write_atomically
from transformer_nmt.runtime import host_cpu

_IDENTITY = 'identity.json'
_MAGIC = b'transformer_nmt program 2\n'  # then a 32-byte HMAC-SHA256 tag, then the pickle
_cache_hits = [0]  # programs JAX's persistent compilation cache supplied in this process


def _count_cache_hit(event: str, **_: Any) -> None:
  _cache_hits[0] += event == '/jax/compilation_cache/cache_hits'


monitoring.register_event_listener(_count_cache_hit)


def files_hash(root: pathlib.Path) -> str:
  """Hash of the Python files under `root`, with their paths relative to it."""
  digest = hashlib.sha256()
  for path in sorted(root.rglob('*.py')):
    digest.update(str(path.relative_to(root)).encode() + b'\0' + path.read_bytes())
  return digest.hexdigest()[:16]


# This package's files as this process imported them: a program traced from other code is
# stale. Hashed now, not when the first program is stored, since a long run (recipe.py trains
# for an hour before it decodes) must not file programs of the code it runs under the hash of
# files edited or upgraded on disk meanwhile.
_CODE_HASH = files_hash(pathlib.Path(__file__).resolve().parents[1])


# jax options that change what a traced program computes (random bits, matmul precision, ...)
_JAX_OPTIONS = ('jax_enable_x64', 'jax_threefry_partitionable', 'jax_default_prng_impl',
                'jax_default_matmul_precision', 'jax_numpy_rank_promotion',
                'jax_numpy_dtype_promotion', 'jax_debug_nans', 'jax_debug_infs',
                'jax_disable_jit', 'jax_enable_checks')


def _host_cpu() -> str:
  """The host CPU's feature flags (hashed): XLA:CPU code uses the instructions it finds."""
  return _digest(host_cpu.flags_line() or platform.processor() or platform.machine())


def identity(**settings: Any) -> dict[str, str]:
  """What a program depends on besides its argument shapes: the software, the backend, the
  jax options that change a traced program, and the caller's `settings` (model and search
  configuration, token ids), each as a string."""
  device = jax.devices()[0]
  fields = {'jax': jax.__version__, 'jaxlib': jaxlib.__version__, 'flax': flax.__version__,
            'backend': f'{device.platform} {device.client.platform_version}',
            'device': device.device_kind, 'xla_flags': os.environ.get('XLA_FLAGS', ''),
            'jax_options': str({k: jax.config.values.get(k) for k in _JAX_OPTIONS}),
            'code': _CODE_HASH}
  if device.platform == 'cpu':
    fields['host_cpu'] = _host_cpu()
  return fields | {name: str(value) for name, value in settings.items()}


def _digest(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def key_path() -> pathlib.Path:
  """The key that signs stored programs: $XDG_CONFIG_HOME (default ~/.config)/
  transformer_nmt/programs.key, outside every workdir."""
  base = os.environ.get('XDG_CONFIG_HOME') or os.path.join(os.path.expanduser('~'), '.config')
  return pathlib.Path(base) / 'transformer_nmt' / 'programs.key'


def signing_key() -> bytes:
  """This user's 32-byte key, created (mode 0600) on first use. Raises OSError when it can
  be neither read nor created."""
  path = key_path()
  try:
    key = path.read_bytes()
  except FileNotFoundError:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
      return signing_key()
    with os.fdopen(fd, 'wb') as f:
      f.write(secrets.token_bytes(32))
    key = path.read_bytes()
  if len(key) < 32:
    raise OSError(f'{path} holds {len(key)} bytes, not a 32-byte key: delete it to make a new '
                  'one (stored programs are then compiled again)')
  return key


def sign(key: bytes, payload: bytes) -> bytes:
  """A stored file's bytes: the magic line, the payload's HMAC-SHA256 tag, the payload."""
  return _MAGIC + hmac.new(key, payload, hashlib.sha256).digest() + payload


def verified(key: bytes, data: bytes) -> Optional[bytes]:
  """The payload of a file `sign` wrote with `key`, or None when it was not (another key,
  a changed byte, an older format)."""
  tag, payload = data[len(_MAGIC):len(_MAGIC) + 32], data[len(_MAGIC) + 32:]
  good = hmac.new(key, payload, hashlib.sha256).digest()
  return payload if data.startswith(_MAGIC) and hmac.compare_digest(tag, good) else None


class ProgramStore:
  """Serialised executables in `root`/<hash of the identity>/<name>-<hash of shapes>.program.

  `loaded` counts this process's programs read from disk that ran (StoredJit proves them on
  their first call), `saved` those written to it."""

  def __init__(self, root: str | os.PathLike, fields: dict[str, str]):
    self.root, self.fields = pathlib.Path(root), fields
    self.directory = self.root / _digest(json.dumps(fields, sort_keys=True))
    self.loaded = self.saved = 0
    self.writable = True
    self.key: Optional[bytes] = None
    try:
      self.key = signing_key()
      if not self.directory.exists():
        self._notice_stale()
    except OSError as e:  # an unreadable directory or key, or one removed while we looked
      self.writable = False
      logging.warning('Not using the compiled programs in %s (%s)', self.root, e)

  def _notice_stale(self) -> None:
    """One line when the root holds programs of other identities only, naming what differs
    from the newest of them."""
    others = sorted((p.stat().st_mtime, p) for p in self.root.glob(f'*/{_IDENTITY}'))
    others = [p for _, p in others]
    if not others:
      return
    try:
      theirs = json.loads(others[-1].read_text())
    except (OSError, ValueError):
      theirs = {}
    differ = sorted(k for k in self.fields.keys() | theirs.keys()
                    if self.fields.get(k) != theirs.get(k))
    count = len(list(others[-1].parent.glob('*.program')))
    logging.warning('The %d compiled programs in %s were built for another %s; compiling '
                    'the ones this run needs again', count, others[-1].parent,
                    ', '.join(differ) or 'identity')

  def path(self, name: str, signature: str) -> pathlib.Path:
    return self.directory / f'{name}-{_digest(signature)}.program'

  def load(self, name: str, signature: str) -> Optional[jax.stages.Compiled]:
    """The program stored for `name` at these argument shapes, or None (also when the file
    does not load, with a warning)."""
    path = self.path(name, signature)
    try:
      data = path.read_bytes() if self.key is not None else b''
    except OSError:
      return None
    if not data:
      return None
    trusted = verified(self.key, data)
    if trusted is None:
      logging.warning('Stored program %s is not signed with this user\'s key (%s); compiling '
                      'it again without loading it', path, key_path())
      return None
    try:
      stored_signature, payload, in_tree, out_tree = pickle.loads(trusted)
      if stored_signature != signature:  # a hash collision, however unlikely
        return None
      program = serialize_executable.deserialize_and_load(
          payload, in_tree, out_tree, execution_devices=jax.devices()[:1])
    except Exception as e:  # noqa: BLE001 -- a damaged or foreign file raises anything
      logging.warning('Stored program %s does not load (%s: %s); compiling it again', path,
                      type(e).__name__, str(e).splitlines()[0][:200] if str(e) else '')
      return None
    return program

  def save(self, name: str, signature: str, program: jax.stages.Compiled) -> None:
    """Writes the program (atomically); on the first failure, e.g. a read-only workdir or a
    full disk, warns once and stops writing."""
    if not self.writable:
      return
    try:
      payload, in_tree, out_tree = serialize_executable.serialize(program)
      self.directory.mkdir(parents=True, exist_ok=True)
      if not (self.directory / _IDENTITY).exists():
        write_atomically(self.directory / _IDENTITY, json.dumps(self.fields, indent=1))
      write_atomically(self.path(name, signature),
                       sign(self.key, pickle.dumps((signature, payload, in_tree, out_tree))))
    except Exception as e:  # noqa: BLE001 -- unwritable disk, or a program that does not
      # serialize (host callbacks, a backend without serialization): never stops decoding
      self.writable = False
      logging.warning('Not keeping compiled programs in %s (%s)', self.directory, e)
      return
    self.saved += 1


def signature(args: Sequence[Any], kwargs: dict[str, Any], static: Sequence[int]
              ) -> Optional[str]:
  """A call's pytree structure, each leaf's shape, dtype and weak type, and the static
  arguments' values: what decides which compiled program serves the call. None when an
  array is committed to a device other than the default one: a stored program runs on that
  one only."""
  dynamic = [a for i, a in enumerate(args) if i not in static]
  leaves, tree = jax.tree_util.tree_flatten((dynamic, kwargs))
  default = jax.devices()[0]
  if any(getattr(x, 'committed', False) and x.sharding.device_set != {default} for x in leaves):
    return None
  shapes = ';'.join(f'{getattr(x, "shape", ())}{getattr(x, "dtype", type(x).__name__)}'
                    f'{"w" if getattr(x, "weak_type", False) else ""}' for x in leaves)
  return f'{tree}|{shapes}|{[args[i] for i in static]!r}'


class Unprepared(RuntimeError):
  """A call that needs a program no one prepared, once its `StoredJit`s are sealed."""


def jit_factory(store: Optional[ProgramStore], sealed: Optional[threading.Event],
                made: Optional[list[StoredJit]] = None) -> Callable[..., StoredJit]:
  """The decoders' `Jit` (decoding.search.Jit) of an engine: StoredJits on `store` (None:
  programs kept in memory only) that refuse to make a program once `sealed` is set, each
  appended to `made` when given (to count their programs)."""
  def jit(fn: Callable, name: str, static_argnums: Sequence[int] = (),
          donate_argnums: Sequence[int] = (),
          compiler_options: Optional[dict[str, str]] = None) -> StoredJit:
    stored = StoredJit(fn, name, store, static_argnums, donate_argnums, compiler_options,
                       sealed)
    if made is not None:
      made.append(stored)
    return stored
  return jit


class StoredJit:
  """`jax.jit(fn, static_argnums=static, donate_argnums=donate)` whose compiled programs, one
  per argument signature, come from a `ProgramStore` when it holds them and go to it when
  they are compiled; without a store and a seal, `jax.jit` itself. Once `sealed` is set, a
  call whose signature has no program yet raises `Unprepared` instead of compiling one: a
  server compiles nothing after its warm-up (each program holds memory and a few hundred
  memory maps, and a process past the kernel's limit on maps dies). Static and donated
  arguments must be positional. Threads may call it at once: each signature is loaded or
  compiled by one of them."""

  def __init__(self, fn: Callable, name: str, store: Optional[ProgramStore] = None,
               static_argnums: Sequence[int] = (), donate_argnums: Sequence[int] = (),
               compiler_options: Optional[dict[str, str]] = None,
               sealed: Optional[threading.Event] = None):
    self.name, self.store, self.static, self.sealed = name, store, tuple(static_argnums), sealed
    self.jitted = jax.jit(fn, static_argnums=self.static, donate_argnums=tuple(donate_argnums),
                          compiler_options=compiler_options)
    self._programs: dict[str, jax.stages.Compiled] = {}
    self._lock = threading.Lock()
    self._pending: dict[str, threading.Lock] = {}  # signature -> held while it is built

  @property
  def programs(self) -> int:
    """How many programs this function holds (made by this process or loaded), when a store
    or a seal tracks them (else jax.jit keeps its own)."""
    return len(self._programs)

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    tracked = self.store is not None or self.sealed is not None
    key = signature(args, kwargs, self.static) if tracked else None
    if key is None:
      return self.jitted(*args, **kwargs)
    dynamic = [a for i, a in enumerate(args) if i not in self.static]
    program = self._programs.get(key)
    if program is not None:
      return program(*dynamic, **kwargs)
    with self._lock:
      building = self._pending.setdefault(key, threading.Lock())
    with building:  # a second thread wanting the same program waits for the first one's
      program = self._programs.get(key)
      if program is not None:
        return program(*dynamic, **kwargs)
      if self.sealed is not None and self.sealed.is_set():
        shapes = [tuple(getattr(x, 'shape', ())) for x in jax.tree_util.tree_leaves(
            [a for i, a in enumerate(args) if i not in self.static][1:])][:4]
        raise Unprepared(f'no {self.name} program was prepared for these shapes {shapes}')
      return self._build(key, args, dynamic, kwargs)

  def _build(self, key: str, args: Sequence[Any], dynamic: list[Any],
             kwargs: dict[str, Any]) -> Any:
    """Loads (or else compiles and stores) the program for `key` and runs it once. Raises
    DataError when a stored program fails after consuming donated inputs (nothing is left
    to run a recompiled program on)."""
    program = None if self.store is None else self.store.load(self.name, key)
    if program is not None:
      try:  # the first call of a stored program, run to its end, proves that it works
        out = jax.block_until_ready(program(*dynamic, **kwargs))
        self._programs[key] = program
        self.store.loaded += 1
        return out
      except (jax.errors.JaxRuntimeError, ValueError, TypeError) as e:
        path = self.store.path(self.name, key)
        reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
        if any(getattr(x, 'is_deleted', lambda: False)()
               for x in jax.tree_util.tree_leaves((dynamic, kwargs))):
          raise DataError(f'Stored program {path} failed while running ({reason}) and took '
                          f'its donated inputs with it; delete {self.store.directory} and run '
                          'again') from None
        logging.warning('Stored program %s does not run (%s); compiling it again', path,
                        reason)
    hits = _cache_hits[0]
    program = self.jitted.lower(*args, **kwargs).compile()
    if self.store is not None and _cache_hits[0] == hits:  # not from the persistent cache
      self.store.save(self.name, key, program)
    self._programs[key] = program
    return program(*dynamic, **kwargs)

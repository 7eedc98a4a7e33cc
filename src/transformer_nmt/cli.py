"""What the command-line programs share: quiet library logging and one-line errors."""

import contextlib
import errno
import glob
import logging
import os
import pathlib
import re
import shutil
import sys
from typing import Any, Callable, NoReturn, Optional


def quiet_logging() -> None:
  """Our progress lines as 'HH:MM:SS message'; library chatter (Orbax, absl) only from WARNING."""
  from absl import logging as absl_logging
  absl_logging.get_absl_handler().setFormatter(
      logging.Formatter('%(asctime)s %(message)s', '%H:%M:%S'))
  logging.getLogger().setLevel(logging.INFO)
  logging.getLogger('absl').setLevel(logging.WARNING)
  logging.getLogger('jax._src.xla_bridge').setLevel(logging.ERROR)  # 'no TPU' notice on CPU
  logging.getLogger('jax._src.xla_bridge').addFilter(_no_cuda_plugin_failure_without_a_gpu)
  absl_logging.get_absl_handler().addFilter(_drop_read_only_notices)
  absl_logging.get_absl_handler().addFilter(_one_line_from_libraries)
  sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)


def _no_cuda_plugin_failure_without_a_gpu(record: logging.LogRecord) -> bool:
  """The CUDA plugin (requirements-dev.txt installs it to compile GPU programs without a GPU)
  fails to start on a machine with no NVIDIA GPU, and JAX logs that with a traceback before
  falling back to the CPU. Without a GPU that failure is expected: dropped. With one, a
  plugin that fails is the user's to see."""
  if not record.getMessage().startswith('Jax plugin configuration error'):
    return True
  return 'cuda' not in record.getMessage() or _has_nvidia_gpu()


def _has_nvidia_gpu() -> bool:
  return os.path.exists('/proc/driver/nvidia') or bool(glob.glob('/dev/nvidia[0-9]*'))


def _quiet_unraisable(hook: Callable[..., Any]) -> Callable[..., Any]:
  """After a failed checkpoint read or write, TensorStore's callbacks for the operations
  still pending find Orbax's event loop closed, and Python prints each one's RuntimeError as
  an unraisable exception, a traceback apiece; the program reports the failure itself."""
  def unraisable(info: Any) -> None:
    if isinstance(info.exc_value, RuntimeError) and str(info.exc_value) == 'Event loop is closed':
      return
    hook(info)
  return unraisable


def _one_line_from_libraries(record: logging.LogRecord) -> bool:
  """Orbax's background save threads (and asyncio under them) log every failure with its
  traceback, dozens for one full disk; the program reports the error itself in one line, so
  their records keep their first line only."""
  if record.exc_info and any(part in record.pathname for part in _CHATTY):
    record.msg = str(record.getMessage()).splitlines()[0] if record.getMessage() else ''
    record.args, record.exc_info, record.exc_text = None, None, None
  return True


_CHATTY = ('/orbax/', '/asyncio/', '/etils/')


def _drop_read_only_notices(record: logging.LogRecord) -> bool:
  """Orbax warns on every read-only checkpoint manager (decoding, selection); nothing to act on."""
  message = str(record.msg)
  return not (message.startswith('CheckpointManagerOptions.read_only=True')
              or message.startswith('Given directory is read only'))


def use_compile_cache(directory: str, min_free_bytes: int = 2 ** 30) -> None:
  """Keeps compiled XLA programs in `directory` (JAX's persistent compilation cache), so a
  rerun that meets the same shapes loads them instead of compiling again: decoding compiles
  one search step per batch size and cache length it meets, much of a file's decoding time.

  When JAX_COMPILATION_CACHE_DIR is set, that directory is used instead: one cache for many
  runs (a sweep, a test suite), since a run only finds programs cached under the same path
  (jax 0.10 puts paths derived from the cache directory into the compile options that key
  its entries), so no two workdirs' own caches ever share one.

  The cache is the first thing to go when the disk is short: with less than `min_free_bytes`
  free where it would live, it is not used (with a warning), so that checkpoints fit.
  """
  import jax
  directory = os.environ.get('JAX_COMPILATION_CACHE_DIR') or directory
  existing = pathlib.Path(directory).absolute()
  while not existing.exists() and existing != existing.parent:
    existing = existing.parent
  free = shutil.disk_usage(existing).free
  if free < min_free_bytes:
    logging.warning('Only %.2f GiB free on the disk of %s: not keeping compiled programs there '
                    '(their cache can take gigabytes)', free / 2 ** 30, directory)
    jax.config.update('jax_compilation_cache_dir', None)  # JAX took the variable at import
    return
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)  # default 1 s skips many


class CompileCounter:
  """Counts, from JAX's monitoring events, the programs this process built: XLA compilations,
  and how many of them the persistent compile cache supplied instead of the compiler."""

  def __init__(self) -> None:
    import jax.monitoring
    self.requests = self.loaded = 0
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)
    jax.monitoring.register_event_listener(self._on_event)

  def _on_duration(self, event: str, duration: float, **_: Any) -> None:
    self.requests += event == '/jax/core/compile/backend_compile_duration'

  def _on_event(self, event: str, **_: Any) -> None:
    self.loaded += event == '/jax/compilation_cache/cache_hits'

  def summary(self) -> str:
    """'N programs compiled, M loaded from the compile cache'."""
    return (f'{self.requests - self.loaded} programs compiled, {self.loaded} loaded from the '
            'compile cache')


def fail(message: str) -> NoReturn:
  """A user mistake: one line on stderr, exit code 2, no traceback."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def config_flag_parser(config_flag: Any) -> Callable[[list[str]], list[str]]:
  """An absl `flags_parser` that reports bad flags, config files and config keys in one line.

  `config_flag` is the holder returned by `config_flags.DEFINE_config_file`.
  """
  from absl import flags

  def parse(argv: list[str]) -> list[str]:
    try:
      rest = flags.FLAGS(argv)
      config_flag.value.to_dict()  # config_flags loads lazily: surface a broken file now
      return rest
    except flags.Error as e:  # a config file's own error comes with a traceback: keep its end
      lines = str(e).strip().splitlines()
      fail(lines[0].split(' Error whilst')[0] + ' ' + lines[-1] if len(lines) > 1 else str(e))
    except Exception as e:  # noqa: BLE001 -- config files are Python: they may raise anything
      missing = _missing_key(e)
      if missing is None:  # bad override values, broken files, a get_config() that raises
        fail('bad --config or --config.* flag: ' + ' '.join(
            f'{type(e).__name__}: {e}'.replace('"', '').split()))
      key, suggestion = missing
      given = [a.split('=')[0] for a in argv if a.startswith('--config.') and key in a]
      hint = f'; did you mean {suggestion}?' if suggestion else ''
      fail(f'{given[0] if given else key}: no such config option{hint} (every option and its '
           'default: src/transformer_nmt/config.py; decode.*: decoding/settings.py)')
  return parse


def flag_parser(argv: list[str]) -> list[str]:
  """An absl `flags_parser` for the programs without a --config: an unknown or badly typed
  flag in one line with exit code 2 (absl's own message takes two and exits with 1)."""
  from absl import flags
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    fail(' '.join(str(e).split()))


def _missing_key(error: Exception) -> Optional[tuple[str, str]]:
  """(the option an override names that the config lacks, the option ml_collections
  suggests instead or ''), from the KeyError config_flags raises (or an AttributeError
  wrapping one); None for any other error. The KeyError's text is "'key'" followed by a line
  'Did you mean "other" instead of "key"?', which must not reach the one-line message as is."""
  if isinstance(error, AttributeError) and error.args and isinstance(error.args[0], KeyError):
    error = error.args[0]
  if not (isinstance(error, KeyError) and error.args):
    return None
  first, *rest = str(error.args[0]).splitlines() or ['']
  suggestion = re.search(r'Did you mean "([^"]+)"', ' '.join(rest))
  return first.strip('\'" '), suggestion.group(1) if suggestion else ''


def main_running(run: Callable[[], None], resumes: bool = False
                 ) -> Callable[[list[str]], None]:
  """An absl `main` that rejects stray arguments, quiets logging, reports UserErrors (bad
  files, options, workdirs) and the file system's refusals in one line and exits with code
  130 on Ctrl-C (train.py has then saved a checkpoint that a rerun resumes from). `resumes`:
  a rerun continues the work (training), which the hint for a full disk then says."""
  def main(argv: list[str]) -> None:
    from absl import app

    from transformer_nmt.errors import UserError
    if len(argv) > 1:
      raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    quiet_logging()
    try:
      run()
    except UserError as e:
      fail(str(e))
    except KeyboardInterrupt:
      raise SystemExit(130) from None
    except BrokenPipeError:  # the reader went away (`decode.py ... | head -n 3`): not an error
      _quiet_exit_on_closed_pipe()
    except Exception as e:  # noqa: BLE001 -- the file system's refusals are the user's to fix
      message = file_system_error(e, resumes)
      if message is None:
        raise
      fail(message)
  return main


CLOSED_PIPE_EXIT = 141  # what a shell reports for a program that SIGPIPE ended (128 + 13)


def _quiet_exit_on_closed_pipe() -> NoReturn:
  """Exits without a word, as a program that SIGPIPE ended would, with stdout pointed at
  /dev/null first: Python's last flush of it would fail again and print a traceback."""
  with contextlib.suppress(OSError, AttributeError, ValueError):
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
  raise SystemExit(CLOSED_PIPE_EXIT)


def file_system_error(error: BaseException, resumes: bool = False) -> Optional[str]:
  """One line for an error the file system raised (a full disk, a read-only or missing
  directory, a path that is a file), wherever it surfaced (Orbax and TensorStore wrap them in
  their own exceptions); None for anything else. `resumes`: a rerun continues the work."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text = str(error)
    if getattr(error, 'errno', None) == errno.ENOSPC or 'No space left on device' in text:
      where = getattr(error, 'filename', None)
      return (f'no space left on the disk{f" writing {where}" if where else ""}; free some '
              '(a workdir\'s compile_cache/ can always be deleted) and run again'
              + (' to resume' if resumes else ''))
    if isinstance(error, OSError) and error.errno in _FILE_SYSTEM_ERRNOS:
      return f'{error.filename or "a file"}: {error.strerror}'
    error = error.__cause__  # explicit wrapping only: a bug met while handling one is a bug
  return None


_FILE_SYSTEM_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR,
                       errno.EDQUOT}

"""What the command-line programs share: quiet library logging and one-line errors."""

import logging
import sys
from typing import Any, Callable, NoReturn


def quiet_logging() -> None:
  """Our progress lines as 'HH:MM:SS message'; library chatter (Orbax, absl) only from WARNING."""
  from absl import logging as absl_logging
  absl_logging.get_absl_handler().setFormatter(
      logging.Formatter('%(asctime)s %(message)s', '%H:%M:%S'))
  logging.getLogger().setLevel(logging.INFO)
  logging.getLogger('absl').setLevel(logging.WARNING)
  logging.getLogger('jax._src.xla_bridge').setLevel(logging.ERROR)  # 'no TPU' notice on CPU
  absl_logging.get_absl_handler().addFilter(_drop_read_only_notices)


def _drop_read_only_notices(record: logging.LogRecord) -> bool:
  """Orbax warns on every read-only checkpoint manager (decoding, selection); nothing to act on."""
  message = str(record.msg)
  return not (message.startswith('CheckpointManagerOptions.read_only=True')
              or message.startswith('Given directory is read only'))


def use_compile_cache(directory: str) -> None:
  """Keeps compiled XLA programs in `directory` (JAX's persistent compilation cache), so a
  rerun that meets the same shapes loads them instead of compiling again: decoding compiles
  one search step per batch size and cache length it meets, tens of seconds per file."""
  import jax
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)  # default 1 s skips many


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
    except (AttributeError, KeyError, TypeError, ValueError, SyntaxError, OSError) as e:
      # config_flags raises these for unknown keys, bad override values and broken files
      fail('bad --config or --config.* flag: ' + ' '.join(str(e).replace('"', '').split()))
  return parse


def main_running(run: Callable[[], None]) -> Callable[[list[str]], None]:
  """An absl `main` that rejects stray arguments, quiets logging, reports UserErrors (bad
  files, options, workdirs) in one line and exits with code 130 on Ctrl-C (train.py has then
  saved a checkpoint that a rerun resumes from)."""
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
  return main

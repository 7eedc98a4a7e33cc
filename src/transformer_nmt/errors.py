"""User-facing errors: the CLIs print these as one line and exit non-zero, without a traceback;
the checks that raise them for a config's values."""

from typing import Any


class UserError(Exception):
  """A mistake in the user's input (files, flags, config), not a bug."""


class ConfigError(UserError, ValueError):
  """A bad config value or key; the message names the option."""


class DataError(UserError):
  """Unreadable or malformed data; the message names the file (and line)."""


def check(ok: bool, message: str) -> None:
  """ConfigError(message) unless `ok`."""
  if not ok:
    raise ConfigError(message)


def is_int(value: Any) -> bool:
  """An int, not a bool (which Python counts as one)."""
  return isinstance(value, int) and not isinstance(value, bool)


def check_positive(section: str, obj: Any, *names: str) -> None:
  """ConfigError naming `section`.NAME unless each of `obj`'s `names` is above 0."""
  for name in names:
    value = getattr(obj, name)
    check(value > 0, f'{section}.{name}={value} must be positive')

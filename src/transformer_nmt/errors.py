"""User-facing errors: the CLIs print these as one line and exit non-zero, without a traceback."""


class UserError(Exception):
  """A mistake in the user's input (files, flags, config), not a bug."""


class ConfigError(UserError, ValueError):
  """A bad config value or key; the message names the option."""


class DataError(UserError):
  """Unreadable or malformed data; the message names the file (and line)."""

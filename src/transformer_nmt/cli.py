"""What train.py and decode.py share: quiet library logging and one-line errors."""

import logging
import sys
from typing import NoReturn


def quiet_logging() -> None:
  """Our progress lines as 'HH:MM:SS message'; library chatter (Orbax, absl) only from WARNING."""
  from absl import logging as absl_logging
  absl_logging.get_absl_handler().setFormatter(
      logging.Formatter('%(asctime)s %(message)s', '%H:%M:%S'))
  logging.getLogger().setLevel(logging.INFO)
  logging.getLogger('absl').setLevel(logging.WARNING)
  logging.getLogger('jax._src.xla_bridge').setLevel(logging.ERROR)  # 'no TPU' notice on CPU


def fail(message: str) -> NoReturn:
  """A user mistake: one line on stderr, exit code 2, no traceback."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)

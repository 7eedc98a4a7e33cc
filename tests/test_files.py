"""files.atomic_output: a replaced file keeps its permissions, a new one gets the umask's."""

import os
import stat

import pytest

from transformer_nmt.files import write_atomically


def _mode(path) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
  """Sets the process's umask for one test and restores it."""
  previous = os.umask(0o022)
  yield os.umask
  os.umask(previous)


def test_a_private_file_stays_private_when_replaced(tmp_path, umask):
  path = tmp_path / 'out.txt'
  path.write_text('old')
  os.chmod(path, 0o600)
  write_atomically(path, 'new')
  assert path.read_text() == 'new' and _mode(path) == 0o600


@pytest.mark.parametrize('mask, expected', [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_a_new_file_honours_the_umask(tmp_path, umask, mask, expected):
  umask(mask)
  path = tmp_path / 'new.bin'
  write_atomically(path, b'\x00\x01')
  assert _mode(path) == expected and path.read_bytes() == b'\x00\x01'
  assert [p.name for p in tmp_path.iterdir()] == ['new.bin']  # no temporary file left

"""decode.py's output file (outputs.py): one writer at a time, --resume only from a partial
that is this run's, no temporary files left for ever, a closed pipe, a workdir's own files."""

import fcntl
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

FLAGS = ['--beam_size', '1', '--max_extra_len', '5']


def run_decode(*flags: str, stdin: str = '') -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, 'decode.py', *flags], cwd=ROOT, input=stdin,
                        capture_output=True, text=True, timeout=300)


def _clean_failure(result: subprocess.CompletedProcess, message: str) -> None:
  assert result.returncode == 2, result.stderr[-2000:]
  assert message in result.stderr.splitlines()[-1], result.stderr[-2000:]
  assert 'Traceback' not in result.stderr, result.stderr[-2000:]


def _start(*flags: str) -> subprocess.Popen:
  """decode.py reading a pipe left open, returned once it has loaded the model (and so holds
  its output, and with --resume has opened OUTPUT.partial)."""
  proc = subprocess.Popen([sys.executable, 'decode.py', *flags], cwd=ROOT, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  for line in proc.stderr:
    if 'checkpoint step(s)' in line:
      return proc
  raise AssertionError(f'decode.py ended with {proc.wait()} before loading the model')


@pytest.mark.parametrize('resume', [True, False])
def test_a_second_decode_writing_the_same_output_is_refused(tiny_workdir, tmp_path, resume):
  out = tmp_path / 'out.de'
  again = ['--resume'] if resume else []
  first = _start('--workdir', str(tiny_workdir), *FLAGS, *again, '--output', str(out))
  try:
    second = run_decode('--workdir', str(tiny_workdir), *FLAGS, *again, '--output', str(out),
                        stdin='a house\n')
    _clean_failure(second, f'--output={out} is being written by another process '
                           f'(PID {first.pid})')
    assert not out.exists()
  finally:
    first.stdin.close()  # no lines: the first run ends with an empty output
    first.wait(timeout=120)
  assert first.returncode == 0 and out.read_text() == ''
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out.de']  # no lock or partial left


def test_an_output_among_the_workdirs_files_is_refused(tiny_workdir, tmp_path):
  work = tmp_path / 'run'
  work.mkdir()
  for entry in tiny_workdir.iterdir():
    if entry.name in ('config.json', 'checkpoints'):
      (work / entry.name).symlink_to(entry)
  shutil.copy(tiny_workdir / 'spm.model', work / 'spm.model')
  tokenizer = (work / 'spm.model').read_bytes()
  for target in ('spm.model', 'metrics.jsonl', 'checkpoints/20/x', 'programs/x'):
    _clean_failure(run_decode('--workdir', str(work), '--output', str(work / target),
                              stdin='a house\n'), 'is a file of the workdir')
  assert (work / 'spm.model').read_bytes() == tokenizer


def test_temporary_files_of_killed_runs_are_removed(tiny_workdir, tmp_path):
  out = tmp_path / 'out.de'
  stale = tmp_path / '.out.de.k1ll3d_x.tmp'  # as atomic_output names them
  stale.write_text('half of a killed run\n')
  live = tmp_path / '.out.de.w0rk1ng_.tmp'  # one that a live process still writes
  live.write_text('still being written\n')
  other = tmp_path / '.out.de.notours.tmp'  # another program's naming
  other.write_text('not ours\n')
  with open(live, 'rb') as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    result = run_decode('--workdir', str(tiny_workdir), *FLAGS, '--output', str(out),
                        stdin='a house\n')
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'removed 1 temporary file(s) that an interrupted run left' in result.stderr
  assert not stale.exists() and live.exists() and other.exists()
  assert out.read_text().count('\n') == 1


def test_a_reader_that_goes_away_ends_decoding_quietly(tiny_workdir, lines):
  """`decode.py ... | head -n 1`: the next write finds the pipe closed; the run ends at once
  without a traceback, as a program that SIGPIPE ends would (status 141)."""
  proc = subprocess.Popen([sys.executable, 'decode.py', '--workdir', str(tiny_workdir), *FLAGS,
                           '--buffer_lines', '1'], cwd=ROOT, text=True, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdin.write(lines[0] + '\n')
  proc.stdin.flush()
  proc.stdout.readline()  # the first translation
  proc.stdout.close()  # head has what it wanted
  proc.stdin.write(''.join(line + '\n' for line in lines[1:4]))
  proc.stdin.close()
  stderr = proc.stderr.read()
  assert proc.wait(timeout=120) == 141, stderr[-2000:]
  assert 'Traceback' not in stderr and 'error:' not in stderr, stderr[-2000:]

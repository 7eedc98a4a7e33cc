"""decode.py's output file (outputs.py): one writer at a time, --resume only from a partial
that is this run's, no temporary files left for ever, a closed pipe, a workdir's own files."""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from transformer_nmt.errors import DataError

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


@pytest.mark.slow
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


def _interrupted(tiny_workdir, tmp_path, lines: list[str]) -> tuple[list[str], str]:
  """A --resume run killed after translating `lines` (read from a pipe): (its flags, the
  partial it left)."""
  flags = ['--workdir', str(tiny_workdir), *FLAGS, '--buffer_lines', str(len(lines)),
           '--resume', '--output', str(tmp_path / 'out.de')]
  proc = _start(*flags)
  proc.stdin.write(''.join(line + '\n' for line in lines))
  proc.stdin.flush()
  record = tmp_path / 'out.de.partial.json'
  deadline = time.time() + 240
  while not (record.exists() and json.loads(record.read_text())['lines'] == len(lines)):
    assert time.time() < deadline and proc.poll() is None
    time.sleep(0.1)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  return flags, str(tmp_path / 'out.de.partial')


@pytest.mark.slow
def test_resume_refuses_a_partial_that_is_not_this_runs(tiny_workdir, tmp_path, lines):
  source = tmp_path / 'in.en'
  source.write_text(''.join(line + '\n' for line in lines[:5]))
  partial = tmp_path / 'out.de.partial'
  partial.write_text('eins\nzwei\ndrei\nvier\nfünf\nsechs\nsieben\n')  # someone else's
  resume = ['--workdir', str(tiny_workdir), *FLAGS, '--resume', '--input', str(source),
            '--output', str(tmp_path / 'out.de')]
  _clean_failure(run_decode(*resume), f'{partial} has no record of what it belongs to')
  assert not (tmp_path / 'out.de').exists() and partial.read_text().count('\n') == 7
  partial.unlink()

  flags, _ = _interrupted(tiny_workdir, tmp_path, lines[:3])
  kept = partial.read_bytes()
  shorter = tmp_path / 'short.en'
  shorter.write_text(''.join(line + '\n' for line in lines[:2]))
  _clean_failure(run_decode(*flags, '--input', str(shorter)),
                 'holds 3 translated lines but the input has only 2')
  other = tmp_path / 'other.en'
  other.write_text(''.join(line + '\n' for line in ['a house'] + lines[1:5]))
  _clean_failure(run_decode(*flags, '--input', str(other)),
                 'translates other lines than the first 3 of this input')
  _clean_failure(run_decode(*flags, '--input', str(source), '--max_extra_len', '4'),
                 'was written with other settings (decode.max_extra_len: 5 then, 4 now)')
  assert partial.read_bytes() == kept  # none of the refusals wrote to it
  partial.write_bytes(kept.split(b'\n', 1)[1])  # a line deleted
  _clean_failure(run_decode(*flags, '--input', str(source)), 'it was changed')
  assert not (tmp_path / 'out.de').exists()


def test_resume_record_cuts_what_it_did_not_record(tmp_path):
  """The library: lines written after the last record (a kill between the two) are cut off
  and translated again; a changed partial or a damaged record is refused."""
  from transformer_nmt.decode_job import outputs
  path = str(tmp_path / 'out.de')
  settings = {'decode': {'beam_size': 1}}
  with pytest.raises(RuntimeError):
    with outputs.resume(path, settings) as partial:
      partial.written(['a', 'b'], 'A\nB\n')
      raise RuntimeError('killed')
  with open(outputs.partial_path(path), 'a') as f:
    f.write('C\nhalf a li')
  with outputs.resume(path, settings) as partial:
    assert partial.done == 2
    assert list(partial.skip(iter([['a'], ['b', 'c'], ['d']]))) == [['c'], ['d']]
    partial.written(['c', 'd'], 'C\nD\n')
  assert (tmp_path / 'out.de').read_text() == 'A\nB\nC\nD\n'
  assert sorted(p.name for p in tmp_path.iterdir()) == ['out.de']
  with pytest.raises(RuntimeError):
    with outputs.resume(path, settings) as partial:
      partial.written(['a'], 'A\n')
      raise RuntimeError('killed')
  with pytest.raises(DataError, match='was written with other settings'):
    with outputs.resume(path, {'decode': {'beam_size': 2}}):
      pass
  with open(outputs.partial_path(path), 'w') as f:
    f.write('X\n')  # same length, other text
  with pytest.raises(DataError, match='was changed since it was written'):
    with outputs.resume(path, settings):
      pass
  with open(outputs.record_path(path), 'w') as f:
    f.write('{"lines": "many"')
  with pytest.raises(DataError, match='is damaged'):
    with outputs.resume(path, settings):
      pass
  os.unlink(outputs.partial_path(path))  # a record without its partial: a new start
  with outputs.resume(path, settings) as partial:
    assert partial.done == 0
    partial.written(['z'], 'Z\n')
  assert (tmp_path / 'out.de').read_text() == 'Z\n'


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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

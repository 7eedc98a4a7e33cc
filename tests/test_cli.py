"""train.py end to end on the tiny config, and its handling of bad input."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import COMPILE_CACHE, ROOT, shared_compile_cache


def run_train(workdir: pathlib.Path, *flags: str,
              shared_cache: bool = True) -> subprocess.CompletedProcess:
  """train.py on the tiny config; with `shared_cache` off, it keeps WORKDIR/compile_cache."""
  cmd = [sys.executable, 'train.py', '--config', 'configs/tiny.py', '--workdir', str(workdir),
         *flags]
  env = shared_compile_cache() if shared_cache else {
      k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def run_decode(workdir: pathlib.Path, *flags: str, stdin: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, 'decode.py', '--workdir', str(workdir), *flags],
                        cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=300)


def metrics(workdir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.slow
def test_train_end_to_end_then_resume(tmp_path):
  workdir = tmp_path / 'run'
  first = run_train(workdir)
  assert first.returncode == 0, first.stderr[-3000:]
  for name in ('config.json', 'spm.model', 'metrics.jsonl', 'checkpoints/20', 'tensorboard'):
    assert (workdir / name).exists(), name
  # JAX_COMPILATION_CACHE_DIR (the suite's shared cache) replaces WORKDIR/compile_cache
  assert not (workdir / 'compile_cache').exists()
  assert list(COMPILE_CACHE.iterdir())
  assert 'Done: ' in first.stderr and 'loaded from the compile cache' in first.stderr
  rows = metrics(workdir)
  train_rows = [r for r in rows if 'train_loss' in r]
  assert [r['step'] for r in train_rows] == [5, 10, 15, 20]
  assert all({'train_loss', 'learning_rate', 'tokens_per_sec'} <= set(r) for r in train_rows)
  assert {'eval_loss', 'eval_bleu', 'test_bleu'} <= set(rows[-1])
  assert list((workdir / 'tensorboard').iterdir()), 'no TensorBoard event file'
  assert 'step 20/20' in first.stderr
  assert 'Encoding the training text into' in first.stderr and 'data wait' in first.stderr
  assert all('data_wait' in r for r in train_rows)

  second = run_train(workdir, '--config.train.num_steps=30')
  assert second.returncode == 0, second.stderr[-3000:]
  assert 'Resumed from checkpoint at step 20' in second.stderr
  assert 'Training SentencePiece' not in second.stderr  # the workdir's tokenizer is reused
  assert 'Training pairs mapped from' in second.stderr  # and the encoded pairs (data.cache)
  assert 'Done: 0 programs compiled' in second.stderr  # every one loaded from the cache
  new_rows = metrics(workdir)[len(rows):]
  assert [r['step'] for r in new_rows if 'train_loss' in r] == [25, 30]
  assert (workdir / 'checkpoints/30').exists()


def _assert_clean_failure(result: subprocess.CompletedProcess, message: str) -> None:
  assert result.returncode != 0
  assert message in result.stderr, result.stderr[-2000:]
  assert 'Traceback' not in result.stderr, result.stderr[-2000:]


def test_the_compile_cache_is_the_workdirs_unless_jax_compilation_cache_dir_names_one(
    tmp_path, monkeypatch):
  import jax

  from transformer_nmt.cli import use_compile_cache
  settings = {}
  monkeypatch.setattr(jax.config, 'update', settings.__setitem__)  # this process's stays as is
  own, shared = str(tmp_path / 'run' / 'compile_cache'), str(tmp_path / 'shared')
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  use_compile_cache(own)
  assert settings['jax_compilation_cache_dir'] == own
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', shared)
  use_compile_cache(own)
  assert settings['jax_compilation_cache_dir'] == shared
  use_compile_cache(own, min_free_bytes=2 ** 60)  # a disk too short: no cache, not even JAX's
  assert settings['jax_compilation_cache_dir'] is None


@pytest.mark.parametrize('flag, message', [
    ('--config.model.num_heads=3', 'model.d_model=32 is not divisible by model.num_heads=3'),
    ('--config.model.residual_dropout=-0.1', 'model.residual_dropout=-0.1 must be in [0, 1)'),
    ('--config.train.label_smoothing=1.5', 'train.label_smoothing=1.5 must be in [0, 1)'),
    ('--config.model.norm_position=middle', "model.norm_position='middle'"),
    ('--config.model.no_such_key=1', 'no_such_key'),
    ('--config.train.global_batch_tokens=-1', 'train.global_batch_tokens=-1 must be 0'),
    ('--config.data.prefetch=-2', 'data.prefetch=-2 must be 0'),
    ('--config=configs/multi30k.py:xx-de', "direction 'xx-de': expected SOURCE-TARGET"),
])
def test_bad_config_values_fail_cleanly_and_write_nothing(tmp_path, flag, message):
  workdir = tmp_path / 'run'
  _assert_clean_failure(run_train(workdir, flag), message)
  assert not workdir.exists()


@pytest.mark.slow
def test_data_errors_fail_cleanly(tmp_path):
  (tmp_path / 'a.en').write_text('one\ntwo\n')
  (tmp_path / 'a.de').write_text('eins\n')
  (tmp_path / 'bad.de').write_bytes(b'eins\nzwei \xff\n')
  workdir = tmp_path / 'run'
  text = ['--config.data.source=text', f'--config.data.valid_src={tmp_path}/a.en',
          f'--config.data.valid_tgt={tmp_path}/a.en']
  cases = [
      ([f'--config.data.train_src={tmp_path}/missing.en',
        f'--config.data.train_tgt={tmp_path}/a.de'], 'missing.en: no such file'),
      ([f'--config.data.train_src={tmp_path}/a.en', f'--config.data.train_tgt={tmp_path}/a.de'],
       'has 2 lines but'),
      ([f'--config.data.train_src={tmp_path}/a.en', f'--config.data.train_tgt={tmp_path}/bad.de'],
       'bad.de:2: invalid UTF-8'),
      ([f'--config.data.train_src={tmp_path}/a.en'], 'data.train_tgt is empty'),
  ]
  for flags, message in cases:
    _assert_clean_failure(run_train(workdir, *text, *flags), message)
    assert not workdir.exists()


def test_an_unwritable_cache_dir_fails_in_one_line(tmp_path):
  (tmp_path / 'file').write_text('not a directory')
  result = run_train(tmp_path / 'run', f'--config.data.cache_dir={tmp_path}/file')
  _assert_clean_failure(result, 'set data.cache_dir to a writable directory')
  assert result.returncode == 2


@pytest.mark.slow
@pytest.mark.parametrize('signum', [signal.SIGINT])  # SIGTERM: test_preemption.py
def test_interrupt_saves_a_checkpoint_to_resume_from(tmp_path, signum):
  workdir = tmp_path / 'run'
  cmd = [sys.executable, 'train.py', '--config', 'configs/tiny.py', '--workdir', str(workdir),
         '--config.train.num_steps=100000', '--config.train.checkpoint_every=100000',
         '--config.train.eval_every=100000']
  proc = subprocess.Popen(cmd, cwd=ROOT, env=shared_compile_cache(), stderr=subprocess.PIPE,
                          text=True)
  deadline = time.time() + 120
  for line in proc.stderr:  # wait until training is under way
    if 'step 10/' in line or time.time() > deadline:
      break
  proc.send_signal(signum)
  rest = proc.communicate(timeout=120)[1]
  assert proc.returncode == 130, rest[-2000:]
  assert 'Traceback' not in rest
  saved = [int(p.name) for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit()]
  assert len(saved) == 1 and saved[0] >= 10
  assert not [p for p in (workdir / 'checkpoints').iterdir() if 'tmp' in p.name]
  again = run_train(workdir, f'--config.train.num_steps={saved[0] + 5}')
  assert again.returncode == 0, again.stderr[-2000:]
  assert f'Resumed from checkpoint at step {saved[0]}' in again.stderr


@pytest.mark.slow
# Gradient accumulation, the harder case (the data position counts micro-batches); one batch
# per step is resumed in test_train_end_to_end_then_resume and in bench/faults.py. Weight
# decay rides along: its optimizer state (optax.adamw's masked chain) must resume exactly too.
@pytest.mark.parametrize('variant', [['--config.train.global_batch_tokens=1024',
                                      '--config.train.weight_decay=0.1']],
                         ids=['accumulate-2-weight-decay'])
def test_sigkill_and_resume_reproduce_the_uninterrupted_losses(tmp_path, variant):
  flags = ['--config.train.log_every=1', '--config.train.checkpoint_every=8',
           '--config.train.eval_every=100000', '--config.eval.bleu_sentences=0', *variant]
  workdir = tmp_path / 'killed'
  cmd = [sys.executable, 'train.py', '--config', 'configs/tiny.py', '--workdir', str(workdir),
         '--config.train.num_steps=100000', *flags]
  proc = subprocess.Popen(cmd, cwd=ROOT, env=shared_compile_cache(), stderr=subprocess.PIPE,
                          text=True)
  for line in proc.stderr:
    if 'step 19/' in line:  # past the checkpoint at step 8
      break
  proc.kill()  # SIGKILL: no chance to save anything
  proc.wait(timeout=60)
  saved = max(int(p.name) for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit())
  assert 8 <= saved < 100000  # a save still in flight at the kill is not a checkpoint
  end = f'--config.train.num_steps={saved + 8}'
  resumed = run_train(workdir, end, *flags)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert f'Resumed from checkpoint at step {saved}' in resumed.stderr
  straight = run_train(tmp_path / 'straight', end, *flags)
  assert straight.returncode == 0, straight.stderr[-2000:]
  expected = {r['step']: r['train_loss'] for r in metrics(tmp_path / 'straight')
              if 'train_loss' in r}
  after = [r for r in metrics(workdir) if 'train_loss' in r][-8:]
  assert [r['step'] for r in after] == list(range(saved + 1, saved + 9))
  for row in after:
    assert row['train_loss'] == pytest.approx(expected[row['step']], rel=1e-6), row['step']


@pytest.mark.slow
def test_workdir_refusals_and_corrupt_checkpoint_fallback(tiny_workdir, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(tiny_workdir, workdir, symlinks=True)  # run_train(workdir): steps 10 and 20
  before = {p: p.read_bytes() for p in workdir.rglob('*') if p.is_file()}
  other = run_train(workdir, '--config.model.d_model=48', '--config.model.num_heads=2',
                    '--config.data.demo_sizes=(300,20,20)')
  _assert_clean_failure(other, 'holds checkpoints of a different model')
  after = {p: p.read_bytes() for p in workdir.rglob('*') if p.is_file()}
  assert after == before  # nothing rewritten before the refusal, not even the demo data
  for blob in (workdir / 'checkpoints' / '20').rglob('*'):
    if blob.is_file() and blob.parent.name == 'd':
      blob.write_bytes(b'damaged')  # what a disk fault or a bad copy leaves
  # decode.py reads the newest checkpoint that reads back, and names a damaged one it is given
  fallback = run_decode(workdir, stdin='a small house\n')
  assert fallback.returncode == 0 and fallback.stdout.count('\n') == 1, fallback.stderr[-3000:]
  assert 'is unreadable' in fallback.stderr and 'checkpoint step(s) [10]' in fallback.stderr
  _assert_clean_failure(run_decode(workdir, '--checkpoint', '20', stdin='x\n'),
                        'checkpoints/20 is unreadable')
  # train.py moves the damaged one aside and writes step 20 again ...
  again = run_train(workdir)
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'Checkpoint at step 20 is unreadable' in again.stderr
  assert 'Resumed from checkpoint at step 10' in again.stderr
  assert 'Moved the unreadable checkpoint of step 20' in again.stderr
  assert (workdir / 'checkpoints' / 'quarantine' / '20').is_dir()
  # ... so that the next run and decode.py find a readable step 20
  third = run_train(workdir)
  assert 'Resumed from checkpoint at step 20' in third.stderr, third.stderr[-3000:]
  decoded = run_decode(workdir, stdin='a small house\n')
  assert decoded.returncode == 0 and 'checkpoint step(s) [20]' in decoded.stderr
  assert 'unreadable' not in decoded.stderr
  # a step entry that cannot be read at all (a symlink loop) is moved aside like a damaged one
  (workdir / 'checkpoints' / '30').symlink_to('30')
  looped = run_train(workdir, '--config.train.num_steps=30')
  assert looped.returncode == 0, looped.stderr[-3000:]
  assert 'Checkpoint at step 30 is unreadable' in looped.stderr
  assert 'Resumed from checkpoint at step 20' in looped.stderr
  assert (workdir / 'checkpoints' / 'quarantine' / '30').is_symlink()
  assert (workdir / 'checkpoints' / '30').is_dir()  # written again by this run


@pytest.mark.parametrize('place', ['checkpoints', 'best'])
def test_checkpoints_that_are_a_file_are_refused_before_anything_is_written(tmp_path, place):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / place).write_text('not a directory')
  started = time.time()
  _assert_clean_failure(run_train(workdir), f'{workdir / place} is a file, not a directory')
  assert time.time() - started < 60  # at once, not after Orbax's timeouts
  assert [p.name for p in workdir.iterdir()] == [place]


@pytest.mark.slow
def test_a_lone_unreadable_checkpoint_is_not_moved(tmp_path):
  workdir = tmp_path / 'run'
  assert run_train(workdir, '--config.train.num_steps=10').returncode == 0
  for blob in (workdir / 'checkpoints' / '10').rglob('*'):
    if blob.is_file() and blob.parent.name == 'd':
      blob.write_bytes(b'damaged')
  _assert_clean_failure(run_train(workdir), 'no checkpoint in')
  assert (workdir / 'checkpoints' / '10').is_dir()  # perhaps the setup is wrong, not the files


@pytest.mark.slow
def test_bad_process_flags_fail_cleanly(tmp_path):
  _assert_clean_failure(run_train(tmp_path / 'run', '--num_processes=2', '--process_id=2'),
                        '--process_id=2 must be in [0, --num_processes=2)')
  _assert_clean_failure(run_train(tmp_path / 'run', '--num_processes=2', '--process_id=1'),
                        'needs --coordinator_address')


@pytest.mark.slow
def test_a_changed_or_missing_tokenizer_is_refused(tiny_workdir, tmp_path):
  from transformer_nmt.data.tokenizer import train_tokenizer
  workdir = tmp_path / 'run'
  shutil.copytree(tiny_workdir, workdir, symlinks=True)  # trained to step 20
  spm_model = workdir / 'spm.model'
  original = spm_model.read_bytes()
  spm_model.unlink()  # with other training data, a retrained model would mean other pieces
  _assert_clean_failure(run_train(workdir, '--config.train.num_steps=21'),
                        'trained with a SentencePiece model that is gone')
  assert not spm_model.exists()  # nothing was retrained in its place
  train_tokenizer(['ein ganz anderer Text', 'another text entirely'] * 50, spm_model,
                  vocab_size=40)
  _assert_clean_failure(run_train(workdir, '--config.train.num_steps=21'),
                        'is not the one its checkpoints were trained with')
  _assert_clean_failure(run_decode(workdir, stdin='a house\n'),
                        'is not the one its checkpoints were trained with')
  spm_model.write_bytes(original)
  assert run_train(workdir, '--config.train.num_steps=21').returncode == 0


@pytest.mark.slow
def test_a_second_run_on_a_busy_workdir_is_refused(tmp_path):
  workdir = tmp_path / 'run'
  cmd = [sys.executable, 'train.py', '--config', 'configs/tiny.py', '--workdir', str(workdir),
         '--config.train.num_steps=40', '--config.train.log_every=1']
  first = subprocess.Popen(cmd, cwd=ROOT, env=shared_compile_cache(), stderr=subprocess.PIPE,
                          text=True)
  for line in first.stderr:  # the first run holds the workdir
    if 'step 2/' in line:
      break
  second = run_train(workdir, '--config.train.num_steps=40')
  _assert_clean_failure(second, f'is in use by another training run (PID {first.pid})')
  rest = first.communicate(timeout=300)[1]
  assert first.returncode == 0, rest[-2000:]
  steps = [r['step'] for r in metrics(workdir) if 'train_loss' in r]
  assert steps == list(range(1, 41))  # only the first run's rows
  assert run_train(workdir, '--config.train.num_steps=40').returncode == 0  # free again


@pytest.mark.slow
def test_unusable_workdirs_and_config_files_fail_in_one_line(tmp_path):
  a_file = tmp_path / 'file'
  a_file.write_text('not a directory')
  _assert_clean_failure(run_train(a_file), 'is a file, not a directory')
  assert a_file.read_text() == 'not a directory'
  broken = tmp_path / 'broken.py'
  broken.write_text('def get_config():\n  raise RuntimeError("no such corpus")\n')
  result = subprocess.run([sys.executable, 'train.py', '--config', str(broken), '--workdir',
                           str(tmp_path / 'run')], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
  _assert_clean_failure(result, 'no such corpus')


def test_a_corpus_of_empty_lines_fails_in_one_line(tmp_path):
  for name in ('e.en', 'e.de'):
    (tmp_path / name).write_text('\n\n \n')
  files = [f'--config.data.{split}_{side}={tmp_path}/e.{lang}' for split in ('train', 'valid')
           for side, lang in (('src', 'en'), ('tgt', 'de'))]
  result = run_train(tmp_path / 'run', '--config.data.source=text', *files)
  _assert_clean_failure(result, 'every training line is empty')


def _mount_tmpfs(path: pathlib.Path, size: str) -> None:
  import os
  if os.geteuid() != 0:
    pytest.skip('mounting a small tmpfs needs root')
  path.mkdir()
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
                    capture_output=True).returncode:
    pytest.skip('mount -t tmpfs is not allowed here')


@pytest.mark.slow
def test_a_full_disk_or_a_read_only_one_fails_in_one_line(tmp_path):
  disk = tmp_path / 'disk'
  _mount_tmpfs(disk, '700k')  # room for the corpus and tokenizer, not for the checkpoints
  try:
    full = run_train(disk / 'run', shared_cache=False)
    _assert_clean_failure(full, 'no space left on the disk')
    assert 'not keeping compiled programs there' in full.stderr  # the cache went first
    subprocess.run(['mount', '-o', 'remount,ro', str(disk)], check=True)
    _assert_clean_failure(run_train(disk / 'other'), 'Read-only file system')
  finally:
    subprocess.run(['umount', str(disk)])


def test_decode_help_lists_the_shared_model_and_search_flags():
  """decode.py's --help lists the flags inference/options.py defines for it (absl shows only
  a program's own flags unless it adopts them), not only its job flags."""
  out = subprocess.run([sys.executable, 'decode.py', '--help'], cwd=ROOT, capture_output=True,
                       text=True, timeout=120).stdout
  for flag in ('--workdir', '--checkpoint', '--dtype', '--beam_size', '--batch_tokens',
               '--mbr', '--input', '--n_best', '--[no]resume', '--[no]programs'):
    assert f'  {flag}:' in out, flag

"""Fault injection: train.py on the tiny config, stopped again and again by SIGKILL, SIGTERM or
SIGINT at random moments (seeded; some land in checkpoint saves and evaluations), each time
resumed, and compared with a run that was never interrupted.

  python bench/faults.py [--rounds 20] [--seed 0] [--markdown bench/RESULTS.md]

Prints, per round, the signal, the step it hit and how the process ended; then the rounds
survived (every resume went on from a checkpoint), the checkpoints quarantined, and whether
every logged training loss and the final parameters equal the uninterrupted run's. Every
third round also appends a damaged line to metrics.jsonl (not UTF-8, not an object, or no
step) before the resume, which must skip it.

Then the one-shot cases, each checked for its expected outcome and for a traceback:
checkpoints that are a file (refused at once), two `decode.py --resume` on one output at once
(one refused, the other's output whole), and an export onto a full disk (a 64 KB tmpfs, when
this process may mount one: one line, nothing left there, and a rerun elsewhere works).
"""

import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

import common
import numpy as np
from absl import app, flags

from transformer_nmt import load_workdir

_ROUNDS = flags.DEFINE_integer('rounds', 20, 'Interruptions.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed for the signals and their moments.')
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the result into this file, '
                                'replacing its bench/faults.py section.')

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 320
FLAGS = ['--config', 'configs/tiny.py', f'--config.train.num_steps={STEPS}',
         '--config.train.log_every=1', '--config.train.checkpoint_every=4',
         '--config.train.eval_every=8', '--config.train.keep_checkpoints=3']
SIGNALS = {'SIGKILL': signal.SIGKILL, 'SIGTERM': signal.SIGTERM, 'SIGINT': signal.SIGINT}


def train(workdir: pathlib.Path) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, 'train.py', *FLAGS, '--workdir', str(workdir)],
                          cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def last_step(text: str) -> int:
  steps = [int(line.split('step ')[1].split('/')[0]) for line in text.splitlines()
           if f'/{STEPS} |' in line]
  return max(steps, default=0)


def interrupt(workdir: pathlib.Path, rng: random.Random) -> dict:
  """One round: run until a random number of further steps (and a random fraction of a
  second) has passed, send a random signal, wait for the process to end."""
  name = rng.choice(sorted(SIGNALS))
  steps_ahead, extra = rng.randint(1, 10), rng.uniform(0.0, 1.5)
  proc = train(workdir)
  seen, target = [], None
  for line in proc.stderr:
    seen.append(line)
    if ' | loss ' in line:
      step = last_step(line)
      target = step + steps_ahead if target is None else target
      if step >= target:
        break
  time.sleep(extra)
  if proc.poll() is None:
    proc.send_signal(SIGNALS[name])
  rest = proc.communicate(timeout=600)[1]
  text = ''.join(seen) + rest
  return {'signal': name, 'hit': last_step(text), 'code': proc.returncode,
          'traceback': 'Traceback' in rest, 'resumed': 'Resumed from checkpoint' in text,
          'finished': f'step {STEPS}/{STEPS}' in text}


def losses(workdir: pathlib.Path) -> list[tuple[int, float]]:
  return [(r['step'], r['train_loss']) for r in common.read_metrics(workdir / 'metrics.jsonl')
          if 'train_loss' in r]


DAMAGED_LINES = (b'\xff\xfe not utf-8\n', b'null\n', b'{"loss": 1.0}\n')


def damage_metrics(workdir: pathlib.Path, rng: random.Random) -> None:
  with open(workdir / 'metrics.jsonl', 'ab') as f:
    f.write(rng.choice(DAMAGED_LINES))


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=600, **kw)


def one_line_failure(result: subprocess.CompletedProcess, message: str) -> bool:
  errors = [line for line in result.stderr.splitlines() if line.startswith('error:')]
  return (result.returncode == 2 and 'Traceback' not in result.stderr and len(errors) == 1
          and message in errors[0])


def checkpoints_file(tmp: pathlib.Path, _: pathlib.Path) -> str:
  workdir = tmp / 'checkpoints_file'
  workdir.mkdir()
  (workdir / 'checkpoints').write_text('a file')
  t0 = time.time()
  result = run(['train.py', *FLAGS, '--workdir', str(workdir)])
  ok = one_line_failure(result, 'is a file, not a directory') and time.time() - t0 < 60
  return f"{'refused' if ok else 'NOT refused'} in {time.time() - t0:.1f} s"


def concurrent_resume(tmp: pathlib.Path, trained: pathlib.Path) -> str:
  source, output = tmp / 'source.txt', tmp / 'resumed.txt'
  count = 4000
  source.write_text(''.join(f'the house number {n} is red\n' for n in range(count)))
  args = [sys.executable, 'decode.py', '--workdir', str(trained), '--input', str(source),
          '--output', str(output), '--resume', '--buffer_lines', '20']
  first = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True)
  lock = output.parent / f'.{output.name}.lock'
  while not lock.exists() and first.poll() is None:  # the first holds the output from here
    time.sleep(0.05)
  second = run(args[1:])
  first_err = first.communicate(timeout=600)[1]
  lines = len(output.read_text().splitlines()) if output.exists() else 0
  ok = (first.returncode == 0 and 'Traceback' not in first_err and lines == count
        and one_line_failure(second, str(output)))
  return (f"{'as expected' if ok else 'NOT as expected'}: first rc {first.returncode} with "
          f'{lines}/{count} lines, second rc {second.returncode}: '
          f"{(second.stderr.strip().splitlines() or [''])[-1][:120]}")


def export_full_disk(tmp: pathlib.Path, trained: pathlib.Path) -> str:
  disk = tmp / 'full_disk'
  disk.mkdir()
  if os.geteuid() != 0 or subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64k', 'tmpfs',
                                          str(disk)], capture_output=True).returncode:
    return 'not run (mounting a tmpfs needs root)'
  try:
    full = run(['export_ctranslate2.py', '--workdir', str(trained), '--out',
                str(disk / 'model')])
    left = sorted(p.name for p in disk.iterdir())
  finally:
    subprocess.run(['umount', str(disk)], check=False)
  again = run(['export_ctranslate2.py', '--workdir', str(trained), '--out', str(tmp / 'model')])
  ok = (one_line_failure(full, 'no space left') and 'resume' not in full.stderr and not left
        and again.returncode == 0 and (tmp / 'model' / 'model.bin').exists())
  return (f"{'as expected' if ok else 'NOT as expected'}: rc {full.returncode}, left on the "
          f'disk {left or "nothing"}, rerun elsewhere rc {again.returncode}')


ONE_SHOT = {'checkpoints that are a file': checkpoints_file,
            'two decode.py --resume on one output': concurrent_resume,
            'export onto a full disk': export_full_disk}


def final_params(workdir: pathlib.Path):
  return load_workdir(workdir).params


def main(argv):
  del argv
  import jax
  rng = random.Random(_SEED.value)
  with tempfile.TemporaryDirectory() as tmp:
    reference, faulted = pathlib.Path(tmp) / 'reference', pathlib.Path(tmp) / 'faulted'
    straight = train(reference)
    assert straight.wait() == 0, straight.stderr.read()[-3000:]
    rounds = []
    for i in range(_ROUNDS.value):
      rounds.append(interrupt(faulted, rng))
      if i % 3 == 2 and faulted.exists():
        damage_metrics(faulted, rng)
        rounds[-1]['metrics_damaged'] = True
      print(f'round {i + 1}: {rounds[-1]}', flush=True)
      if rounds[-1]['finished']:
        break
    end = train(faulted)
    end_err = end.communicate(timeout=1800)[1]
    assert end.returncode == 0, end_err[-3000:]
    expected = dict(losses(reference))
    logged = losses(faulted)
    equal_losses = all(np.isclose(loss, expected[step], rtol=1e-6) for step, loss in logged)
    same = jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(a, b)),
                                  final_params(faulted), final_params(reference))
    quarantined = faulted / 'checkpoints' / 'quarantine'  # where unreadable ones are moved
    expected_code = {'SIGKILL': -9, 'SIGTERM': 130, 'SIGINT': 130}
    survived = sum(1 for i, r in enumerate(rounds)
                   if not r['traceback'] and (i == 0 or r['resumed'])
                   and (r['code'] == expected_code[r['signal']] or r['finished']))
    one_shot = {name: case(pathlib.Path(tmp), reference) for name, case in ONE_SHOT.items()}
  counts = {name: sum(r['signal'] == name for r in rounds) for name in SIGNALS}
  text = (f'{common.stamp()}\n\n'
          f"{len(rounds)} interruptions of a {STEPS}-step tiny run (checkpoints every 4 steps, "
          f"evaluations every 8), {counts}: {survived} ended as expected (SIGKILL: killed; "
          f"SIGTERM/SIGINT: exit 130 with a checkpoint) without a traceback, each followed by a "
          f"resume; {len(list(quarantined.iterdir())) if quarantined.exists() else 0} "
          f"checkpoints quarantined; {len(logged)} logged training losses (steps redone after "
          f"a SIGKILL logged again) {'all equal' if equal_losses else 'NOT all equal'} to the "
          f"uninterrupted run's; final parameters "
          f"{'identical' if all(jax.tree_util.tree_leaves(same)) else 'DIFFERENT'}; "
          f"{sum(r.get('metrics_damaged', False) for r in rounds)} damaged metrics lines "
          'skipped by the resumes.\n\n' + ''.join(f'- {name}: {outcome}\n'
                                                 for name, outcome in one_shot.items()))
  print(text)
  if _MARKDOWN.value:
    common.write_section(_MARKDOWN.value, 'bench/faults.py', text)


if __name__ == '__main__':
  app.run(main)

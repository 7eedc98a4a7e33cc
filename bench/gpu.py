"""The GPU device run: what a GPU user needs to know, measured in one command of under 9 minutes.

  bash bench/gpu.sh prepare        # here: wheels the GPU image lacks, Multi30k en-de (ignored)
  bash bench/gpu.sh run            # there: python bench/gpu.py --out $OUT
  JAX_PLATFORMS=cpu python bench/gpu.py --out /tmp/gpu --smoke   # every step, tiny, on a CPU

Steps, each a subprocess with its own time limit, so that a failure or an overrun still leaves
the others' results; after each, results.json and summary.md in --out are rewritten:
  environment  jax.print_environment_info() and the devices. First because it takes seconds
               and everything after it can run out of time.
  tests        the tests that mean something on a GPU (model, attention masks, cached decoding
               against teacher forcing, beam search, train step, checkpoint round trip), with
               the GPU as JAX's default backend.
  train_speed  bench/train.py: transformer-base in bfloat16 at the paper's batch (about 25k
               real tokens per side), ours against torch.nn.Transformer (bf16 autocast, and
               torch.compile), MFU against the bf16 matmul peak measured in the same run.
  recipe       configs/multi30k_1h.py:en-de trained with train.py (seed 0): wall time,
               validation and test2016 BLEU from its metrics.jsonl.
  decoding     that model on test2016, beam 4: bench/latency.py (10 lines, a cold workdir and
               stored programs, CTranslate2 float16 on the GPU when its wheel loads) and
               bench/decode.py (tokens/s and sentences/s against CTranslate2).
  seeds        the recipe again with seeds 1 and 2 while time is left (mean and spread).

Files in --out (the device tool returns at most 8): results.json, summary.md,
environment.txt and one log per step (tests, train_speed, recipe, decoding). --smoke runs each
step on tiny shapes and a few steps, to test this script.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import common
from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / 'shared' / 'data' / 'multi30k'

_OUT = flags.DEFINE_string('out', os.environ.get('OUT', '/tmp/gpu_run'), 'Where results go.')
_SMOKE = flags.DEFINE_bool('smoke', False, 'Tiny shapes and few steps: tests this script.')
_DEADLINE = flags.DEFINE_integer('deadline_s', 530, 'Seconds for all steps together.')
_STEPS = flags.DEFINE_list('steps', ['environment', 'tests', 'train_speed', 'recipe',
                                     'decoding', 'seeds'], 'Steps to run, in this order.')

GPU_TESTS = ['tests/model/test_attention.py', 'tests/model/test_model.py',
             'tests/model/test_precision.py', 'tests/decoding/test_beam_search.py',
             'tests/training/test_steps.py', 'tests/test_checkpoint.py']
ENVIRONMENT_JOB = '''
import jax
jax.print_environment_info()
print('devices:', jax.devices())
'''


class Run:
  """The results so far, the deadline, and the files in --out."""

  def __init__(self, out: pathlib.Path, deadline_s: float):
    self.out, self.start, self.deadline_s = out, time.monotonic(), deadline_s
    self.results: dict[str, dict] = {}
    out.mkdir(parents=True, exist_ok=True)

  def left(self) -> float:
    return self.deadline_s - (time.monotonic() - self.start)

  def step(self, name: str, args: list[str], limit: float, log: str, env: dict | None = None,
           append: bool = False, reserve: float = 0.0) -> dict:
    """Runs one command with its output in `log` (in --out), for at most `limit` seconds and
    at most what is left of the deadline after `reserve` seconds kept for the steps after it;
    returns its entry in the results (rc, seconds, whether it was stopped)."""
    limit = max(1.0, min(limit, self.left() - reserve))
    t0 = time.monotonic()
    with open(self.out / log, 'a' if append else 'w') as f:
      f.write(f'$ {" ".join(args)}\n')
      f.flush()
      try:
        rc = subprocess.run(args, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=limit,
                            env=dict(os.environ, **(env or {}))).returncode
        stopped = False
      except subprocess.TimeoutExpired:
        rc, stopped = None, True
      f.write(f'\n[{name}: rc {rc}, {time.monotonic() - t0:.1f} s'
              f'{", stopped at its time limit" if stopped else ""}]\n')
    result = self.results.setdefault(name, {})
    result.update(rc=rc, seconds=round(time.monotonic() - t0, 1), stopped=stopped,
                  limit_s=round(limit))
    return result

  def save(self) -> None:
    self.results['_run'] = {'seconds': round(time.monotonic() - self.start, 1),
                            'smoke': _SMOKE.value, 'date': time.strftime('%Y-%m-%d %H:%M UTC',
                                                                          time.gmtime())}
    (self.out / 'results.json').write_text(json.dumps(self.results, indent=1) + '\n')
    (self.out / 'summary.md').write_text(summary(self.results, self.out))


def tail(path: pathlib.Path, pattern: str) -> list[str]:
  """The lines of a log that match `pattern`."""
  if not path.exists():
    return []
  return [line for line in path.read_text(errors='replace').splitlines() if re.search(pattern,
                                                                                       line)]


def tables(path: pathlib.Path) -> list[str]:
  """The markdown tables of a log (a header row, its rule and the rows after them) and the
  lines that follow a table up to the next blank line (the benchmarks' ratios)."""
  lines = path.read_text(errors='replace').splitlines() if path.exists() else []
  keep, inside = [], False
  for i, line in enumerate(lines):
    starts = i + 1 < len(lines) and re.match(r'^\| :?-+:? \|', lines[i + 1]) is not None
    if starts or (inside and line.strip()):
      keep.append(line)
      inside = True
    elif inside:
      keep.append('')
      inside = False
  return keep


def environment(run: Run) -> None:
  run.step('environment', [sys.executable, '-c', ENVIRONMENT_JOB], 60, 'environment.txt')
  run.results['environment']['devices'] = tail(run.out / 'environment.txt', r'^devices:')


def tests(run: Run) -> None:
  selection = GPU_TESTS[:1] if _SMOKE.value else GPU_TESTS
  result = run.step('tests', [sys.executable, '-m', 'pytest', '-v', '-p', 'no:cacheprovider',
                              *selection], 120, 'tests.log', reserve=300,
                    env={'JAX_PLATFORMS': os.environ.get('JAX_PLATFORMS', 'cuda'),
                         'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'})
  log = run.out / 'tests.log'
  result['summary'] = (tail(log, r'\d+ (passed|failed)') or ['?'])[-1]
  result['passed'] = len(tail(log, r' PASSED'))
  result['failed'] = tail(log, r' FAILED| ERROR')


def train_speed(run: Run) -> None:
  shape = (['--config', 'configs/tiny.py', '--batch', '8', '--length', '16', '--steps', '2',
            '--vocab_size', '512', '--peak_size', '256'] if _SMOKE.value else
           ['--config', 'configs/base.py', '--batch', '512', '--length', '64', '--steps', '20',
            '--vocab_size', '32768'])
  # --smoke leaves out torch.compile, which takes minutes on a CPU (the device run has it)
  variants = 'jax-bfloat16,torch-bfloat16' + ('' if _SMOKE.value else ',torch-bfloat16-compile')
  result = run.step('train_speed', [sys.executable, 'bench/train.py', *shape, '--variants',
                                    variants], 200, 'train_speed.log', reserve=200)
  log = run.out / 'train_speed.log'
  result['table'] = tables(log) + tail(log, r' / .*x tokens/s$')


def recipe_args(seed: int, workdir: pathlib.Path) -> list[str]:
  args = [sys.executable, 'train.py', '--config', 'configs/multi30k_1h.py:en-de', '--workdir',
          str(workdir), f'--config.train.seed={seed}', '--config.train.checkpoint_every=1000000']
  first = workdir.parent / 'seed0' / 'spm.model'
  if seed and first.exists():  # the same SentencePiece model, not trained again
    args.append(f'--config.data.spm_model={first}')
  if _SMOKE.value:
    args += ['--config.train.num_steps=20', '--config.train.eval_every=10',
             '--config.train.warmup_steps=10', '--config.model.num_layers=1',
             '--config.model.d_model=32', '--config.model.d_ff=64', '--config.data.vocab_size=200',
             '--config.eval.bleu_sentences=8']
  return args


def recipe(run: Run, seed: int) -> None:
  workdir = pathlib.Path('/tmp/gpu_recipe') / f'seed{seed}'
  name = f'recipe seed {seed}'
  result = run.step(name, recipe_args(seed, workdir), 300, 'recipe.log', append=seed > 0,
                    reserve=0 if seed else 70)
  result['workdir'] = str(workdir)
  result.update(final_metrics(workdir / 'metrics.jsonl'))


def final_metrics(path: pathlib.Path) -> dict:
  """The last evaluation's figures and the train wall time from a run's metrics.jsonl."""
  figures: dict = {}
  for row in common.read_metrics(path):
    for key in ('step', 'wall_s', 'eval_bleu', 'valid_bleu', 'test_bleu', 'eval_nll'):
      if key in row:
        figures[key] = row[key]
  return figures


def decoding(run: Run) -> None:
  workdir = pathlib.Path('/tmp/gpu_recipe/seed0')
  source = str(MULTI30K / 'test2016.en')
  lines = '20' if _SMOKE.value else '1000'
  env = {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
  run.step('decoding latency', [sys.executable, 'bench/latency.py', '--workdir', str(workdir),
                                '--input', source, '--sizes', '10', '--beam_size', '4',
                                '--ct2_device', 'auto'], 90, 'decoding.log', env=env, reserve=40)
  run.step('decoding speed', [sys.executable, 'bench/decode.py', '--workdir', str(workdir),
                              '--input', source, '--reference', str(MULTI30K / 'test2016.de'),
                              '--max_sentences', lines, '--beams', '4',
                              '--variants', 'cached,cached bfloat16', '--ctranslate2',
                              '--ct2_device', 'auto', '--ct2_compute_types', 'float16'],
           120, 'decoding.log', env=env, append=True)
  run.results['decoding speed']['table'] = tables(run.out / 'decoding.log')


def seeds(run: Run) -> None:
  for seed in (1, 2):
    previous = run.results.get('recipe seed 0', {}).get('seconds', 0)
    if run.left() < previous + 10:
      run.results[f'recipe seed {seed}'] = {'skipped': f'{run.left():.0f} s left, seed 0 took '
                                                       f'{previous:.0f} s'}
      return
    recipe(run, seed)


def summary(results: dict, out: pathlib.Path) -> str:
  """The markdown page of the run: each step's outcome and figures."""
  lines = [f"# GPU run, {results['_run']['date']}" + (' (smoke test)' if results['_run']['smoke']
                                                      else ''), '']
  for name, r in results.items():
    if name.startswith('_'):
      continue
    state = r.get('skipped') or (f"rc {r.get('rc')}, {r.get('seconds')} s"
                                 + (' (stopped at its limit)' if r.get('stopped') else ''))
    lines.append(f'## {name}: {state}')
    for key, value in r.items():
      if key in ('rc', 'seconds', 'stopped', 'skipped', 'limit_s'):
        continue
      if isinstance(value, list):
        lines += [''] + [str(v) for v in value] + ['']
      else:
        lines.append(f'- {key}: {value}')
    lines.append('')
  bleus = [r['eval_bleu'] for n, r in results.items() if n.startswith('recipe') and
           'eval_bleu' in r]
  if len(bleus) > 1:
    lines.append(f'Recipe validation BLEU over {len(bleus)} seeds: mean '
                 f'{statistics.mean(bleus):.2f}, spread {max(bleus) - min(bleus):.2f}')
  return '\n'.join(lines) + '\n'


def main(argv: list[str]) -> None:
  del argv
  run = Run(pathlib.Path(_OUT.value), _DEADLINE.value)
  actions = {'environment': environment, 'tests': tests, 'train_speed': train_speed,
             'recipe': lambda r: recipe(r, 0), 'decoding': decoding, 'seeds': seeds}
  unknown = [s for s in _STEPS.value if s not in actions]
  if unknown:
    raise app.UsageError(f'--steps: unknown {unknown}; choose from {list(actions)}')
  for name in _STEPS.value:
    if run.left() < 5:
      run.results[name] = {'skipped': 'no time left'}
    else:
      print(f'{time.strftime("%H:%M:%S")} {name} ({run.left():.0f} s left)', flush=True)
      actions[name](run)
    run.save()
  print((run.out / 'summary.md').read_text())


if __name__ == '__main__':
  app.run(main)

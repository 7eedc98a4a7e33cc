"""Time to translation, whole process: decode.py against CTranslate2 on the same weights.

  python bench/latency.py --workdir runs/m30k_en_de --input ../shared/data/multi30k/test2016.en

For the first N lines of the input (N in --sizes), each job is a fresh Python process, timed
from its start to its exit (wall, user + system CPU, peak resident memory):
- decode.py on a cold workdir: no stored programs, no compile cache (everything compiled);
- decode.py warm: again, calling the programs the cold run stored in WORKDIR/programs;
- with --precompiled_from FILE (e.g. the validation set): decode.py on a workdir holding only
  the programs `decode.py --precompile --input FILE` stored (small jobs' and FILE's; recipe.py
  leaves FILE's alone);
- decode.py --noprograms, warm JAX compile cache (how decode.py worked before the store):
  every program traced again and looked up in the cache;
- CTranslate2: a process that imports ctranslate2 and sentencepiece, loads the exported model,
  tokenizes, translates with the same beam and length penalty, and writes (its length limit
  is one for the whole call: the longest input + 50, where decode.py's is each input's own);
- the JAX runtime alone (import jax, one array on the device): the baseline of our memory.
The workdir is never written: each N gets a scratch workdir that links its config, vocabulary
and checkpoints. Needs bench/requirements.txt (ctranslate2).
"""

import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import common
from absl import app, flags

from transformer_nmt import DecodeConfig, load_workdir

DEFAULTS = DecodeConfig()
_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_SIZES = flags.DEFINE_list('sizes', ['1', '10', '100', '1000'], 'Numbers of first lines.')
_BEAM = flags.DEFINE_integer('beam_size', DEFAULTS.beam_size, 'Beam size for both.')
_DTYPE = flags.DEFINE_enum('dtype', None, ['float32', 'bfloat16'], "decode.py's --dtype "
                           "(default: the run's model.dtype); CTranslate2 runs in float32.")
_CHUNK = flags.DEFINE_integer('chunk', None, "decode.py's --chunk (default: the run's "
                              'decode.chunk, which its config.json keeps).')
_CONCURRENT = flags.DEFINE_integer('concurrent_batches', None, "decode.py's --concurrent_batches "
                                   '(default: its own, 2 on a CPU).')
_PRECOMPILED = flags.DEFINE_string(
    'precompiled_from', None, 'Also time decode.py on a workdir whose programs `decode.py '
    '--precompile --input FILE` stored (e.g. the validation set).')
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the table into this file, '
                                'replacing its bench/latency.py section.')
_CT2_DEVICE = flags.DEFINE_enum('ct2_device', 'cpu', ['cpu', 'cuda', 'auto'],
                                'Where CTranslate2 runs (auto: cuda when it sees a GPU), in '
                                'float32 on a CPU and float16 on a GPU.')

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The CTranslate2 job: argv = model dir, source and target SentencePiece models, input, output,
# beam, alpha, max extra len, device (cpu, cuda or auto).
CT2_JOB = '''
import sys
import ctranslate2, sentencepiece
model, src_spm, tgt_spm, source, target, beam, alpha, extra, device = sys.argv[1:]
if device == 'auto':
  device = 'cuda' if ctranslate2.get_cuda_device_count() > 0 else 'cpu'
sp = sentencepiece.SentencePieceProcessor(model_file=src_spm)
out = sentencepiece.SentencePieceProcessor(model_file=tgt_spm)
lines = open(source, encoding='utf-8').read().splitlines()
pieces = [p + ['</s>'] for p in sp.encode(lines, out_type=str)]
translator = ctranslate2.Translator(model, device=device,
                                    compute_type='float16' if device == 'cuda' else 'float32')
results = translator.translate_batch(
    pieces, beam_size=int(beam), length_penalty=float(alpha), max_batch_size=4096,
    batch_type='tokens', max_decoding_length=max(map(len, pieces)) + int(extra))
with open(target, 'w', encoding='utf-8') as f:
  f.writelines(out.decode(r.hypotheses[0]) + '\\n' for r in results)
'''
BASELINE_JOB = 'import jax, jax.numpy as jnp; jnp.zeros(1).block_until_ready()'


# Runs a command and reports its wall and CPU time and peak memory. Launched as a small
# process of its own: Linux keeps a parent's peak resident size in a child's count across
# fork and exec, and this benchmark's own process holds the model and JAX.
LAUNCH_JOB = '''
import json, os, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
stderr = proc.stderr.read()
_, status, usage = os.wait4(proc.pid, 0)
report = dict(wall=time.perf_counter() - t0, cpu=usage.ru_utime + usage.ru_stime,
              gb=usage.ru_maxrss / 2**20, code=os.waitstatus_to_exitcode(status), stderr=stderr)
open(sys.argv[1], 'w').write(json.dumps(report))
'''


def run(args: list[str]) -> dict:
  """Runs one process to its end: wall and CPU seconds, peak memory in GB, stderr."""
  import json
  with tempfile.NamedTemporaryFile(suffix='.json') as report:
    subprocess.run([sys.executable, '-c', LAUNCH_JOB, report.name, *args], cwd=ROOT, check=True)
    result = json.loads(pathlib.Path(report.name).read_text())
  if result['code']:
    raise RuntimeError(f'{shlex.join(args)} failed:\n{result["stderr"][-2000:]}')
  return result


def scratch_workdir(workdir: pathlib.Path) -> pathlib.Path:
  """A workdir that links the trained one's files but keeps its own programs and cache."""
  scratch = pathlib.Path(tempfile.mkdtemp(prefix='latency_'))
  for entry in workdir.iterdir():
    if entry.name.startswith('spm') or entry.name in ('config.json', 'checkpoints', 'best'):
      (scratch / entry.name).symlink_to(entry.resolve())
  return scratch


def _decode_args(work: pathlib.Path, source: pathlib.Path) -> list[str]:
  """decode.py on `work` translating `source` with the benchmark's settings."""
  args = [sys.executable, 'decode.py', '--workdir', str(work), '--input', str(source),
          '--beam_size', str(_BEAM.value)]
  args += ['--dtype', _DTYPE.value] if _DTYPE.value else []
  args += ['--concurrent_batches', str(_CONCURRENT.value)] if _CONCURRENT.value else []
  return args + (['--chunk', str(_CHUNK.value)] if _CHUNK.value else [])


def programs(stderr: str) -> str:
  """'compiled / from the compile cache / stored' counts from decode.py's speed line."""
  m = re.search(r'(\d+) programs compiled, (\d+) loaded from the compile cache'
                r'(?:, (\d+) stored programs loaded)?', stderr)
  return f'{m[1]} / {m[2]} / {m[3] or 0}' if m else '?'


def tokenizer_files(workdir: pathlib.Path) -> tuple[str, str]:
  """The workdir's (source, target) SentencePiece models: spm.model for a joint vocabulary,
  else spm.src.model and spm.tgt.model (the workdir layout train.py writes)."""
  joint = workdir / 'spm.model'
  if joint.exists():
    return str(joint), str(joint)
  return str(workdir / 'spm.src.model'), str(workdir / 'spm.tgt.model')


def main(argv):
  del argv
  workdir = pathlib.Path(_WORKDIR.value)
  model = load_workdir(workdir)
  decode = model.decode
  ct2_dir = tempfile.mkdtemp(prefix='latency_ct2_')
  common.export_ctranslate2(workdir, ct2_dir)
  src_spm, tgt_spm = tokenizer_files(workdir)
  lines = pathlib.Path(_INPUT.value).read_text(encoding='utf-8').splitlines()
  scratch = pathlib.Path(tempfile.mkdtemp(prefix='latency_io_'))
  baseline = run([sys.executable, '-c', BASELINE_JOB])
  table, scratch_dirs = [], [scratch, pathlib.Path(ct2_dir)]
  seed = None
  if _PRECOMPILED.value:
    seed = scratch_workdir(workdir)
    run(_decode_args(seed, pathlib.Path(_PRECOMPILED.value).resolve()) + ['--precompile'])
    scratch_dirs.append(seed)
  for n in [int(s) for s in _SIZES.value]:
    source, ours, theirs = scratch / f'{n}.src', scratch / f'{n}.ours', scratch / f'{n}.ct2'
    source.write_text(''.join(line + '\n' for line in lines[:n]), encoding='utf-8')
    work = scratch_workdir(workdir)
    decode_cmd = _decode_args(work, source) + ['--output', str(ours)]
    jobs = [('decode.py, cold workdir', decode_cmd), ('decode.py, stored programs', decode_cmd),
            ('decode.py --noprograms, first', decode_cmd + ['--noprograms']),
            ('decode.py --noprograms, warm compile cache', decode_cmd + ['--noprograms']),
            ('CTranslate2 end to end', [sys.executable, '-c', CT2_JOB, ct2_dir, src_spm,
                                        tgt_spm, str(source), str(theirs), str(_BEAM.value),
                                        str(decode.alpha), str(decode.max_extra_len),
                                        _CT2_DEVICE.value])]
    if seed is not None:  # a copy of the precompiled programs, which the timed run adds to
      shutil.copytree(seed / 'programs', (after := scratch_workdir(workdir)) / 'programs')
      seeded = f'decode.py, after --precompile --input {pathlib.Path(_PRECOMPILED.value).name}'
      jobs.insert(2, (seeded, _decode_args(after, source) + ['--output', str(ours)]))
      scratch_dirs.append(after)
    scratch_dirs.append(work)
    cold = None
    for name, args in jobs:
      try:
        r = run(args)
      except RuntimeError as e:
        if not name.startswith('CTranslate2'):
          raise
        last = str(e).strip().splitlines()[-1]  # e.g. its CUDA libraries do not load
        table.append(f'| {n} | {name} | - | - | - | not run: {last[:200]} |')
        print(table[-1], flush=True)
        continue
      same = ''
      if name.startswith('decode.py'):  # every way of running decode.py translates alike
        cold = cold or ours.read_text()
        if ours.read_text() != cold:
          raise RuntimeError(f'{n} lines, {name}: the output differs from the cold run')
      if name.startswith('CTranslate2'):
        a, b = ours.read_text().splitlines(), theirs.read_text().splitlines()
        same = f'{sum(x == y for x, y in zip(a, b))}/{n} lines as ours'
      if name.endswith(', first'):
        continue  # fills the compile cache for the next job
      table.append(f'| {n} | {name} | {r["wall"]:.2f} | {r["cpu"]:.2f} | {r["gb"]:.2f} | '
                   f'{programs(r["stderr"]) if "decode" in name else same} |')
      print(table[-1], flush=True)
  text = (f'{common.stamp()}\n\nModel {model.cfg.encoder_depth}+'
          f'{model.cfg.decoder_depth} layers, d_model {model.cfg.d_model}, checkpoint steps '
          f'{model.steps}; beam {_BEAM.value}, alpha {decode.alpha}, length limit input + '
          f'{decode.max_extra_len}; decode.py computes in {_DTYPE.value or model.cfg.dtype}, '
          f'chunks of {_CHUNK.value or decode.chunk} steps, '
          f'{_CONCURRENT.value or "2 (its default on a CPU)"} batches at once. '
          f'Whole processes; the JAX runtime alone (import jax, one array): {baseline["wall"]:.2f}'
          f' s wall, {baseline["gb"]:.2f} GB.\n\n'
          '| lines | job | wall s | CPU s | peak GB | programs compiled / from compile cache / '
          'stored (decode.py); agreement (CTranslate2) |\n| ---: | --- | ---: | ---: | ---: | '
          '--- |\n' + '\n'.join(table) + '\n')
  print(text)
  for directory in scratch_dirs:
    shutil.rmtree(directory, ignore_errors=True)
  if _MARKDOWN.value:
    common.write_section(_MARKDOWN.value, 'bench/latency.py', text)


if __name__ == '__main__':
  app.run(main)

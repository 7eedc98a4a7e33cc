"""Training speed, side by side in one run: our train step against torch.nn.Transformer.

  python bench/train.py --config configs/multi30k.py --batch 64 --length 24 --steps 20

Every variant runs in its own subprocess (so peak memory is its own) on the same fixed batch:
B rows whose source and target lengths are drawn in [length/2, length] (seeded), padded to
`length`. Printed per variant: real (non-padding) source + target tokens/s, step time (median
and spread over the timed steps; compilation or the first step apart), achieved FLOP/s and MFU
against the peak matmul rate measured in this same run (the better of a measurement before and
one after the steps: this machine's speed drifts with its neighbours' load), peak memory (the
process's peak RSS on CPU) and, for ours, XLA's planned temporary buffers (activations and
workspace of the compiled step, independent of the allocator). PyTorch is optional
(`pip install -r bench/requirements.txt`); without it only our variants run.

With --profile, 3 more of our steps run under jax.profiler and the table is followed by their
time per XLA op kind (matmul, elementwise fusion, copy) and the largest ops with their shapes.

FLOPs are the model's matmul FLOPs on the padded batch (forward x 3 for forward + backward),
counted the same way for every framework, so FLOP/s ratios equal step-time ratios.

On a machine with a GPU both frameworks run on it (JAX's default backend; PyTorch on
`cuda`), the peak is an 8192^3 matmul instead of 2048^3, peak memory is the device's, and
`torch-bfloat16-compile` runs the same model through `torch.compile` (bench/gpu.py runs
transformer-base at the paper's batch this way).
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

import common
from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # configs/

_CONFIG = flags.DEFINE_string('config', 'configs/multi30k.py', 'Config file (model section).')
_BATCH = flags.DEFINE_integer('batch', 64, 'Rows per batch.')
_LENGTH = flags.DEFINE_integer('length', 24, 'Padded length of source and target.')
_STEPS = flags.DEFINE_integer('steps', 20, 'Timed steps per variant.')
_VOCAB = flags.DEFINE_integer('vocab_size', 8000, 'Shared vocabulary size.')
_PEAK_SIZE = flags.DEFINE_integer('peak_size', 0, 'n of the n^3 matmul that measures the peak '
                                  '(0: 2048 on a CPU, 8192 on a GPU); bench/gpu.py --smoke '
                                  "takes a small one: torch's bfloat16 matmul on a CPU without "
                                  'bfloat16 instructions ran at about 1 GFLOP/s.')
_VARIANTS = flags.DEFINE_list('variants', ['jax-float32', 'jax-bfloat16', 'torch-float32',
                                           'torch-bfloat16'], 'What to run, in this order; '
                             'jax-DTYPE-remat recomputes layer activations in the backward pass; '
                             'torch-DTYPE-compile runs torch.compile.')
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the table into this file, '
                                'replacing its bench/train.py section.')
_CHILD = flags.DEFINE_string('child', None, 'Internal: run one variant and print JSON.')
_OVERRIDES = flags.DEFINE_multi_string('set', [], 'Model override KEY=VALUE (e.g. num_layers=6).')
_PROFILE = flags.DEFINE_bool('profile', False, 'Also trace 3 of our steps (jax.profiler) and '
                             'print where their time goes, by XLA op kind and largest ops.')
_SECTION = flags.DEFINE_string('section', '', 'Name suffix of the RESULTS.md section to replace '
                               '(several model sizes side by side).')


# ----------------------------------------------------------------------------- shared setup

def model_section() -> dict:
  import importlib.util
  path, _, arg = _CONFIG.value.partition(':')
  spec = importlib.util.spec_from_file_location('bench_config', ROOT / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  model = dict((module.get_config(arg) if arg else module.get_config()).model)
  model['vocab_size'] = _VOCAB.value
  for item in _OVERRIDES.value:
    key, _, value = item.partition('=')
    model[key] = type(model[key])(value) if not isinstance(model[key], bool) else value == 'True'
  return model


def depths(m: dict) -> tuple[int, int]:
  """(encoder layers, decoder layers) of a model section."""
  return m['num_encoder_layers'] or m['num_layers'], m['num_decoder_layers'] or m['num_layers']


def fixed_lengths(batch: int, length: int, seed: int = 0):
  import numpy as np
  rng = np.random.default_rng(seed)
  return tuple(rng.integers(length // 2, length + 1, batch) for _ in range(2))


def train_flops(m: dict, batch: int, src_len: int, tgt_len: int) -> float:
  """Matmul FLOPs of one training step on the padded batch (forward x 3)."""
  d, ff, v = m['d_model'], m['d_ff'], m['vocab_size']
  n_enc, n_dec = depths(m)
  s, t = batch * src_len, batch * tgt_len  # token positions per side
  encoder = n_enc * (s * (8 * d * d + 4 * d * ff) + 4 * batch * src_len * src_len * d)
  decoder = n_dec * (t * (8 * d * d + 4 * d * d + 4 * d * ff) + s * 4 * d * d
                 + 4 * batch * tgt_len * tgt_len * d + 4 * batch * tgt_len * src_len * d)
  return 3.0 * (encoder + decoder + t * 2 * d * v)


def peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def time_steps(run_step, steps: int) -> dict:
  """run_step() performs one step and blocks until it is done; first call timed apart."""
  t0 = time.perf_counter()
  run_step()
  first = time.perf_counter() - t0
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    run_step()
    times.append(time.perf_counter() - t0)
  return {'first_s': first, 'times': times}


# ----------------------------------------------------------------------------- JAX

def peak_matmul_jax(dtype: str, repeats: int = 5) -> float:
  """FLOP/s of an n^3 jitted matmul (bfloat16 inputs accumulate in float32); n = 8192 on a
  GPU, 2048 on a CPU (or --peak_size)."""
  import jax
  import jax.numpy as jnp
  n = _PEAK_SIZE.value or (2048 if jax.default_backend() == 'cpu' else 8192)
  x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
  f(x, x).block_until_ready()
  best = min(_timed(lambda: f(x, x).block_until_ready()) for _ in range(repeats))
  return 2.0 * n ** 3 / best


def _timed(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def run_jax(dtype: str, remat: bool = False) -> dict:
  import functools

  import jax

  from transformer_nmt import (
    TrainState,
    Transformer,
    init_params,
    make_optimizer,
    model_config_from_dict,
    rsqrt_warmup,
    train_step,
  )

  m = model_section()
  m_cfg = {k: v for k, v in m.items() if k != 'vocab_size'}
  m_cfg['dtype'] = dtype
  m_cfg['remat'] = remat or m_cfg.get('remat', False)
  cfg = model_config_from_dict(m_cfg, vocab_size=m['vocab_size'], src_vocab_size=m['vocab_size'])
  schedule = rsqrt_warmup(cfg.d_model, 4000)  # the paper's: eq. 3, warmup 4000
  state = TrainState.create(apply_fn=Transformer(cfg).apply,  # Adam 0.9 / 0.98 / 1e-9
                            params=init_params(cfg, jax.random.key(0)),
                            tx=make_optimizer(schedule))
  batch = jax_batch(m['vocab_size'])
  step = jax.jit(functools.partial(train_step, label_smoothing=0.1, learning_rate_fn=schedule),
                 donate_argnums=0)
  rng = jax.random.key(1)
  peak_dtype = 'bfloat16' if dtype == 'bfloat16' else 'float32'
  peak_before = peak_matmul_jax(peak_dtype)
  t0 = time.perf_counter()
  compiled = step.lower(state, batch, rng).compile()
  compile_s = time.perf_counter() - t0
  holder = {'state': state}

  def one() -> None:
    holder['state'], metrics = compiled(holder['state'], batch, rng)
    jax.block_until_ready(metrics['loss'])
  result = time_steps(one, _STEPS.value)
  result['compile_s'] = compile_s
  result['xla_flops'] = (compiled.cost_analysis() or {}).get('flops')
  result['peak_flops'] = max(peak_before, peak_matmul_jax(peak_dtype))
  memory = compiled.memory_analysis()
  result['temp_mb'] = memory.temp_size_in_bytes / 2 ** 20 if memory else None
  result['device'] = jax.devices()[0].device_kind
  result['memory_mb'] = _jax_peak_memory_mb()
  if _PROFILE.value:
    result['profile'] = profile_ops(one, steps=3)
    ops = list(result['profile']['ops'])[:8]
    result['profile']['where'] = describe_ops(compiled.as_text(), ops)
  return result


def describe_ops(hlo: str, names: list[str]) -> dict[str, str]:
  """op name -> 'result shape, jax op name' from the compiled HLO text's metadata."""
  import re
  out = {}
  for name in names:
    m = re.search(rf'%?{re.escape(name)} = (\S+) .*?op_name="([^"]*)"', hlo)
    if m:
      out[name] = f'{m.group(1)}, {m.group(2).split("/")[-1][:60]}'
  return out


def profile_ops(run_step, steps: int) -> dict:
  """Milliseconds per step by XLA op (thunk) name, from a jax.profiler trace of `steps` calls
  of run_step (blocking), plus the wall time per step."""
  import collections
  import gzip
  import tempfile

  import jax
  directory = tempfile.mkdtemp(prefix='bench_trace_')
  t0 = time.perf_counter()
  with jax.profiler.trace(directory):
    for _ in range(steps):
      run_step()
  wall_ms = 1e3 * (time.perf_counter() - t0) / steps
  trace = next(pathlib.Path(directory).rglob('*.trace.json.gz'))
  events = json.load(gzip.open(trace))['traceEvents']
  per_op = collections.Counter()
  for e in events:  # XLA CPU thunks run on the runtime's threads, named after HLO ops
    if e.get('ph') == 'X' and not e['name'].startswith(('$', 'end:')) and '::' not in e['name'] \
        and e['name'][0].islower():
      per_op[e['name']] += e['dur'] / 1e3 / steps
  return {'wall_ms': wall_ms, 'ops': dict(per_op.most_common(400))}


def op_kind(name: str) -> str:
  """Coarse kind of an XLA CPU op name: matmul (dot, YNNPACK/oneDNN fusions), elementwise
  fusion, copy/transpose, or other."""
  if name.startswith(('dot', 'ynn', 'onednn', 'convolution', 'custom-call')):
    return 'matmul'
  if 'fusion' in name:
    return 'elementwise fusion'
  if name.startswith(('copy', 'transpose')):
    return 'copy / transpose'
  return 'other'


def profile_text(name: str, profile: dict) -> str:
  kinds = {}
  for op, ms in profile['ops'].items():
    kinds[op_kind(op)] = kinds.get(op_kind(op), 0.0) + ms
  traced = sum(kinds.values())
  top = list(profile['ops'].items())[:8]  # profile_ops keeps them largest first
  return (f"Profile of {name}: {profile['wall_ms']:.0f} ms per step (traced), ops "
          f'{traced:.0f} ms: ' + ', '.join(f'{k} {v:.0f} ms ({100 * v / traced:.0f}%)'
                                           for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
          + '. Largest ops: ' + '; '.join(
              f"{op} {ms:.1f} ms" + (f" [{profile['where'][op]}]" if op in profile.get('where', {})
                                     else '') for op, ms in top) + '.\n')


def _jax_peak_memory_mb() -> float:
  import jax
  stats = jax.devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    return stats['peak_bytes_in_use'] / 2 ** 20
  return peak_rss_mb()


def jax_batch(vocab: int) -> dict:
  import jax.numpy as jnp
  return {k: jnp.asarray(v, jnp.int32) for k, v in numpy_batch(vocab).items()}


# ----------------------------------------------------------------------------- PyTorch

def run_torch(dtype: str, compiled: bool = False) -> dict:
  import math

  import torch
  import torch.nn.functional as F

  torch.set_num_threads(os.cpu_count() or 1)
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  torch.manual_seed(0)
  m = model_section()
  d, v = m['d_model'], m['vocab_size']
  n_enc, n_dec = depths(m)

  class Model(torch.nn.Module):
    """torch.nn.Transformer with our hyperparameters: shared, tied embeddings scaled by
    sqrt(d), sinusoidal positions, pre- or post-LN, dropout as configured."""

    def __init__(self):
      super().__init__()
      self.embed = torch.nn.Embedding(v, d, padding_idx=0)
      torch.nn.init.normal_(self.embed.weight, 0.0, d ** -0.5)
      self.core = torch.nn.Transformer(
          d_model=d, nhead=m['num_heads'], num_encoder_layers=n_enc,
          num_decoder_layers=n_dec, dim_feedforward=m['d_ff'],
          dropout=m['residual_dropout'], batch_first=True,
          norm_first=m['norm_position'] == 'pre')
      pos = torch.arange(_LENGTH.value)[:, None]
      freq = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
      pe = torch.zeros(_LENGTH.value, d)
      pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
      self.register_buffer('pe', pe)

    def forward(self, src, tgt_in, src_pad, tgt_pad, causal):
      x = self.embed(src) * math.sqrt(d) + self.pe[:src.shape[1]]
      y = self.embed(tgt_in) * math.sqrt(d) + self.pe[:tgt_in.shape[1]]
      h = self.core(x, y, tgt_mask=causal, src_key_padding_mask=src_pad,
                    tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad,
                    tgt_is_causal=True)
      return h @ self.embed.weight.T

  model = Model().to(device)
  forward = torch.compile(model) if compiled else model
  opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
  b = {k: torch.from_numpy(val).long().to(device) for k, val in numpy_batch(v).items()}
  causal = torch.nn.Transformer.generate_square_subsequent_mask(_LENGTH.value, device=device)

  def one() -> None:
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == 'bfloat16'):
      logits = forward(b['src'], b['tgt_in'], b['src_segments'] == 0, b['tgt_segments'] == 0,
                       causal)
      loss = F.cross_entropy(logits.float().reshape(-1, v), b['tgt_out'].reshape(-1),
                             ignore_index=0, label_smoothing=0.1)
    loss.backward()
    opt.step()
    if device == 'cuda':
      torch.cuda.synchronize()
  peak_before = peak_matmul_torch(dtype, device)
  result = time_steps(one, _STEPS.value)
  result['compile_s'] = None
  result['peak_flops'] = max(peak_before, peak_matmul_torch(dtype, device))
  result['temp_mb'] = None
  name = torch.cuda.get_device_name() if device == 'cuda' else 'cpu'
  result['device'] = f'{name} (torch {torch.__version__})'
  result['memory_mb'] = (torch.cuda.max_memory_allocated() / 2 ** 20 if device == 'cuda'
                         else peak_rss_mb())
  return result


def numpy_batch(vocab: int) -> dict:
  """The fixed benchmark batch (all batch keys of steps.train_step) as numpy arrays."""
  import numpy as np
  batch, length = _BATCH.value, _LENGTH.value
  src_lens, tgt_lens = fixed_lengths(batch, length)
  rng = np.random.default_rng(1)
  out = {}
  for side, lens in (('src', src_lens), ('tgt', tgt_lens)):
    seg = (np.arange(length)[None, :] < lens[:, None]).astype(np.int32)
    ids = rng.integers(4, vocab, (batch, length)) * seg
    out[f'{side}_segments'] = seg
    out[f'{side}_positions'] = np.arange(length)[None, :].repeat(batch, 0) * seg
    if side == 'src':
      out['src'] = ids
    else:
      out['tgt_out'] = ids
      out['tgt_in'] = np.concatenate([np.full((batch, 1), 2), ids[:, :-1]], axis=1) * seg
  return out


def peak_matmul_torch(dtype: str, device: str = 'cpu', repeats: int = 5) -> float:
  """FLOP/s of an n^3 matmul on `device`: n = 8192 on a GPU, 2048 on a CPU (or --peak_size)."""
  import torch
  n = _PEAK_SIZE.value or (8192 if device == 'cuda' else 2048)
  x = torch.randn(n, n, device=device).to(torch.bfloat16 if dtype == 'bfloat16'
                                           else torch.float32)
  sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)

  def product() -> None:
    x @ x
    sync()
  product()
  return 2.0 * n ** 3 / min(_timed(product) for _ in range(repeats))


# ----------------------------------------------------------------------------- driver

def child(variant: str) -> None:
  framework, dtype, *extra = variant.split('-')  # e.g. jax-bfloat16-remat
  result = (run_jax(dtype, 'remat' in extra) if framework == 'jax'
            else run_torch(dtype, 'compile' in extra))
  print('RESULT ' + json.dumps(result))


def run_variant(variant: str) -> dict | None:
  cmd = [sys.executable, __file__, '--child', variant, '--config', _CONFIG.value,
         '--batch', str(_BATCH.value), '--length', str(_LENGTH.value),
         '--steps', str(_STEPS.value), '--vocab_size', str(_VOCAB.value),
         '--peak_size', str(_PEAK_SIZE.value), f'--profile={_PROFILE.value}'] + [
             f'--set={s}' for s in _OVERRIDES.value]
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
  lines = [line for line in proc.stdout.splitlines() if line.startswith('RESULT ')]
  if proc.returncode != 0 or not lines:
    tail = (proc.stderr.strip().splitlines() or ['(no output)'])[-1]
    print(f'{variant}: failed ({tail})', file=sys.stderr)
    return None
  return json.loads(lines[-1][len('RESULT '):])


def table(results: dict[str, dict], real_tokens: int, flops: float) -> str:
  head = ('| variant | real tok/s | step ms (median) | spread (p10-p90) | compile / first s | '
          'TFLOP/s | peak matmul TFLOP/s | MFU | peak memory MB | XLA temp MB |\n'
          '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n')
  rows = []
  for name, r in results.items():
    times = sorted(r['times'])
    median = statistics.median(times)
    p10, p90 = times[len(times) // 10], times[min(len(times) - 1, (9 * len(times)) // 10)]
    first = r['compile_s'] if r['compile_s'] is not None else r['first_s']
    rows.append(f"| {name} | {real_tokens / median:,.0f} | {1e3 * median:.1f} | "
                f"{1e3 * p10:.1f}-{1e3 * p90:.1f} | {first:.1f} | {flops / median / 1e12:.3f} | "
                f"{r['peak_flops'] / 1e12:.3f} | {100 * flops / median / r['peak_flops']:.0f}% | "
                f"{r['memory_mb']:,.0f} | {_mb(r.get('temp_mb'))} |")
  return head + '\n'.join(rows) + '\n'


def _mb(value: float | None) -> str:
  return '-' if value is None else f'{value:,.0f}'


def ratios(results: dict[str, dict]) -> list[str]:
  med = {k: statistics.median(r['times']) for k, r in results.items()}
  out = []
  for ours in [k for k in med if k.startswith('jax')]:
    for theirs in [k for k in med if k.startswith('torch')]:
      out.append(f'{ours} / {theirs}: {med[theirs] / med[ours]:.2f}x tokens/s')
  return out


def main(argv: list[str]) -> None:
  del argv
  if _CHILD.value:
    child(_CHILD.value)
    return
  m = model_section()
  src_lens, tgt_lens = fixed_lengths(_BATCH.value, _LENGTH.value)
  real = int(src_lens.sum() + tgt_lens.sum())
  flops = train_flops(m, _BATCH.value, _LENGTH.value, _LENGTH.value)
  results = {}
  for variant in _VARIANTS.value:
    print(f'running {variant} ...', file=sys.stderr, flush=True)
    r = run_variant(variant)
    if r is not None:
      results[variant] = r
  device = next(iter(results.values()))['device'] if results else '?'
  text = (f'{common.stamp(device)}\n\n'
          f"Model: {'+'.join(map(str, depths(m)))} layers, d_model {m['d_model']}, d_ff "
          f"{m['d_ff']}, {m['num_heads']} heads, vocab {m['vocab_size']}, {m['norm_position']}-LN;"
          f" batch {_BATCH.value} x {_LENGTH.value} per side, {real} real tokens "
          f"({100 * (1 - real / (2 * _BATCH.value * _LENGTH.value)):.0f}% padding), "
          f"{flops / 1e9:.1f} GFLOP per step; {_STEPS.value} timed steps.\n\n"
          + table(results, real, flops) + '\n' + ''.join(f'- {r}\n' for r in ratios(results))
          + ''.join('\n' + profile_text(k, r['profile']) for k, r in results.items()
                    if 'profile' in r))
  print(text)
  if _MARKDOWN.value:
    name = 'bench/train.py' + (f' {_SECTION.value}' if _SECTION.value else '')
    common.write_section(_MARKDOWN.value, name, text)


if __name__ == '__main__':
  app.run(main)

"""Compile the train step for a TPU slice or GPU hosts without them: memory, collectives,
and on TPUs FLOPs and step time.

  python aot_compile.py --config configs/big.py --topology v5e:8x8 \
      --config.train.shard_params=True
  python aot_compile.py --config configs/big.py --topology h100:8x8 \
      --config.train.shard_params=True

The step before booking a pod: it builds the program train.py runs (its mesh, shardings and
buffer donation) for the slice, from shapes alone, and reports per chip what that run would
meet. Exit code 1 when the program does not fit the chip's HBM (by how much, in one line);
2 for a bad flag or topology. `--decode` compiles the encoder and one cached decoder step of
beam search instead. TPUs need libtpu (`pip install "jax[tpu]"` of our jax version), GPUs the
CUDA plugin without its CUDA libraries (`pip install --no-deps jax-cuda12-plugin
jax-cuda12-pjrt` of our jax version); requirements-dev.txt installs both. Runs on the CPU.
"""

import json
import os
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # the TPU is only a compilation target here
os.environ.setdefault('TPU_ACCELERATOR_TYPE', 'v5litepod-4')  # quiets libtpu's host probing
os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')  # no TPU is opened: compiling only

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from transformer_nmt.cli import config_flag_parser, main_running  # noqa: E402
from transformer_nmt.inference import options  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/base.py', 'Config file (Python).')
_TOPOLOGY = flags.DEFINE_string('topology', 'v5e:2x2', 'TPU slice (v5e:4x4, v5p:4x4x4) or GPU '
                                'hosts (h100:8 is one host of 8 H100s, h100:8x8 eight hosts).')
_LENGTH = flags.DEFINE_integer('length', 64, 'Padded tokens per side of every row.')
_BATCH = flags.DEFINE_integer('batch', 0, 'Global rows per step; 0 = the config\'s tokens per '
                              'update (train.global_batch_tokens, else data.tokens_per_batch) / '
                              '--length, rounded down to a multiple of the chips.')
_DECODE = flags.DEFINE_bool('decode', False, 'Compile the encoder and one decoder step of beam '
                            'search instead of the train step.')
options.define_decode_flags(('beam_size',))  # with --decode; default: the config's
_CACHE = flags.DEFINE_integer('cache_length', 0, 'With --decode: self-attention cache '
                              'positions; 0 = --length + decode.max_extra_len.')
_BUDGET = flags.DEFINE_float('budget', 1.0, 'Fraction of the chip\'s HBM the program may use.')
_TOP = flags.DEFINE_integer('top', 0, 'Also list the N instructions with the most estimated '
                            'cycles, with the JAX operation each came from.')
_JSON = flags.DEFINE_bool('json', False, 'Print the report as one JSON object.')


def _rows(config, chips: int) -> int:
  from transformer_nmt.errors import UserError
  if _BATCH.value:
    rows = _BATCH.value
  else:
    tokens = config.train.global_batch_tokens or config.data.tokens_per_batch
    rows = max(chips, tokens // _LENGTH.value // chips * chips)
  if rows % chips:
    raise UserError(f'--batch={rows} must be a multiple of the {chips} chips')
  return rows


def _format(report: dict) -> str:
  from transformer_nmt.accelerators import aot
  gib = lambda n: f'{n / 2 ** 30:.2f} GiB'  # noqa: E731
  m = report['memory']
  lines = [f"{report['program']} on {report['topology']} ({report['chips']} x {report['chip']}), "
           f"{report['shape']}",
           f"  parameters {report['parameters']:,} ({gib(report['parameter_bytes_per_chip'])} "
           f"per chip with Adam moments)",
           f"  memory per chip: arguments {gib(m['argument'])}, outputs {gib(m['output'])} "
           f"(aliased {gib(m['alias'])}), temporaries {gib(m['temp'])}, code {gib(m['code'])}; "
           f"total {gib(m['total'])} of {gib(m['hbm'])} HBM ({100 * m['total'] / m['hbm']:.0f}%)"]
  if report['gpu']:
    lines.append(f"  JAX allocates {100 * aot.GPU_DEFAULT_MEMORY_FRACTION:.0f}% of a GPU's memory "
                 f"by default ({gib(aot.GPU_DEFAULT_MEMORY_FRACTION * m['hbm'])}); set "
                 'XLA_PYTHON_CLIENT_MEM_FRACTION for more')
  if report['flops']:
    lines.append(f"  per chip: {report['flops'] / 1e9:,.1f} GFLOP, "
                 f"{report['bytes_accessed'] / 1e9:,.2f} GB accessed (XLA cost analysis)")
  for kind, c in sorted(report['collectives'].items()):
    lines.append(f"  {kind}: {c['count']} ops, {c['bytes'] / 1e6:,.1f} MB")
  if not report['collectives']:
    lines.append('  no collectives')
  names = {'roofline': 'roofline max(FLOPs/peak, bytes/bandwidth)',
           'xla_estimate': "XLA's estimated cycles"}
  for name, s in report['step'].items():
    lines.append(f"  step by {names[name]}: {1e3 * s['seconds']:.2f} ms, "
                 f"{s['tokens_per_s']:,.0f} target tokens/s for the slice, "
                 f"MFU {100 * s['mfu']:.0f}%")
  for row in report.get('top', []):
    lines.append(f"  {row['cycles']:>10,} cycles  {row['shape'][:60]:<60}  {row['op_name'][-90:]}")
  lines += [f'  note: {note}' for note in report['notes']]
  if report['gpu']:
    lines.append('  no FLOP count or step time: XLA gives no cost analysis for GPU programs')
  elif 'xla_estimate' not in report['step']:
    lines.append(f"  XLA's estimate: {report['estimated_cycles']:,} cycles (no published clock "
                 'for this chip)')
  return '\n'.join(lines)


def _over_budget(report: dict) -> str:
  m = report['memory']
  allowed = _BUDGET.value * m['hbm']
  if m['total'] <= allowed:
    return ''
  return (f"{report['program']} needs {m['total'] / 2 ** 30:.2f} GiB per chip on "
          f"{report['topology']}, {(m['total'] - allowed) / 2 ** 30:.2f} GiB over the budget of "
          f"{allowed / 2 ** 30:.2f} GiB ({_BUDGET.value:g} x {report['chip']} HBM)")


def run() -> None:
  from transformer_nmt.accelerators import aot
  from transformer_nmt.typed_config import validate_config
  config = validate_config(_CONFIG.value)
  devices, chip = aot.topology_devices(_TOPOLOGY.value)
  rows = _rows(config, len(devices))
  if _DECODE.value:
    beam = options.with_overrides(config.decode, options.decode_overrides(('beam_size',)))
    programs = aot.decoding_programs(config, devices, rows, _LENGTH.value, beam.beam_size,
                                     _CACHE.value)
  else:
    programs = [aot.train_program(config, devices, rows, _LENGTH.value)]
  try:
    reports = [aot.report(program, chip, len(devices), _TOP.value) for program in programs]
  except aot.DoesNotFit as e:
    print(f'error: {e} on {_TOPOLOGY.value}', file=sys.stderr)
    raise SystemExit(1) from None
  for report in reports:
    report['topology'] = _TOPOLOGY.value
  print(json.dumps(reports if _DECODE.value else reports[0]) if _JSON.value else
        '\n'.join(_format(r) for r in reports))
  problems = [p for p in map(_over_budget, reports) if p]
  if problems:
    print('error: ' + '; '.join(problems), file=sys.stderr)
    raise SystemExit(1)


if __name__ == '__main__':
  app.run(main_running(run), flags_parser=config_flag_parser(_CONFIG))

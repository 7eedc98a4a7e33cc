"""Compiling our programs for TPU slices and GPU clusters that this machine does not have.

`jax.experimental.topologies` describes a TPU slice (e.g. 'v5e:8x8') with libtpu alone, and
GPU hosts (e.g. 'h100:8x8', 8 hosts of 8) with the CUDA plugin and a GPU target config that
the project ships (gpu_target.py); XLA then compiles the real per-chip program for it from
abstract inputs (ShapeDtypeStructs carrying NamedShardings), without allocating any array. The
compiled program tells what a pod run would meet: memory per chip, every collective, and on
TPUs FLOPs, bytes accessed and XLA's own per-instruction time estimates (XLA's GPU compiler
gives no cost analysis). This module holds the chip table, the analysis of a compiled program
and the roofline; aot_compile.py builds the programs.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any, Optional

import jax
import numpy as np

from transformer_nmt.accelerators import gpu_target
from transformer_nmt.errors import UserError

if TYPE_CHECKING:  # imported where used: the chip and topology helpers stay light
  from transformer_nmt.config import ModelConfig
  from transformer_nmt.typed_config import Sections

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """Published per-chip figures: HBM, peak dense bfloat16 FLOP/s, HBM bandwidth, TensorCore
  clock (for XLA's cycle estimates; None where not published), and whether it is a GPU."""

  name: str
  hbm_bytes: int
  peak_flops: float
  hbm_bytes_per_s: float
  clock_hz: Optional[float]
  gpu: bool = False


CHIPS = {
    'v4': Chip('TPU v4', 32 * GIB, 275e12, 1200e9, 1.05e9),
    'v5e': Chip('TPU v5e', 16 * GIB, 197e12, 819e9, 1.5e9),
    'v5p': Chip('TPU v5p', 95 * GIB, 459e12, 2765e9, None),
    'v6e': Chip('TPU v6e', 32 * GIB, 918e12, 1640e9, None),
}
# GPUs: NVIDIA's published dense bfloat16 peak and HBM bandwidth (SXM cards); the memory is
# what CUDA reports for the card (the target config's device_memory_size).
GPUS = {'h100': Chip('NVIDIA H100 80GB', 84_929_347_584, 989.4e12, 3.35e12, None, gpu=True)}
TOPOLOGY_EXAMPLES = ('v5e:2x2, v5e:4x4, v5e:8x8, v5e:16x16, v6e:4x4, v5p:4x4x4, v4:4x4x4; '
                     'GPUs: h100:8 (one host of 8), h100:8x8 (8 hosts of 8)')
_TOPOLOGY = re.compile(r'^(v4|v5e|v5p|v6e):\d+x\d+(x\d+)?$')
_GPU_TOPOLOGY = re.compile(r'^(?P<kind>h100):(?:(?P<hosts>\d+)x)?(?P<gpus>\d+)$')
# What JAX allocates of a GPU's memory by default (XLA_PYTHON_CLIENT_MEM_FRACTION).
GPU_DEFAULT_MEMORY_FRACTION = 0.75


def topology_devices(name: str) -> tuple[list, Chip]:
  """The devices (one per chip) of a TPU slice such as 'v5e:4x4' or of GPU hosts such as
  'h100:8x8' (8 hosts of 8 GPUs; 'h100:8' is one host), and the chip's figures.

  Raises UserError naming valid examples for a name libtpu does not know, or saying what
  to install when the compiler for the platform is missing.
  """
  gpu = _GPU_TOPOLOGY.match(name)
  if gpu:
    return _gpu_devices(gpu['kind'], int(gpu['hosts'] or 1), int(gpu['gpus'])), GPUS[gpu['kind']]
  if not _TOPOLOGY.match(name):
    raise UserError(f'--topology={name!r} is not a TPU or GPU topology; use one like '
                    f'{TOPOLOGY_EXAMPLES}')
  from jax.experimental import topologies
  kind = name.split(':')[0]
  extra = {'chip_config_name': 'megacore'} if kind == 'v4' else {}  # one device per v4 chip
  try:
    topology = topologies.get_topology_desc(topology_name=name, platform='tpu', **extra)
  except Exception as e:  # noqa: BLE001 -- libtpu raises XlaRuntimeError/ValueError/RuntimeError
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f'--topology={name!r}: {first} (examples: {TOPOLOGY_EXAMPLES})') from None
  return list(topology.devices), CHIPS[kind]


def _gpu_devices(kind: str, hosts: int, gpus: int) -> list:
  from jax.experimental import topologies
  if hosts < 1 or gpus < 1:
    raise UserError(f'--topology={kind}:{hosts}x{gpus} needs at least one host and one GPU '
                    f'(examples: {TOPOLOGY_EXAMPLES})')
  try:
    topology = topologies.get_topology_desc(platform='cuda', target_config=gpu_target.config(kind),
                                            topology=f'1x{hosts}x{gpus}')
  except Exception as e:  # noqa: BLE001 -- a missing plugin is NotImplementedError or RuntimeError
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f'--topology={kind}:{gpus if hosts == 1 else f"{hosts}x{gpus}"} needs '
                    f'the CUDA plugin of jax {jax.__version__} (pip install --no-deps '
                    f'jax-cuda12-plugin=={jax.__version__} jax-cuda12-pjrt=={jax.__version__}, '
                    f'as requirements-dev.txt does): {first}') from None
  return list(topology.devices)


@dataclasses.dataclass(frozen=True)
class Collective:
  """One cross-chip operation of a compiled program: kind ('all-gather', 'all-reduce',
  'reduce-scatter', 'all-to-all', 'collective-permute'), the arrays it moves (dtype, shape of
  the larger side: the gathered result, the reduced operand) and their bytes."""

  kind: str
  arrays: tuple[tuple[str, tuple[int, ...]], ...]
  nbytes: int
  name: str


_DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 'bf16': 2, 'f16': 2, 's16': 2, 'u16': 2, 'f32': 4,
                's32': 4, 'u32': 4, 'f64': 8, 's64': 8, 'u64': 8}
_KINDS = ('all-gather', 'all-reduce', 'reduce-scatter', 'all-to-all', 'collective-permute')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+) = (?P<result>.*?) '
                          r'(?P<op>' + '|'.join(_KINDS) + r')(?P<start>-start)?\((?P<args>.*)$')
_ARRAY = re.compile(r'\b(' + '|'.join(_DTYPE_BYTES) + r')\[([\d,]*)\]')


def _arrays(text: str) -> list[tuple[str, tuple[int, ...]]]:
  return [(dtype, tuple(int(d) for d in dims.split(',') if d)) for dtype, dims in
          _ARRAY.findall(text)]


def _nbytes(arrays: list[tuple[str, tuple[int, ...]]]) -> int:
  return sum(_DTYPE_BYTES[dtype] * int(np.prod(shape)) for dtype, shape in arrays)


def collectives(hlo_text: str) -> list[Collective]:
  """Every collective in an optimized HLO module's text, counted once.

  Both sides are read (operands with their shapes where the text lists them, and the two
  halves of an asynchronous start's result tuple); the larger one is the array the
  collective is about. The TPU compiler splits one asynchronous
  collective into several fusions (start, steps, done) that each hold a copy of it under the
  same channel id: those count once. It also writes a reduce-scatter as an all-reduce inside
  a fusion named 'all-reduce-scatter' (each device keeps a slice): counted as reduce-scatter.
  """
  found: dict[str, Collective] = {}
  computation = ''
  for line in hlo_text.splitlines():
    if line and not line[0].isspace():
      computation = line.split(' ', 1)[0].lstrip('%')
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    kind = match['op']
    if kind == 'all-reduce' and computation.startswith('all-reduce-scatter'):
      kind = 'reduce-scatter'
    operands = _arrays(match['args'].split('),')[0].split(', channel_id')[0])
    sides = [operands] + [_arrays(part) for part in _start_tuple(match['result'])]
    side = max(sides, key=_nbytes)
    channel = re.search(r'channel_id=(\d+)', line)
    key = f"{kind}#{channel[1]}" if channel else match['name']
    if key not in found or found[key].nbytes < _nbytes(side):
      found[key] = Collective(kind, tuple(side), _nbytes(side), match['name'])
  return list(found.values())


def _start_tuple(result: str) -> list[str]:
  """The result of an asynchronous '-start' collective, '((operands...), (results...))' (the
  GPU compiler names its operands without shapes), as its two halves; any other result
  whole."""
  if not result.startswith('(('):
    return [result]
  depth = 0
  for i, char in enumerate(result):
    depth += {'(': 1, ')': -1}.get(char, 0)
    if depth == 1 and char == ')':
      return [result[1:i + 1], result[i + 1:]]
  return [result]


def estimated_cycles(hlo_text: str) -> int:
  """Sum of XLA's per-instruction 'estimated_cycles' over the entry computation."""
  entry = hlo_text[hlo_text.index('\nENTRY '):]
  entry = entry[:entry.index('\n}')]
  return sum(int(c) for c in re.findall(r'"estimated_cycles":"(\d+)"', entry))


def costliest(hlo_text: str, count: int) -> list[dict[str, Any]]:
  """The `count` entry-computation instructions with the most estimated cycles: cycles, the
  result's shape, and the JAX operation (op_name metadata, which names the model's module and
  primitive) it came from."""
  entry = hlo_text[hlo_text.index('\nENTRY '):]
  entry = entry[:entry.index('\n}')]
  rows = []
  for line in entry.splitlines():
    cycles = re.search(r'"estimated_cycles":"(\d+)"', line)
    head = re.match(r'\s*(?:ROOT\s+)?%?([\w.\-]+) = (\S+)', line)
    if cycles and head:
      op = re.search(r'op_name="([^"]*)"', line)
      rows.append({'cycles': int(cycles[1]), 'instruction': head[1], 'shape': head[2],
                   'op_name': op[1] if op else ''})
  return sorted(rows, key=lambda r: -r['cycles'])[:count]


def analyze(compiled: Any, chip: Chip, chips: int, tokens: int) -> dict[str, Any]:
  """The figures of one compiled per-chip program.

  Args:
    compiled: `jax.jit(...).lower(...).compile()` for the slice.
    chip: the slice's chip.
    chips: chips in the slice.
    tokens: target tokens per step of the whole slice (padded), for tokens/s.

  Returns:
    a JSON-ready dict: bytes per chip (argument, output, alias, temp, code, total, hbm), flops
    and bytes accessed per chip, collectives by kind (count, bytes), the roofline and XLA-cycle
    step times with the tokens/s and MFU each implies.
  """
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}  # None on GPUs
  text = compiled.as_text()
  mem = {'argument': memory.argument_size_in_bytes, 'output': memory.output_size_in_bytes,
         'alias': memory.alias_size_in_bytes, 'temp': memory.temp_size_in_bytes,
         'code': memory.generated_code_size_in_bytes}
  mem['total'] = mem['argument'] + mem['output'] - mem['alias'] + mem['temp'] + mem['code']
  mem['hbm'] = chip.hbm_bytes
  flops, accessed = float(cost.get('flops', 0.0)), float(cost.get('bytes accessed', 0.0))
  by_kind: dict[str, dict[str, int]] = {}
  for c in collectives(text):
    entry = by_kind.setdefault(c.kind, {'count': 0, 'bytes': 0})
    entry['count'] += 1
    entry['bytes'] += c.nbytes
  times = {'roofline': max(flops / chip.peak_flops, accessed / chip.hbm_bytes_per_s)} if flops \
      else {}
  cycles = estimated_cycles(text)
  if chip.clock_hz:
    times['xla_estimate'] = cycles / chip.clock_hz
  steps = {name: {'seconds': t, 'tokens_per_s': tokens / t if t else 0.0,
                  'mfu': flops / (t * chip.peak_flops) if t else 0.0}
           for name, t in times.items()}
  return {'chip': chip.name, 'gpu': chip.gpu, 'chips': chips, 'memory': mem, 'flops': flops,
          'bytes_accessed': accessed, 'collectives': by_kind, 'estimated_cycles': cycles,
          'step': steps}


def abstract(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs of `tree` (arrays or structs) carrying `shardings` (a matching tree)."""
  return jax.tree_util.tree_map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


BATCH_KEYS = ('src', 'src_segments', 'src_positions', 'tgt_in', 'tgt_out', 'tgt_segments',
              'tgt_positions')


def _model_config(config: Sections) -> ModelConfig:
  """The model with data.vocab_size as its (shared) vocabulary, as SentencePiece would give."""
  from transformer_nmt.typed_config import model_config_from_dict
  vocab = config.data.vocab_size
  return model_config_from_dict(config.model, vocab_size=vocab, src_vocab_size=vocab)


def _bytes_per_chip(tree: Any, shardings: Any) -> int:
  return sum(int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize for x, s in
             zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(shardings)))


@dataclasses.dataclass(frozen=True)
class Program:
  """A lowered program ready to compile for a slice, with what its report needs."""

  name: str
  lowered: Any  # jax.stages.Lowered
  tokens: int  # target tokens (or decoded positions) per run of the program, whole slice
  description: str
  parameters: int
  parameter_bytes_per_chip: int  # parameters (and Adam moments, when training) on one chip


_NO_TRITON_TILING = "Couldn't find output tile sizes"


class DoesNotFit(Exception):
  """The TPU compiler refused the program for want of HBM."""


def report(program: Program, chip: Chip, chips: int, top: int = 0) -> dict[str, Any]:
  """Compiles `program` and returns `analyze`'s figures with its description (and with
  `top` > 0, its `costliest` instructions under 'top').

  Raises DoesNotFit, saying by how much, when the compiler runs out of HBM.
  """
  notes = []
  try:
    compiled = program.lowered.compile()
  except Exception as e:  # noqa: BLE001 -- XLA's JaxRuntimeError, matched by its status
    if chip.gpu and _NO_TRITON_TILING in str(e):
      # Without a GPU to autotune on, XLA may find no Triton tiling for a small matmul; such
      # a program is compiled with cuBLAS matmuls instead, and the report says so.
      compiled = program.lowered.compile({'xla_gpu_enable_triton_gemm': False})
      notes.append('compiled with xla_gpu_enable_triton_gemm=false (no Triton tiling found '
                   'without a GPU to autotune on)')
    elif 'RESOURCE_EXHAUSTED' in str(e):
      raise DoesNotFit(f'{program.name} ({program.description}) does not fit a {chip.name}: '
                       + _shortfall(str(e))) from None
    else:
      raise
  figures = analyze(compiled, chip, chips, program.tokens)
  figures['notes'] = notes
  if top:
    figures['top'] = costliest(compiled.as_text(), top)
  figures.update(program=program.name, shape=program.description, parameters=program.parameters,
                 parameter_bytes_per_chip=program.parameter_bytes_per_chip)
  return figures


def _shortfall(message: str) -> str:
  """'... required for HLO temporaries (22.09G) exceeds available HBM (15.75G).' -> one
  sentence with the excess; the compiler's first line when it says something else."""
  sizes = re.search(r'\((\d+(?:\.\d+)?)G\) exceeds available HBM \((\d+(?:\.\d+)?)G\)', message)
  if not sizes:
    return message.strip().splitlines()[0]
  need, have = float(sizes[1]), float(sizes[2])
  return (f'its temporaries need {need:.2f} GiB, {need - have:.2f} GiB over the {have:.2f} GiB '
          'of HBM left for them')


def train_program(config: Sections, devices: list, rows: int, length: int) -> Program:
  """train.py's step (its mesh, shardings and donation) for one batch of [rows, length] per
  update on `devices`, lowered from shapes alone."""
  from transformer_nmt import sharding
  from transformer_nmt.model.transformer import count_params
  from transformer_nmt.training import jitted
  from transformer_nmt.training.state import create_train_state
  model_cfg = _model_config(config)
  mesh = jitted.make_mesh(config.train, devices)
  state = jax.eval_shape(lambda: create_train_state(model_cfg, config.train, jax.random.key(0)))
  placement = jitted.state_shardings(state, mesh)
  step = jitted.jit_steps(model_cfg, config.train, mesh, placement, donate=True)['train']
  batch = {k: jax.ShapeDtypeStruct((rows, length), np.int32,
                                   sharding=sharding.batch_sharding(mesh)) for k in BATCH_KEYS}
  key = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sharding.replicated(mesh))
  weights = (state.params, state.opt_state)
  return Program(
      'train step', step.lower(abstract(state, placement), batch, rng), rows * length,
      f'global batch {rows} x {length} tokens per side, {model_cfg.dtype}, mesh data '
      f'{mesh.shape[sharding.DATA_AXIS]} x fsdp {mesh.shape[sharding.FSDP_AXIS]}',
      count_params(state.params),
      _bytes_per_chip(weights, (placement.params, placement.opt_state)))


def decoding_programs(config: Sections, devices: list, rows: int, length: int, beam: int,
                      cache_length: int) -> list[Program]:
  """The encoder (with the cross-attention K/V of every decoder layer) for [rows, length]
  sources and one cached decoder step for rows x `beam` hypotheses, parameters replicated
  and rows split over all chips."""
  from transformer_nmt import sharding
  from transformer_nmt.decoding.ensemble import kernels_as_computed
  from transformer_nmt.model.transformer import Transformer, count_params, init_params
  model_cfg = _model_config(config)
  model = Transformer(model_cfg)
  mesh = sharding.device_mesh(devices)
  rows_split, whole = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  place = lambda tree: jax.tree_util.tree_map(  # noqa: E731
      lambda x: rows_split if x.ndim else whole, tree)
  params = jax.eval_shape(lambda: init_params(model_cfg, jax.random.key(0)))
  params = abstract(params, jax.tree_util.tree_map(lambda _: whole, params))
  params = kernels_as_computed(model_cfg, params)  # as the Engine hands them over
  cache_length = cache_length or length + config.decode.max_extra_len

  def encode(params: Any, src: jax.Array, segments: jax.Array) -> Any:
    variables = {'params': params}
    memory = model.apply(variables, src, segments, method=Transformer.encode)
    cache = model.apply(variables, memory, segments, cache_length, method=Transformer.init_cache)
    return cache.tile_beams(beam)  # the reference path, as an accelerator's engine runs it

  def step(params: Any, ids: jax.Array, cache: Any) -> Any:
    return model.apply({'params': params}, ids, cache, method=Transformer.decode_step)

  src = jax.ShapeDtypeStruct((rows, length), np.int32, sharding=rows_split)
  cache = jax.eval_shape(encode, params, src, src)
  cache = abstract(cache, place(cache))
  ids = jax.ShapeDtypeStruct((rows * beam,), np.int32, sharding=rows_split)
  count = count_params(params)
  param_bytes = _bytes_per_chip(params, jax.tree_util.tree_map(lambda _: whole, params))
  return [
      Program('encoder', jax.jit(encode, out_shardings=place(cache)).lower(params, src, src),
              rows * length, f'{rows} sources x {length} tokens, {model_cfg.dtype}', count,
              param_bytes),
      Program('decoder step', jax.jit(step).lower(params, ids, cache), rows * beam,
              f'{rows} sentences x beam {beam}, cache of {cache_length} positions, '
              f'{model_cfg.dtype}', count, param_bytes)]

"""Layers unrolled (what model.py does) against `nn.scan` over them: compile time and step time
of N encoder layers' forward and backward pass with dropout, side by side in one run.

  python bench/scan_layers.py [--layers 6] [--d_model 512] [--batch 32] [--length 32]

nn.scan traces and compiles one layer body and loops over stacked parameters, so its compile
time should barely grow with depth; the question is what the loop costs per step.
"""

import shlex
import statistics
import sys
import time

from absl import app, flags

_LAYERS = flags.DEFINE_integer('layers', 6, 'Encoder layers.')
_D_MODEL = flags.DEFINE_integer('d_model', 512, 'Width (d_ff = 4x, heads = width / 64).')
_BATCH = flags.DEFINE_integer('batch', 32, 'Rows.')
_LENGTH = flags.DEFINE_integer('length', 32, 'Positions per row.')
_STEPS = flags.DEFINE_integer('steps', 10, 'Timed steps.')


def stacks(cfg, layers: int):
  """(unrolled, scanned) Flax modules mapping x [B, S, D] -> [B, S, D] through `layers`
  EncoderLayers in training mode (dropout on)."""
  import flax.linen as nn

  from transformer_nmt.model.transformer import EncoderLayer

  class Unrolled(nn.Module):
    @nn.compact
    def __call__(self, x):
      for _ in range(layers):
        x = EncoderLayer(cfg)(x, None, False)
      return x

  class Body(nn.Module):
    @nn.compact
    def __call__(self, x, _):
      return EncoderLayer(cfg, name='layer')(x, None, False), None

  class Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
      scan = nn.scan(Body, variable_axes={'params': 0}, split_rngs={'params': True,
                                                                     'dropout': True},
                     length=layers)
      return scan(name='layers')(x, None)[0]

  return Unrolled(), Scanned()


def measure(module, x) -> tuple[float, float]:
  """(compile seconds, median step ms) of the gradient of sum(module(x)^2)."""
  import jax
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  params = module.init(rngs, x)['params']

  def loss(p, x, rng):
    return (module.apply({'params': p}, x, rngs={'dropout': rng}) ** 2).sum()
  grad = jax.jit(jax.grad(loss))
  t0 = time.perf_counter()
  compiled = grad.lower(params, x, rngs['dropout']).compile()
  compile_s = time.perf_counter() - t0
  jax.block_until_ready(compiled(params, x, rngs['dropout']))
  times = []
  for _ in range(_STEPS.value):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(params, x, rngs['dropout']))
    times.append(time.perf_counter() - t0)
  return compile_s, 1e3 * statistics.median(times)


def main(argv):
  del argv
  import jax

  from transformer_nmt.config import ModelConfig
  d = _D_MODEL.value
  cfg = ModelConfig(vocab_size=8, num_layers=_LAYERS.value, d_model=d, d_ff=4 * d,
                    num_heads=max(1, d // 64)).validate()
  x = jax.random.normal(jax.random.key(2), (_BATCH.value, _LENGTH.value, d))
  print(f'`python bench/scan_layers.py {shlex.join(sys.argv[1:])}`: {_LAYERS.value} encoder '
        f'layers, d_model {d}, batch {_BATCH.value} x {_LENGTH.value}, forward + backward')
  print('| stack | compile s | step ms (median) |\n| --- | ---: | ---: |')
  for name, module in zip(('unrolled (ours)', 'nn.scan'), stacks(cfg, _LAYERS.value)):
    compile_s, step_ms = measure(module, x)
    print(f'| {name} | {compile_s:.2f} | {step_ms:.1f} |', flush=True)


if __name__ == '__main__':
  sys.path.insert(0, '.')
  app.run(main)

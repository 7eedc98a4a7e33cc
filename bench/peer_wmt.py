"""Our train step against the Flax WMT example's, both compiled for one TPU slice here.

  python bench/peer_wmt.py --peer_dir PATH/flax/examples/wmt --config configs/base.py \
      --topology v5e:4x4 --batch 384 --length 64

The peer is the nearest JAX implementation of the same paper: google/flax `examples/wmt`
(models.py and train.py, read from --peer_dir; nothing is fetched or copied). It is built at
our config's sizes (layers, widths, heads, vocabulary, dropout, bfloat16) with its own loss,
its own AdamW (weight decay 0) and its own pmap-style train step (`lax.pmean` over an axis
named 'batch', run with shard_map over all chips), and compiled with the same global batch.
Prints one markdown table: memory, FLOPs, bytes accessed, collectives and the two step-time
estimates of aot.analyze for both programs.
"""

import importlib.util
import os
import pathlib
import sys
import types

for _name, _value in (('JAX_PLATFORMS', 'cpu'), ('TPU_ACCELERATOR_TYPE', 'v5litepod-4'),
                      ('TPU_SKIP_MDS_QUERY', '1'), ('TPU_WORKER_HOSTNAMES', 'localhost'),
                      ('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')):
  os.environ.setdefault(_name, _value)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/base.py', 'Our config (sizes).')
_PEER = flags.DEFINE_string('peer_dir', None, 'flax/examples/wmt of a google/flax checkout.',
                            required=True)
_TOPOLOGY = flags.DEFINE_string('topology', 'v5e:4x4', 'TPU slice.')
_BATCH = flags.DEFINE_integer('batch', 384, 'Global rows.')
_LENGTH = flags.DEFINE_integer('length', 64, 'Tokens per side of every row.')

# train.py of the example imports its input pipeline, TensorFlow, CLU and its decoder: none is
# needed to build its train step, so they are stood in for by empty modules.
_ABSENT = ('clu', 'clu.metric_writers', 'clu.periodic_actions', 'tensorflow', 'bleu', 'decode',
           'input_pipeline')


def _load(path: pathlib.Path, name: str) -> types.ModuleType:
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def peer_program(config, devices: list, rows: int, length: int):
  """The Flax WMT example's train step at our config's sizes, lowered for `devices`."""
  import functools

  import flax.training.checkpoints  # noqa: F401 -- looks for TensorFlow before the stand-ins exist
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from transformer_nmt import aot
  peer_dir = pathlib.Path(_PEER.value)
  for name in _ABSENT:
    sys.modules.setdefault(name, types.ModuleType(name))
  sys.modules['tensorflow'].data = types.SimpleNamespace(Dataset=object)  # annotations only
  models = _load(peer_dir / 'models.py', 'models')
  train = _load(peer_dir / 'train.py', 'peer_train')
  m = config.model
  if m.num_encoder_layers not in (0, m.num_layers) or m.num_decoder_layers not in (
      0, m.num_layers):
    raise ValueError('the Flax WMT example has one depth for both stacks: leave '
                     'model.num_encoder_layers and model.num_decoder_layers at 0')
  vocab = config.data.vocab_size
  peer_cfg = models.TransformerConfig(
      vocab_size=vocab, output_vocab_size=vocab, share_embeddings=True,
      logits_via_embedding=True, dtype=jnp.dtype(m.dtype), emb_dim=m.d_model,
      num_heads=m.num_heads, num_layers=m.num_layers, qkv_dim=m.d_model, mlp_dim=m.d_ff,
      max_len=max(256, length), dropout_rate=m.residual_dropout,
      attention_dropout_rate=m.attention_dropout, deterministic=False)
  init_cfg = peer_cfg.replace(deterministic=True)
  shape = (1, length)
  params = jax.eval_shape(lambda: models.Transformer(init_cfg).init(
      jax.random.key(0), jnp.ones(shape, jnp.int32), jnp.ones(shape, jnp.int32))['params'])
  lr = train.create_learning_rate_schedule(learning_rate=0.0625,
                                           warmup_steps=config.train.warmup_steps)
  state = jax.eval_shape(lambda p: train.TrainState.create(
      apply_fn=models.Transformer(peer_cfg).apply, params=p,
      tx=optax.adamw(lr, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0), dynamic_scale=None),
      params)
  mesh = Mesh(np.asarray(devices), ('batch',))
  step = functools.partial(train.train_step, config=peer_cfg, learning_rate_fn=lr,
                           label_smoothing=config.train.label_smoothing)
  sharded = jax.shard_map(lambda s, b, r: step(s, b, dropout_rng=r), mesh=mesh,
                          in_specs=(PartitionSpec(), PartitionSpec('batch'), PartitionSpec()),
                          out_specs=(PartitionSpec(), PartitionSpec()), check_vma=False)
  whole, rows_split = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh,
                                                                         PartitionSpec('batch'))
  keys = ('inputs', 'targets', 'inputs_position', 'targets_position', 'inputs_segmentation',
          'targets_segmentation')
  batch = {k: jax.ShapeDtypeStruct((rows, length), np.int32, sharding=rows_split) for k in keys}
  key = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=whole)
  abstract_state = aot.abstract(state, jax.tree_util.tree_map(lambda _: whole, state))
  lowered = jax.jit(sharded, donate_argnums=0).lower(abstract_state, batch, rng)
  count = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
  return aot.Program('train step (Flax WMT example)', lowered, rows * length,
                     f'global batch {rows} x {length}, {m.dtype}', count, 0)


def _row(name: str, r: dict) -> str:
  m, step = r['memory'], r['step']
  collectives = ', '.join(f"{k} {c['count']} / {c['bytes'] / 1e6:,.0f} MB"
                          for k, c in sorted(r['collectives'].items()))
  xla = step.get('xla_estimate', {})
  return (f"| {name} | {r['parameters'] / 1e6:.1f}M | {m['argument'] / 2 ** 30:.2f} | "
          f"{m['temp'] / 2 ** 30:.2f} | {m['total'] / 2 ** 30:.2f} | {r['flops'] / 1e9:,.0f} | "
          f"{r['bytes_accessed'] / 1e9:.2f} | {collectives} | "
          f"{1e3 * step['roofline']['seconds']:.2f} ({100 * step['roofline']['mfu']:.0f}%) | "
          f"{1e3 * xla.get('seconds', float('nan')):.2f} ({100 * xla.get('mfu', 0):.0f}%) |")


def main(argv: list[str]) -> None:
  del argv
  from transformer_nmt import aot
  from transformer_nmt.typed_config import validate_config
  config = _CONFIG.value
  devices, chip = aot.topology_devices(_TOPOLOGY.value)
  rows, length = _BATCH.value, _LENGTH.value
  ours = aot.report(aot.train_program(validate_config(config), devices, rows, length), chip,
                    len(devices))
  peer = aot.report(peer_program(config, devices, rows, length), chip, len(devices))
  print(f'{_TOPOLOGY.value} ({len(devices)} x {chip.name}), global batch {rows} x {length} '
        f'tokens per side, model {config.model.dtype}, per chip:\n')
  print('| program | params | arguments GiB | temporaries GiB | total GiB | GFLOP | '
        'GB accessed | collectives (count / bytes) | roofline ms (MFU) | XLA estimate ms (MFU) |')
  print('| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |')
  print(_row('ours (train.py)', ours))
  print(_row('Flax WMT example', peer))


if __name__ == '__main__':
  app.run(main)

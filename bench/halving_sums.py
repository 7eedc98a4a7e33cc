"""decode.batch_invariant's programs with the model's and the search's sums written as halvings
(model/sums.py, as the engine traces them) against the library's sums (jnp.sum, jax.nn.softmax,
jax.nn.logsumexp, flax's LayerNorm: XLA CPU turns each sum over more than 32 elements into a
reduce-window loop). Two engines with the option on the same loaded model, one traced each
way, alternating, and the default programs (YNNPACK's reductions) beside them; prints the
fastest round of each way, their ratios, and the lines each pair translates differently.

  python bench/halving_sums.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import side_by_side
from absl import app, flags

from transformer_nmt.data.batching import read_lines
from transformer_nmt.inference.engine import Engine
from transformer_nmt.model import sums

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained or imported workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_LINES = flags.DEFINE_integer('lines', 1000, 'First lines of --input to translate.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Alternating rounds (after one to compile).')

_LIBRARY = {'total': jnp.sum, 'maximum': jnp.max, 'softmax': jax.nn.softmax,
            'logsumexp': jax.nn.logsumexp,
            'LayerNorm': functools.partial(nn.LayerNorm, dtype=jnp.float32)}


def main(_):
  halving = Engine.load(_WORKDIR.value)
  halving = Engine(halving.model, dataclasses.replace(halving.decode, batch_invariant=True))
  library = Engine(halving.model, halving.decode)
  default = Engine(halving.model, dataclasses.replace(halving.decode, batch_invariant=False))

  def library_way(lines: list[str]) -> list[str]:
    with side_by_side.patched(sums, _LIBRARY):  # programs traced summing as the libraries do
      return library.translate(lines)
  lines = read_lines(_INPUT.value)[:_LINES.value]
  print(f'beam {halving.decode.beam_size}, {halving.concurrent_batches} decoding threads')
  side_by_side.compare({'library sums (before)': library_way, 'halving sums': halving.translate},
                       lines, _ROUNDS.value)
  side_by_side.compare({'halving sums': halving.translate, 'default programs': default.translate},
                       lines, _ROUNDS.value)


if __name__ == '__main__':
  app.run(main)

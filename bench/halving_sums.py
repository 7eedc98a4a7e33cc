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
from absl import app

from transformer_nmt.inference.engine import Engine
from transformer_nmt.model import sums

_OPTIONS = side_by_side.define_flags(lines=1000, rounds=3)

_LIBRARY = {'total': jnp.sum, 'maximum': jnp.max, 'softmax': jax.nn.softmax,
            'logsumexp': jax.nn.logsumexp,
            'LayerNorm': functools.partial(nn.LayerNorm, dtype=jnp.float32)}


def main(_):
  options = _OPTIONS()
  halving = Engine.load(options.workdir)
  halving = Engine(halving.model, dataclasses.replace(halving.decode, batch_invariant=True))
  library = Engine(halving.model, halving.decode)
  default = Engine(halving.model, dataclasses.replace(halving.decode, batch_invariant=False))

  def library_way(lines: list[str]) -> list[str]:
    with side_by_side.patched(sums, _LIBRARY):  # programs traced summing as the libraries do
      return library.translate(lines)
  lines = options.lines
  print(f'beam {halving.decode.beam_size}, {halving.concurrent_batches} decoding threads')
  side_by_side.compare({'library sums (before)': library_way, 'halving sums': halving.translate},
                       lines, options.rounds)
  side_by_side.compare({'halving sums': halving.translate, 'default programs': default.translate},
                       lines, options.rounds)


if __name__ == '__main__':
  app.run(main)

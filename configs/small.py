"""A CPU-sized Transformer for Multi30k en->de: 2000 float32 steps of configs/multi30k.py.

Kept for existing workdirs and commands (bench/RESULTS.md was measured on it).
"""

import ml_collections

from configs import multi30k


def get_config() -> ml_collections.ConfigDict:
  c = multi30k.get_config('en-de')
  c.model.update(dtype='float32')
  c.train.update(num_steps=2000, eval_every=250)
  return c

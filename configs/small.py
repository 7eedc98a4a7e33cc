"""A CPU-sized Transformer for Multi30k en->de: configs/multi30k.py in that direction.

Kept under this name for existing workdirs and commands; see configs/multi30k.py.
"""

import ml_collections

from configs import multi30k


def get_config() -> ml_collections.ConfigDict:
  return multi30k.get_config('en-de')

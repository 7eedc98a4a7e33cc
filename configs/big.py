"""Transformer-big (paper Table 3, 'big'): N 6, d_model 1024, d_ff 4096, h 16, P_drop 0.3.

The paper trained it for 300k steps (3.5 days on 8 P100s); en-fr used P_drop 0.1.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  c = base.get_config()
  c.model.update(d_model=1024, d_ff=4096, num_heads=16, residual_dropout=0.3,
                 embedding_dropout=0.3)
  c.train.update(num_steps=300_000)
  return c

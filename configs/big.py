"""Transformer-big on WMT14 en->de (paper Table 3 'big'): N 6, d_model 1024, d_ff 4096, h 16,
P_drop 0.3, 300k steps (3.5 days on 8 P100s), the last 20 checkpoints averaged. Paper: 28.4
BLEU (tokenized, compound splitting). en-fr used P_drop 0.1.

  python train.py --config configs/big.py --workdir runs/big
  python decode.py --workdir runs/big --average_last 20 --input newstest2014.en ...
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  c = base.get_config()
  c.model.update(d_model=1024, d_ff=4096, num_heads=16, residual_dropout=0.3,
                 embedding_dropout=0.3)
  c.train.update(num_steps=300_000, keep_checkpoints=20)
  return c

"""Multi30k trained in at most one hour on 2 CPU cores: configs/multi30k.py with 3400 steps and
an exponential moving average of the weights.

    python recipe.py --config configs/multi30k_1h.py:en-de --workdir runs/m30k_1h_en_de

Takes the direction argument of configs/multi30k.py (default en-de). On a 2-core CPU with
bfloat16 matrix units (AMX) a step takes about 0.7 s, so 3400 steps with an evaluation every
500 trained in 43 minutes (docs/RESULTS.md, where the sweep behind these values is recorded);
recipe.py's selection and test decoding (about 4 minutes) come after the training hour.
"""

import ml_collections

from configs import multi30k


def get_config(direction: str = 'en-de') -> ml_collections.ConfigDict:
  c = multi30k.get_config(direction)
  # The 2000-step runs were still improving (docs/plots/m30k_en_de/curves.png); the EMA is one
  # more candidate for recipe.py's choice on validation (decay 0.999: about the last 1000 steps).
  c.train.update(num_steps=3400, warmup_steps=800, eval_every=500, checkpoint_every=250,
                 ema_decay=0.999)
  return c

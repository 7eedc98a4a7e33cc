"""Multi30k in about an hour on 2 CPU cores: configs/multi30k.py in float32 with 1500 steps.

    python recipe.py --config configs/multi30k_1h.py --workdir runs/m30k_1h

Takes the direction argument of configs/multi30k.py (default en-de). Training takes about
45 minutes on 2 cores, which leaves the rest of the hour for recipe.py's selection on the
validation set and beam search on the test sets.
"""

import ml_collections

from configs import multi30k


def get_config(direction: str = 'en-de') -> ml_collections.ConfigDict:
  c = multi30k.get_config(direction)
  c.model.update(dtype='float32')
  c.train.update(num_steps=1500, warmup_steps=600, eval_every=500, checkpoint_every=250)
  c.eval.update(bleu_sentences=300)
  return c

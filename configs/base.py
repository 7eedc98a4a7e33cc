"""Transformer-base (paper Table 3, 'base'): N 6, d_model 512, d_ff 2048, h 8, P_drop 0.1.

Train on your own files:
  python train.py --config configs/base.py --workdir runs/base \
    --config.data.train_src=train.en --config.data.train_tgt=train.de \
    --config.data.valid_src=valid.en --config.data.valid_tgt=valid.de
"""

import ml_collections

from transformer_nmt.defaults import default_config


def get_config() -> ml_collections.ConfigDict:
  c = default_config()  # its model and train sections are the paper's base values
  c.model.update(num_layers=6, d_model=512, d_ff=2048, num_heads=8, residual_dropout=0.1,
                 embedding_dropout=0.1)
  c.train.update(num_steps=100_000, warmup_steps=4000, label_smoothing=0.1)
  c.data.update(vocab_size=37000, tokens_per_batch=4096)
  c.eval.update(max_extra_len=50)
  return c

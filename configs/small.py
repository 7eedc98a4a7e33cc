"""A CPU-sized Transformer for Multi30k en->de (about 29k short caption pairs).

Reads ../shared/data/multi30k relative to the repository root; override the paths for other
data. Pre-LN with t2t's extra dropouts trains more stably at this size (named deviations).
"""

import ml_collections

from configs import base

MULTI30K = '../shared/data/multi30k'


def get_config() -> ml_collections.ConfigDict:
  c = base.get_config()
  c.model.update(num_layers=3, d_model=256, d_ff=1024, num_heads=4, residual_dropout=0.1,
                 embedding_dropout=0.1, attention_dropout=0.1, relu_dropout=0.1,
                 norm_position='pre')
  c.data.update(train_src=f'{MULTI30K}/train.en', train_tgt=f'{MULTI30K}/train.de',
                valid_src=f'{MULTI30K}/valid.en', valid_tgt=f'{MULTI30K}/valid.de',
                test_src=f'{MULTI30K}/test2016.en', test_tgt=f'{MULTI30K}/test2016.de',
                vocab_size=8000, max_len=64, tokens_per_batch=3072)
  # About 7 epochs, roughly an hour on 2 CPU cores (~3k tokens/s).
  c.train.update(num_steps=2000, warmup_steps=800, learning_rate_multiplier=1.0,
                 log_every=50, eval_every=250, checkpoint_every=250)
  c.eval.update(bleu_sentences=300)
  return c

"""The embedded default: English number words and dates into German, generated offline.

`python train.py --config configs/demo.py --workdir demo_run` generates the corpus into the
workdir, trains a small Transformer for a few CPU minutes and reports BLEU on held-out pairs.
"""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  c = base.get_config()
  c.model.update(num_layers=2, d_model=128, d_ff=512, num_heads=4, residual_dropout=0.1,
                 embedding_dropout=0.1, norm_position='pre')
  c.data.update(source='demo', demo_sizes=(40000, 300, 500), vocab_size=1000,
                spm_model_type='unigram', max_len=64, tokens_per_batch=2048)
  c.train.update(num_steps=1500, warmup_steps=400, learning_rate_multiplier=2.0,
                 global_batch_tokens=0, log_every=100, eval_every=500, checkpoint_every=500)
  c.eval.update(bleu_sentences=300)
  return c

"""A minute model for tests: trains in seconds on the demo corpus."""

import ml_collections

from configs import base


def get_config() -> ml_collections.ConfigDict:
  c = base.get_config()
  c.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2)
  c.data.update(source='demo', demo_sizes=(400, 20, 20), vocab_size=200,
                spm_model_type='unigram', max_len=48, tokens_per_batch=512,
                bucket_boundaries=(24, 48))
  c.train.update(num_steps=20, warmup_steps=5, global_batch_tokens=0, log_every=5,
                 eval_every=10, checkpoint_every=10, keep_checkpoints=2)
  c.eval.update(bleu_sentences=10)
  c.decode.update(max_extra_len=10, tokens_per_batch=512)
  return c

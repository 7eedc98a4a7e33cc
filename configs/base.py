"""Transformer-base on WMT14 en->de, the paper's recipe (Table 3 'base', §5):
N 6, d_model 512, d_ff 2048, h 8, P_drop 0.1, eps_ls 0.1, 100k steps, warmup 4000, batches of
about 25k source + 25k target tokens, a shared ~37k BPE vocabulary, newstest2013 to validate
and newstest2014 to test. Paper: 27.3 BLEU (tokenized, compound splitting), 12 hours on 8 P100s.

  tfds build wmt14_translate/de-en            # once; needs tensorflow-cpu for preparing only
  python train.py --config configs/base.py --workdir runs/base

The global batch (train.global_batch_tokens) is reached by gradient accumulation: 6 batches
of 4096 tokens per side on one device; on 8 devices set --config.data.tokens_per_batch=25000.
Reverse the direction with --config.data.src_lang=de --config.data.tgt_lang=en; for WMT17 use
--config.data.tfds_name=wmt17_translate/de-en. On your own files:
--config.data.source=text --config.data.train_src=... (see README).
"""

import ml_collections

from transformer_nmt.config import default_config


def get_config() -> ml_collections.ConfigDict:
  c = default_config()  # its model and train sections are the paper's base values
  c.model.update(num_layers=6, d_model=512, d_ff=2048, num_heads=8, residual_dropout=0.1,
                 embedding_dropout=0.1)
  c.train.update(num_steps=100_000, warmup_steps=4000, label_smoothing=0.1,
                 global_batch_tokens=25_000, checkpoint_every=2000, keep_checkpoints=5)
  c.data.update(source='tfds', tfds_name='wmt14_translate/de-en', src_lang='en', tgt_lang='de',
                vocab_size=37000, tokens_per_batch=4096)
  c.decode.update(max_extra_len=50)  # §6.1
  return c

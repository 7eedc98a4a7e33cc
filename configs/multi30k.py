"""Multi30k (about 29k short caption pairs) in either direction, sized for 2 CPU cores.

    python train.py --config configs/multi30k.py:de-en --workdir runs/m30k_de_en

The argument after the colon is the direction, SOURCE-TARGET over en, de, fr, cs (default
en-de). Data is read from ../shared/data/multi30k relative to the repository root; override
data.* for another location. Validation is valid.*, the test set test2016.* (recipe.py also
decodes test2017). Pre-LN with tensor2tensor's extra dropouts trains more stably at this size
(named deviations, see README). Computes in bfloat16 with float32 accumulation and float32
master weights, faster than float32 on CPUs with AMX (bench/RESULTS.md, 'Optimisations
tried').
"""

import ml_collections

from configs import base

MULTI30K = '../shared/data/multi30k'
LANGUAGES = ('en', 'de', 'fr', 'cs')


def parse_direction(direction: str) -> tuple[str, str]:
  src, _, tgt = direction.partition('-')
  if src not in LANGUAGES or tgt not in LANGUAGES or src == tgt:
    raise ValueError(f'direction {direction!r}: expected SOURCE-TARGET over {LANGUAGES}, '
                     'e.g. en-de')
  return src, tgt


def get_config(direction: str = 'en-de') -> ml_collections.ConfigDict:
  src, tgt = parse_direction(direction or 'en-de')
  c = base.get_config()
  c.model.update(num_layers=3, d_model=256, d_ff=1024, num_heads=4, residual_dropout=0.1,
                 embedding_dropout=0.1, attention_dropout=0.1, relu_dropout=0.1,
                 norm_position='pre', dtype='bfloat16')
  c.data.update(source='text', train_src=f'{MULTI30K}/train.{src}',
                train_tgt=f'{MULTI30K}/train.{tgt}',
                valid_src=f'{MULTI30K}/valid.{src}', valid_tgt=f'{MULTI30K}/valid.{tgt}',
                test_src=f'{MULTI30K}/test2016.{src}', test_tgt=f'{MULTI30K}/test2016.{tgt}',
                extra_test_src=(f'{MULTI30K}/test2017.{src}',),
                extra_test_tgt=(f'{MULTI30K}/test2017.{tgt}',),
                vocab_size=8000, max_len=64, tokens_per_batch=3072)
  # About 7 epochs. Checkpoints every 250 steps: the last 5 span the final 1250 steps, which
  # is what --average_last and recipe.py's checkpoint selection draw on.
  c.train.update(num_steps=2000, warmup_steps=800, learning_rate_multiplier=1.0,
                 global_batch_tokens=0, keep_checkpoints=5, log_every=50, eval_every=500,
                 checkpoint_every=250)
  c.eval.update(bleu_sentences=300)
  return c

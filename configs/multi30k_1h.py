"""Multi30k trained in under one hour on 2 CPU cores: configs/multi30k.py with 4 layers
instead of 3, residual and embedding dropout 0.2 instead of 0.1, 3400 steps and an exponential
moving average of the weights.

    python recipe.py --config configs/multi30k_1h.py:en-de --workdir runs/m30k_1h_en_de

Takes the direction argument of configs/multi30k.py (default en-de); de-en also ends with a
linear cooldown of the learning rate over its last 1000 steps (train.cooldown_steps), has
residual and embedding dropout 0.3, spends the hour on 4800 steps of batches of 2048
tokens instead of 3400 of 3072, decays the weights (train.weight_decay 0.2) and decodes with
beam 8; the other directions have finer length buckets
(data.bucket_boundaries, 15 lengths instead of 9).
The step counts are what trains, evaluations included, within the hour on the 2-core machines
of docs/RESULTS.md, which records each run's train wall on a CPU with bfloat16 matrix units
(AMX) and on an AMD EPYC without them, and the sweeps behind these values, chosen on
validation BLEU. recipe.py's selection and test decoding come after the training hour. The
16-bit dropout draws that are now the default (model.dropout_bits) are what keep the hour on
the machine without AMX; de-en's current settings and en-de's finer buckets were timed there
only, not yet on the AMX machine.
"""

import ml_collections

from configs import multi30k


def get_config(direction: str = 'en-de') -> ml_collections.ConfigDict:
  c = multi30k.get_config(direction)
  # The sweep's best on en-de validation (docs/RESULTS.md): one more layer, which still fits
  # the hour, with more dropout than the paper's P_drop 0.1 (§5.4).
  c.model.update(num_layers=4, residual_dropout=0.2, embedding_dropout=0.2)
  # The 2000-step runs were still improving (docs/plots/m30k_en_de/curves.png); the EMA is one
  # more candidate for recipe.py's choice on validation. With the warm-up (train.ema_warmup)
  # the decay is (1 + step) / (10 + step) throughout these 3400 steps, not 0.999: 0.9974 at
  # the end, an average over about the last 380 steps. A run with 0.9995 logged the same
  # figures at every step until it was stopped (docs/RESULTS.md).
  c.train.update(num_steps=3400, warmup_steps=800, eval_every=500, checkpoint_every=250,
                 ema_decay=0.999)
  if multi30k.parse_direction(direction or 'en-de') == ('de', 'en'):
    # Chosen on de-en validation (docs/RESULTS.md, as the choices below): eq. 3 decayed
    # linearly to 0 over the last 1000 steps; tried en-de too, where it did not gain.
    c.train.cooldown_steps = 1000
    # Chosen on de-en validation after it: residual and embedding dropout 0.3, for a run
    # whose validation NLL had stopped falling while its training NLL still fell. Tried en-de
    # too, where it did not gain.
    c.model.update(residual_dropout=0.3, embedding_dropout=0.3)
    # Chosen on de-en validation on the AMD machine: the same hour spent on 5000 updates of
    # 2048 padded tokens per side instead of 3400 of 3072, since a smaller step takes less
    # time (bench/train.py). Tried en-de too, where beam search did not gain. The steps are
    # now 4800 (below); the moving average's decay reaches 0.9981 by then.
    c.data.tokens_per_batch = 2048
    # Chosen on de-en validation: beam 8, on which recipe.py's minimum Bayes risk choice by
    # chrF gained (more than beam 8 without it or beam 4 with it). Only the search after
    # training changes; test2016 BLEU stayed the same.
    c.decode.beam_size = 8
    # Chosen on de-en validation over 0.1 and none: decoupled weight decay 0.2 on the
    # matrices (AdamW, Loshchilov and Hutter 2019; not in the paper), which lowered validation
    # NLL at every evaluation, more with each larger value, at no measurable cost per step.
    c.train.weight_decay = 0.2
    # Chosen for the hour, then on validation (2026-11-27, one AMD EPYC instance, each run
    # uninterrupted): 5000 steps trained over the hour there; of 4800 and 4600, which fit it,
    # 4800 scored higher. The cooldown now starts at step 3800. recipe.py's choice was beam
    # 8, α 1.25.
    c.train.num_steps = 4800
  else:
    # Chosen on en-de validation on the AMD machine (docs/RESULTS.md): length buckets every 2
    # tokens up to 20 and about 15% apart above (multiples of 2, not 4, and growth 1.15
    # instead of 1.25), so that less of each padded batch is padding: each update carries
    # more real tokens, and the 3400 steps still fit the hour. On de-en they did not gain on
    # validation: not adopted there.
    c.data.bucket_boundaries = (8, 10, 12, 14, 16, 18, 20, 24, 28, 32, 36, 42, 48, 56, 64)
  return c

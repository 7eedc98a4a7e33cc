"""The full experiment config with documented defaults; every file in configs/ starts here.

The model section is transformer-base (paper Table 3); `check_sections` rejects any key
that is not defined here, so typos in configs and overrides fail loudly.
"""

from __future__ import annotations

import ml_collections


def default_config() -> ml_collections.ConfigDict:
  """Transformer-base hyperparameters with text-file data; see README for each option."""
  c = ml_collections.ConfigDict()
  c.model = dict(
      num_layers=6, d_model=512, d_ff=2048, num_heads=8,
      residual_dropout=0.1, embedding_dropout=0.1,  # P_drop (§5.4)
      attention_dropout=0.0, relu_dropout=0.0,  # tensor2tensor's extra dropouts (0 = paper)
      norm_position='post',  # 'post' (paper) or 'pre' (tensor2tensor)
      layer_norm_epsilon=1e-6,
      positional_encoding='interleaved',  # paper §3.5; 'concat' = tensor2tensor
      share_embeddings=True,  # shared source/target embedding, joint vocabulary
      tie_output=True,  # target embedding = pre-softmax projection (§3.4)
      dtype='float32',  # compute dtype: 'float32' or 'bfloat16' (params stay float32)
      # bfloat16 mode: the output projection writes float32 logits (True) or bfloat16 ones
      # (False: half the bytes of the largest array of a step; the loss still sums in float32)
      float32_logits=True,
      remat=False,  # recompute layer activations in the backward pass: less memory, more time
  )
  c.data = dict(
      source='text',  # 'text': the files below; 'tfds': tensorflow-datasets; 'demo': built-in
      train_src='', train_tgt='', valid_src='', valid_tgt='', test_src='', test_tgt='',
      extra_test_src=(), extra_test_tgt=(),  # more test sets for recipe.py (parallel lists)
      demo_sizes=(40000, 500, 500),  # train/valid/test pairs for source='demo'
      # source='tfds': the builder, languages (direction) and train/valid/test splits. For
      # wmt14_translate/de-en the splits are train, validation = newstest2013 and
      # test = newstest2014 (the paper's); '' as test split = none.
      tfds_name='wmt14_translate/de-en', src_lang='en', tgt_lang='de',
      tfds_splits=('train', 'validation', 'test'), tfds_data_dir='',
      max_train_examples=0,  # > 0: only the first N training pairs (tfds; quick runs)
      spm_model='',  # existing SentencePiece model; '' trains one into the workdir
      joint_vocab=True,  # one SentencePiece model on source+target text
      vocab_size=37000,  # paper: ~37000 shared BPE tokens for en-de
      spm_model_type='bpe',  # 'bpe' (paper) or 'unigram'
      spm_max_sentences=1_000_000,  # sample size for training SentencePiece
      max_len=256,  # longest pair kept, in subword tokens incl. EOS (longer ones are counted)
      tokens_per_batch=4096,  # padded tokens per side per batch (paper: ~25k, issue 4)
      bucket_boundaries=(),  # () = geometric buckets up to max_len
      pack_length=0,  # > 0: pack pairs into rows of this many tokens per side, not buckets
  )
  c.train = dict(
      num_steps=100_000,  # paper base: 100k steps
      warmup_steps=4000,  # eq. 3
      learning_rate_multiplier=1.0,  # scales eq. 3 (tensor2tensor's learning_rate)
      adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9,  # §5.3
      clip_grad_norm=0.0,  # 0 = off (paper)
      label_smoothing=0.1,  # eps_ls (§5.4)
      # Tokens per side per update, reached by accumulating gradients over
      # round(global_batch_tokens / data.tokens_per_batch) batches; 0 = one batch per update.
      # The paper's ~25k per side is e.g. 8 GPUs x 3125, or 1 device x 4096 x 6.
      global_batch_tokens=0,
      shard_params=False,  # True: split params and Adam state over the devices (FSDP)
      fsdp_devices=0,  # with shard_params: devices on the mesh's fsdp axis (0 = all)
      seed=0,
      log_every=100,
      eval_every=1000,
      checkpoint_every=1000,
      keep_checkpoints=5,  # the latest K checkpoints (workdir/checkpoints)
      keep_best=True,  # also keep the one with the best eval_bleu (workdir/best)
  )
  c.eval = dict(
      bleu_sentences=500,  # validation sentences decoded for BLEU at each eval (0 = all)
      max_extra_len=50,  # output length limit = input length + this (§6.1)
      tokens_per_batch=4096,
  )
  return c

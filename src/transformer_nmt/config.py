"""The one source of the configuration: every section's options, defaults, types and checks.

An experiment config (`configs/*.py`, an ml_collections ConfigDict so that command lines can
override it) starts from `default_config()`, which is built from the frozen dataclasses below:
`model` (ModelConfig, a static jit argument once the tokenizer fixes the vocabulary), `data`,
`train`, `eval` and `decode` (decoding/settings.py's DecodeConfig, beside the search it
sets: the defaults of decode.py, recipe.py and the library's translators). A program turns
its config into these typed sections once (`typed_config.validate_config`); the library takes
them, never the ConfigDict.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.errors import check, check_positive, is_int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Transformer hyperparameters (paper §3, Table 3).

  Deviations from the paper are named options: `norm_position='pre'` and
  `positional_encoding='concat'` are the tensor2tensor variants, and the
  attention/ReLU dropouts default to 0 as in the paper (tensor2tensor uses 0.1). The options
  after `remat` describe models imported from Marian (OPUS-MT, import_marian.py); each
  default is the paper's (docs/MODEL_OPTIONS.md).
  """

  vocab_size: int = 0  # filled from the tokenizer; target vocab when not shared
  src_vocab_size: int = 0  # only used when share_embeddings is False
  num_layers: int = 6  # N, for both encoder and decoder
  # Layers of one stack when it differs from num_layers (0 = num_layers, the paper). Kasai
  # et al. (2021) keep quality with a deep encoder and a shallow decoder, and search faster:
  # beam search runs the decoder once per output token, the encoder once per input.
  num_encoder_layers: int = 0
  num_decoder_layers: int = 0
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8
  residual_dropout: float = 0.1  # P_drop on each sublayer output (§5.4)
  embedding_dropout: float = 0.1  # P_drop on embeddings + positions (§5.4)
  attention_dropout: float = 0.0  # on attention probabilities (tensor2tensor)
  relu_dropout: float = 0.0  # after the FFN's ReLU (tensor2tensor)
  # Word dropout (Sennrich et al. 2016; Marian's --dropout-src/--dropout-trg draw one per
  # position for the whole batch, these one per token): in training each token's whole word
  # embedding is zeroed with this probability and the kept ones divided by 1 - it; positions
  # stay. The model learns not to lean on any one subword. 0 in the paper.
  source_word_dropout: float = 0.0
  target_word_dropout: float = 0.0
  # Random bits per dropout draw: 16 (two draws per threefry word; keep probabilities in
  # steps of 2^-16) or 32 (jax.random.bernoulli). model/dropout.py.
  dropout_bits: int = 16
  norm_position: str = 'post'  # 'post': paper LayerNorm(x + Sublayer(x)); 'pre': t2t
  layer_norm_epsilon: float = 1e-6
  # 'interleaved': the paper's sin/cos interleaving; 'concat': tensor2tensor's [sin | cos]
  # with its own spacing of the rates; 'halves': the paper's rates as [sin | cos] (Marian).
  positional_encoding: str = 'interleaved'
  share_embeddings: bool = True  # one source/target embedding over a joint vocabulary
  tie_output: bool = True  # target embedding = pre-softmax projection (§3.4)
  dtype: str = 'float32'  # compute dtype; trained parameters stay float32
  float32_logits: bool = True  # bfloat16 mode: False rounds the logits to bfloat16 (memory)
  remat: bool = False  # recompute each layer's activations in the backward pass (memory)
  # The FFN's nonlinearity: 'relu' (eq. 2), 'swish' (x * sigmoid(x), Marian's and OPUS-MT's)
  # or 'gelu' (the exact, erf-based one).
  activation: str = 'relu'
  # Biases on the attention projections W^Q, W^K, W^V, W^O (Marian has them; the paper's
  # equations and tensor2tensor do not).
  attention_bias: bool = False
  # Embeddings multiplied by sqrt(d_model) (§3.4); False: used as they are.
  scale_embeddings: bool = True
  # A learned [V] bias added to the output logits (Marian's final_logits_bias); the paper's
  # pre-softmax projection is the tied embedding alone.
  final_logits_bias: bool = False

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def encoder_depth(self) -> int:
    return self.num_encoder_layers or self.num_layers

  @property
  def decoder_depth(self) -> int:
    return self.num_decoder_layers or self.num_layers

  @property
  def src_vocab(self) -> int:
    return self.vocab_size if self.share_embeddings else self.src_vocab_size

  def validate(self) -> ModelConfig:
    """Raises ConfigError naming the option when a value is out of range."""
    check(self.d_model > 0 and self.d_ff > 0 and self.num_layers > 0 and self.num_heads > 0,
          'model.d_model, model.d_ff, model.num_layers and model.num_heads must be positive')
    for name in ('num_encoder_layers', 'num_decoder_layers'):
      value = getattr(self, name)
      check(value >= 0, f'model.{name}={value} must be 0 (model.num_layers) or positive')
    check(self.d_model % self.num_heads == 0,
          f'model.d_model={self.d_model} is not divisible by model.num_heads={self.num_heads}')
    for name in ('residual_dropout', 'embedding_dropout', 'attention_dropout', 'relu_dropout',
                 'source_word_dropout', 'target_word_dropout'):
      rate = getattr(self, name)
      check(0.0 <= rate < 1.0, f'model.{name}={rate} must be in [0, 1)')
    check(self.dropout_bits in (16, 32),
          f'model.dropout_bits={self.dropout_bits} must be 16 or 32')
    check(self.norm_position in ('post', 'pre'),
          f"model.norm_position={self.norm_position!r} must be 'post' or 'pre'")
    check(self.positional_encoding in POSITIONAL_ENCODINGS,
          f'model.positional_encoding={self.positional_encoding!r} must be one of '
          f'{list(POSITIONAL_ENCODINGS)}')
    check(self.activation in ACTIVATIONS,
          f'model.activation={self.activation!r} must be one of {list(ACTIVATIONS)}')
    check(self.dtype in ('float32', 'bfloat16'),
          f"model.dtype={self.dtype!r} must be 'float32' or 'bfloat16'")
    check(self.layer_norm_epsilon > 0, 'model.layer_norm_epsilon must be positive')
    check(self.d_model % 2 == 0, 'model.d_model must be even for sinusoidal positions')
    return self


POSITIONAL_ENCODINGS = ('interleaved', 'concat', 'halves')
ACTIVATIONS = ('relu', 'swish', 'gelu')  # model.activation (model/layers.py)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the parallel text comes from, its subword vocabulary and its batches."""

  source: str = 'text'  # 'text': the files below; 'tfds': tensorflow-datasets; 'demo': built-in
  train_src: str = ''
  train_tgt: str = ''
  # More training pairs (parallel lists of files; source='text'), appended to train_*: e.g.
  # other source languages with the same target (many-to-one). SentencePiece trains on all.
  extra_train_src: tuple = ()
  extra_train_tgt: tuple = ()
  valid_src: str = ''
  valid_tgt: str = ''
  test_src: str = ''
  test_tgt: str = ''
  extra_test_src: tuple = ()  # more test sets for recipe.py (parallel lists)
  extra_test_tgt: tuple = ()
  demo_sizes: tuple = (40000, 500, 500)  # train/valid/test pairs for source='demo'
  # source='tfds': the builder, languages (direction) and train/valid/test splits. For
  # wmt14_translate/de-en the splits are train, validation = newstest2013 and
  # test = newstest2014 (the paper's); '' as test split = none.
  tfds_name: str = 'wmt14_translate/de-en'
  src_lang: str = 'en'
  tgt_lang: str = 'de'
  tfds_splits: tuple = ('train', 'validation', 'test')
  tfds_data_dir: str = ''
  max_train_examples: int = 0  # > 0: only the first N training pairs (tfds; quick runs)
  spm_model: str = ''  # existing SentencePiece model; '' trains one into the workdir
  joint_vocab: bool = True  # one SentencePiece model on source+target text
  vocab_size: int = 37000  # paper: ~37000 shared BPE tokens for en-de
  spm_model_type: str = 'bpe'  # 'bpe' (paper) or 'unigram'
  spm_max_sentences: int = 1_000_000  # sample size for training SentencePiece
  # Subword regularisation of the training pairs (Kudo 2018; BPE-dropout for bpe models): each
  # epoch segments them anew by SentencePiece sampling, seeded by train.seed and the epoch.
  # spm_alpha: unigram smoothing / BPE dropout probability (0 = off, the paper); spm_nbest:
  # sample among the n best segmentations (-1 = all; unigram models only).
  spm_alpha: float = 0.0
  spm_nbest: int = -1
  max_len: int = 256  # longest pair kept, in subword tokens incl. EOS (longer ones are counted)
  tokens_per_batch: int = 4096  # padded tokens per side per batch (paper: ~25k per update)
  bucket_boundaries: tuple = ()  # () = geometric buckets up to max_len
  pack_length: int = 0  # > 0: pack pairs into rows of this many tokens per side, not buckets
  # Tokenise once (data/cache.py): the encoded training split is stored as memory-mapped id
  # arrays in cache_dir ('' = the workdir's data_cache/; a directory shared by runs on the
  # same files works too), keyed by the tokenizers and the training files' path, size and
  # modification time; later starts map it instead of encoding the text again, which at
  # WMT14's size is a long wait in every start and process. False = encode at every start.
  # With source='tfds' the key is the dataset, its version and files, and each process stores
  # its own share.
  cache: bool = True
  cache_dir: str = ''
  # Training batches built ahead of the step by a background thread (data/prefetch.py); 0 =
  # built on the loop's thread. The log's data_wait is the share of time the loop waited.
  prefetch: int = 4

  def validate(self) -> DataConfig:
    check_positive('data', self, 'tokens_per_batch', 'max_len', 'vocab_size')
    check(self.source in ('text', 'tfds', 'demo'),
          f"data.source={self.source!r} must be 'text', 'tfds' or 'demo'")
    for extra in ('extra_train', 'extra_test'):
      srcs, tgts = getattr(self, f'{extra}_src'), getattr(self, f'{extra}_tgt')
      check(len(srcs) == len(tgts), f'data.{extra}_src and data.{extra}_tgt pair up one to '
            f'one, but list {len(srcs)} and {len(tgts)} files')
      check(all(srcs) and all(tgts),
            f'data.{extra}_src and data.{extra}_tgt list an empty file name')
    check(self.source == 'text' or not self.extra_train_src,
          f"data.extra_train_src needs data.source='text' (it is {self.source!r})")
    check(self.prefetch >= 0, f'data.prefetch={self.prefetch} must be 0 (no background '
          'thread) or the number of batches built ahead')
    check(0.0 <= self.spm_alpha <= 1.0, f'data.spm_alpha={self.spm_alpha} must be in [0, 1] '
          '(0 = no subword sampling)')
    check(self.spm_nbest == -1 or self.spm_nbest >= 1, f'data.spm_nbest={self.spm_nbest} must '
          'be -1 (all segmentations) or positive')
    check(len(self.demo_sizes) == 3 and all(is_int(n) and n >= 0 for n in self.demo_sizes)
          and self.demo_sizes[0] > 0, f'data.demo_sizes={self.demo_sizes} must be three '
          'counts of demo pairs (train, valid, test): train at least 1, the others 0 or more')
    check(not self.pack_length or self.pack_length >= self.max_len,
          f'data.pack_length={self.pack_length} must be 0 (no packing) or at least '
          f'data.max_len={self.max_len}, so that every pair fits in a row')
    return self


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The optimisation (paper §5.3, §5.4) and the loop's rhythm."""

  num_steps: int = 100_000  # paper base: 100k steps
  warmup_steps: int = 4000  # eq. 3
  learning_rate_multiplier: float = 1.0  # scales eq. 3 (tensor2tensor's learning_rate)
  # Eq. 3 times a linear decay to 0 over the last N of num_steps (0 = off, the paper): a
  # short run ends annealed rather than at a rate still near its peak.
  cooldown_steps: int = 0
  adam_b1: float = 0.9  # §5.3
  adam_b2: float = 0.98
  adam_eps: float = 1e-9
  clip_grad_norm: float = 0.0  # 0 = off (paper)
  # Decoupled weight decay (AdamW, Loshchilov and Hutter 2019; fairseq's --weight-decay with
  # its adam optimizer): every update also subtracts learning rate x weight_decay x the weight
  # from each matrix (fairseq also from biases and LayerNorm parameters). 0 = off (paper).
  weight_decay: float = 0.0
  label_smoothing: float = 0.1  # eps_ls (§5.4)
  # Tokens per side per update, reached by accumulating gradients over
  # round(global_batch_tokens / data.tokens_per_batch) batches; 0 = one batch per update.
  # The paper's ~25k per side is e.g. 8 GPUs x 3125, or 1 device x 4096 x 6.
  global_batch_tokens: int = 0
  shard_params: bool = False  # True: split params and Adam state over the devices (FSDP)
  fsdp_devices: int = 0  # with shard_params: devices on the mesh's fsdp axis (0 = all)
  seed: int = 0
  log_every: int = 100
  eval_every: int = 1000
  checkpoint_every: int = 1000
  keep_checkpoints: int = 5  # the latest K checkpoints (workdir checkpoints/)
  keep_best: bool = True  # also keep the one with the best eval_bleu (workdir best/)
  # Exponential moving average of the weights (Polyak averaging; fairseq's EMA, Marian's
  # exponential smoothing), used by evaluation, best/ and decode.py; 0 = off (the paper).
  ema_decay: float = 0.0
  # Cap the decay at (1 + step) / (10 + step) (TensorFlow's ExponentialMovingAverage with
  # num_updates), so that early weights fade fast. The cap stays below ema_decay until step
  # (10 d - 1) / (1 - d): 8990 for 0.999, so a shorter run averages over about the last
  # step / 9 steps whatever ema_decay says (0.9974 at step 3400). False: ema_decay throughout.
  ema_warmup: bool = True
  # Stop after this many evaluations in a row without a better eval_bleu (0 = never; the
  # paper trains a fixed number of steps).
  patience: int = 0
  # (first step, number of steps): a jax.profiler trace of those steps in WORKDIR/profile
  # (process 0), for TensorBoard's profile plugin; () = none.
  profile_steps: tuple = ()
  # A workdir of an earlier run: a new run starts from the weights of its latest checkpoint
  # (their moving average when it kept one) with a fresh optimizer, step and data order, e.g.
  # to fine-tune (training/init_from.py). Its model shapes and SentencePiece model (given as
  # data.spm_model) must be this run's. '' = fresh weights (the paper).
  init_from: str = ''

  def validate(self) -> TrainConfig:
    check_positive('train', self, 'num_steps', 'warmup_steps', 'log_every', 'eval_every',
                   'checkpoint_every', 'keep_checkpoints', 'adam_eps', 'learning_rate_multiplier')
    for name in ('label_smoothing', 'adam_b1', 'adam_b2'):
      value = getattr(self, name)
      check(0.0 <= value < 1.0, f'train.{name}={value} must be in [0, 1)')
    check(self.clip_grad_norm >= 0, f'train.clip_grad_norm={self.clip_grad_norm} must be 0 '
          '(off) or positive')
    check(self.weight_decay >= 0, f'train.weight_decay={self.weight_decay} must be 0 (off) or '
          'positive')
    check(self.global_batch_tokens >= 0, f'train.global_batch_tokens={self.global_batch_tokens}'
          ' must be 0 (one batch of data.tokens_per_batch per update) or positive')
    check(self.fsdp_devices >= 0, f'train.fsdp_devices={self.fsdp_devices} must be 0 (all '
          'devices) or positive')
    check(0 <= self.cooldown_steps <= self.num_steps,
          f'train.cooldown_steps={self.cooldown_steps} must be 0 (off) or at most '
          f'train.num_steps={self.num_steps}')
    check(self.patience >= 0, f'train.patience={self.patience} must be 0 (off) or positive')
    check(0.0 <= self.ema_decay < 1.0, f'train.ema_decay={self.ema_decay} must be in [0, 1) '
           '(0 = off)')
    window = tuple(self.profile_steps)
    check(not window or (len(window) == 2 and all(isinstance(x, int) and x >= 1 for x in window)
                          and window[0] + window[1] - 1 <= self.num_steps),
           f'train.profile_steps={window} must be () or (first step, number of steps) with '
           f'positive integers ending by train.num_steps={self.num_steps}')
    return self


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Validation during training: loss on the whole set, greedy BLEU on a sample (decoded with
  the `decode` section's length limit and batch size)."""

  bleu_sentences: int = 500  # validation sentences decoded for BLEU at each eval (0 = all)

  def validate(self) -> EvalConfig:
    check(self.bleu_sentences >= 0, f'eval.bleu_sentences={self.bleu_sentences} must be 0 '
          '(all) or positive')
    return self


PROGRAM_SET = ('vocab_size', 'src_vocab_size')  # model options the tokenizer decides
SECTIONS = {'data': DataConfig, 'train': TrainConfig, 'eval': EvalConfig, 'decode': DecodeConfig}
# Options that moved, so that an old config gets told where to (stored_config.migrate).
MOVED = {'eval.max_extra_len': 'decode.max_extra_len',
         'eval.tokens_per_batch': 'decode.tokens_per_batch'}


def default_config() -> ml_collections.ConfigDict:
  """The full experiment config with every option at its default: transformer-base (paper
  Table 3) on text files. configs/*.py start here."""
  model = {f.name: f.default for f in dataclasses.fields(ModelConfig)
           if f.name not in PROGRAM_SET}
  sections = {name: dataclasses.asdict(cls()) for name, cls in SECTIONS.items()}
  return ml_collections.ConfigDict({'model': model, **sections})

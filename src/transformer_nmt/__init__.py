"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in JAX/Flax Linen.

The pieces researchers reuse, all pure functions or init/apply modules:

  attention: dot_product_attention, causal_mask, padding_mask, MultiHeadAttention, KVCache
  positions: sinusoidal_positions
  model:     ModelConfig, Transformer, init_params, count_params
  training:  smoothed_cross_entropy, rsqrt_warmup, make_optimizer, create_train_state,
             train_step, eval_step
  decoding:  SearchSpec, greedy_search, beam_search, length_penalty, translate,
             translate_greedy, Scorer
  a trained workdir: Engine (load, translate, n-best hypotheses with scores, score of given
             translations), Hypothesis, load_workdir, CheckpointChoice, DecodeConfig
"""

from transformer_nmt.config import ModelConfig
from transformer_nmt.decoding.beam import beam_search, length_penalty
from transformer_nmt.decoding.scoring import Scorer
from transformer_nmt.decoding.search import greedy_search
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.decoding.translate import translate, translate_greedy
from transformer_nmt.errors import ConfigError, DataError, UserError
from transformer_nmt.inference import CheckpointChoice, Engine, Hypothesis, load_workdir
from transformer_nmt.model.attention import (
                                       KVCache,
                                       MultiHeadAttention,
                                       attention_weights,
                                       causal_mask,
                                       dot_product_attention,
                                       padding_mask,
)
from transformer_nmt.model.layers import sinusoidal_positions
from transformer_nmt.model.transformer import DecoderCache, Transformer, count_params, init_params
from transformer_nmt.training.losses import smoothed_cross_entropy
from transformer_nmt.training.schedules import rsqrt_warmup
from transformer_nmt.training.state import TrainState, create_train_state, make_optimizer
from transformer_nmt.training.steps import eval_step, train_step
from transformer_nmt.typed_config import model_config_from_dict

__all__ = [
    'CheckpointChoice', 'ConfigError', 'DataError', 'DecodeConfig', 'DecoderCache', 'Engine',
    'Hypothesis', 'KVCache', 'ModelConfig', 'MultiHeadAttention', 'Scorer', 'SearchSpec',
    'TrainState', 'Transformer', 'UserError', 'attention_weights', 'beam_search', 'causal_mask',
    'count_params', 'create_train_state', 'dot_product_attention', 'eval_step', 'greedy_search',
    'init_params', 'length_penalty', 'load_workdir', 'make_optimizer', 'model_config_from_dict',
    'padding_mask', 'rsqrt_warmup', 'sinusoidal_positions', 'smoothed_cross_entropy', 'train_step',
    'translate', 'translate_greedy',
]

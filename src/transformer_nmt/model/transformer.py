"""The encoder-decoder Transformer (paper §3.1, Figure 1).

Dimension legend: B batch, S source length, T target length, D model dim, V vocabulary.
Sequences carry segment ids ([B, L] int, 0 = padding) and positions ([B, L], restarting
at 0 for every sequence), so padded and packed batches use the same code.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_nmt.config import ModelConfig
from transformer_nmt.model.attention import (
  KVCache,
  MultiHeadAttention,
  causal_mask,
  padding_mask,
  xavier_dense,
)
from transformer_nmt.model.dropout import Dropout
from transformer_nmt.model.layers import Embed, FeedForward, sinusoidal_positions


def layer_norm(cfg: ModelConfig) -> nn.Module:
  """Layer normalisation (§3.1) in float32, whatever the compute dtype."""
  return nn.LayerNorm(epsilon=cfg.layer_norm_epsilon, dtype=jnp.float32)


class _SublayerStack(nn.Module):
  """Shared residual wiring: post-LN LayerNorm(x + Dropout(f(x))) (§3.1, §5.4) or pre-LN
  x + Dropout(f(LayerNorm(x))) (tensor2tensor). `layer_norm` and `attention` make its
  submodules (a runtime's subclass computes them its own way: runtime/network.py)."""

  cfg: ModelConfig
  num_sublayers: int

  def setup(self) -> None:
    self.norms = [self.layer_norm() for _ in range(self.num_sublayers)]
    self.dropout = Dropout(self.cfg.residual_dropout, self.cfg.dropout_bits)

  def layer_norm(self) -> nn.Module:
    return layer_norm(self.cfg)

  def attention(self) -> MultiHeadAttention:
    return MultiHeadAttention(self.cfg)

  def residual(self, i: int, x: jax.Array, fn: Callable[[jax.Array], jax.Array],
               deterministic: bool) -> jax.Array:
    dtype = x.dtype
    if self.cfg.norm_position == 'pre':
      return x + self.dropout(fn(self.norms[i](x).astype(dtype)), deterministic)
    return self.norms[i](x + self.dropout(fn(x), deterministic)).astype(dtype)


class EncoderLayer(_SublayerStack):
  """Self-attention then FFN, each wrapped in a residual connection."""

  num_sublayers: int = 2

  def setup(self) -> None:
    super().setup()
    self.self_attention = self.attention()
    self.ffn = FeedForward(self.cfg)

  def __call__(self, x: jax.Array, mask: Optional[jax.Array], deterministic: bool) -> jax.Array:
    """x: [B, S, D]; mask broadcastable to [B, H, S, S] -> [B, S, D]."""
    x = self.residual(0, x, lambda h: self.self_attention(h, h, mask, deterministic), deterministic)
    return self.residual(1, x, lambda h: self.ffn(h, deterministic), deterministic)


class DecoderLayer(_SublayerStack):
  """Masked self-attention, encoder-decoder attention, FFN (§3.1)."""

  num_sublayers: int = 3

  def setup(self) -> None:
    super().setup()
    self.self_attention = self.attention()
    self.cross_attention = self.attention()
    self.ffn = FeedForward(self.cfg)

  def cross_kv(self, memory: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Encoder output [B, S, D] -> cross-attention keys, values [B, S, H, Dh]."""
    return self.cross_attention.project_kv(memory)

  def __call__(self, y: jax.Array, memory: jax.Array, self_mask: jax.Array,
               cross_mask: Optional[jax.Array], deterministic: bool) -> jax.Array:
    """Teacher-forced: y [B, T, D], memory [B, S, D] -> [B, T, D]."""
    k, v = self.cross_kv(memory)
    y = self.residual(0, y, lambda h: self.self_attention(h, h, self_mask, deterministic),
                      deterministic)
    return self._cross_and_ffn(y, k, v, cross_mask, deterministic)

  def step(self, y_t: jax.Array, cache: KVCache, cross_k: jax.Array, cross_v: jax.Array,
           cross_mask: Optional[jax.Array]) -> tuple[jax.Array, KVCache]:
    """One decoding position of N = B * K hypotheses (the K beams of each of B sentences,
    consecutive; K = 1 outside beam search): y_t [N, 1, D] -> ([N, 1, D], updated
    self-attention cache); cross_k, cross_v [B, S, H, Dh] and cross_mask [B, 1, 1, S] are
    the sentences'. A sentence's K beams attend to its memory as K queries (eq. 1 with
    T = K), so the memory is never copied per beam."""
    def self_attend(h: jax.Array) -> jax.Array:
      nonlocal cache
      out, cache = self.self_attention.step(h, cache)
      return out

    def cross_attend(h: jax.Array) -> jax.Array:
      queries = h.reshape((cross_k.shape[0], -1, h.shape[-1]))  # [B, K, D]
      return self.cross_attention.attend(queries, cross_k, cross_v, cross_mask,
                                         True).reshape(h.shape)
    y_t = self.residual(0, y_t, self_attend, True)
    y_t = self.residual(1, y_t, cross_attend, True)
    return self.residual(2, y_t, lambda h: self.ffn(h, True), True), cache

  def _cross_and_ffn(self, y: jax.Array, k: jax.Array, v: jax.Array,
                     cross_mask: Optional[jax.Array], deterministic: bool) -> jax.Array:
    y = self.residual(1, y, lambda h: self.cross_attention.attend(
        h, k, v, cross_mask, deterministic), deterministic)
    return self.residual(2, y, lambda h: self.ffn(h, deterministic), deterministic)


@flax.struct.dataclass
class DecoderCache:
  """Everything incremental decoding reuses across steps (one entry per decoder layer).

  self_attention: KVCache per layer, one row per hypothesis ([B * K, ...] in beam search).
  cross_k, cross_v: [B, S, H, Dh] per layer, the encoder-decoder attention's keys and values,
    computed once per batch: one row per sentence, which its K beams share.
  cross_mask: [B, 1, 1, S] bool, real source positions.
  """

  self_attention: tuple[KVCache, ...]
  cross_k: tuple[jax.Array, ...]
  cross_v: tuple[jax.Array, ...]
  cross_mask: jax.Array

  @property
  def index(self) -> jax.Array:
    return self.self_attention[0].index

  def reorder_beams(self, gather: Callable[[Any], Any]) -> DecoderCache:
    """Beam search's reordering (`gather` maps hypothesis rows within each sentence's
    beams): only the self-attention K/V differ between the beams of a sentence."""
    return self.replace(self_attention=gather(self.self_attention))

  def tile_beams(self, beam_size: int) -> DecoderCache:
    """Beam search's K hypotheses per sentence: the self-attention caches [B, ...] ->
    [B*K, ...]; the cross-attention entries stay one per sentence."""
    return self.replace(self_attention=jax.tree_util.tree_map(
        lambda x: jnp.repeat(x, beam_size, axis=0) if x.ndim else x, self.self_attention))

  def resize(self, length: int) -> DecoderCache:
    """Room for `length` decoding positions (decoding.decode_loop grows the cache in stages)."""
    return self.replace(self_attention=tuple(kv.resize(length) for kv in self.self_attention))


def _default_positions(ids: jax.Array) -> jax.Array:
  return jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)


class Transformer(nn.Module):
  """Encoder-decoder Transformer with pure init/apply.

  Methods (use `model.apply(variables, ..., method=Transformer.encode)` etc.):
    __call__(src, tgt_in, ...) -> [B, T, V] logits (teacher forcing);
    encode(src, ...) -> [B, S, D]; decode(memory, tgt_in, ...) -> [B, T, V];
    init_cache(memory, src_segments, max_len) -> DecoderCache;
    decode_step(ids_t, cache) -> ([B, V] logits, DecoderCache).
  """

  cfg: ModelConfig

  def setup(self) -> None:
    cfg = self.cfg
    self.tgt_embed = Embed(cfg.vocab_size, cfg)
    self.src_embed = self.tgt_embed if cfg.share_embeddings else Embed(cfg.src_vocab, cfg)
    self.encoder_layers = [self.encoder_layer() for _ in range(cfg.encoder_depth)]
    self.decoder_layers = [self.decoder_layer() for _ in range(cfg.decoder_depth)]
    if cfg.norm_position == 'pre':  # pre-LN needs a final LayerNorm on each stack
      self.encoder_norm = self.layer_norm()
      self.decoder_norm = self.layer_norm()
    if not cfg.tie_output:
      self.output = xavier_dense(cfg.vocab_size, cfg, False, 'output')
    if cfg.final_logits_bias:  # Marian's; zero at the start, as there
      self.logits_bias = self.param('final_logits_bias', nn.initializers.zeros_init(),
                                    (cfg.vocab_size,), jnp.float32)
    self.embed_dropout = Dropout(cfg.embedding_dropout, cfg.dropout_bits)
    # Word dropout: one draw per token zeroes its whole embedding ([B, T, D], broadcast over D).
    # Modules with rate 0 draw nothing, so the other masks stay those of runs without it.
    self.src_word_dropout = Dropout(cfg.source_word_dropout, cfg.dropout_bits, (-1,))
    self.tgt_word_dropout = Dropout(cfg.target_word_dropout, cfg.dropout_bits, (-1,))

  # The submodules a runtime's subclass replaces (runtime/network.py); the names, and so the
  # parameters, stay the same.
  def encoder_layer(self) -> EncoderLayer:
    if self.cfg.remat:  # keep only layer inputs for the backward pass; `deterministic` is static
      return nn.remat(EncoderLayer, static_argnums=(3,))(self.cfg)
    return EncoderLayer(self.cfg)

  def decoder_layer(self) -> DecoderLayer:
    if self.cfg.remat:
      return nn.remat(DecoderLayer, static_argnums=(5,))(self.cfg)
    return DecoderLayer(self.cfg)

  def layer_norm(self) -> nn.Module:
    return layer_norm(self.cfg)

  def _embed(self, embed: Embed, word_dropout: Dropout, ids: jax.Array,
             positions: Optional[jax.Array], deterministic: bool) -> jax.Array:
    """ids [B, T] -> dropout(word_dropout(embedding) + positions) [B, T, D]."""
    positions = _default_positions(ids) if positions is None else positions
    x = word_dropout(embed(ids), deterministic) + sinusoidal_positions(
        positions, self.cfg.d_model, self.cfg.positional_encoding).astype(self.cfg.dtype)
    return self.embed_dropout(x, deterministic)  # §5.4: dropout on embeddings + positions

  def encode(self, src: jax.Array, src_segments: Optional[jax.Array] = None,
             src_positions: Optional[jax.Array] = None, deterministic: bool = True) -> jax.Array:
    """src: [B, S] ids -> memory [B, S, D]."""
    mask = None if src_segments is None else padding_mask(src_segments, src_segments)
    x = self._embed(self.src_embed, self.src_word_dropout, src, src_positions, deterministic)
    for layer in self.encoder_layers:
      x = layer(x, mask, deterministic)
    return self.encoder_norm(x).astype(x.dtype) if self.cfg.norm_position == 'pre' else x

  def decode(self, memory: jax.Array, tgt_in: jax.Array, src_segments: Optional[jax.Array] = None,
             tgt_segments: Optional[jax.Array] = None, tgt_positions: Optional[jax.Array] = None,
             deterministic: bool = True) -> jax.Array:
    """memory [B, S, D], tgt_in [B, T] (BOS-shifted targets) -> logits [B, T, V] float32."""
    self_mask = causal_mask(tgt_in.shape[1])
    cross_mask = None
    if tgt_segments is not None:
      self_mask = self_mask & padding_mask(tgt_segments, tgt_segments)
    if src_segments is not None:
      q_segments = jnp.ones_like(tgt_in) if tgt_segments is None else tgt_segments
      cross_mask = padding_mask(q_segments, src_segments)
    y = self._embed(self.tgt_embed, self.tgt_word_dropout, tgt_in, tgt_positions, deterministic)
    for layer in self.decoder_layers:
      y = layer(y, memory, self_mask, cross_mask, deterministic)
    return self._logits(y)

  def _logits(self, y: jax.Array) -> jax.Array:
    if self.cfg.norm_position == 'pre':
      y = self.decoder_norm(y).astype(y.dtype)
    if self.cfg.tie_output:
      logits = self.tgt_embed.logits(y)
    else:
      logits = self.output(y).astype(jnp.float32 if self.cfg.float32_logits else self.cfg.dtype)
    if self.cfg.final_logits_bias:
      logits = logits + self.logits_bias.astype(logits.dtype)
    return logits

  def __call__(self, src: jax.Array, tgt_in: jax.Array, src_segments: Optional[jax.Array] = None,
               tgt_segments: Optional[jax.Array] = None, src_positions: Optional[jax.Array] = None,
               tgt_positions: Optional[jax.Array] = None, deterministic: bool = True) -> jax.Array:
    """src [B, S], tgt_in [B, T] -> logits [B, T, V] (teacher forcing)."""
    memory = self.encode(src, src_segments, src_positions, deterministic)
    return self.decode(memory, tgt_in, src_segments, tgt_segments, tgt_positions, deterministic)

  def init_cache(self, memory: jax.Array, src_segments: jax.Array, max_len: int) -> DecoderCache:
    """Precomputes cross-attention K/V and empty self-attention caches for `max_len` steps."""
    batch = memory.shape[0]
    kvs = [layer.cross_kv(memory) for layer in self.decoder_layers]
    empty = KVCache.zeros(batch, max_len, self.cfg.num_heads, self.cfg.head_dim,
                          jnp.dtype(self.cfg.dtype))
    return DecoderCache(self_attention=tuple(empty for _ in self.decoder_layers),
                        cross_k=tuple(k for k, _ in kvs), cross_v=tuple(v for _, v in kvs),
                        cross_mask=(src_segments > 0)[:, None, None, :])

  def decode_step(self, ids_t: jax.Array, cache: DecoderCache) -> tuple[jax.Array, DecoderCache]:
    """ids_t: [B] the previous token -> (logits [B, V] for the next one, advanced cache)."""
    positions = jnp.broadcast_to(cache.index, (ids_t.shape[0], 1))
    y = self._embed(self.tgt_embed, self.tgt_word_dropout, ids_t[:, None], positions,
                    True)  # [B, 1, D]
    new_caches = []
    for layer, kv, k, v in zip(self.decoder_layers, cache.self_attention, cache.cross_k,
                               cache.cross_v):
      y, kv = layer.step(y, kv, k, v, cache.cross_mask)
      new_caches.append(kv)
    logits = self._logits(y)[:, 0].astype(jnp.float32)  # the search sums log-probabilities
    return logits, cache.replace(self_attention=tuple(new_caches))


def init_params(cfg: ModelConfig, rng: jax.Array) -> dict:
  """Initial parameters for `cfg` (shapes only need a [1, 1] dummy batch)."""
  dummy = jnp.ones((1, 1), jnp.int32)
  return Transformer(cfg).init(rng, dummy, dummy)['params']


def last_cross_attention(cfg: ModelConfig, intermediates: Any) -> jax.Array:
  """The last decoder layer's encoder-decoder attention [B, H, T, S], from the
  'intermediates' collection of a teacher-forced `Transformer.apply(..., mutable=
  ['intermediates'])`."""
  last = intermediates[f'decoder_layers_{cfg.decoder_depth - 1}']
  return last['cross_attention']['attention_weights'][0]


def count_params(params: dict) -> int:
  """Total number of scalars in a parameter pytree (works on ShapeDtypeStructs too)."""
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))

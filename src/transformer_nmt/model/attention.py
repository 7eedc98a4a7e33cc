"""Scaled dot-product attention (paper eq. 1), masks, and multi-head attention (§3.2.2).

Dimension legend: B batch, T query length, S key length, H heads, Dh head dim, D model dim.
Masks are boolean, True where attention is allowed, broadcastable to [B, H, T, S].
"""

from __future__ import annotations

from typing import Callable, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_nmt.config import ModelConfig
from transformer_nmt.model import one_step, sums
from transformer_nmt.model.dropout import dropout
from transformer_nmt.model.precision import Dense

# The one minus infinity: masked attention logits and impossible search scores. Finite, so
# that sums and comparisons stay well-defined; exp(NEG_INF - max) is exactly 0 in float32.
NEG_INF = -1.0e9


def attention_weights(q: jax.Array, k: jax.Array, mask: Optional[jax.Array], *,
                      one_query: bool = False, halving: bool = False) -> jax.Array:
  """softmax(Q K^T / sqrt(d_k)) of eq. 1 as float32 probabilities [B, H, T, S].

  A query row whose keys are all masked (a padding position) gets all-zero weights, never NaN.

  Args:
    q: [B, T, H, Dh] queries.
    k: [B, S, H, Dh] keys; with `one_query` laid out per head, [B / G, H, S, Dh] (G = 1, or G
      consecutive query rows sharing a key row: the beams of a sentence in cross-attention).
    mask: bool, broadcastable to [B, H, T, S] (or to k's rows); None means attend everywhere.
    one_query: T = 1, a decoding step (the decoder's `step` says so): computed by the
      one_step.py kernels, the same values as the einsum, several times faster on XLA CPU
      (`step_kv` lays out the keys).
    halving: sums as model/sums.py adds them (ModelConfig.halving_sums).
  """
  scale = jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
  if one_query:
    logits = one_step.one_query_logits(q * scale, k, halving)  # [B, H, 1, S]
    if mask is not None and mask.shape[0] not in (1, q.shape[0]):  # per key row: per query row
      mask = jnp.repeat(mask, q.shape[0] // mask.shape[0], axis=0)
  else:
    logits = jnp.einsum('bthd,bshd->bhts', q * scale, k,
                        preferred_element_type=jnp.float32)  # [B, H, T, S]
  return _masked_softmax(logits, mask, halving)


def _masked_softmax(logits: jax.Array, mask: Optional[jax.Array],
                    halving: bool = False) -> jax.Array:
  softmax = sums.softmax if halving else jax.nn.softmax
  if mask is None:
    return softmax(logits, axis=-1)
  probs = softmax(jnp.where(mask, logits, NEG_INF), axis=-1)
  return jnp.where(mask, probs, 0.0)  # all-masked rows: uniform -> zeros


def apply_attention(probs: jax.Array, v: jax.Array, *, dropout_rng: Optional[jax.Array] = None,
                    dropout_rate: float = 0.0, dropout_bits: int = 16,
                    one_query: bool = False, halving: bool = False) -> jax.Array:
  """probs [B, H, T, S] @ v [B, S, H, Dh] -> [B, T, H, Dh], with dropout on the weights
  (tensor2tensor's attention dropout, drawn as model/dropout.py does) when `dropout_rng` is
  given. With `one_query` (T = 1), v may be shared by groups of rows as in
  `attention_weights`, and the one_step.py kernel computes it (`halving`: its sums as
  model/sums.py adds them)."""
  if dropout_rng is not None and dropout_rate > 0.0:
    probs = dropout(dropout_rng, probs, dropout_rate, dropout_bits)
  if one_query:
    return one_step.one_query_values(probs, v, halving)
  return jnp.einsum('bhts,bshd->bthd', probs.astype(v.dtype), v)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: Optional[jax.Array],
                          *, dropout_rng: Optional[jax.Array] = None,
                          dropout_rate: float = 0.0, dropout_bits: int = 16) -> jax.Array:
  """Scaled dot-product attention, eq. 1: softmax(Q K^T / sqrt(d_k)) V with a boolean mask.

  Args:
    q: [B, T, H, Dh] queries; k, v: [B, S, H, Dh] keys and values.
    mask: bool, broadcastable to [B, H, T, S]; None means attend everywhere. Fully masked
      query rows return zeros.
    dropout_rng, dropout_rate, dropout_bits: optional dropout on the attention probabilities
      (model/dropout.py).

  Returns:
    [B, T, H, Dh] attended values.
  """
  return apply_attention(attention_weights(q, k, mask), v, dropout_rng=dropout_rng,
                         dropout_rate=dropout_rate, dropout_bits=dropout_bits)


def causal_mask(length: int) -> jax.Array:
  """[1, 1, T, T]: position t may attend to positions <= t (decoder self-attention, §3.2.3)."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]


def padding_mask(q_segments: jax.Array, kv_segments: jax.Array) -> jax.Array:
  """[B, 1, T, S]: attend only between real tokens of the same segment.

  Args:
    q_segments: [B, T] int, 0 for padding, k > 0 for the k-th sequence in a row.
    kv_segments: [B, S] int, same convention. One sequence per row uses 1 everywhere.
  """
  same = q_segments[:, :, None] == kv_segments[:, None, :]
  real = (q_segments[:, :, None] > 0) & (kv_segments[:, None, :] > 0)
  return (same & real)[:, None]


@flax.struct.dataclass
class KVCache:
  """Decoder self-attention keys/values written one position per step.

  k, v: [B, H, L_max, Dh]; index: [] int32, the next position to write. One query's logits
  and weighted values are then dots over contiguous rows of Dh, a step writes contiguous rows,
  and a beam's gather (below) moves runs of Dh values: on XLA CPU, decoding a server's
  batches is faster than with keys transposed to [B, H, Dh, L_max].

  A bfloat16 cache holds its values' bit patterns as uint16 (`stored_dtype`; `k` and `v` are
  then bits, read as values by `attention_weights` and `attend`): XLA CPU carries a bfloat16
  array through a decoding loop as a float32 copy (it widens the gathers that reorder the
  beams), so each chunk of steps held every layer's keys and values in float32 as well, at
  twice their bytes; integers it leaves alone. Same values, same outputs, a lower peak memory
  (the bitcasts cost nothing on other backends).

  In beam search on a CPU (`beams` K > 1, rows B = sentences x K; `slots_by_default`) a
  hypothesis' keys and values stay in the row that wrote them: slots [B, L_max] int32 says
  which of its sentence's K rows holds each position of the hypothesis, and a reorder of the
  beams moves only these indices (`reorder`), not every layer's keys and values at every step.
  Reading gathers each position from its row (`_own_rows`), in the pass that already widens
  the bits to float32.
  """

  k: jax.Array
  v: jax.Array
  index: jax.Array
  slots: Optional[jax.Array] = None
  beams: int = flax.struct.field(pytree_node=False, default=1)

  @classmethod
  def zeros(cls, batch: int, max_len: int, num_heads: int, head_dim: int,
            dtype: jnp.dtype = jnp.float32) -> KVCache:
    stored = stored_dtype(dtype)
    shape = (batch, num_heads, max_len, head_dim)
    return cls(jnp.zeros(shape, stored), jnp.zeros(shape, stored), jnp.zeros((), jnp.int32))

  @property
  def length(self) -> int:
    return self.v.shape[2]

  def append(self, k: jax.Array, v: jax.Array) -> KVCache:
    """Writes k, v: [B, 1, H, Dh] at `index` and advances it."""
    k_t = _to_stored(jnp.swapaxes(k, 1, 2), self.k.dtype)  # [B, H, 1, Dh]
    v_t = _to_stored(jnp.swapaxes(v, 1, 2), self.v.dtype)
    slots = self.slots
    if slots is not None:  # each row writes its own hypothesis' position
      slots = jax.lax.dynamic_update_slice_in_dim(slots, self._own_slot()[:, None], self.index,
                                                  axis=1)
    return self.replace(k=jax.lax.dynamic_update_slice_in_dim(self.k, k_t, self.index, axis=2),
                        v=jax.lax.dynamic_update_slice_in_dim(self.v, v_t, self.index, axis=2),
                        index=self.index + 1, slots=slots)

  def resize(self, length: int) -> KVCache:
    """The cache with room for `length` positions: cut, or extended with zeros (slot 0, a
    row of the hypothesis' own sentence)."""
    extra = length - self.length
    if extra <= 0:
      slots = None if self.slots is None else self.slots[:, :length]
      return self.replace(k=self.k[:, :, :length], v=self.v[:, :, :length], slots=slots)
    none = (0, 0)
    slots = None if self.slots is None else jnp.pad(self.slots, (none, (0, extra)))
    widths = (none, none, (0, extra), none)
    return self.replace(k=jnp.pad(self.k, widths), v=jnp.pad(self.v, widths), slots=slots)

  def tile(self, beams: int, slots: Optional[bool] = None) -> KVCache:
    """Each row's hypothesis [B, ...] repeated for `beams` hypotheses -> [B*beams, ...], each
    holding its own positions; with `slots` (default: `slots_by_default()`) reorders will
    move slots only."""
    own = self.replace(k=self._own_rows(self.k), v=self._own_rows(self.v), slots=None)
    tiled = jax.tree_util.tree_map(lambda x: jnp.repeat(x, beams, axis=0) if x.ndim else x, own)
    return tiled._with_own_slots(beams, slots)

  def reorder(self, gather: Callable[[jax.Array], jax.Array]) -> KVCache:
    """Beam search's reorder: `gather` maps per-hypothesis rows [B*K', ...] to [B*K, ...]
    (beam.gather_beams). Only the slots move; a cache of one hypothesis per sentence
    (K' = 1: the search's first step) is tiled to K rows."""
    if self.slots is not None:
      return self.replace(slots=gather(self.slots))
    k, v = gather(self.k), gather(self.v)
    return self.replace(k=k, v=v)._with_own_slots(k.shape[0] // self.k.shape[0])

  def _with_own_slots(self, beams: int, slots: Optional[bool] = None) -> KVCache:
    """Every position held by the row itself (beams > 1 and `slots`, default:
    `slots_by_default()`), or no slots."""
    if beams == 1 or not (slots_by_default() if slots is None else slots):
      return self.replace(slots=None, beams=1)
    rows = self.k.shape[0]
    slots = jnp.broadcast_to((jnp.arange(rows, dtype=jnp.int32) % beams)[:, None],
                             (rows, self.length))
    return self.replace(slots=slots, beams=beams)

  def _own_slot(self) -> jax.Array:
    """[B] each row's place among its sentence's K rows."""
    return jnp.arange(self.k.shape[0], dtype=jnp.int32) % self.beams

  def _own_rows(self, x: jax.Array) -> jax.Array:
    """x [B, H, L_max, Dh] (k or v) with each hypothesis' positions gathered from the rows of
    its sentence that hold them (`slots`); x itself without slots."""
    if self.slots is None:
      return x
    rows, beams = x.shape[0], self.beams
    grouped = x.reshape((rows // beams, beams) + x.shape[1:])  # [B/K, K, H, L_max, Dh]
    slots = self.slots.reshape(rows // beams, beams, 1, self.length, 1)
    return jnp.take_along_axis(grouped, slots, axis=1).reshape(x.shape)

  def valid_mask(self) -> jax.Array:
    """[1, 1, 1, L_max]: positions written so far (including the one just appended)."""
    return (jnp.arange(self.length) < self.index)[None, None, None, :]

  def attention_weights(self, q: jax.Array, halving: bool = False) -> jax.Array:
    """Eq. 1's weights of one query per row over the positions written: q [B, 1, H, Dh] ->
    float32 [B, H, 1, L_max] (zero at unwritten positions). `halving`: the softmax's sums
    as model/sums.py adds them."""
    q = q[:, 0].astype(jnp.float32) * q.shape[-1] ** -0.5  # [B, H, Dh]
    logits = jnp.einsum('bhd,bhld->bhl', q, _float32(self._own_rows(self.k)))[:, :, None]
    return _masked_softmax(logits, self.valid_mask(), halving)

  def attend(self, probs: jax.Array, halving: bool = False) -> jax.Array:
    """probs [B, H, 1, L_max] -> the weighted values [B, 1, H, Dh]. With `halving` (sums
    outside YNNPACK: model/sums.py) a dot, which YNNPACK keeps."""
    v = _float32(self._own_rows(self.v))  # [B, H, L_max, Dh]
    if halving:
      out = jnp.einsum('bhl,bhld->bhd', probs[:, :, 0], v)
    else:
      out = jnp.sum(probs[:, :, 0, :, None] * v, axis=2)  # [B, H, Dh]
    return out[:, None].astype(value_dtype(self.v.dtype))


def slots_by_default() -> bool:
  """Whether beam caches keep slots (KVCache) when not told: on XLA:CPU, where moving every
  layer's keys and values at every step costs more than gathering them as they are read. A TPU's
  compiler estimates the opposite for its decoder step, so accelerators move them, and aot.py
  compiles that program."""
  return jax.default_backend() == 'cpu'


def stored_dtype(dtype: jnp.dtype) -> jnp.dtype:
  """The dtype a KVCache keeps values of `dtype` in: uint16 bit patterns for bfloat16."""
  return jnp.dtype(jnp.uint16) if jnp.dtype(dtype) == jnp.bfloat16 else jnp.dtype(dtype)


def value_dtype(stored: jnp.dtype) -> jnp.dtype:
  """The dtype of the values a KVCache array of dtype `stored` holds."""
  return jnp.dtype(jnp.bfloat16) if jnp.dtype(stored) == jnp.uint16 else jnp.dtype(stored)


def _to_stored(x: jax.Array, stored: jnp.dtype) -> jax.Array:
  """x rounded to the values a KVCache array of dtype `stored` holds, in that dtype."""
  x = x.astype(value_dtype(stored))
  return jax.lax.bitcast_convert_type(x, stored) if x.dtype != stored else x


def _float32(x: jax.Array) -> jax.Array:
  """A KVCache array's values in float32."""
  values = value_dtype(x.dtype)
  return (jax.lax.bitcast_convert_type(x, values) if x.dtype != values else x).astype(jnp.float32)


def xavier_dense(features: int, cfg: ModelConfig, use_bias: bool, name: str) -> Dense:
  """Dense layer with Xavier-uniform kernel, float32 params and the configured compute dtype
  (bfloat16 matmuls accumulate in float32, see precision.py)."""
  return Dense(features, use_bias, cfg.dtype, name=name)


class MultiHeadAttention(nn.Module):
  """Multi-head attention with W^Q, W^K, W^V, W^O (§3.2.2); no biases, as in tensor2tensor
  (`model.attention_bias=True` adds them, as Marian has).

  Each projection is one [D, D] Xavier-uniform matrix, i.e. the paper's per-head W_i
  concatenated along the output axis.
  """

  cfg: ModelConfig

  def setup(self) -> None:
    d, bias = self.cfg.d_model, self.cfg.attention_bias
    self.query = xavier_dense(d, self.cfg, bias, 'query')
    self.key = xavier_dense(d, self.cfg, bias, 'key')
    self.value = xavier_dense(d, self.cfg, bias, 'value')
    self.out = xavier_dense(d, self.cfg, bias, 'out')

  def _split(self, x: jax.Array) -> jax.Array:
    return x.reshape(x.shape[:-1] + (self.cfg.num_heads, self.cfg.head_dim))  # [B, L, H, Dh]

  def project_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[B, S, D] -> keys and values, each [B, S, H, Dh]."""
    return self._split(self.key(x)), self._split(self.value(x))

  def step_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[B, S, D] memory -> what `attend(..., one_query=True)` takes: keys per head
    [B, H, S, Dh], values [B, S, H, Dh] (once per batch for cross-attention)."""
    k, v = self.project_kv(x)
    return jnp.swapaxes(k, 1, 2), v

  def attend(self, x_q: jax.Array, k: jax.Array, v: jax.Array, mask: Optional[jax.Array],
             deterministic: bool, one_query: bool = False) -> jax.Array:
    """[B, T, D] queries against precomputed [B, S, H, Dh] keys/values -> [B, T, D];
    `one_query`: a decoding step, keys and values from `step_kv` (see `attention_weights`)."""
    q = self._split(self.query(x_q))
    rng = None
    if not deterministic and self.cfg.attention_dropout > 0.0:
      rng = self.make_rng('dropout')
    halving = self.cfg.halving_sums
    probs = attention_weights(q, k, mask, one_query=one_query, halving=halving)
    self.sow('intermediates', 'attention_weights', probs)  # kept only if the caller asks
    out = apply_attention(probs, v, dropout_rng=rng, dropout_rate=self.cfg.attention_dropout,
                          dropout_bits=self.cfg.dropout_bits, one_query=one_query,
                          halving=halving)
    return self.out(out.reshape(out.shape[:2] + (self.cfg.d_model,)))

  def __call__(self, x_q: jax.Array, x_kv: jax.Array, mask: Optional[jax.Array],
               deterministic: bool = True) -> jax.Array:
    """[B, T, D] queries, [B, S, D] memory -> [B, T, D]."""
    k, v = self.project_kv(x_kv)
    return self.attend(x_q, k, v, mask, deterministic)

  def step(self, x_t: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
    """Self-attention for one new position: x_t [B, 1, D] -> ([B, 1, D], cache with it appended)."""
    k, v = self.project_kv(x_t)
    cache = cache.append(k, v)
    halving = self.cfg.halving_sums
    probs = cache.attention_weights(self._split(self.query(x_t)), halving)  # [B, H, 1, L_max]
    self.sow('intermediates', 'attention_weights', probs)
    out = cache.attend(probs, halving)  # [B, 1, H, Dh]
    return self.out(out.reshape(out.shape[:2] + (self.cfg.d_model,))), cache

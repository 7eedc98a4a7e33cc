"""The decoder cache of the CPU runtime's decoding step (network.py), in XLA:CPU's layouts.

model/'s KVCache and DecoderCache are the reference: keys and values [B, L, H, Dh] in the
compute dtype, every beam with its own copy of everything. Here, for one-query steps on
XLA:CPU:
- self-attention keys and values [B, H, L, Dh] (a query's logits and weighted values are dots
  over contiguous rows of Dh), bfloat16 held as uint16 bits, and in beam search "slots": a
  reorder of the beams moves indices, not every layer's keys and values (`StepKVCache`);
- cross-attention keys per head [B', H, S, Dh], computed once per batch and shared by the K
  beams of a sentence (one_step.py's kernels read a sentence's G rows together).
Same values, same outputs as the reference (tests/runtime/test_network.py).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax
import jax
import jax.numpy as jnp

from transformer_nmt.model.attention import masked_softmax
from transformer_nmt.model.transformer import DecoderCache
from transformer_nmt.runtime import sums


@flax.struct.dataclass
class StepKVCache:
  """Decoder self-attention keys/values written one position per step.

  k, v: [B, H, L_max, Dh]; index: [] int32, the next position to write. One query's logits
  and weighted values are then dots over contiguous rows of Dh, a step writes contiguous rows,
  and a beam's gather (below) moves runs of Dh values: on XLA CPU, decoding a server's
  batches is faster than with keys transposed to [B, H, Dh, L_max].

  A bfloat16 cache holds its values' bit patterns as uint16 (`stored_dtype`; `k` and `v` are
  then bits, read as values by `attention_weights` and `attend`): XLA CPU carries a bfloat16
  array through a decoding loop as a float32 copy (it widens the gathers that reorder the
  beams), so each chunk of steps held every layer's keys and values in float32 as well, at
  twice their bytes; integers it leaves alone. Same values, same outputs, a lower peak memory.

  In beam search (`beams` K > 1, rows B = sentences x K) a
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
            dtype: jnp.dtype = jnp.float32) -> StepKVCache:
    stored = stored_dtype(dtype)
    shape = (batch, num_heads, max_len, head_dim)
    return cls(jnp.zeros(shape, stored), jnp.zeros(shape, stored), jnp.zeros((), jnp.int32))

  @property
  def length(self) -> int:
    return self.v.shape[2]

  def append(self, k: jax.Array, v: jax.Array) -> StepKVCache:
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

  def resize(self, length: int) -> StepKVCache:
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

  def tile(self, beams: int, slots: bool = True) -> StepKVCache:
    """Each row's hypothesis [B, ...] repeated for `beams` hypotheses -> [B*beams, ...], each
    holding its own positions; with `slots` reorders will move slots only (without, they
    move the keys and values)."""
    own = self.replace(k=self._own_rows(self.k), v=self._own_rows(self.v), slots=None)
    tiled = jax.tree_util.tree_map(lambda x: jnp.repeat(x, beams, axis=0) if x.ndim else x, own)
    return tiled._with_own_slots(beams, slots)

  def reorder(self, gather: Callable[[jax.Array], jax.Array]) -> StepKVCache:
    """Beam search's reorder: `gather` maps per-hypothesis rows [B*K', ...] to [B*K, ...]
    (beam.gather_beams). Only the slots move; a cache of one hypothesis per sentence
    (K' = 1: the search's first step) is tiled to K rows."""
    if self.slots is not None:
      return self.replace(slots=gather(self.slots))
    k, v = gather(self.k), gather(self.v)
    return self.replace(k=k, v=v)._with_own_slots(k.shape[0] // self.k.shape[0])

  def _with_own_slots(self, beams: int, slots: bool = True) -> StepKVCache:
    """Every position held by the row itself (beams > 1 and `slots`), or no
    slots."""
    if beams == 1 or not slots:
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
    as sums.py adds them."""
    q = q[:, 0].astype(jnp.float32) * q.shape[-1] ** -0.5  # [B, H, Dh]
    logits = jnp.einsum('bhd,bhld->bhl', q, _float32(self._own_rows(self.k)))[:, :, None]
    return masked_softmax(logits, self.valid_mask(),
                          sums.softmax if halving else jax.nn.softmax)

  def attend(self, probs: jax.Array, halving: bool = False) -> jax.Array:
    """probs [B, H, 1, L_max] -> the weighted values [B, 1, H, Dh]. With `halving` (sums
    outside YNNPACK: sums.py) a dot, which YNNPACK keeps."""
    v = _float32(self._own_rows(self.v))  # [B, H, L_max, Dh]
    if halving:
      out = jnp.einsum('bhl,bhld->bhd', probs[:, :, 0], v)
    else:
      out = jnp.sum(probs[:, :, 0, :, None] * v, axis=2)  # [B, H, Dh]
    return out[:, None].astype(value_dtype(self.v.dtype))


def stored_dtype(dtype: jnp.dtype) -> jnp.dtype:
  """The dtype a StepKVCache keeps values of `dtype` in: uint16 bit patterns for bfloat16."""
  return jnp.dtype(jnp.uint16) if jnp.dtype(dtype) == jnp.bfloat16 else jnp.dtype(dtype)


def value_dtype(stored: jnp.dtype) -> jnp.dtype:
  """The dtype of the values a StepKVCache array of dtype `stored` holds."""
  return jnp.dtype(jnp.bfloat16) if jnp.dtype(stored) == jnp.uint16 else jnp.dtype(stored)


def _to_stored(x: jax.Array, stored: jnp.dtype) -> jax.Array:
  """x rounded to the values a StepKVCache array of dtype `stored` holds, in that dtype."""
  x = x.astype(value_dtype(stored))
  return jax.lax.bitcast_convert_type(x, stored) if x.dtype != stored else x


def _float32(x: jax.Array) -> jax.Array:
  """A StepKVCache array's values in float32."""
  values = value_dtype(x.dtype)
  return (jax.lax.bitcast_convert_type(x, values) if x.dtype != values else x).astype(jnp.float32)


@flax.struct.dataclass
class StepCache(DecoderCache):
  """model.DecoderCache with the runtime's layouts (one entry per decoder layer):

  self_attention: StepKVCache per layer (see its layout).
  cross_k: [B', H, S, Dh] per layer, computed once per batch, laid out per head (one
    decoding step's logits are then a matmul per sentence and head: one_step.py).
  cross_v: [B', S, H, Dh] per layer; cross_mask: [B', 1, 1, S] bool, real source positions.
  In beam search B = B' * K: the K beams of a sentence share its cross-attention entries.
  """

  def reorder_beams(self, gather: Callable[[Any], Any]) -> StepCache:
    """Beam search's reordering, of each layer's StepKVCache (its slots only)."""
    return self.replace(self_attention=tuple(kv.reorder(gather) for kv in self.self_attention))

  def tile_beams(self, beam_size: int, slots: bool = True) -> StepCache:
    """Beam search's K hypotheses per sentence, of the self-attention caches only.
    `slots`: see StepKVCache.tile."""
    return self.replace(self_attention=tuple(kv.tile(beam_size, slots)
                                             for kv in self.self_attention))

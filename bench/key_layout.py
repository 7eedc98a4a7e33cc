"""The self-attention cache's keys laid out as its values, [B, H, L, Dh] (model.attention.
KVCache), against the layout they replaced, transposed to [B, H, Dh, L]. Two engines on the
same loaded model, one traced each way, alternating (bench/side_by_side.py): the whole list,
groups of 1-16 lines (requests served one by one) and shuffled calls of 250 lines (a busy
server's batches); prints the fastest round of each, their ratio, and the lines they
translate differently (the logits' dots add in another order).

  python bench/key_layout.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import jax
import jax.numpy as jnp
import side_by_side
from absl import app

from transformer_nmt.model import attention

_OPTIONS = side_by_side.define_flags(lines=1000, rounds=3, calls=250)


Cache = attention.KVCache


def _own_rows(self: Cache, x: jax.Array, length_axis: int) -> jax.Array:
  """KVCache._own_rows for either layout: the gather along `length_axis`."""
  if self.slots is None:
    return x
  rows, beams = x.shape[0], self.beams
  shape = [rows // beams, beams] + [1] * (x.ndim - 1)
  shape[length_axis + 1] = self.length
  grouped = x.reshape((rows // beams, beams) + x.shape[1:])
  return jnp.take_along_axis(grouped, self.slots.reshape(shape), axis=1).reshape(x.shape)


def _zeros(cls, batch: int, max_len: int, num_heads: int, head_dim: int,
           dtype: jnp.dtype = jnp.float32) -> Cache:
  stored = attention.stored_dtype(dtype)
  return cls(jnp.zeros((batch, num_heads, head_dim, max_len), stored),
             jnp.zeros((batch, num_heads, max_len, head_dim), stored), jnp.zeros((), jnp.int32))


def _append(self: Cache, k: jax.Array, v: jax.Array) -> Cache:
  k_t = attention._to_stored(jnp.transpose(k, (0, 2, 3, 1)), self.k.dtype)  # [B, H, Dh, 1]
  v_t = attention._to_stored(jnp.swapaxes(v, 1, 2), self.v.dtype)
  slots = self.slots
  if slots is not None:
    slots = jax.lax.dynamic_update_slice_in_dim(slots, self._own_slot()[:, None], self.index,
                                                axis=1)
  return self.replace(k=jax.lax.dynamic_update_slice_in_dim(self.k, k_t, self.index, axis=3),
                      v=jax.lax.dynamic_update_slice_in_dim(self.v, v_t, self.index, axis=2),
                      index=self.index + 1, slots=slots)


def _resize(self: Cache, length: int) -> Cache:
  extra, none = length - self.length, (0, 0)
  if extra <= 0:
    slots = None if self.slots is None else self.slots[:, :length]
    return self.replace(k=self.k[..., :length], v=self.v[:, :, :length], slots=slots)
  slots = None if self.slots is None else jnp.pad(self.slots, (none, (0, extra)))
  return self.replace(k=jnp.pad(self.k, (none, none, none, (0, extra))),
                      v=jnp.pad(self.v, (none, none, (0, extra), none)), slots=slots)


def _tile(self: Cache, beams: int, slots=None) -> Cache:
  own = self.replace(k=_own_rows(self, self.k, 3), v=_own_rows(self, self.v, 2), slots=None)
  tiled = jax.tree_util.tree_map(lambda x: jnp.repeat(x, beams, axis=0) if x.ndim else x, own)
  return tiled._with_own_slots(beams, slots)


def _attention_weights(self: Cache, q: jax.Array, halving: bool = False) -> jax.Array:
  q = q[:, 0].astype(jnp.float32) * q.shape[-1] ** -0.5  # [B, H, Dh]
  keys = attention._float32(_own_rows(self, self.k, 3))  # [B, H, Dh, L]
  logits = jnp.einsum('bhd,bhdl->bhl', q, keys)[:, :, None]
  return attention._masked_softmax(logits, self.valid_mask(), halving)


_BEFORE = {'zeros': classmethod(_zeros), 'append': _append, 'resize': _resize, 'tile': _tile,
           'attention_weights': _attention_weights}


def main(_):
  side_by_side.before_and_now(_OPTIONS(), [(Cache, _BEFORE)], 'keys [B, H, Dh, L] (before)',
                              'keys [B, H, L, Dh]')


if __name__ == '__main__':
  app.run(main)

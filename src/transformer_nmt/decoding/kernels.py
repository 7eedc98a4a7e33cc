"""What a search computes with: one value, chosen when the engine is built.

The reference is the paper's model/ (eq. 1 as einsums, a plain KV cache) with jax.nn's
logsumexp and `lax.top_k`; a runtime (runtime/) gives its backend's faster ones, with the same
outputs. Accelerators take the reference.

The protocol:
- `network(cfg)`: a flax module with model.Transformer's methods (`encode`, `init_cache`,
  `decode_step`, `__call__`) and its parameters. `init_cache` gives the decoder step's cache:
  it has `resize`, `tile_beams` and `reorder_beams` (search.GrowingCache, search.BeamCache).
- `logsumexp(x, axis, keepdims)` and `top_k(x, k) -> (values, indices)`: the reductions of the
  search itself (beam candidates, greedy's argmax, sampling's top-k); `top_k` picks the lowest
  index among equal values, as `lax.top_k` does.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import flax.linen as nn
import jax

from transformer_nmt.config import ModelConfig
from transformer_nmt.model.transformer import Transformer


@dataclasses.dataclass(frozen=True)
class Kernels:
  """The network and the search's reductions (see the module docstring)."""

  network: Callable[[ModelConfig], nn.Module] = Transformer
  logsumexp: Callable[..., jax.Array] = jax.nn.logsumexp
  top_k: Callable[[jax.Array, int], tuple[jax.Array, jax.Array]] = jax.lax.top_k


REFERENCE = Kernels()

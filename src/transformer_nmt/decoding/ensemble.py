"""Decoding with one model or an ensemble of several, behind the same two functions.

An ensemble is a tuple of model configs with a tuple of parameter trees. At every step each
member runs its own cached decoder step and the members' log-probabilities are averaged (a
log-linear ensemble); the search normalises the average, so its distribution is the
normalised geometric mean of the members'. The members must share the source and target
vocabularies (inference/loading.py checks the tokenizers).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence, Union

import flax
import jax
import jax.numpy as jnp
import numpy as np

from transformer_nmt.config import ModelConfig
from transformer_nmt.decoding.kernels import REFERENCE, Kernels
from transformer_nmt.decoding.search import LogitsFn

Models = Union[ModelConfig, Sequence[ModelConfig]]  # one model, or an ensemble's members


def with_dtype(cfg: Models, dtype: Optional[str]) -> Models:
  """The model(s) computing in `dtype` ('float32' or 'bfloat16'; None: unchanged). Only the
  compute precision changes: the parameters stay as trained."""
  return cfg if dtype is None else each(cfg, dtype=dtype)


def each(cfg: Models, **changes: Any) -> Models:
  """The model(s) with `changes` made to every member's ModelConfig."""
  if isinstance(cfg, ModelConfig):
    return dataclasses.replace(cfg, **changes)
  return tuple(dataclasses.replace(c, **changes) for c in cfg)


def kernels_as_computed(cfg: Models, params: Any) -> Any:
  """The parameters with every Dense kernel in its model's compute dtype, as the decoding
  programs take them (Engine.params_as_computed); the same outputs, since a bfloat16 Dense casts
  its float32 kernel at every call (precision.mixed_matmul), so the cast only moves out of the
  programs: they no longer copy the kernels at every call, which lowers a short job's peak
  memory. Cast in numpy and put on the device, so that no program compiles for it (a tree of
  ShapeDtypeStructs gets the kernels' new dtype). Parameters with nothing to cast (a float32
  model, kernels already cast) come back as they are. Embeddings, norms and biases stay in
  float32, as the model reads them."""
  if not isinstance(cfg, ModelConfig):
    return tuple(kernels_as_computed(c, p) for c, p in zip(cfg, params, strict=True))
  dtype = jnp.dtype(cfg.dtype)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  if all(np.dtype(x.dtype) == dtype for path, x in leaves if _is_kernel(path)):
    return params
  if any(isinstance(x, jax.ShapeDtypeStruct) for _, x in leaves):  # shapes only (aot.py)
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding)
        if _is_kernel(path) else x, params)

  def cast(path: tuple, x: Any) -> Any:
    return np.asarray(x).astype(dtype) if _is_kernel(path) else x
  return jax.device_put(jax.tree_util.tree_map_with_path(cast, params))


def _is_kernel(path: tuple) -> bool:
  """Whether a parameter tree path ends at a Dense kernel (precision.Dense's 'kernel')."""
  return getattr(path[-1], 'key', None) == 'kernel'


@flax.struct.dataclass
class EnsembleCache:
  """The members' decoder caches; beam search and the growing cache act on each."""

  members: tuple[Any, ...]

  def tile_beams(self, beam_size: int) -> EnsembleCache:
    return EnsembleCache(tuple(m.tile_beams(beam_size) for m in self.members))

  def reorder_beams(self, gather: Callable[[Any], Any]) -> EnsembleCache:
    return EnsembleCache(tuple(m.reorder_beams(gather) for m in self.members))

  def resize(self, length: int) -> EnsembleCache:
    return EnsembleCache(tuple(m.resize(length) for m in self.members))


def is_ensemble(cfg: Models) -> bool:
  return not isinstance(cfg, ModelConfig)


def dtypes(cfg: Models) -> str:
  """The members' compute dtypes, '/'-joined: 'float32', or 'bfloat16/float32' for an
  ensemble of both."""
  return '/'.join(sorted({c.dtype for c in (cfg if is_ensemble(cfg) else [cfg])}))


def members(cfg: Models, params: Any) -> list[tuple[ModelConfig, Any]]:
  """[(config, parameters)] of each member (one for a single model)."""
  return list(zip(cfg, params)) if is_ensemble(cfg) else [(cfg, params)]


def start(cfg: Models, params: Any, src: jax.Array, src_segments: jax.Array, length: int,
          kernels: Kernels = REFERENCE) -> Any:
  """Encodes src [B, S] and returns the decoder cache for `length` steps (an EnsembleCache
  holding one per member for an ensemble), of `kernels.network`."""
  caches = []
  for c, p in members(cfg, params):
    model, variables = kernels.network(c), {'params': p}
    memory = model.apply(variables, src, src_segments, method='encode')
    caches.append(model.apply(variables, memory, src_segments, length, method='init_cache'))
  return EnsembleCache(tuple(caches)) if is_ensemble(cfg) else caches[0]


def step_fn(cfg: Models, params: Any, kernels: Kernels = REFERENCE) -> LogitsFn:
  """The decoder step `logits_fn(ids [N], cache) -> ([N, V], cache)` of `kernels.network`:
  one model's logits, or the mean of the members' log-probabilities."""
  if not is_ensemble(cfg):
    model = kernels.network(cfg)
    return lambda ids, cache: model.apply({'params': params}, ids, cache, method='decode_step')

  def step(ids: jax.Array, cache: EnsembleCache) -> tuple[jax.Array, EnsembleCache]:
    logps, caches = [], []
    for (c, p), member in zip(members(cfg, params), cache.members):
      logits, member = kernels.network(c).apply({'params': p}, ids, member,
                                                method='decode_step')
      logps.append(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
      caches.append(member)
    return jnp.mean(jnp.stack(logps), axis=0), EnsembleCache(tuple(caches))
  return step

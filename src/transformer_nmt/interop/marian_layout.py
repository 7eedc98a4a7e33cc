"""A Marian (OPUS-MT) checkpoint in Hugging Face's layout: its tensors' names beside ours (the
one map that import_marian.py, marian.py, reads by and export_marian.py, marian_export.py,
writes by, so that the two stay each other's inverse) and reading its weights.

Linear weights are [out, in] there and kernels [in, out] here; LayerNorm's weight is our
scale. The embedding tables keep their [V, D] shape on both sides.
"""

from __future__ import annotations

import pathlib
import pickle
from typing import Any, Iterator

import numpy as np

from transformer_nmt.config import ModelConfig
from transformer_nmt.errors import DataError

SHARED = 'model.shared.weight'
ENCODER_EMBED = 'model.encoder.embed_tokens.weight'
DECODER_EMBED = 'model.decoder.embed_tokens.weight'
LM_HEAD = 'lm_head.weight'
LOGITS_BIAS = 'final_logits_bias'  # [1, V] there, [V] here
POSITIONS = ('model.encoder.embed_positions.weight', 'model.decoder.embed_positions.weight')

_ATTENTION = (('query', 'q_proj'), ('key', 'k_proj'), ('value', 'v_proj'), ('out', 'out_proj'))
# Our sublayers of one layer and their prefixes there, in the order of the layer.
_ENCODER = (('self_attention', 'self_attn', 'attention'),
            ('norms_0', 'self_attn_layer_norm', 'norm'),
            ('ffn/wi', 'fc1', 'dense'), ('ffn/wo', 'fc2', 'dense'),
            ('norms_1', 'final_layer_norm', 'norm'))
_DECODER = (('self_attention', 'self_attn', 'attention'),
            ('norms_0', 'self_attn_layer_norm', 'norm'),
            ('cross_attention', 'encoder_attn', 'attention'),
            ('norms_1', 'encoder_attn_layer_norm', 'norm'),
            ('ffn/wi', 'fc1', 'dense'), ('ffn/wo', 'fc2', 'dense'),
            ('norms_2', 'final_layer_norm', 'norm'))


def layer_tensors(cfg: ModelConfig) -> Iterator[tuple[tuple[str, ...], str, str]]:
  """Every linear map and LayerNorm of both stacks as (our path to its dict, e.g.
  ('encoder_layers_0', 'ffn', 'wi'), their name prefix, e.g. 'model.encoder.layers.0.fc1',
  kind 'dense' (kernel [in, out] / weight [out, in], bias [out]) or 'norm' (scale / weight
  [D], bias [D]))."""
  for stack, depth, sublayers in (('encoder', cfg.encoder_depth, _ENCODER),
                                  ('decoder', cfg.decoder_depth, _DECODER)):
    for i in range(depth):
      for ours, theirs, kind in sublayers:
        path = (f'{stack}_layers_{i}', *ours.split('/'))
        prefix = f'model.{stack}.layers.{i}.{theirs}'
        if kind == 'attention':
          for projection, name in _ATTENTION:
            yield (*path, projection), f'{prefix}.{name}', 'dense'
        else:
          yield path, prefix, kind


class MarianError(DataError):
  """A Marian checkpoint that cannot be imported, or a model that cannot be exported as one;
  the message names the file or option."""


def read_tensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
  """The checkpoint's tensors as numpy arrays of their stored type (float32, float16 or
  bfloat16), by name: model.safetensors (no torch needed), else pytorch_model.bin when torch
  is installed (weights_only: tensors only, no unpickled code)."""
  safetensors_file, torch_file = directory / 'model.safetensors', directory / 'pytorch_model.bin'
  if safetensors_file.exists():
    from safetensors import SafetensorError, safe_open
    try:
      try:
        with safe_open(str(safetensors_file), framework='np') as f:
          tensors = f.get_tensors()
      except TypeError:  # bfloat16, which numpy lacks: through JAX's arrays
        with safe_open(str(safetensors_file), framework='flax') as f:
          tensors = {k: np.asarray(v) for k, v in f.get_tensors().items()}
    except (SafetensorError, OSError, ValueError) as e:
      raise MarianError(f'{safetensors_file} is damaged or truncated ({e})') from None
  elif torch_file.exists():
    try:
      import torch
    except ImportError:
      raise MarianError(f'{torch_file} needs torch to read (pip install torch), or give the '
                        'model as model.safetensors') from None
    try:
      state = torch.load(str(torch_file), map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as e:
      raise MarianError(_refused_pickle(torch_file, str(e))) from None
    except Exception as e:  # noqa: BLE001 -- torch raises many kinds for a bad file
      raise MarianError(f'{torch_file} does not read ({type(e).__name__}: '
                        f'{str(e).splitlines()[0][:200] if str(e) else ""})') from None
    if not isinstance(state, dict):
      raise MarianError(f'{torch_file} holds a {type(state).__name__}, not a state dict of '
                        'tensors')
    tensors = {k: _numpy(v) for k, v in state.items() if isinstance(v, torch.Tensor)}
  else:
    raise MarianError(f'{directory} has neither model.safetensors nor pytorch_model.bin')
  return tensors


def _numpy(tensor: Any) -> np.ndarray:
  """A torch tensor as numpy, of the same type (numpy has no bfloat16: ml_dtypes')."""
  import ml_dtypes
  import torch
  if tensor.dtype == torch.bfloat16:
    return tensor.float().numpy().astype(ml_dtypes.bfloat16)  # exact: widened, then back
  return tensor.numpy()


def _refused_pickle(path: pathlib.Path, error: str) -> str:
  """Our one line for torch.load's refusal with weights_only: torch's own text tells the
  reader how to switch that protection off, which a model's importer must never advise."""
  if 'global' in error.lower():  # torch: 'Unsupported global: GLOBAL module.name ...'
    return (f'{path} holds Python objects other than tensors, which could run code when '
            'loaded: refused for safety; give the weights as model.safetensors instead (convert '
            'the file where you trust its source)')
  detail = error.split('WeightsUnpickler error:')[-1].strip().splitlines()
  detail = [line for line in detail if line.strip() and 'weights_only' not in line][:1]
  return (f'{path} is damaged or not a PyTorch state dict'
          + (f' ({detail[0].strip()[:200]})' if detail else ''))

"""Export a trained model to CTranslate2 (a C++ inference engine) for deployment.

CTranslate2's Transformer spec matches ours layer for layer: scaled embeddings plus sinusoidal
positions (we pass our own table, so both variants work), pre- or post-LN sublayers, fused
Q/K/V in self-attention and fused K/V in cross-attention, ReLU FFN, a final norm for pre-LN,
and the output projection. Its linear weights are [out, in]; ours are [in, out].

Using the export: source tokens are SentencePiece pieces followed by '</s>' (our models see
EOS at the end of every source), e.g.

    translator = ctranslate2.Translator(out_dir)
    pieces = sp.encode(line, out_type=str) + ['</s>']
    translator.translate_batch([pieces], beam_size=4)

The options of imported Marian models (docs/MODEL_OPTIONS.md) have CTranslate2 counterparts:
the FFN's activation, biases on the attention projections, embeddings left unscaled, and the
final logits bias as the output projection's bias; the decoder's start token is the target
tokenizer's (the padding piece for a Marian model).

CTranslate2's length penalty divides by length^alpha, not GNMT's ((5 + length) / 6)^alpha, so
beam search results can differ slightly from ours; greedy search agrees.

Quantizations (QUANTIZATIONS, export_ctranslate2.py --quantization) are CTranslate2's own,
applied to the weights as exported: int8 and int8_float32 (int8 weights, float32 elsewhere),
int16, float16 and bfloat16 (converted with torch, which must then be installed).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from typing import Any, Optional

import jax.numpy as jnp
import numpy as np

from transformer_nmt.config import ModelConfig
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.errors import ConfigError
from transformer_nmt.files import current_umask
from transformer_nmt.model.layers import sinusoidal_positions

QUANTIZATIONS = ('int8', 'int8_float32', 'int16', 'float16', 'bfloat16')
# The package CTranslate2's converter needs for a quantization, beyond itself and numpy.
NEEDS = {'bfloat16': 'torch'}


def check_quantization(quantization: Optional[str]) -> None:
  """ConfigError unless `quantization` is None or one of QUANTIZATIONS whose converter's
  package is installed; called before any work, so that a missing one is a line, not a
  traceback from inside CTranslate2 after loading the model."""
  if quantization is not None and quantization not in QUANTIZATIONS:
    raise ConfigError(f'--quantization={quantization} is not one of {", ".join(QUANTIZATIONS)}')
  package = NEEDS.get(quantization)
  if package is None:
    return
  try:
    __import__(package)
  except ImportError:
    raise ConfigError(f'--quantization={quantization} needs {package}, which is not installed '
                      f'(CTranslate2 converts the weights with it): pip install {package}, or '
                      'choose another --quantization') from None


def _array(x: Any) -> np.ndarray:
  """A float32 copy that CTranslate2 may change: its int8 and int16 quantizations scale the
  arrays they are given in place, and ours (views of JAX arrays) are read-only."""
  return np.array(x, np.float32)


def _linear(spec: Any, kernel: np.ndarray, bias: Any = None) -> None:
  spec.weight = np.ascontiguousarray(_array(kernel).T)  # [in, out] -> [out, in]
  if bias is not None:
    spec.bias = _array(bias)


def _norm(spec: Any, p: dict) -> None:
  spec.gamma, spec.beta = _array(p['scale']), _array(p['bias'])


def _attention(spec: Any, p: dict, norm: dict, self_attention: bool) -> None:
  q, k, v = (_array(p[n]['kernel']) for n in ('query', 'key', 'value'))
  biased = 'bias' in p['query']  # model.attention_bias
  bq, bk, bv = (_array(p[n]['bias']) if biased else None for n in ('query', 'key', 'value'))
  joined = lambda *bs: np.concatenate(bs) if biased else None  # noqa: E731
  out_bias = p['out'].get('bias')
  if self_attention:
    _linear(spec.linear[0], np.concatenate([q, k, v], axis=1), joined(bq, bk, bv))
    _linear(spec.linear[1], p['out']['kernel'], out_bias)
  else:
    _linear(spec.linear[0], q, bq)
    _linear(spec.linear[1], np.concatenate([k, v], axis=1), joined(bk, bv))
    _linear(spec.linear[2], p['out']['kernel'], out_bias)
  _norm(spec.layer_norm, norm)


def _ffn(spec: Any, p: dict, norm: dict) -> None:
  _linear(spec.linear_0, p['wi']['kernel'], p['wi']['bias'])
  _linear(spec.linear_1, p['wo']['kernel'], p['wo']['bias'])
  _norm(spec.layer_norm, norm)


def build_spec(cfg: ModelConfig, params: Any, src_tok: Tokenizer, tgt_tok: Tokenizer,
               max_positions: int = 1024) -> Any:
  """A ctranslate2 TransformerSpec holding our parameters and vocabularies."""
  from ctranslate2.specs import common_spec, transformer_spec
  if not cfg.tie_output:
    raise ConfigError('CTranslate2 export supports tied output projections only')
  activation = {'relu': common_spec.Activation.RELU, 'swish': common_spec.Activation.SWISH,
                'gelu': common_spec.Activation.GELU}[cfg.activation]
  spec = transformer_spec.TransformerSpec.from_config(
      (cfg.encoder_depth, cfg.decoder_depth), cfg.num_heads, pre_norm=cfg.norm_position == 'pre',
      activation=activation)
  spec.config.layer_norm_epsilon = cfg.layer_norm_epsilon
  positions = sinusoidal_positions(jnp.arange(max_positions), cfg.d_model,
                                   cfg.positional_encoding)
  tgt_table = params['tgt_embed']['embedding']
  src_table = tgt_table if cfg.share_embeddings else params['src_embed']['embedding']
  enc, dec = spec.encoder, spec.decoder
  # Each its own copy: CTranslate2 aliases equal arrays itself, then quantizes them in place.
  enc.embeddings[0].weight, dec.embeddings.weight = _array(src_table), _array(tgt_table)
  enc.position_encodings.encodings = _array(positions)
  dec.position_encodings.encodings = _array(positions)
  dec.projection.weight = _array(tgt_table)  # [V, D] = the tied pre-softmax projection
  if cfg.final_logits_bias:
    dec.projection.bias = _array(params['final_logits_bias'])
  enc.scale_embeddings = dec.scale_embeddings = cfg.scale_embeddings
  for i, layer in enumerate(enc.layer):
    p = params[f'encoder_layers_{i}']
    _attention(layer.self_attention, p['self_attention'], p['norms_0'], True)
    _ffn(layer.ffn, p['ffn'], p['norms_1'])
  for i, layer in enumerate(dec.layer):
    p = params[f'decoder_layers_{i}']
    _attention(layer.self_attention, p['self_attention'], p['norms_0'], True)
    _attention(layer.attention, p['cross_attention'], p['norms_1'], False)
    _ffn(layer.ffn, p['ffn'], p['norms_2'])
  if cfg.norm_position == 'pre':
    _norm(enc.layer_norm, params['encoder_norm'])
    _norm(dec.layer_norm, params['decoder_norm'])
  for tok, register in ((src_tok, spec.register_source_vocabulary),
                        (tgt_tok, spec.register_target_vocabulary)):
    register(tok.pieces(range(tok.vocab_size)))
  special = tgt_tok.pieces([tgt_tok.unk_id, tgt_tok.bos_id, tgt_tok.eos_id])
  spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = special
  spec.config.decoder_start_token = special[1]
  return spec


def export(cfg: ModelConfig, params: Any, src_tok: Tokenizer, tgt_tok: Tokenizer,
           out_dir: str | os.PathLike, quantization: str | None = None) -> None:
  """Writes a CTranslate2 model directory (model.bin, vocabularies, config.json).

  `quantization` is one of QUANTIZATIONS; None keeps float32. ConfigError for another, or
  for one whose package is missing (check_quantization).
  """
  check_quantization(quantization)
  spec = build_spec(cfg, params, src_tok, tgt_tok)
  spec.validate()
  spec.optimize(quantization=quantization)
  out = pathlib.Path(out_dir)
  out.parent.mkdir(parents=True, exist_ok=True)
  # Written beside `out` and renamed when complete (rename(2) replaces an empty directory),
  # so that a full disk or a crash leaves no half-written model behind.
  partial = pathlib.Path(tempfile.mkdtemp(prefix=f'.{out.name}.', suffix='.partial',
                                          dir=out.parent))
  try:
    spec.save(str(partial))
    os.chmod(partial, 0o777 & ~current_umask())  # mkdtemp makes it private
    os.replace(partial, out)
  except BaseException:
    shutil.rmtree(partial, ignore_errors=True)
    raise

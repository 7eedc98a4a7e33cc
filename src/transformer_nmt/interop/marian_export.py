"""export_marian.py's library: a workdir's model as a Marian (OPUS-MT) checkpoint in Hugging
Face's layout, which transformers' MarianMTModel.from_pretrained and
MarianTokenizer.from_pretrained load offline. The inverse of marian.py (import_marian.py),
by the same map of names (marian_layout.py).

The directory gets config.json, model.safetensors (float32), source.spm and target.spm (the
workdir's SentencePiece models: the one joint model twice for a joint vocabulary),
vocab.json ({piece: id}; with separate vocabularies the source's, and target_vocab.json the
target's, as tokenizer_config.json's separate_vocabs tells MarianTokenizer) and
generation_config.json (module GENERATION). A model of ours trained from scratch keeps its
SentencePiece ids (pad 0, unk 1, bos 2, eos 3): the tables list its pieces in id order and
config.json names them, its decoder starting from bos (decoder_start_token_id), where an
imported one starts from pad.

Marian's model is post-LN with sinusoidal positions as [sin | cos] halves, LayerNorm epsilon
1e-5, biases on the attention projections and a final logits bias: a model of ours without
biases gets zeros there (the same function); model options Marian has no counterpart for
(pre-LN, the other position encodings, another epsilon) are refused in one line naming the
option (MarianError). The directory is written whole or not at all (staging.py).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Callable, Mapping

import numpy as np

from transformer_nmt.config import ModelConfig
from transformer_nmt.data.tokenizer import PieceTable, Tokenizer
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.interop import marian_layout as layout
from transformer_nmt.interop import staging
from transformer_nmt.interop.marian_layout import MarianError

# The options Marian's model fixes, with the value it has.
FIXED = {'norm_position': 'post', 'positional_encoding': 'halves', 'layer_norm_epsilon': 1e-5}


def check_exportable(cfg: ModelConfig) -> None:
  """MarianError naming the first model option that Marian's model cannot hold."""
  for name, value in FIXED.items():
    if getattr(cfg, name) != value:
      raise MarianError(f'model.{name}={getattr(cfg, name)!r}: Marian models have only '
                        f'{value!r}; this model cannot be exported to transformers')


def hf_config(cfg: ModelConfig, tgt_tok: Tokenizer, max_positions: int) -> dict[str, Any]:
  """MarianConfig's config.json for `cfg` (dropout rates as trained, for further training)."""
  return {
      'architectures': ['MarianMTModel'], 'model_type': 'marian', 'dtype': 'float32',
      'vocab_size': cfg.src_vocab, 'decoder_vocab_size': cfg.vocab_size,
      'share_encoder_decoder_embeddings': cfg.share_embeddings,
      'tie_word_embeddings': cfg.tie_output, 'd_model': cfg.d_model,
      'encoder_layers': cfg.encoder_depth, 'decoder_layers': cfg.decoder_depth,
      'encoder_attention_heads': cfg.num_heads, 'decoder_attention_heads': cfg.num_heads,
      'encoder_ffn_dim': cfg.d_ff, 'decoder_ffn_dim': cfg.d_ff,
      'activation_function': cfg.activation, 'scale_embedding': cfg.scale_embeddings,
      'max_position_embeddings': max_positions, 'dropout': cfg.residual_dropout,
      'attention_dropout': cfg.attention_dropout, 'activation_dropout': cfg.relu_dropout,
      'pad_token_id': tgt_tok.pad_id, 'eos_token_id': tgt_tok.eos_id,
      'forced_eos_token_id': tgt_tok.eos_id, 'decoder_start_token_id': tgt_tok.bos_id,
      'is_encoder_decoder': True, 'use_cache': True}


def generation_config(decode: DecodeConfig, tgt_tok: Tokenizer,
                      max_positions: int) -> dict[str, Any]:
  """generation_config.json: the special ids, the run's decode.beam_size as num_beams,
  decode.beam_stop 'k_finished' as early_stopping (transformers' False stops as 'bound' does)
  and, only for decode.alpha 0, length_penalty 0: transformers divides a hypothesis's
  log-probability by length^length_penalty, we by GNMT's ((5 + length) / 6)^alpha, and the
  two agree only at 0 (tests/test_marian_export.py). With another alpha transformers' default
  (1.0) stays. Outputs end at max_length tokens (the position table's), not at the input's
  length + decode.max_extra_len as ours do."""
  out = {'decoder_start_token_id': tgt_tok.bos_id, 'eos_token_id': tgt_tok.eos_id,
         'forced_eos_token_id': tgt_tok.eos_id, 'pad_token_id': tgt_tok.pad_id,
         'max_length': max_positions, 'num_beams': decode.beam_size,
         'early_stopping': decode.beam_stop == 'k_finished'}
  if decode.alpha == 0:
    out['length_penalty'] = 0.0
  return out


def hf_tensors(cfg: ModelConfig, params: Any) -> dict[str, np.ndarray]:
  """Our parameters as the tensors MarianMTModel.save_pretrained writes for `cfg`'s
  embedding options (each table once where transformers ties it, every copy where it does
  not: with tie_word_embeddings false it ties none). MarianError for parameters left over."""
  left = _copy(params)  # emptied as it is written: what is left has no place there

  def take(path: tuple[str, ...]) -> dict:
    node = left
    for key in path[:-1]:
      node = node[key]
    return node.pop(path[-1])

  f32 = lambda x: np.ascontiguousarray(np.asarray(x, np.float32))  # noqa: E731
  target = f32(left.pop('tgt_embed')['embedding'])
  source = target if cfg.share_embeddings else f32(left.pop('src_embed')['embedding'])
  out = {layout.LOGITS_BIAS: f32(left.pop('final_logits_bias', np.zeros(cfg.vocab_size)))
         .reshape(1, -1)}
  if cfg.share_embeddings and cfg.tie_output:
    out[layout.SHARED] = target
  else:
    out.update({layout.ENCODER_EMBED: source, layout.DECODER_EMBED: target})
    if cfg.share_embeddings:  # transformers keeps the shared table beside its copies
      out[layout.SHARED] = target
  if not cfg.tie_output:
    out[layout.LM_HEAD] = f32(left.pop('output')['kernel']).T
  for path, prefix, kind in layout.layer_tensors(cfg):
    p = take(path)
    if kind == 'dense':
      out[f'{prefix}.weight'] = f32(p.pop('kernel')).T
      bias = p.pop('bias', None)  # none without model.attention_bias: zeros, the same function
      out[f'{prefix}.bias'] = f32(np.zeros(out[f'{prefix}.weight'].shape[0]) if bias is None
                                  else bias)
    else:
      out[f'{prefix}.weight'], out[f'{prefix}.bias'] = f32(p.pop('scale')), f32(p.pop('bias'))
    if p:
      raise MarianError(f'parameters {sorted(p)} of {"/".join(path)} have no place in a Marian '
                        'model')
  rest = [k for k, v in _flatten(left)]
  if rest:
    raise MarianError(f'parameters {rest[:3]} have no place in a Marian model')
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _copy(tree: Any) -> Any:
  return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, Mapping) else tree


def _flatten(tree: Any, prefix: str = '') -> list[tuple[str, Any]]:
  if not isinstance(tree, Mapping):
    return [(prefix, tree)]
  return [item for k, v in tree.items() for item in _flatten(v, f'{prefix}/{k}'.lstrip('/'))]


def tokenizer_files(src_tok: Tokenizer, tgt_tok: Tokenizer,
                    max_positions: int) -> dict[str, bytes]:
  """source.spm, target.spm, vocab.json (target_vocab.json) and tokenizer_config.json.
  MarianError for special pieces that MarianTokenizer would not find by their names."""
  tables = []
  for tok in (src_tok, tgt_tok):
    special = tok.pieces([tok.eos_id, tok.unk_id, tok.pad_id])
    if special != list(PieceTable.SPECIAL):
      raise MarianError(f'{tok.path}: its eos, unk and pad pieces are {special}; '
                        f'MarianTokenizer finds them by the names {list(PieceTable.SPECIAL)}')
    tables.append({piece: i for i, piece in enumerate(tok.pieces(range(tok.vocab_size)))})
  separate = tables[0] != tables[1]
  dump = lambda table: json.dumps(table, ensure_ascii=False, indent=1).encode()  # noqa: E731
  files = {'source.spm': src_tok.path.read_bytes(), 'target.spm': tgt_tok.path.read_bytes(),
           'vocab.json': dump(tables[0]),
           'tokenizer_config.json': dump({'tokenizer_class': 'MarianTokenizer',
                                          'separate_vocabs': separate,
                                          'model_max_length': max_positions})}
  if separate:
    files['target_vocab.json'] = dump(tables[1])
  return files


def export_model(cfg: ModelConfig, params: Any, src_tok: Tokenizer, tgt_tok: Tokenizer,
                 decode: DecodeConfig, out_dir: str | os.PathLike) -> None:
  """Writes the Marian checkpoint directory `out_dir` (module docstring). MarianError
  (nothing written) for a model Marian cannot hold, an `out_dir` that exists and is not
  empty or cannot be made, or a full disk; Stopped (nothing written) on Ctrl-C or SIGTERM."""
  with staging.stops() as stop_here:
    _export(cfg, params, src_tok, tgt_tok, decode, pathlib.Path(out_dir), stop_here)


def _export(cfg: ModelConfig, params: Any, src_tok: Tokenizer, tgt_tok: Tokenizer,
            decode: DecodeConfig, out: pathlib.Path, stop_here: Callable[[], None]) -> None:
  from safetensors.numpy import save

  check_exportable(cfg)
  staging.check_empty(out, '--out', MarianError)
  # Marian's position table ends here: the longest source decode.py would take.
  max_positions = decode.max_input_len
  files = tokenizer_files(src_tok, tgt_tok, max_positions)
  dump = lambda obj: json.dumps(obj, indent=2).encode()  # noqa: E731
  files['config.json'] = dump(hf_config(cfg, tgt_tok, max_positions))
  files['generation_config.json'] = dump(generation_config(decode, tgt_tok, max_positions))
  # 'pt': transformers loads only safetensors files whose metadata names a framework it knows.
  files['model.safetensors'] = save(hf_tensors(cfg, params), metadata={'format': 'pt'})
  stop_here()
  needed = sum(len(data) for data in files.values())
  with staging.staged(out, '--out', 'the export', needed, MarianError, stop_here) as partial:
    for name, data in files.items():
      (partial / name).write_bytes(data)
      stop_here()

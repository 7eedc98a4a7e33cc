"""import_marian.py's library: a Marian (OPUS-MT) checkpoint in Hugging Face's layout as a
workdir of ours.

The checkpoint directory holds config.json (model_type 'marian'), model.safetensors (or
pytorch_model.bin, read only when torch is installed, with weights_only=True), source.spm and
target.spm (SentencePiece) and vocab.json (one piece table for both). Its model is the
paper's encoder-decoder with the differences that docs/MODEL_OPTIONS.md lists, each a named
model option here: the FFN's activation, attention biases, the final logits bias, positions
as [sin | cos] halves at the paper's rates, LayerNorm epsilon 1e-5, and the piece table's ids
(eos 0, pad last, the decoder starting from pad). What it uses and we lack is refused in one
line naming it (MarianError), never converted into another model.

The newer generation (OPUS-MT 'tc', Tatoeba-Challenge) may give the source and the target
their own vocabularies (share_encoder_decoder_embeddings false, decoder_vocab_size; vocab.json
and target_vocab.json with tokenizer_config.json's separate_vocabs) and an output layer of its
own (tie_word_embeddings false): model.share_embeddings and model.tie_output false here.

The workdir gets config.json, spm.src.model, spm.tgt.model, vocab.json (both sides' tables
in one file with separate vocabularies: data/tokenizer.py's PieceTable) and one checkpoint of
the parameters alone (step 0), so that decode.py, the Engine, export_ctranslate2.py,
export_marian.py and train.init_from read it as a trained run. It is written whole or not
at all (staging.py: a partial directory renamed when complete; Ctrl-C and SIGTERM stop it
where it can stop cleanly, Orbax's save finished, raising Stopped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import shutil
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from transformer_nmt.config import PROGRAM_SET, ModelConfig, default_config
from transformer_nmt.data.tokenizer import PieceTable, Tokenizer
from transformer_nmt.errors import DataError
from transformer_nmt.interop import marian_layout as layout
from transformer_nmt.interop import staging
from transformer_nmt.interop.marian_layout import MarianError, read_tensors  # noqa: F401 -- tests'
from transformer_nmt.interop.staging import Stopped  # noqa: F401 -- import_marian.py's

ACTIVATIONS = {'swish': 'swish', 'silu': 'swish', 'relu': 'relu', 'gelu': 'gelu'}
# Options of older Marian/BART configs that change the model, with the value that does not.
UNSUPPORTED = {'normalize_before': False, 'normalize_embedding': False,
               'layernorm_embedding': False, 'add_final_layer_norm': False,
               'add_bias_logits': False, 'static_position_embeddings': True,
               'is_encoder_decoder': True}
FILES = ('source.spm', 'target.spm', 'vocab.json')
TARGET_VOCAB = 'target_vocab.json'  # the target side's table, with separate_vocabs


def model_config(hf: Mapping[str, Any], where: str = 'config.json') -> ModelConfig:
  """Our ModelConfig of a Marian config.json (a dict); MarianError for what we lack."""
  kind = hf.get('model_type')
  if kind != 'marian':
    raise MarianError(f"{where}: model_type {kind!r} is not a Marian model ('marian')")
  for key, fine in UNSUPPORTED.items():
    if key in hf and hf[key] != fine:
      raise MarianError(f'{where}: {key}={hf[key]!r} is not supported (only {fine!r})')
  for a, b in (('encoder_ffn_dim', 'decoder_ffn_dim'),
               ('encoder_attention_heads', 'decoder_attention_heads')):
    if hf.get(a) != hf.get(b):
      raise MarianError(f'{where}: {a}={hf.get(a)} differs from {b}={hf.get(b)}; both stacks '
                        'must have the same shape')
  for key in ('share_encoder_decoder_embeddings', 'tie_word_embeddings'):
    if not isinstance(hf.get(key, True), bool):
      raise MarianError(f'{where}: {key}={hf[key]!r} is not true or false')
  # transformers' MarianMTModel ties all three tables only with both true; with
  # tie_word_embeddings false even a shared table's encoder and decoder copies are their own.
  shared = hf.get('share_encoder_decoder_embeddings', True) and hf.get('tie_word_embeddings', True)
  vocab = hf.get('vocab_size')
  target_vocab = hf.get('decoder_vocab_size') or vocab
  if hf.get('share_encoder_decoder_embeddings', True) and target_vocab != vocab:
    raise MarianError(f"{where}: decoder_vocab_size={hf['decoder_vocab_size']} differs from "
                      f'vocab_size={vocab} with share_encoder_decoder_embeddings true (one '
                      'table cannot have both sizes)')
  if hf.get('decoder_start_token_id') != hf.get('pad_token_id'):
    raise MarianError(f"{where}: decoder_start_token_id={hf.get('decoder_start_token_id')} is not "
                      f"pad_token_id={hf.get('pad_token_id')} (Marian's decoders start from pad)")
  activation = ACTIVATIONS.get(hf.get('activation_function', 'gelu'))
  if activation is None:
    raise MarianError(f"{where}: activation_function={hf['activation_function']!r} is not one "
                      f'of {sorted(ACTIVATIONS)}')
  try:
    dropout = float(hf.get('dropout', 0.1))
    return ModelConfig(
        vocab_size=int(target_vocab), src_vocab_size=int(vocab), share_embeddings=shared,
        tie_output=bool(hf.get('tie_word_embeddings', True)), d_model=int(hf['d_model']),
        num_layers=int(hf['encoder_layers']), num_decoder_layers=int(hf['decoder_layers']),
        d_ff=int(hf['encoder_ffn_dim']), num_heads=int(hf['encoder_attention_heads']),
        residual_dropout=dropout, embedding_dropout=dropout,
        attention_dropout=float(hf.get('attention_dropout', 0.0)),
        relu_dropout=float(hf.get('activation_dropout', 0.0)),
        layer_norm_epsilon=1e-5,  # torch.nn.LayerNorm's, which Marian's layers use
        positional_encoding='halves', activation=activation, attention_bias=True,
        scale_embeddings=bool(hf.get('scale_embedding', False)), final_logits_bias=True,
    ).validate()
  except (KeyError, TypeError, ValueError) as e:
    raise MarianError(f'{where}: missing or bad value ({type(e).__name__}: {e})') from None


def convert(tensors: Mapping[str, np.ndarray], cfg: ModelConfig,
            source: str = 'the checkpoint') -> dict:
  """Marian's tensors as our parameter tree for `cfg` (every shape checked against it), by
  marian_layout's names: linear weights are [out, in] there and kernels [in, out] here. The
  embedding tables: module docstring and `_embeddings`."""
  t = dict(tensors)

  def take(name: str) -> np.ndarray:
    if name not in t:
      raise MarianError(f'{source} lacks the tensor {name}')
    return np.asarray(t.pop(name), np.float32)

  params: dict[str, Any] = _embeddings(t, cfg, source)
  for path, prefix, kind in layout.layer_tensors(cfg):
    node = params
    for key in path:
      node = node.setdefault(key, {})
    if kind == 'dense':
      node.update(kernel=take(f'{prefix}.weight').T, bias=take(f'{prefix}.bias'))
    else:
      node.update(scale=take(f'{prefix}.weight'), bias=take(f'{prefix}.bias'))
  params['final_logits_bias'] = take(layout.LOGITS_BIAS).reshape(-1)
  _check_positions(t, cfg, source)
  if t:
    raise MarianError(f'{source} has tensors this model does not use, e.g. {sorted(t)[0]} '
                      f'({len(t)} in all): another layout')
  _check_shapes(params, cfg, source)
  return params


def _embeddings(t: dict[str, np.ndarray], cfg: ModelConfig, source: str) -> dict:
  """Our embedding parameters, taken out of `t`. Shared and tied (the older OPUS-MT): one
  [V, D] table whose copies (encoder, decoder, lm_head) must equal it. Otherwise as
  transformers' MarianMTModel uses them: the encoder's and the decoder's own tables (the
  shared one where a checkpoint stores no copy; it is unused beside both), and lm_head as
  the output layer unless tied to the decoder's table."""
  if cfg.share_embeddings:
    return {'tgt_embed': {'embedding': _one_embedding(t, source)}}
  shared = t.pop(layout.SHARED, None)

  def table(name: str) -> np.ndarray:
    found = t.pop(name, shared)
    if found is None:
      raise MarianError(f'{source} lacks the tensor {name}')
    return np.asarray(found, np.float32)

  params = {'src_embed': {'embedding': table(layout.ENCODER_EMBED)},
            'tgt_embed': {'embedding': table(layout.DECODER_EMBED)}}
  if not cfg.tie_output:
    if layout.LM_HEAD not in t:
      raise MarianError(f'{source} lacks the tensor {layout.LM_HEAD} (tie_word_embeddings is '
                        'false: the output layer is its own)')
    params['output'] = {'kernel': np.asarray(t.pop(layout.LM_HEAD), np.float32).T}
  elif layout.LM_HEAD in t:
    head, tied = t.pop(layout.LM_HEAD), params['tgt_embed']['embedding']
    if head.shape != tied.shape or not np.array_equal(np.asarray(head, np.float32), tied):
      raise MarianError(f'{source}: {layout.LM_HEAD} differs from {layout.DECODER_EMBED} '
                        'although tie_word_embeddings is true')
  return params


def _one_embedding(t: dict[str, np.ndarray], source: str) -> np.ndarray:
  """The shared [V, D] table; its tied copies (encoder, decoder, lm_head) must equal it."""
  names = (layout.SHARED, layout.ENCODER_EMBED, layout.DECODER_EMBED, layout.LM_HEAD)
  found = [(n, t.pop(n)) for n in names if n in t]
  if not found:
    raise MarianError(f'{source} lacks the embedding table ({layout.SHARED})')
  for name, table in found[1:]:
    if table.shape != found[0][1].shape or not np.array_equal(table, found[0][1]):
      raise MarianError(f'{source}: {name} differs from {found[0][0]} although '
                        'share_encoder_decoder_embeddings and tie_word_embeddings are true')
  return np.asarray(found[0][1], np.float32)


def _check_positions(t: dict[str, np.ndarray], cfg: ModelConfig, source: str) -> None:
  """Stored position tables (older checkpoints keep them) must be our 'halves' sinusoids, up
  to the rounding of the type they are stored in: float16 rounds sines of up to 1 by up to
  4.9e-4, bfloat16 by 3.9e-3 (half of each type's eps); learned tables differ by far more."""
  import jax.numpy as jnp
  import ml_dtypes

  from transformer_nmt.model.layers import sinusoidal_positions
  for name in layout.POSITIONS:
    if name in t:
      table = t.pop(name)
      try:
        rounding = float(ml_dtypes.finfo(table.dtype).eps)
      except ValueError:  # not a floating type
        rounding = 0.0
      ours = np.asarray(sinusoidal_positions(jnp.arange(table.shape[0]), cfg.d_model, 'halves'))
      # 1e-4: float32 sines of large arguments computed two ways (theirs, ours) differ by that.
      if table.shape != ours.shape or not np.allclose(np.asarray(table, np.float32), ours,
                                                      rtol=0, atol=1e-4 + rounding):
        raise MarianError(f'{source}: {name} is not the sinusoidal table (learned positions '
                          'are not supported)')


def _check_shapes(params: dict, cfg: ModelConfig, source: str) -> None:
  import jax

  from transformer_nmt.model.transformer import init_params
  expected = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  flat = dict(jax.tree_util.tree_flatten_with_path(params)[0])
  for path, want in jax.tree_util.tree_flatten_with_path(expected)[0]:
    got = flat.get(path)
    if got is None or got.shape != want.shape:
      raise MarianError(f'{source}: {jax.tree_util.keystr(path)} has shape '
                        f'{None if got is None else got.shape}, config.json says {want.shape}')


def separate_vocabs(directory: pathlib.Path) -> bool:
  """Whether MarianTokenizer.from_pretrained gives the two sides their own tables (vocab.json
  the source's, target_vocab.json the target's): tokenizer_config.json's separate_vocabs."""
  path = directory / 'tokenizer_config.json'
  if not path.exists():
    return False
  try:
    separate = json.loads(path.read_text(encoding='utf-8')).get('separate_vocabs', False)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
    raise MarianError(f'cannot read {path}: {e}') from None
  if not isinstance(separate, bool):
    raise MarianError(f'{path}: separate_vocabs={separate!r} is not true or false')
  return separate


def check_tokenizers(directory: pathlib.Path, hf: Mapping[str, Any], cfg: ModelConfig) -> bool:
  """MarianError unless source.spm, target.spm and vocab.json (and target_vocab.json with
  separate vocabularies) load and fit config.json and `cfg`; whether the vocabularies are
  separate."""
  separate = separate_vocabs(directory)
  names = FILES + ((TARGET_VOCAB,) if separate else ())
  for name in names:
    if not (directory / name).is_file():
      raise MarianError(f'{directory} has no {name}'
                        + (' (tokenizer_config.json: separate_vocabs)' if name == TARGET_VOCAB
                           else ''))
  try:
    source, target = (PieceTable(directory / name) for name in (names[2], names[-1]))
    Tokenizer(directory / 'source.spm', directory / names[2])
    Tokenizer(directory / 'target.spm', directory / names[-1])
  except DataError as e:
    raise MarianError(str(e)) from None
  if not separate and cfg.src_vocab != cfg.vocab_size:
    raise MarianError(f'{directory / "config.json"}: decoder_vocab_size={cfg.vocab_size} '
                      f'differs from vocab_size={cfg.src_vocab} but the tokenizer has one '
                      f'table (vocab.json; no separate_vocabs in tokenizer_config.json)')
  for table, what, ours, theirs in (
      (source, 'pieces', len(source.pieces), cfg.src_vocab),
      (target, 'pieces', len(target.pieces), cfg.vocab_size),
      (target, "'<pad>' id", target.pad_id, hf.get('pad_token_id')),
      (target, "'</s>' id", target.eos_id, hf.get('eos_token_id'))):
    if ours != theirs:
      raise MarianError(f'{table.path} does not match config.json: {ours} {what} there, '
                        f'{theirs} in config.json')
  return separate


def import_checkpoint(directory: str | os.PathLike, workdir: str | os.PathLike) -> ModelConfig:
  """Writes the workdir of the Marian checkpoint in `directory` (module docstring); returns
  its model config. MarianError (nothing written) when it cannot be imported, `workdir`
  exists and is not empty or cannot be made, or its disk is too full; Stopped (nothing
  written) on Ctrl-C or SIGTERM."""
  with staging.stops() as stop_here:
    return _import(pathlib.Path(directory), pathlib.Path(workdir), stop_here)


def _import(directory: pathlib.Path, out: pathlib.Path, stop_here: Callable[[], None]
            ) -> ModelConfig:
  staging.check_empty(out, '--workdir', MarianError)
  config_file = directory / 'config.json'
  try:
    hf = json.loads(config_file.read_text(encoding='utf-8'))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise MarianError(f'cannot read {config_file}: {e}') from None
  if not isinstance(hf, dict):
    raise MarianError(f'{config_file} is not a JSON object')
  cfg = model_config(hf, str(config_file))
  separate = check_tokenizers(directory, hf, cfg)
  tensors = read_tensors(directory)
  stop_here()
  params = convert(tensors, cfg, str(directory))
  del tensors
  stop_here()
  names = FILES + ((TARGET_VOCAB,) if separate else ())
  needed = (sum((directory / name).stat().st_size for name in names) + 2 ** 18  # + metadata
            + int(1.1 * sum(x.nbytes for x in _leaves(params))))
  with staging.staged(out, '--workdir', 'the import', needed, MarianError,
                      stop_here) as partial:
    _write_workdir(partial, directory, cfg, params, hf, separate, stop_here)
  return cfg


def _leaves(tree: Any) -> Iterator[np.ndarray]:
  for value in tree.values():
    yield from _leaves(value) if isinstance(value, dict) else (value,)


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
  """Orbax logs a failed save (a full disk) from its threads in lines of its own before the
  exception that import_checkpoint reports in one line naming the workdir: silenced."""
  logger = logging.getLogger('absl')
  level = logger.level
  logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    logger.setLevel(level)


def _write_workdir(root: pathlib.Path, directory: pathlib.Path, cfg: ModelConfig,
                   params: dict, hf: Mapping[str, Any], separate: bool,
                   stop_here: Callable[[], None]) -> None:
  from transformer_nmt.checkpoint import Checkpointer
  from transformer_nmt.typed_config import sections
  from transformer_nmt.workdir import Workdir
  wd = Workdir(root)
  src_path, tgt_path = wd.tokenizer_paths(joint=False)
  for name, path in (('source.spm', src_path), ('target.spm', tgt_path)) + (
      () if separate else (('vocab.json', wd.piece_table),)):
    shutil.copyfile(directory / name, path)
    stop_here()
  if separate:  # the workdir has one table file: each side's under its SentencePiece model
    PieceTable.write_tables(wd.piece_table, [
        (spm, PieceTable(directory / name).index)
        for spm, name in ((src_path, 'vocab.json'), (tgt_path, TARGET_VOCAB))])
  src_tok, tgt_tok = Tokenizer(src_path, wd.piece_table), Tokenizer(tgt_path, wd.piece_table)
  config = default_config()
  config.model.update({k: v for k, v in dataclasses.asdict(cfg).items() if k not in PROGRAM_SET})
  config.data.joint_vocab = False  # two SentencePiece models, one piece table
  # Marian's position table ends at max_position_embeddings; longer lines are split.
  config.decode.max_input_len = min(config.decode.max_input_len,
                                    int(hf.get('max_position_embeddings', 1024)))
  wd.write_config(sections(config).to_dict(), cfg,
                  {'src': src_tok.fingerprint, 'tgt': tgt_tok.fingerprint})
  with _quiet_orbax():
    ckpt = Checkpointer(wd.checkpoints, keep=1)
    try:
      ckpt.save_params(0, params)
    finally:
      ckpt.close()  # waits for Orbax's threads

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

The workdir gets config.json, spm.src.model, spm.tgt.model, vocab.json and one checkpoint of
the parameters alone (step 0), so that decode.py, the Engine, export_ctranslate2.py and
train.init_from read it as a trained run. It is written beside its final name, as a hidden
.NAME.PID@HOST.XXXXXXXX.partial directory, and renamed when complete. A refusal or an error
(a full disk) removes it. Ctrl-C and SIGTERM (in the main thread) stop the import at the next
point where it can stop cleanly (Orbax's save finished) and remove it too, raising Stopped; a
second Ctrl-C stops at once. What no handler sees (SIGKILL, a power cut) or that second
Ctrl-C can leave it; the next import into the same workdir removes it once the process
named in it is gone from this host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import pathlib
import pickle
import re
import shutil
import signal
import socket
import tempfile
import threading
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from transformer_nmt.config import PROGRAM_SET, ModelConfig, default_config
from transformer_nmt.data.tokenizer import PieceTable, Tokenizer
from transformer_nmt.errors import DataError
from transformer_nmt.files import current_umask

ACTIVATIONS = {'swish': 'swish', 'silu': 'swish', 'relu': 'relu', 'gelu': 'gelu'}
# Options of older Marian/BART configs that change the model, with the value that does not.
UNSUPPORTED = {'normalize_before': False, 'normalize_embedding': False,
               'layernorm_embedding': False, 'add_final_layer_norm': False,
               'add_bias_logits': False, 'static_position_embeddings': True,
               'share_encoder_decoder_embeddings': True, 'tie_word_embeddings': True,
               'is_encoder_decoder': True}
FILES = ('source.spm', 'target.spm', 'vocab.json')


class MarianError(DataError):
  """A checkpoint directory that cannot be imported; the message names the file or option."""


class Stopped(KeyboardInterrupt):
  """Ctrl-C or SIGTERM (`signum`) stopped an import; what it had written is removed."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


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
  vocab = hf.get('vocab_size')
  if hf.get('decoder_vocab_size') not in (None, vocab):
    raise MarianError(f"{where}: decoder_vocab_size={hf['decoder_vocab_size']} differs from "
                      f'vocab_size={vocab} (separate vocabularies are not supported)')
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
        vocab_size=int(vocab), src_vocab_size=int(vocab), d_model=int(hf['d_model']),
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


def convert(tensors: Mapping[str, np.ndarray], cfg: ModelConfig,
            source: str = 'the checkpoint') -> dict:
  """Marian's tensors as our parameter tree for `cfg` (every shape checked against it).

  Linear weights are [out, in] there and kernels [in, out] here; the one embedding table
  [V, D] serves source, target and the tied output projection in both.
  """
  t = dict(tensors)

  def take(name: str) -> np.ndarray:
    if name not in t:
      raise MarianError(f'{source} lacks the tensor {name}')
    return np.asarray(t.pop(name), np.float32)

  def dense(prefix: str) -> dict:
    return {'kernel': take(f'{prefix}.weight').T, 'bias': take(f'{prefix}.bias')}

  def norm(prefix: str) -> dict:
    return {'scale': take(f'{prefix}.weight'), 'bias': take(f'{prefix}.bias')}

  def attention(prefix: str) -> dict:
    return {ours: dense(f'{prefix}.{theirs}') for ours, theirs in
            (('query', 'q_proj'), ('key', 'k_proj'), ('value', 'v_proj'), ('out', 'out_proj'))}

  params: dict[str, Any] = {'tgt_embed': {'embedding': _one_embedding(t, source)}}
  for i in range(cfg.encoder_depth):
    p = f'model.encoder.layers.{i}'
    params[f'encoder_layers_{i}'] = {
        'self_attention': attention(f'{p}.self_attn'), 'norms_0': norm(f'{p}.self_attn_layer_norm'),
        'ffn': {'wi': dense(f'{p}.fc1'), 'wo': dense(f'{p}.fc2')},
        'norms_1': norm(f'{p}.final_layer_norm')}
  for i in range(cfg.decoder_depth):
    p = f'model.decoder.layers.{i}'
    params[f'decoder_layers_{i}'] = {
        'self_attention': attention(f'{p}.self_attn'), 'norms_0': norm(f'{p}.self_attn_layer_norm'),
        'cross_attention': attention(f'{p}.encoder_attn'),
        'norms_1': norm(f'{p}.encoder_attn_layer_norm'),
        'ffn': {'wi': dense(f'{p}.fc1'), 'wo': dense(f'{p}.fc2')},
        'norms_2': norm(f'{p}.final_layer_norm')}
  params['final_logits_bias'] = take('final_logits_bias').reshape(-1)
  _check_positions(t, cfg, source)
  if t:
    raise MarianError(f'{source} has tensors this model does not use, e.g. {sorted(t)[0]} '
                      f'({len(t)} in all): another layout')
  _check_shapes(params, cfg, source)
  return params


def _one_embedding(t: dict[str, np.ndarray], source: str) -> np.ndarray:
  """The shared [V, D] table; its tied copies (encoder, decoder, lm_head) must equal it."""
  names = ('model.shared.weight', 'model.encoder.embed_tokens.weight',
           'model.decoder.embed_tokens.weight', 'lm_head.weight')
  found = [(n, t.pop(n)) for n in names if n in t]
  if not found:
    raise MarianError(f'{source} lacks the embedding table (model.shared.weight)')
  for name, table in found[1:]:
    if table.shape != found[0][1].shape or not np.array_equal(table, found[0][1]):
      raise MarianError(f'{source}: {name} differs from {found[0][0]}: untied embeddings or '
                        'output layer are not supported')
  return np.asarray(found[0][1], np.float32)


def _check_positions(t: dict[str, np.ndarray], cfg: ModelConfig, source: str) -> None:
  """Stored position tables (older checkpoints keep them) must be our 'halves' sinusoids, up
  to the rounding of the type they are stored in: float16 rounds sines of up to 1 by up to
  4.9e-4, bfloat16 by 3.9e-3 (half of each type's eps); learned tables differ by far more."""
  import jax.numpy as jnp
  import ml_dtypes

  from transformer_nmt.model.layers import sinusoidal_positions
  for name in ('model.encoder.embed_positions.weight', 'model.decoder.embed_positions.weight'):
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


def check_tokenizers(directory: pathlib.Path, hf: Mapping[str, Any]) -> None:
  """MarianError unless source.spm, target.spm and vocab.json load and fit config.json."""
  for name in FILES:
    if not (directory / name).is_file():
      raise MarianError(f'{directory} has no {name}')
  try:
    table = PieceTable(directory / 'vocab.json')
    for name in FILES[:2]:
      Tokenizer(directory / name, directory / 'vocab.json')
  except DataError as e:
    raise MarianError(str(e)) from None
  vocab = hf.get('vocab_size')
  for what, ours, theirs in (('pieces', len(table.pieces), vocab),
                             ("'<pad>' id", table.pad_id, hf.get('pad_token_id')),
                             ("'</s>' id", table.eos_id, hf.get('eos_token_id'))):
    if ours != theirs:
      raise MarianError(f'{directory / "vocab.json"} does not match config.json: {ours} {what} '
                        f'there, {theirs} in config.json')


def import_checkpoint(directory: str | os.PathLike, workdir: str | os.PathLike) -> ModelConfig:
  """Writes the workdir of the Marian checkpoint in `directory` (module docstring); returns
  its model config. MarianError (nothing written) when it cannot be imported, `workdir`
  exists and is not empty or cannot be made, or its disk is too full; Stopped (nothing
  written) on Ctrl-C or SIGTERM."""
  with _stops() as stop_here:
    return _import(pathlib.Path(directory), pathlib.Path(workdir), stop_here)


def _import(directory: pathlib.Path, out: pathlib.Path, stop_here: Callable[[], None]
            ) -> ModelConfig:
  try:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
      raise MarianError(f'--workdir={out} exists and is not empty; choose a new directory')
  except OSError as e:
    raise MarianError(f'--workdir={out}: cannot look into it ({e.strerror})') from None
  config_file = directory / 'config.json'
  try:
    hf = json.loads(config_file.read_text(encoding='utf-8'))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise MarianError(f'cannot read {config_file}: {e}') from None
  if not isinstance(hf, dict):
    raise MarianError(f'{config_file} is not a JSON object')
  cfg = model_config(hf, str(config_file))
  check_tokenizers(directory, hf)
  tensors = read_tensors(directory)
  stop_here()
  params = convert(tensors, cfg, str(directory))
  del tensors
  stop_here()
  needed = (sum((directory / name).stat().st_size for name in FILES) + 2 ** 18  # + metadata
            + int(1.1 * sum(x.nbytes for x in _leaves(params))))
  partial = _partial_directory(out)
  try:
    free = shutil.disk_usage(partial).free
    if free < needed:  # refused before Orbax's threads fail with a page of logging
      raise MarianError(_no_space(out, needed, free))
    _write_workdir(partial, directory, cfg, params, hf, stop_here)
    os.chmod(partial, 0o777 & ~current_umask())  # mkdtemp makes it private
    stop_here()  # the last point: a signal after it finds the import complete
    if out.exists():
      out.rmdir()  # empty (checked above): rename(2) then puts the workdir in its place
    os.replace(partial, out)
  except BaseException as e:
    shutil.rmtree(partial, ignore_errors=True)
    # Named for the workdir: shutil's error names the file copied, Orbax's its own temporary.
    if isinstance(e, Exception) and _is_full_disk(e):
      raise MarianError(_no_space(out, needed)) from None
    raise
  return cfg


@contextlib.contextmanager
def _stops() -> Iterator[Callable[[], None]]:
  """SIGINT and SIGTERM only noted while importing; the function yielded raises Stopped at
  the points where stopping is clean. An exception raised by the handler itself would land
  wherever Python is: in Orbax's threads' machinery, whose writes then go on into what the
  cleanup removes, or in a garbage-collection callback, where it is lost. A second Ctrl-C
  raises KeyboardInterrupt at once. Outside the main thread (no handlers there) nothing is
  noted."""
  if threading.current_thread() is not threading.main_thread():
    yield lambda: None
    return
  received: list[int] = []

  def note(signum: int, frame: Any) -> None:
    del frame
    if received and signum == signal.SIGINT:
      raise KeyboardInterrupt
    received.append(signum)

  def stop_here() -> None:
    if received:
      raise Stopped(received[0])

  # A signal ignored by whoever started us (a background job's SIGINT) stays ignored.
  previous = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)
              if signal.getsignal(s) is not signal.SIG_IGN}
  try:
    yield stop_here
  finally:
    for s, handler in previous.items():  # None: one not set from Python
      signal.signal(s, signal.SIG_DFL if handler is None else handler)


def _leaves(tree: Any) -> Iterator[np.ndarray]:
  for value in tree.values():
    yield from _leaves(value) if isinstance(value, dict) else (value,)


def _no_space(out: pathlib.Path, needed: int, free: int | None = None) -> str:
  """The line for a full disk; `free`: measured before writing (unknown once the disk has
  filled while writing, with what was written since removed)."""
  return (f'no space left on the disk of --workdir={out}: the import needs about '
          f'{needed / 1e6:.1f} MB, '
          + ('the disk filled while writing' if free is None else f'{free / 1e6:.1f} MB are free')
          + '; free some and run again (nothing was written)')


def _is_full_disk(error: BaseException | None) -> bool:
  """Whether `error` or one it was raised from or during is ENOSPC (or a full quota); Orbax
  and TensorStore wrap it in their own exceptions, sometimes as text only."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if getattr(error, 'errno', None) in (errno.ENOSPC, errno.EDQUOT) or any(
        text in str(error) for text in ('No space left on device', 'Disk quota exceeded')):
      return True
    error = error.__cause__ or error.__context__
  return False


def _partial_directory(out: pathlib.Path) -> pathlib.Path:
  """A new empty hidden directory beside `out`, named for this process and host so that a
  later import can tell whether its writer is gone (module docstring); earlier imports' that
  are left behind by a killed process are removed first. MarianError if it cannot be made."""
  host = re.sub(r'[^A-Za-z0-9.-]', '_', socket.gethostname())
  try:
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out, host)
    return pathlib.Path(tempfile.mkdtemp(prefix=f'.{out.name}.{os.getpid()}@{host}.',
                                         suffix='.partial', dir=out.parent))
  except OSError as e:
    file = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if file is not None:
      raise MarianError(f'--workdir={out}: {file} is a file, not a directory') from None
    raise MarianError(f'--workdir={out}: cannot create it in {out.parent} ({e.strerror})'
                      ) from None


def _remove_stale_partials(out: pathlib.Path, host: str) -> None:
  pattern = re.compile(re.escape(f'.{out.name}.') + r'(\d+)@' + re.escape(host)
                       + r'\.[a-z0-9_]+\.partial')
  for entry in out.parent.iterdir():
    match = pattern.fullmatch(entry.name)
    if match and entry.is_dir() and not _alive(int(match.group(1))):
      shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)  # signal 0: only whether the process exists
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's
    pass
  return True


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
                   params: dict, hf: Mapping[str, Any], stop_here: Callable[[], None]) -> None:
  from transformer_nmt.checkpoint import Checkpointer
  from transformer_nmt.typed_config import sections
  from transformer_nmt.workdir import Workdir
  wd = Workdir(root)
  src_path, tgt_path = wd.tokenizer_paths(joint=False)
  for name, path in (('source.spm', src_path), ('target.spm', tgt_path),
                     ('vocab.json', wd.piece_table)):
    shutil.copyfile(directory / name, path)
    stop_here()
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

"""Load a trained workdir and translate sentences in length-sorted token-budget batches."""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from transformer_nmt.checkpoint import Checkpointer
from transformer_nmt.config import ModelConfig
from transformer_nmt.data import batching as data_lib
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.decoding.translate import CompactingTranslate, translate
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.workdir import Workdir


@dataclasses.dataclass
class LoadedModel:
  """A workdir's model config, parameters, tokenizers and which checkpoints they come from."""

  cfg: ModelConfig
  params: Any
  src_tok: Tokenizer
  tgt_tok: Tokenizer
  steps: list[int]
  config: dict  # the resolved training config (config.json)


def load_workdir(workdir: str | pathlib.Path, checkpoint: Optional[int] = None,
                 average_last: int = 0, best: bool = False) -> LoadedModel:
  """Restores parameters from one checkpoint (latest by default) or the mean of the last N;
  with `best`, from the checkpoint of highest validation BLEU (workdir/best) instead.

  The paper averaged the last 5 (base) or 20 (big) checkpoints, written every 10 minutes.
  """
  wd = Workdir(workdir)
  if not wd.config.exists():
    raise DataError(f'{workdir} is not a training workdir (no {wd.config.name})')
  config = wd.read_config()
  cfg = ModelConfig(**config['resolved_model'])
  src_tok, tgt_tok = _tokenizers(wd)
  if best and (checkpoint is not None or average_last):
    raise ConfigError('--best picks one checkpoint; drop --checkpoint and --average_last')
  directory = wd.checkpoint_dir(best)
  if best and not directory.exists():
    raise DataError(f'{workdir} has no best checkpoint (train.keep_best was off or no '
                    'evaluation has run yet)')
  ckpt = Checkpointer(directory, read_only=True)
  steps = _choose_steps(ckpt.all_steps(), workdir, checkpoint, average_last)
  params = average_params([ckpt.restore_params(step) for step in steps])
  ckpt.close()
  _check_vocab(params, cfg, tgt_tok)
  return LoadedModel(cfg, params, src_tok, tgt_tok, steps, config)


def _tokenizers(wd: Workdir) -> tuple[Tokenizer, Tokenizer]:
  paths = wd.existing_tokenizer_paths()
  if paths is None:
    raise DataError(f'{wd.root} has no SentencePiece model ({wd.tokenizer_paths(True)[0].name})')
  src = Tokenizer(paths[0])
  return src, src if paths[1] == paths[0] else Tokenizer(paths[1])


def _choose_steps(available: Sequence[int], workdir: pathlib.Path, checkpoint: Optional[int],
                  average_last: int) -> list[int]:
  available = sorted(available)
  if not available:
    raise DataError(f'{workdir} has no checkpoints')
  if checkpoint is not None and average_last:
    raise ConfigError('give either --checkpoint or --average_last, not both')
  if checkpoint is not None:
    if checkpoint not in available:
      raise DataError(f'{workdir} has no checkpoint at step {checkpoint}; available: {available}')
    return [checkpoint]
  if average_last > len(available):
    raise DataError(f'--average_last={average_last} but {workdir} keeps only {len(available)} '
                    f'checkpoints: {available}')
  return available[-max(average_last, 1):]


def average_params(trees: Sequence[Any]) -> Any:
  """Elementwise mean of parameter pytrees (float32)."""
  return jax.tree_util.tree_map(lambda *xs: np.mean(np.stack(xs), axis=0), *trees)


def _check_vocab(params: Any, cfg: ModelConfig, tok: Tokenizer) -> None:
  table = params['tgt_embed']['embedding']
  if table.shape[0] != tok.vocab_size or cfg.vocab_size != tok.vocab_size:
    raise DataError(f'tokenizer {tok.path} has {tok.vocab_size} pieces but the checkpoint\'s '
                    f'vocabulary has {table.shape[0]}; they do not belong together')


class Translator:
  """Translates token-id rows in length buckets (one compile per bucket) and keeps the order."""

  def __init__(self, cfg: ModelConfig, src_tok: Tokenizer, tgt_tok: Tokenizer, *,
               beam_size: int = 4, alpha: float = 0.6, max_extra_len: int = 50,
               tokens_per_batch: int = 4096, chunk: int = 4, cache_mode: str = 'cached',
               temperature: float = 0.0, top_k: int = 0, seed: int = 0,
               grow_cache: bool = True, beam_stop: str = 'bound', compact: bool = True):
    """`compact` drops finished sentences every `chunk` steps (translate.CompactingTranslate,
    'cached' decoding only); without it each batch runs as one jitted loop (translate.translate)
    that checks every `chunk` steps whether all its rows are done. Chunks of 4 rather than 8
    steps: 0.95-1.3x as fast with compaction on test2016, mostly faster (bench/RESULTS.md);
    more shapes to compile."""
    self.src_tok, self.tgt_tok, self.tokens_per_batch = src_tok, tgt_tok, tokens_per_batch
    self._rng = jax.random.key(seed)  # sampling only: batch i uses fold_in(rng, i)
    search = dict(bos_id=tgt_tok.bos_id, eos_id=tgt_tok.eos_id, pad_id=tgt_tok.pad_id,
                  beam_size=beam_size, alpha=alpha, max_extra_len=max_extra_len, chunk=chunk,
                  temperature=temperature, top_k=top_k, beam_stop=beam_stop)
    self.compact = compact and cache_mode == 'cached'
    if self.compact:
      self._translate = CompactingTranslate(cfg, **search)
    else:
      self._translate = jax.jit(functools.partial(translate, cfg, cache_mode=cache_mode,
                                                  grow_cache=grow_cache, **search))

  def translate_ids(self, params: Any, rows: Sequence[np.ndarray],
                    progress: Optional[Callable[[int], None]] = None) -> list[np.ndarray]:
    """rows: source ids ending in EOS -> output ids (without EOS), in the order of `rows`."""
    out: list[np.ndarray] = [np.zeros(0, np.int32)] * len(rows)
    if not rows:
      return out
    lengths = np.array([len(r) for r in rows])
    boundaries = data_lib.bucket_boundaries(int(lengths.max()))
    # Compacting decoding starts a bucket's last batch at its sentences rounded up to 8 rows
    # (filler rows would fill the first chunks); the one-loop path keeps powers of two.
    plans = data_lib.trim_rows(data_lib.plan_batches(lengths, boundaries, self.tokens_per_batch),
                               power_of_two=not self.compact)
    for i, plan in enumerate(plans):
      src, segments, _ = data_lib.pad_rows(rows, plan, self.src_tok.pad_id)
      ids = np.asarray(self._translate(params, src, segments,
                                       rng=jax.random.fold_in(self._rng, i)))  # [rows, S+extra]
      for row, example in enumerate(plan.examples):
        out[example] = _strip(ids[row], self.tgt_tok.eos_id)
      if progress is not None:
        progress(len(plan.examples))
    return out

  def translate_lines(self, params: Any, lines: Sequence[str],
                      progress: Optional[Callable[[int], None]] = None) -> list[str]:
    """Sentences -> translations; an empty line gives an empty line."""
    keep = [i for i, line in enumerate(lines) if line.strip()]
    encoded = self.src_tok.encode([lines[i] for i in keep])
    rows = [np.array(ids + [self.src_tok.eos_id], np.int32) for ids in encoded]
    outputs = self.translate_ids(params, rows, progress)
    texts = self.tgt_tok.decode([o.tolist() for o in outputs])
    result = [''] * len(lines)
    for i, text in zip(keep, texts):
      result[i] = text
    return result


def _strip(ids: np.ndarray, eos_id: int) -> np.ndarray:
  ends = np.flatnonzero(ids == eos_id)
  return ids[:ends[0]] if len(ends) else ids

"""The command-line options of the programs that load an engine (decode.py): which model
(workdirs, checkpoints, precision, stored programs, threads) and changes to its run's search
settings, one flag per DecodeConfig option. Defined here once, so that every such program
offers the same flags with the same help."""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any, Optional, Sequence

from absl import flags

from transformer_nmt.cli import use_compile_cache
from transformer_nmt.decoding.settings import BEAM_STOPS, DECODE, MBR_UTILITIES, DecodeConfig
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.inference.loading import LATEST, CheckpointChoice, LoadedModel, load_model
from transformer_nmt.runtime import heap
from transformer_nmt.workdir import Workdir

_RUN = " (default: the run's decode.{}, normally {})"
# flag -> (DecodeConfig option it changes, help); each defaults to the run's own value
DECODE_FLAGS = {
    'beam_size': ('beam_size', 'Beam size (1 = greedy).'),
    'alpha': ('alpha', 'Length penalty exponent.'),
    'beam_stop': ('beam_stop', "When a sentence's search ends: bound = once no live beam can "
                  'beat its best finished hypothesis (tensor2tensor, the paper); k_finished = '
                  'also once beam_size hypotheses have finished (OpenNMT, CTranslate2; fewer '
                  'steps).'),
    'compact': ('compact', 'Drop finished sentences from a batch every --chunk steps (faster); '
                '--nocompact runs each batch as one jitted loop until its last sentence ends.'),
    'chunk': ('chunk', 'Decoding steps between checks for finished sentences (and, with '
              '--compact, between compactions).'),
    'batch_tokens': ('tokens_per_batch', 'Padded source tokens per batch.'),
    'max_extra_len': ('max_extra_len', 'Output limit = input length + this.'),
    'split_len': ('split_len', 'Lines of more source subwords than this are translated in '
                  "pieces split at sentence ends (0 = the run's data.max_len, the longest line "
                  'the model trained on).'),
    'max_input_len': ('max_input_len', 'Longest source sentence in subword tokens: a longer '
                      'one is cut into pieces of this length, counted on stderr.'),
    'temperature': ('temperature', 'Sample with this temperature instead of searching '
                    '(research extra; 0 = off).'),
    'top_k': ('top_k', 'When sampling, only from the k likeliest tokens (0 = all).'),
    'seed': ('seed', 'Sampling seed.'),
    'min_len': ('min_len', 'At least this many subwords before EOS (0 = no minimum; the paper '
                'uses none).'),
    'max_len': ('max_len', 'At most this many subwords before EOS, whatever the input length '
                '(0 = only --max_extra_len).'),
    'no_repeat_ngram': ('no_repeat_ngram', 'No n-gram of this many subwords twice in one output '
                        '(0 = off).'),
    'batch_invariant': ('batch_invariant', "On a CPU, the same translation of a sentence in "
                        'any batch (serve.py answers as decode.py does when both have it): '
                        "XLA sums without YNNPACK's reductions, whose order depends on the "
                        "batch's shape; large batches decode slower."),
    'mbr': ('mbr', 'Minimum Bayes risk: output the hypothesis of the beam with the highest '
            'expected sentence BLEU or chrF against the others, weighted by model probability, '
            'instead of the likeliest (off = the paper).'),
}
_CHOICES = {'beam_stop': list(BEAM_STOPS), 'mbr': ['off', *MBR_UTILITIES]}


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  """Which model an engine loads and how it runs (see `define_model_flags` for each)."""

  workdirs: tuple[str, ...]
  choice: CheckpointChoice = LATEST
  dtype: Optional[str] = None
  programs: bool = True
  compile_cache: bool = True
  malloc_heaps: int = -1
  concurrent_batches: int = 0

  def program_dir(self) -> Optional[pathlib.Path]:
    """Where compiled programs are kept: the first workdir's programs/ (None: --noprograms)."""
    return Workdir(self.workdirs[0]).programs if self.programs else None

  def limit_heaps(self, compiling: bool = False) -> None:
    """--malloc_heaps (heap.py), before any thread allocates: a thread keeps the heap it
    first takes. A count given outright that this C library cannot set is said on stderr."""
    count = self.malloc_heaps
    if count < -1:
      raise DataError(f'--malloc_heaps={count} must be -1 (automatic), 0 (the default) or '
                      'positive')
    heaps = heap.heaps_for(count, self.program_dir(), compiling=compiling)
    if heaps > 0 and not heap.limit_heaps(heaps) and count > 0:
      print(f'--malloc_heaps={count}: this C library cannot limit its heaps (glibc only); '
            'ignored', file=sys.stderr)

  def load(self, overrides: dict[str, Any]) -> LoadedModel:
    """The model these options name, its run's decode settings changed by `overrides`
    (`with_overrides`); with --noprograms JAX's compilation cache in the first workdir
    (before loading, which compiles too)."""
    if self.compile_cache and not self.programs:
      use_compile_cache(str(Workdir(self.workdirs[0]).compile_cache))
    return load_model(self.workdirs, self.choice, dtype=self.dtype, snapshot=self.programs,
                      settings=lambda run: with_overrides(run, overrides))


def define_checkpoint_flags() -> None:
  """--checkpoint, --best, --ema, --average_last: a `CheckpointChoice` (`checkpoint_choice`),
  for every program that loads a workdir's weights."""
  flags.DEFINE_integer('checkpoint', None, 'Checkpoint step (default: latest).')
  flags.DEFINE_bool('best', False, 'Use the checkpoint with the best validation BLEU.')
  flags.DEFINE_bool('ema', True, 'Use the moving average of the weights when the run kept one '
                    '(train.ema_decay); --noema for the raw weights.')
  flags.DEFINE_integer('average_last', 0, 'Average the last N checkpoints (paper: base 5, '
                       'big 20).')


def checkpoint_choice() -> CheckpointChoice:
  """The value of `define_checkpoint_flags`' flags; a ConfigError when they do not go
  together."""
  f = flags.FLAGS
  return CheckpointChoice(f.checkpoint, f.average_last, f.best, f.ema)


def define_model_flags() -> None:
  """--workdir (repeatable: an ensemble), the checkpoint flags (`define_checkpoint_flags`),
  --dtype, --programs, --compile_cache, --malloc_heaps, --concurrent_batches."""
  flags.DEFINE_multi_string('workdir', None, 'Training workdir; repeat it for an ensemble '
                            '(log-probabilities averaged at every step; the members must '
                            'share their vocabularies; search settings from the first).',
                            required=True)
  define_checkpoint_flags()
  flags.DEFINE_enum('dtype', None, ['float32', 'bfloat16'], 'Compute precision (activations, '
                    'products, caches; the Dense kernels are cast to it once at load, the '
                    'other parameters stay float32); outputs differ between the two (speeds: '
                    "docs/decoding.md). Default: the run's model.dtype, except float32 for a "
                    'bfloat16 run on a CPU without bfloat16 instructions (AVX512-BF16, AMX, '
                    "Arm's BF16), where float32 decodes faster.")
  flags.DEFINE_bool('programs', True, 'Keep the compiled decoding programs in WORKDIR/programs, '
                    'so a later run with the same settings calls the ones it needs without '
                    'tracing or compiling them (programs of another jax, backend, code or '
                    'settings are left alone), and the restored parameters in '
                    'WORKDIR/programs/params, which a later run of the same checkpoints reads '
                    'without Orbax.')
  flags.DEFINE_bool('compile_cache', True, 'With --noprograms: keep compiled programs in '
                    'WORKDIR/compile_cache (or in $JAX_COMPILATION_CACHE_DIR), so a later run '
                    'with the same batch shapes skips most compilation (JAX persistent cache; '
                    'it still traces every program).')
  flags.DEFINE_integer('malloc_heaps', -1, "Heaps (arenas) of glibc's malloc for this process "
                       '(glibc only): -1 (automatic): 2 when WORKDIR/programs holds stored '
                       'programs (not with --precompile), else the default; 0: the default (up '
                       'to 8 per core); N: at most N. Fewer heaps fragment less (measurements: '
                       'docs/decoding.md).')
  flags.DEFINE_integer('concurrent_batches', 0, 'Batches decoded at once, each by a thread (0: '
                       '2 on a CPU, 1 on an accelerator); a job of one batch is cut into this '
                       'many, so on a CPU a rare translation depends on the value unless '
                       '--batch_invariant.')


def model_options() -> ModelOptions:
  """The values of `define_model_flags`' flags."""
  f = flags.FLAGS
  return ModelOptions(tuple(f.workdir), checkpoint_choice(), f.dtype, f.programs,
                      f.compile_cache, f.malloc_heaps, f.concurrent_batches)


def define_decode_flags(names: Sequence[str] = tuple(DECODE_FLAGS)) -> None:
  """One flag per DecodeConfig option in DECODE_FLAGS (or those of them `names` lists: a
  program that changes only some, recipe.py and aot_compile.py), of that option's type,
  unset (None) unless given: the run's own value stays."""
  for flag in names:
    option, help_text = DECODE_FLAGS[flag]
    default = getattr(DECODE, option)
    text = help_text + _RUN.format(option, default)
    if option in _CHOICES:
      flags.DEFINE_enum(flag, None, _CHOICES[option], text)
    elif isinstance(default, bool):
      flags.DEFINE_bool(flag, None, text)
    elif isinstance(default, int):
      flags.DEFINE_integer(flag, None, text)
    else:
      flags.DEFINE_float(flag, None, text)


def decode_overrides(names: Sequence[str] = tuple(DECODE_FLAGS)) -> dict[str, Any]:
  """The DecodeConfig options given by `define_decode_flags(names)`' flags: option -> value."""
  values = {flag: getattr(flags.FLAGS, flag) for flag in names}
  return {DECODE_FLAGS[flag][0]: v for flag, v in values.items() if v is not None}


def with_overrides(run: DecodeConfig, overrides: dict[str, Any]) -> DecodeConfig:
  """The run's decode section with the options given on the command line, checked; a bad
  value is a DataError naming the flag, not the config option."""
  try:
    return dataclasses.replace(run, **overrides)
  except ConfigError as e:
    message = str(e)
    for flag, (option, _) in DECODE_FLAGS.items():
      if option in overrides:
        message = message.replace(f'decode.{option}', f'--{flag}')
    raise DataError(message) from None

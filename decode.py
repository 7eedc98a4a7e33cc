"""Translate with a trained workdir: python decode.py --workdir DIR --input FILE --output FILE

Reads FILE (or stdin) in blocks of --buffer_lines, translates each block and writes its lines
before reading the next (one output line per input line; empty lines stay empty), so memory
stays bounded and a terminal gets each typed line back at once. With --reference it reads
the input whole and prints sacreBLEU with its signature and chrF.

--format jsonl writes one JSON object per input line: the source's subwords and up to
--n_best hypotheses, each with its text, length-normalised score, log-probability, subwords,
per-subword log-probabilities and alignment (forced decoding, decoding/scoring.py).
--score_reference FILE translates nothing: it scores FILE's lines as translations of the
input (text: "logprob<TAB>score" per line; jsonl: the same object with that one hypothesis).
--prefix FILE starts each translation with its line's target prefix; --resume continues an
interrupted run from OUTPUT.partial.

The compiled programs are kept in WORKDIR/programs, so a later run with the same settings
starts without compiling (decoding/programs.py); --precompile only fills it: with the
programs of small jobs (--precompile_rows, --precompile_length), then those FILE's batches
need with --input FILE.
"""

import contextlib
import json
import sys
import time
from typing import IO, Any, Callable, Iterator, Optional

from absl import app, flags

from transformer_nmt.cli import CompileCounter, flag_parser, main_running, use_compile_cache
from transformer_nmt.config import (
  BEAM_STOPS,
  DECODE,
  MBR_UTILITIES,
  PRECOMPILE_LENGTH,
  PRECOMPILE_ROWS,
  DecodeConfig,
)

_WORKDIR = flags.DEFINE_multi_string('workdir', None, 'Training workdir; repeat it for an '
                                     'ensemble (log-probabilities averaged at every step; the '
                                     'members must share their vocabularies; search settings '
                                     'from the first).', required=True)
_CHECKPOINT = flags.DEFINE_integer('checkpoint', None, 'Checkpoint step (default: latest).')
_BEST = flags.DEFINE_bool('best', False, 'Use the checkpoint with the best validation BLEU.')
_EMA = flags.DEFINE_bool('ema', True, 'Use the moving average of the weights when the run '
                         'kept one (train.ema_decay); --noema for the raw weights.')
_AVERAGE = flags.DEFINE_integer('average_last', 0, 'Average the last N checkpoints (paper: '
                                'base 5, big 20).')
_INPUT = flags.DEFINE_string('input', '-', 'Source text, one sentence per line; - for stdin.')
_OUTPUT = flags.DEFINE_string('output', '-', 'Where translations go; - for stdout.')
_REFERENCE = flags.DEFINE_string('reference', None, 'Reference translations for scoring.')
# Search settings default to the run's config (its `decode` section, see config.DecodeConfig:
# the paper's beam 4, alpha 0.6, input length + 50), so a flag is only needed to change one.
_RUN = " (default: the run's decode.{}, normally {})"
_BEAM = flags.DEFINE_integer('beam_size', None, 'Beam size (1 = greedy).' +
                             _RUN.format('beam_size', DECODE.beam_size))
_ALPHA = flags.DEFINE_float('alpha', None, 'Length penalty exponent.' +
                            _RUN.format('alpha', DECODE.alpha))
_BEAM_STOP = flags.DEFINE_enum('beam_stop', None, list(BEAM_STOPS),
                               'When a sentence\'s search ends: bound = once no live beam can '
                               'beat its best finished hypothesis (tensor2tensor, the paper); '
                               'k_finished = also once beam_size hypotheses have finished '
                               '(OpenNMT, CTranslate2; fewer steps).' +
                               _RUN.format('beam_stop', DECODE.beam_stop))
_COMPACT = flags.DEFINE_bool('compact', None, 'Drop finished sentences from a batch every '
                             '--chunk steps (faster); --nocompact runs each batch as one jitted '
                             'loop until its last sentence ends.' +
                             _RUN.format('compact', DECODE.compact))
_CHUNK = flags.DEFINE_integer('chunk', None, 'Decoding steps between checks for finished '
                              'sentences (and, with --compact, between compactions).' +
                              _RUN.format('chunk', DECODE.chunk))
_DTYPE = flags.DEFINE_enum('dtype', None, ['float32', 'bfloat16'], 'Compute precision '
                           '(activations, products, caches; the Dense kernels are cast to it once '
                           'at load, the other parameters stay float32); outputs differ between '
                           'the two. bfloat16 beam search was '
                           '1.28x as fast as float32 on a CPU with bfloat16 matrix units (Intel '
                           'AMX; bench/RESULTS.md; not measured on CPUs without them). Default: '
                           "the run's model.dtype.")
_PRECOMPILE = flags.DEFINE_bool('precompile', False, 'Compile and store in WORKDIR/programs '
                                'the programs of small jobs (see --precompile_rows; also what '
                                'lines typed at a terminal need), then those the batches of '
                                '--input need (none when it is a terminal), writing no '
                                'translations: run it once on text like the text to come (the '
                                'validation set, say) and later runs start at once.')
_PRECOMPILE_ROWS = flags.DEFINE_integer('precompile_rows', PRECOMPILE_ROWS, 'With --precompile: '
                                        'the small jobs made ready are of up to this many '
                                        'sentences (0: none) ...')
_PRECOMPILE_LENGTH = flags.DEFINE_integer('precompile_length', PRECOMPILE_LENGTH, '... of up '
                                          'to this many source subwords, EOS included.')
_COMPILE_CACHE = flags.DEFINE_bool('compile_cache', True, 'With --noprograms: keep compiled '
                                   'programs in WORKDIR/compile_cache (or in '
                                   '$JAX_COMPILATION_CACHE_DIR), so a later run with the same '
                                   'batch shapes skips most compilation (JAX persistent cache; '
                                   'it still traces every program).')
_PROGRAMS = flags.DEFINE_bool('programs', True, 'Keep the compiled decoding programs in '
                              'WORKDIR/programs, so a later run with the same settings calls '
                              'the ones it needs without tracing or compiling them (programs '
                              'of another jax, backend, code or settings are left alone), and '
                              'the restored parameters in WORKDIR/programs/params, which a '
                              'later run of the same checkpoints reads without Orbax.')
_MALLOC_HEAPS = flags.DEFINE_integer(
    'malloc_heaps', -1, "Heaps (arenas) of glibc's malloc for this process (glibc only): -1 "
    '(automatic): 2 when WORKDIR/programs holds stored programs (not with --precompile), else '
    'the default; 0: the default (up to 8 per core); N: at most N. Fewer heaps fragment less: '
    'with its programs stored, 1000 lines of test2016 peaked at 0.96 GB with 2 heaps against '
    '1.04 GB (medians of nine runs, same speed), while a run that compiles its programs took '
    '8% longer (bench/RESULTS.md).')
_BATCH_TOKENS = flags.DEFINE_integer('batch_tokens', None, 'Padded source tokens per batch.' +
                                     _RUN.format('tokens_per_batch', DECODE.tokens_per_batch))
_MAX_EXTRA = flags.DEFINE_integer('max_extra_len', None, 'Output limit = input length + this.' +
                                  _RUN.format('max_extra_len', DECODE.max_extra_len))
_MAX_INPUT = flags.DEFINE_integer('max_input_len', None, 'Longest source in subword tokens: '
                                  'longer lines are translated in pieces split at sentence ends '
                                  '(a longer sentence is truncated), counted on stderr.' +
                                  _RUN.format('max_input_len', DECODE.max_input_len))
_TEMPERATURE = flags.DEFINE_float('temperature', None, 'Sample with this temperature instead '
                                  'of searching (research extra; 0 = off).')
_TOP_K = flags.DEFINE_integer('top_k', None, 'When sampling, only from the k likeliest tokens '
                              '(0 = all).')
_SEED = flags.DEFINE_integer('seed', None, 'Sampling seed.')
_MIN_LEN = flags.DEFINE_integer('min_len', None, 'At least this many subwords before EOS '
                                '(0 = no minimum; the paper uses none).')
_MAX_LEN = flags.DEFINE_integer('max_len', None, 'At most this many subwords before EOS, '
                                'whatever the input length (0 = only --max_extra_len).')
_NO_REPEAT = flags.DEFINE_integer('no_repeat_ngram', None, 'No n-gram of this many subwords '
                                  'twice in one output (0 = off).')
_MBR = flags.DEFINE_enum('mbr', None, ['off', *MBR_UTILITIES], 'Minimum Bayes risk: output the '
                         'hypothesis of the beam with the highest expected sentence BLEU or chrF '
                         'against the others, weighted by model probability, instead of the '
                         'likeliest (off = the paper).' + _RUN.format('mbr', DECODE.mbr))
# flag -> the decode option it overrides
_OVERRIDES = {'beam_size': _BEAM, 'alpha': _ALPHA, 'beam_stop': _BEAM_STOP, 'compact': _COMPACT,
              'chunk': _CHUNK, 'tokens_per_batch': _BATCH_TOKENS, 'max_extra_len': _MAX_EXTRA,
              'max_input_len': _MAX_INPUT, 'temperature': _TEMPERATURE, 'top_k': _TOP_K,
              'seed': _SEED, 'min_len': _MIN_LEN, 'max_len': _MAX_LEN,
              'no_repeat_ngram': _NO_REPEAT, 'mbr': _MBR}
DEFAULT_BUFFER = 2000  # lines per block of a file or pipe: memory stays bounded by a block
_BUFFER = flags.DEFINE_integer('buffer_lines', 0, 'Lines read, translated and written per block '
                               f'(0: 1 when stdin is a terminal, so that a typed line is '
                               f'translated at once, else {DEFAULT_BUFFER}).')
_CONCURRENT = flags.DEFINE_integer('concurrent_batches', 0, 'Batches decoded at once, each by a '
                                   'thread (0: 2 on a CPU, 1 on an accelerator); the outputs '
                                   'are the same for any value.')
_FORMAT = flags.DEFINE_enum('format', 'text', ['text', 'jsonl'], 'text: one translation per '
                            'line; jsonl: one JSON object per line with hypotheses and scores.')
_N_BEST = flags.DEFINE_integer('n_best', 1, 'Hypotheses per line, best first (at most the beam '
                               'size; more than 1 needs --format jsonl). A sentence can end '
                               'with fewer: the search stops once no live beam can win.')
_SCORE_REFERENCE = flags.DEFINE_string('score_reference', None, 'Score these translations of '
                                       'the input (one per line) instead of translating.')
_PREFIX = flags.DEFINE_string('prefix', None, 'Target prefixes, one per input line (empty: '
                             'none): each translation starts with its line\'s prefix and the '
                             'search continues after it.')
_RESUME = flags.DEFINE_bool('resume', False, 'Keep the translated lines in OUTPUT.partial as '
                            'they are written, with a record of what they translate in '
                            'OUTPUT.partial.json; a run interrupted before the end continues '
                            'after the last recorded line there (same input and flags: a '
                            'partial of other settings or input is refused), and '
                            'OUTPUT.partial becomes OUTPUT at the end.')
_TOKENIZED = flags.DEFINE_bool('tokenized_bleu', False, 'Also print paper-style tokenized BLEU.')
_PLOT = flags.DEFINE_string('plot_attention', None, 'Directory for cross-attention heatmaps.')
_PLOT_COUNT = flags.DEFINE_integer('plot_sentences', 3, 'How many sentences to plot.')


def _read(path: str) -> list[str]:
  from transformer_nmt.data import batching as data_lib
  if path == '-':
    return data_lib.split_lines(sys.stdin.buffer.read(), '<stdin>')
  return data_lib.read_lines(path)


def _check_output(path: str, sources: dict[str, str], workdirs: list[str]) -> None:
  """Before any work: the output can be written, and is none of the files read nor any
  file of the workdirs used (their tokenizer, config, checkpoints, ...)."""
  if path == '-':
    return
  import os
  import pathlib

  from transformer_nmt.errors import DataError
  from transformer_nmt.workdir import Workdir
  out = pathlib.Path(path).absolute()
  for workdir in workdirs:
    if Workdir(workdir).owns(out):
      raise DataError(f'--output={path} is a file of the workdir {workdir}: writing it would '
                      'damage the run; choose a path outside the workdir\'s own files')
  if out.is_dir():
    raise DataError(f'--output={path} is a directory')
  if out.exists() and not out.is_file():  # a device or pipe: replacing it would be wrong
    raise DataError(f'--output={path} is not a regular file; use --output=- for stdout')
  if not out.parent.is_dir():
    raise DataError(f'--output={path}: the directory {out.parent} does not exist')
  if not os.access(out.parent, os.W_OK):
    raise DataError(f'--output={path}: cannot write to {out.parent}')
  for flag, source in sources.items():
    if source and source != '-' and pathlib.Path(source).exists() and (
        out.resolve() == pathlib.Path(source).resolve()
        or out.exists() and os.path.samefile(out, source)):
      raise DataError(f'--output={path} is also the {flag} file: it would be overwritten')


@contextlib.contextmanager
def _output(path: str) -> Iterator[IO[str]]:
  """stdout, or a file written through a temporary one and renamed at the end, so that it is
  never left half-written (an interrupted run leaves the old file as it was)."""
  if path == '-':
    yield sys.stdout
    return
  from transformer_nmt.files import atomic_output
  with atomic_output(path) as f:
    yield f


def _input_blocks(path: str, size: int) -> Iterator[list[str]]:
  """The input in blocks of `size` lines (0: one line at a time from a terminal, else
  DEFAULT_BUFFER); the file is opened now, so that a missing one fails before any work."""
  from transformer_nmt.data import batching as data_lib
  from transformer_nmt.errors import DataError
  if path == '-':
    stream, name = sys.stdin.buffer, '<stdin>'
  else:
    try:
      stream, name = open(path, 'rb'), path
    except OSError as e:
      raise DataError(f'{path}: cannot read ({e.strerror})') from None
  if size == 0:
    size = 1 if path == '-' and sys.stdin.isatty() else DEFAULT_BUFFER
  return data_lib.line_blocks(stream, name, size)


class _Progress:
  """Prints 'translated n[/N] sentences' to stderr about every 10% of a known total, or
  every 10 seconds of a stream."""

  def __init__(self, total: Optional[int], enabled: bool):
    self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.time()
    self.next = max(1, total // 10) if total else 0
    self.next_time = self.t0 + 10.0

  def __call__(self, n: int) -> None:
    self.done += n
    due = self.done >= self.next if self.total else time.time() >= self.next_time
    if self.enabled and due:
      rate = self.done / max(time.time() - self.t0, 1e-9)
      of = f'/{self.total}' if self.total else ''
      print(f'translated {self.done}{of} sentences ({rate:.1f}/s)', file=sys.stderr)
      self.next += max(1, (self.total or 0) // 10)
      self.next_time = time.time() + 10.0


def _settings(run: DecodeConfig) -> DecodeConfig:
  """The run's decode section with the flags given on the command line."""
  import dataclasses

  from transformer_nmt.errors import ConfigError, DataError
  given = {name: flag.value for name, flag in _OVERRIDES.items() if flag.value is not None}
  try:
    return dataclasses.replace(run, **given).validate()
  except ConfigError as e:  # name the flags, not the config options
    message = str(e)
    for name in given:
      message = message.replace(f'decode.{name}', f'--{_OVERRIDES[name].name}')
    raise DataError(message) from None


def _header(model: Any, decode: DecodeConfig) -> str:
  """The stderr line saying what translates: members, checkpoints, search, precision."""
  from transformer_nmt.decoding import ensemble
  search = (f'sampling at temperature {decode.temperature}, top-k {decode.top_k}'
            if decode.temperature > 0 else
            f'beam {decode.beam_size}, alpha {decode.alpha}, stop {decode.beam_stop}' +
            (f', MBR {decode.mbr}' if decode.mbr != 'off' and decode.beam_size > 1 else ''))
  members = f'ensemble of {len(_WORKDIR.value)} models, ' if len(_WORKDIR.value) > 1 else ''
  cfgs = model.cfg if ensemble.is_ensemble(model.cfg) else [model.cfg]
  dtypes = '/'.join(sorted({c.dtype for c in cfgs}))
  return f'{members}checkpoint step(s) {model.steps}, {search}, {dtypes}'


def run() -> None:
  _limit_heaps()  # before any thread allocates: a thread keeps the heap it first takes
  _check_streams()
  _check_output(_OUTPUT.value, {'--input': _INPUT.value, '--reference': _REFERENCE.value,
                                '--score_reference': _SCORE_REFERENCE.value,
                                '--prefix': _PREFIX.value}, _WORKDIR.value)
  _check_modes()
  with _held_output():
    _translate()


def _check_streams() -> None:
  """A closed stdin or stdout (`<&-`, `>&-`: Python then has None for them) that this run
  would read or write is refused before any work, not met after it."""
  from transformer_nmt.errors import DataError
  if sys.stdin is None and _INPUT.value == '-':
    raise DataError('--input=- reads stdin, which is closed; give --input FILE')
  if sys.stdout is None and _OUTPUT.value == '-' and not _PRECOMPILE.value:
    raise DataError('--output=- writes to stdout, which is closed; give --output FILE')
  if sys.stdout is None and _REFERENCE.value:
    raise DataError('--reference prints its scores on stdout, which is closed')


@contextlib.contextmanager
def _held_output() -> Iterator[None]:
  """--output (and OUTPUT.partial) held by this run, so that a second decode.py writing it
  is refused (outputs.hold), with the temporary files that killed runs left beside it
  removed; nothing for stdout."""
  if _OUTPUT.value == '-':
    yield
    return
  from transformer_nmt import outputs
  from transformer_nmt.files import remove_stale_temporaries
  with outputs.hold(_OUTPUT.value):
    removed = remove_stale_temporaries(_OUTPUT.value)
    if removed:
      print(f'removed {len(removed)} temporary file(s) that an interrupted run left beside '
            f'{_OUTPUT.value}', file=sys.stderr)
    yield


def _translate() -> None:
  """What `run` does once the flags and the output are checked and the output is held."""
  import dataclasses

  from transformer_nmt.decoding import ensemble
  from transformer_nmt.decoding.translator import Translator, load_ensemble
  from transformer_nmt.errors import DataError
  from transformer_nmt.workdir import Workdir
  whole, beside = _read_whole()
  refs = beside.get('reference', beside.get('score_reference'))
  if _BUFFER.value < 0:
    raise DataError(f'--buffer_lines={_BUFFER.value} must be 0 (automatic) or positive')
  if _CONCURRENT.value < 0:
    raise DataError(f'--concurrent_batches={_CONCURRENT.value} must be 0 (automatic) or positive')
  blocks = iter([whole]) if whole is not None else _input_blocks(_INPUT.value, _BUFFER.value)
  _settings(DECODE)  # a bad flag fails before the model loads
  compiles = CompileCounter()
  if _COMPILE_CACHE.value and not _PROGRAMS.value:  # before loading, which compiles too
    use_compile_cache(str(Workdir(_WORKDIR.value[0]).compile_cache))
  model = load_ensemble(_WORKDIR.value, _CHECKPOINT.value, _AVERAGE.value, _BEST.value,
                        _EMA.value, snapshot=_PROGRAMS.value)
  decode = _settings(model.decode)
  cfg = ensemble.with_dtype(model.cfg, _DTYPE.value)
  # The kernels as the programs take them (Translator.as_computed), in place of the float32
  # ones: only one copy stays in memory.
  model = dataclasses.replace(model, cfg=cfg,
                              params=ensemble.kernels_as_computed(cfg, model.params))
  print(_header(model, decode), file=sys.stderr)
  if _N_BEST.value > decode.beam_size:
    raise DataError(f'--n_best={_N_BEST.value} must be at most the beam size ({decode.beam_size})')
  if _N_BEST.value > 1 and decode.temperature > 0:
    raise DataError(f'--n_best={_N_BEST.value}: sampling (--temperature) gives one hypothesis')
  programs = _program_dir()
  translator = Translator(model.cfg, model.src_tok, model.tgt_tok, decode, n_best=_N_BEST.value,
                          programs=programs, concurrent_batches=_CONCURRENT.value)
  if _SCORE_REFERENCE.value:
    _score_reference(translator, model, whole, refs)
    return
  if _PRECOMPILE.value:
    blocks = _precompile_small_jobs(translator, model.params, blocks)
  progress = _Progress(len(whole) if whole is not None else None, _INPUT.value != '-')
  t0 = time.time()
  keep = None if whole is not None else (_PLOT_COUNT.value if _PLOT.value else 0)
  count, tokens, kept = _write(translator, model, decode, blocks, progress, keep,
                               beside.get('prefix'))
  seconds = max(time.time() - t0, 1e-9)
  print(f'{count} sentences in {seconds:.1f} s (compilation included): '
        f'{count / seconds:.1f} sentences/s, {tokens / seconds:.0f} target tokens/s; '
        f'{compiles.summary()}{_stored(translator)}', file=sys.stderr)
  if _PRECOMPILE.value:
    _report_precompiled(translator.store)
  if _REFERENCE.value:
    _score([h for _, h in kept], refs)
  if _PLOT.value:
    from transformer_nmt.plots import plot_cross_attention
    lines, hyps = [s for s, _ in kept], [h for _, h in kept]
    for path in plot_cross_attention(model, lines, hyps, _PLOT.value, _PLOT_COUNT.value):
      print(f'wrote {path}', file=sys.stderr)


def _program_dir() -> Any:
  """The first workdir's WORKDIR/programs (a pathlib.Path), or None with --noprograms."""
  from transformer_nmt.workdir import Workdir
  return Workdir(_WORKDIR.value[0]).programs if _PROGRAMS.value else None


def _limit_heaps() -> None:
  """--malloc_heaps (decoding/heap.py); a count given outright that this C library cannot
  set is said on stderr."""
  from transformer_nmt.decoding import heap
  from transformer_nmt.errors import DataError
  count = _MALLOC_HEAPS.value
  if count < -1:
    raise DataError(f'--malloc_heaps={count} must be -1 (automatic), 0 (the default) or positive')
  heaps = heap.heaps_for(count, _program_dir(), compiling=_PRECOMPILE.value)
  if heaps > 0 and not heap.limit_heaps(heaps) and count > 0:
    print(f'--malloc_heaps={count}: this C library cannot limit its heaps (glibc only); '
          'ignored', file=sys.stderr)


def _write(translator: Any, model: Any, decode: DecodeConfig, blocks: Iterator[list[str]],
           progress: _Progress, keep: Optional[int], prefixes: Optional[list[str]]
           ) -> tuple[int, int, list[tuple[str, str]]]:
  """The blocks translated into --output: through OUTPUT.partial with --resume, nowhere
  with --precompile, else atomically (see `_translate_blocks` for what it returns)."""
  if _RESUME.value:
    from transformer_nmt import outputs
    with outputs.resume(_OUTPUT.value, _resume_settings(model, decode)) as partial:
      if partial.done:
        print(f'resuming after the {partial.done} lines in '
              f'{outputs.partial_path(_OUTPUT.value)}', file=sys.stderr)
      return _translate_blocks(translator, model, partial.skip(blocks), progress, keep,
                               partial.written)
  import os
  sink = open(os.devnull, 'w', encoding='utf-8') if _PRECOMPILE.value else None
  with contextlib.closing(sink) if sink else _output(_OUTPUT.value) as out:
    def write(_: list[str], text: str) -> None:
      out.write(text)
      out.flush()  # a block's translations are out before the next block is read
    return _translate_blocks(translator, model, blocks, progress, keep, write, prefixes)


def _resume_settings(model: Any, decode: DecodeConfig) -> dict[str, Any]:
  """What decides the translations, as --resume's record keeps it: a partial written with
  other settings is refused (outputs.resume)."""
  import dataclasses
  import pathlib

  from transformer_nmt.decoding import ensemble
  cfgs = model.cfg if ensemble.is_ensemble(model.cfg) else [model.cfg]
  return {'workdirs': [str(pathlib.Path(w).resolve()) for w in _WORKDIR.value],
          'checkpoint_steps': model.steps, 'best': _BEST.value, 'ema': _EMA.value,
          'dtypes': [c.dtype for c in cfgs], 'decode': dataclasses.asdict(decode),
          'format': _FORMAT.value, 'n_best': _N_BEST.value}


def _precompile_small_jobs(translator: Any, params: Any, blocks: Iterator[list[str]]
                           ) -> Iterator[list[str]]:
  """--precompile's first part: the programs of small jobs and of lines typed at a terminal
  (Translator.precompile). Returns the input's blocks still to compile for, none when the
  input is a terminal (nobody is going to type the validation set)."""
  t0 = time.time()
  shapes = translator.precompile(params, _PRECOMPILE_ROWS.value, _PRECOMPILE_LENGTH.value)
  print(f'{shapes} batch shapes of jobs of up to {_PRECOMPILE_ROWS.value} sentences of up to '
        f'{_PRECOMPILE_LENGTH.value} subwords made in {time.time() - t0:.1f} s', file=sys.stderr)
  return iter([]) if _INPUT.value == '-' and sys.stdin.isatty() else blocks


def _report_precompiled(store: Any) -> None:
  """--precompile's last line, or an error when nothing could be stored."""
  from transformer_nmt.errors import DataError
  if not store.writable:
    raise DataError(f'--precompile: the programs could not be stored in {store.root} (see the '
                    'warning above)')
  print(f'{store.saved} programs compiled and stored in {store.directory} ({store.loaded} '
        'were there already)', file=sys.stderr)


def _stored(translator: Any) -> str:
  """', N stored programs loaded' when the translator keeps its programs in the workdir."""
  store = translator.store
  return '' if store is None else f', {store.loaded} stored programs loaded'


def _read_whole() -> tuple[Optional[list[str]], dict[str, list[str]]]:
  """Scoring and prefixes need every line: the input read whole (None when none of them is
  asked for) and each of --reference, --score_reference, --prefix by flag name, line counts
  checked before any work."""
  from transformer_nmt.errors import DataError
  whole, beside = None, {}
  for flag in (_REFERENCE, _SCORE_REFERENCE, _PREFIX):
    if flag.value:
      whole = _read(_INPUT.value) if whole is None else whole
      beside[flag.name] = _read(flag.value)
      if len(beside[flag.name]) != len(whole):
        raise DataError(f'--{flag.name}={flag.value} has {len(beside[flag.name])} lines but '
                        f'the input has {len(whole)}')
  return whole, beside


def _translate_blocks(translator: Any, model: Any, blocks: Iterator[list[str]],
                      progress: _Progress, keep: Optional[int],
                      write: Callable[[list[str], str], None],
                      prefixes: Optional[list[str]] = None
                      ) -> tuple[int, int, list[tuple[str, str]]]:
  """Translates block after block, handing each block and its translations' text to `write`
  before the next block is read (`prefixes`: one per line, with a single block). Returns the
  sentence and target-token counts and the first `keep` (source, translation) pairs (all
  with None: for scoring)."""
  count = tokens = 0
  kept: list[tuple[str, str]] = []
  for block in blocks:
    if _FORMAT.value == 'jsonl':
      found = translator.hypotheses(model.params, block, progress, prefixes)
      hyps = [h[0].text if h else '' for _, h in found]
      write(block, ''.join(_json_line(source, h) for source, h in found))
    else:
      hyps = translator.translate_lines(model.params, block, progress, prefixes)
      write(block, ''.join(h + '\n' for h in hyps))
    count += len(block)
    tokens += sum(len(ids) + 1 for ids in model.tgt_tok.encode([h for h in hyps if h]))
    room = len(block) if keep is None else max(keep - len(kept), 0)
    kept += list(zip(block, hyps))[:room]
  return count, tokens, kept


def _check_modes() -> None:
  """Flags that do not go together, before any work."""
  from transformer_nmt.errors import DataError
  if _N_BEST.value < 1:
    raise DataError(f'--n_best={_N_BEST.value} must be at least 1')
  for flag in (_AVERAGE, _PLOT_COUNT):
    if flag.value < 0:
      raise DataError(f'--{flag.name}={flag.value} must be 0 or positive')
  if _N_BEST.value > 1 and _FORMAT.value != 'jsonl':
    raise DataError(f'--n_best={_N_BEST.value} needs --format jsonl (text is one line per input)')
  if _PRECOMPILE.value and (not _PROGRAMS.value or _OUTPUT.value != '-' or _RESUME.value
                            or _SCORE_REFERENCE.value or _PLOT.value):
    raise DataError('--precompile stores programs and writes no translations: it takes none '
                    'of --noprograms, --output, --resume, --score_reference, --plot_attention')
  for flag in (_PRECOMPILE_ROWS, _PRECOMPILE_LENGTH):
    if flag.value < 0:
      raise DataError(f'--{flag.name}={flag.value} must be 0 or positive')
  if _RESUME.value and (_OUTPUT.value == '-' or _REFERENCE.value or _SCORE_REFERENCE.value
                        or _PREFIX.value):
    raise DataError('--resume continues an --output file, and not with --reference, '
                    '--score_reference or --prefix (they read the input whole)')
  if _PLOT.value and len(_WORKDIR.value) > 1:
    raise DataError('--plot_attention shows one model; give one --workdir')
  if _SCORE_REFERENCE.value and (_REFERENCE.value or _N_BEST.value > 1 or _PLOT.value
                                 or _PREFIX.value):
    raise DataError('--score_reference scores given translations: it takes none of '
                    '--reference, --n_best, --plot_attention, --prefix')


def _json_line(source: list[str], hypotheses: list[Any]) -> str:
  return json.dumps({'source_tokens': source,
                     'hypotheses': [h.as_json() for h in hypotheses]}, ensure_ascii=False) + '\n'


def _score_reference(translator: Any, model: Any, sources: list[str], targets: list[str]
                     ) -> None:
  """Writes the model's scores of `targets` as translations of `sources` (forced decoding)."""
  t0 = time.time()
  scored = translator.score(model.params, sources, targets)
  with _output(_OUTPUT.value) as out:
    for source, hyp in scored:
      out.write(f'{hyp.logprob:.6f}\t{hyp.score:.6f}\n' if _FORMAT.value == 'text' else
                _json_line(source, [hyp]))
  print(f'scored {len(scored)} sentence pairs in {time.time() - t0:.1f} s', file=sys.stderr)


def _score(hyps: list[str], refs: list[str]) -> None:
  from transformer_nmt import metrics
  bleu, signature = metrics.corpus_bleu(hyps, refs)
  chrf, chrf_signature = metrics.corpus_chrf(hyps, refs)
  print(f'sacreBLEU {bleu:.2f}  {signature}\nchrF {chrf:.2f}  {chrf_signature}')
  if _TOKENIZED.value:
    print(f'tokenized BLEU (paper-style: 13a tokens + compound splitting; not sacreBLEU) '
          f'{metrics.tokenized_bleu(hyps, refs):.2f}')


if __name__ == '__main__':
  app.run(main_running(run), flags_parser=flag_parser)

"""The decode section of a run's config: how a search translates (paper §6.1), checked when
made (`DecodeConfig.validate`), with the library's defaults (`DECODE`) and the small jobs that
`decode.py --precompile` prepares."""

from __future__ import annotations

import dataclasses
import math

from transformer_nmt.errors import check, check_positive, is_int

BEAM_STOPS = ('bound', 'k_finished')
MBR_UTILITIES = ('bleu', 'chrf')  # decode.mbr, besides 'off' (decoding/mbr.py)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Translating (paper §6.1: beam 4, length penalty alpha 0.6, outputs up to input + 50)."""

  beam_size: int = 4  # 1 = greedy
  alpha: float = 0.6  # length penalty exponent
  max_extra_len: int = 50  # output limit = input length + this
  tokens_per_batch: int = 4096  # padded source tokens per batch
  # Lines of more source subwords than this (EOS included) are translated in pieces split at
  # sentence ends (inference/long_lines.py): a model trained on shorter lines ends early on
  # longer ones. 0: the run's data.max_len, the longest line it trained on.
  split_len: int = 0
  # Longest source in subword tokens (EOS included), 4x the default data.max_len: a sentence
  # longer than this is cut into pieces of this length (counted on stderr); keeps memory
  # bounded whatever the input.
  max_input_len: int = 1024
  # Steps between checks for finished sentences (and, with `compact`, between compactions).
  # 6 decodes as fast as 4 and compiles fewer programs, so a first run ends sooner; 8 compiles
  # fewer still but decodes slower.
  chunk: int = 6
  compact: bool = True  # drop finished sentences from a batch every `chunk` steps
  # 'bound': a sentence ends once no live beam can beat its best finished hypothesis
  # (tensor2tensor, the paper); 'k_finished': also once beam_size hypotheses have finished
  # (OpenNMT, CTranslate2; fewer steps).
  beam_stop: str = 'bound'
  temperature: float = 0.0  # > 0: sample instead of searching (research extra)
  top_k: int = 0  # when sampling, only from the k likeliest tokens (0 = all)
  seed: int = 0  # sampling seed
  # Output controls, all off (0) as in the paper: at least `min_len` and at most `max_len`
  # subwords before EOS (max_len also bounds input length + max_extra_len), and no n-gram of
  # `no_repeat_ngram` subwords twice in one output.
  min_len: int = 0
  max_len: int = 0
  no_repeat_ngram: int = 0
  # 'off' (the paper: the likeliest hypothesis) or a sentence-level utility, 'bleu' or 'chrf':
  # minimum Bayes risk choice among the beam's beam_size finished hypotheses (decoding/mbr.py).
  mbr: str = 'off'
  # On a CPU: sum in an order that does not depend on the batch's shape, so that a sentence's
  # translation and scores do not depend on the batch it shares (serve.py answers as decode.py
  # does with it too; how: runtime/compiler.py). Off by default: large batches decode slower
  # with it. No effect on other backends.
  batch_invariant: bool = False

  def __post_init__(self) -> None:
    self.validate()  # checked when made (also by dataclasses.replace): no later check needed

  def validate(self) -> DecodeConfig:
    """Raises ConfigError naming the first option out of range (flags and config.json alike:
    a NaN, an infinity or a negative count would otherwise run every line to its length limit
    and still exit 0). Runs when a DecodeConfig is made; every config section offers it."""
    check(0 <= self.alpha < math.inf,  # NaN fails every comparison
          f'decode.alpha={self.alpha} must be a finite number, 0 or more')
    check(0 <= self.temperature < math.inf,
          f'decode.temperature={self.temperature} must be a finite number, 0 (search) or more')
    check_positive('decode', self, 'beam_size', 'tokens_per_batch', 'chunk')
    check(self.max_input_len >= 2, f'decode.max_input_len={self.max_input_len} must be at '
          'least 2 (a token and EOS)')
    for name in ('split_len', 'max_extra_len', 'top_k', 'min_len', 'max_len', 'no_repeat_ngram'):
      value = getattr(self, name)
      check(value >= 0, f'decode.{name}={value} must be 0 (off) or positive')
    for field in dataclasses.fields(self):  # the programs take them as 32-bit integers
      value = getattr(self, field.name)
      check(not is_int(value) or abs(value) < 2 ** 31,
            f'decode.{field.name}={value} must be below 2**31')
    check(self.beam_stop in BEAM_STOPS,
          f'decode.beam_stop={self.beam_stop!r} must be one of {list(BEAM_STOPS)}')
    check(not self.max_len or self.min_len <= self.max_len,
          f'decode.min_len={self.min_len} must not exceed decode.max_len={self.max_len}')
    check(self.mbr in ('off',) + MBR_UTILITIES,
          f'decode.mbr={self.mbr!r} must be one of {["off", *MBR_UTILITIES]}')
    check(self.mbr == 'off' or self.temperature == 0, f'decode.mbr={self.mbr!r} chooses among '
          'beam search hypotheses: it needs decode.temperature=0')
    return self


DECODE = DecodeConfig()  # the decoding defaults, for the library's signatures
# The small jobs whose decoding programs `decode.py --precompile` makes besides its input's
# (Engine.precompile): up to this many sentences of up to this many source subwords, EOS
# included. 16 x 64 covers every line of Multi30k's test sets; after these programs a short
# job compiles nothing.
PRECOMPILE_ROWS = 16
PRECOMPILE_LENGTH = 64

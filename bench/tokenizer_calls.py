"""SentencePiece's two ways of encoding lines, per line: a list in one call (on threads the
call starts, one per core) against each line alone, for lists of 1 to 256 lines, on an idle
CPU and with every core kept busy by other processes. Tokenizer.encode takes each line alone
below THREADED_LINES lines and the list in one call from there.

  python bench/tokenizer_calls.py --spm_model W/spm.model \
    --input ../shared/data/multi30k/test2016.en
"""

import multiprocessing
import os
import time

from absl import app, flags

from transformer_nmt.data.batching import read_lines
from transformer_nmt.data.tokenizer import THREADED_LINES, Tokenizer

_SPM = flags.DEFINE_string('spm_model', None, 'A SentencePiece model, e.g. W/spm.model.',
                           required=True)
_INPUT = flags.DEFINE_string('input', None, 'Sentences, one per line.', required=True)
_SIZES = flags.DEFINE_list('sizes', ['1', '4', '16', '64', '256'], 'Lines per call.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Rounds over --input per way (the fastest).')


def _spin(stop: multiprocessing.Event) -> None:
  while not stop.is_set():
    pass


def per_line_us(tok: Tokenizer, lines: list[str], size: int) -> tuple[float, float]:
  """Microseconds per line: (the list in one threaded call, each line alone)."""
  sp, threads = tok._sp, os.cpu_count() or 1
  groups = [lines[i:i + size] for i in range(0, len(lines), size)]
  ways = (lambda g: sp.encode(g, out_type=int, num_threads=threads),
          lambda g: [sp.encode(line, out_type=int) for line in g])
  best = []
  for way in ways:
    fastest = float('inf')
    for _ in range(_ROUNDS.value):
      t0 = time.perf_counter()
      for g in groups:
        way(g)
      fastest = min(fastest, time.perf_counter() - t0)
    best.append(1e6 * fastest / len(lines))
  return best[0], best[1]


def main(_):
  tok = Tokenizer(_SPM.value)
  lines = read_lines(_INPUT.value)
  print(f'{len(lines)} lines, {os.cpu_count()} cores; Tokenizer.encode takes the list in one '
        f'call from {THREADED_LINES} lines\n\n| CPU | lines per call | list in one call, us '
        'per line | each line alone, us per line |\n| --- | ---: | ---: | ---: |')
  for busy in (False, True):
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,))
                for _ in range((os.cpu_count() or 1) if busy else 0)]
    for p in spinners:
      p.start()
    try:
      for size in map(int, _SIZES.value):
        threaded, alone = per_line_us(tok, lines, size)
        print(f'| {"busy" if busy else "idle"} | {size} | {threaded:.1f} | {alone:.1f} |',
              flush=True)
    finally:
      stop.set()
      for p in spinners:
        p.join()


if __name__ == '__main__':
  app.run(main)

"""Small jobs, two ways of batching them in one process, alternating round by round, each
job's programs compiled before the clock starts. Prints the median milliseconds of
Engine.translate per job.

--compare floors (1, 2, 4 sentences): batches of as few rows as the sentences need
(batches.START_ROWS = 1) against batches padded to 8 rows (the floor before).
--compare threads (e.g. 4, 8, 16, 64 sentences): a job that fits one batch cut into one batch
per decoding thread (batches.split_for_threads) against the one batch it was before.

  python bench/small_jobs.py --workdir W --input ../shared/data/multi30k/test2016.en
  python bench/small_jobs.py --workdir W --input ... --compare threads --sizes 4,8,16,64
"""

import statistics
import time

from absl import app, flags

from transformer_nmt.data.batching import read_lines
from transformer_nmt.inference import batches
from transformer_nmt.inference.engine import Engine

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained or imported workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_SIZES = flags.DEFINE_list('sizes', ['1', '2', '4'], 'Sentences per job.')
_JOBS = flags.DEFINE_integer('jobs', 10, 'Jobs per size and floor in each of the rounds.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Alternating rounds.')
_COMPARE = flags.DEFINE_enum('compare', 'floors', ['floors', 'threads'], 'What to compare.')
_SPLIT = batches.split_for_threads
_ONE_BATCH = lambda plans, *_: plans  # noqa: E731 -- the job as fill_batches planned it
# Per comparison: variant name -> (batches.START_ROWS, batches.split_for_threads)
VARIANTS = {'floors': {'8 rows at least (before)': (8, _SPLIT),
                       'as few rows as needed': (1, _SPLIT)},
            'threads': {'one batch (before)': (1, _ONE_BATCH),
                        'one batch per thread': (1, _SPLIT)}}


def use(variant: tuple) -> None:
  batches.START_ROWS, batches.split_for_threads = variant


def main(_):
  engine = Engine.load(_WORKDIR.value)
  lines = read_lines(_INPUT.value)
  times: dict[tuple[str, int], list[float]] = {}
  variants = VARIANTS[_COMPARE.value]
  for size in map(int, _SIZES.value):
    jobs = [lines[i * size:(i + 1) * size] for i in range(_JOBS.value)]
    for variant in variants.values():  # compile every shape the jobs meet
      use(variant)
      for job in jobs:
        engine.translate(job)
    for _ in range(_ROUNDS.value):
      for name, variant in variants.items():
        use(variant)
        for job in jobs:
          start = time.perf_counter()
          engine.translate(job)
          times.setdefault((name, size), []).append(time.perf_counter() - start)
  d = engine.decode
  print(f'beam {d.beam_size}, {_JOBS.value} jobs x {_ROUNDS.value} rounds per cell; '
        'median ms per job')
  print(f'{engine.concurrent_batches} decoding threads')
  print('| sentences | ' + ' | '.join(variants) + ' | ratio |')
  print('| ---: |' + ' ---: |' * (len(variants) + 1))
  for size in map(int, _SIZES.value):
    before, after = (statistics.median(times[name, size]) * 1000 for name in variants)
    print(f'| {size} | {before:.1f} | {after:.1f} | {before / after:.2f}x |')


if __name__ == '__main__':
  app.run(main)

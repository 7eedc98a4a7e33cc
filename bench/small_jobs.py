"""Small jobs (1, 2, 4 sentences): the engine's batches of as few rows as the sentences need
(batches.START_ROWS = 1) against batches padded to 8 rows (the floor before), in one process,
the two alternating round by round, each job's programs compiled before the clock starts.
Prints the median milliseconds of Engine.translate per job.

  python bench/small_jobs.py --workdir W --input ../shared/data/multi30k/test2016.en
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
FLOORS = {'8 rows at least (before)': 8, 'as few rows as needed': 1}


def main(_):
  engine = Engine.load(_WORKDIR.value)
  lines = read_lines(_INPUT.value)
  times: dict[tuple[str, int], list[float]] = {}
  for size in map(int, _SIZES.value):
    jobs = [lines[i * size:(i + 1) * size] for i in range(_JOBS.value)]
    for floor in FLOORS.values():  # compile every shape the jobs meet
      batches.START_ROWS = floor
      for job in jobs:
        engine.translate(job)
    for _ in range(_ROUNDS.value):
      for name, floor in FLOORS.items():
        batches.START_ROWS = floor
        for job in jobs:
          start = time.perf_counter()
          engine.translate(job)
          times.setdefault((name, size), []).append(time.perf_counter() - start)
  d = engine.decode
  print(f'beam {d.beam_size}, {_JOBS.value} jobs x {_ROUNDS.value} rounds per cell; '
        'median ms per job')
  print('| sentences | ' + ' | '.join(FLOORS) + ' | ratio |')
  print('| ---: |' + ' ---: |' * (len(FLOORS) + 1))
  for size in map(int, _SIZES.value):
    before, after = (statistics.median(times[name, size]) * 1000 for name in FLOORS)
    print(f'| {size} | {before:.1f} | {after:.1f} | {before / after:.2f}x |')


if __name__ == '__main__':
  app.run(main)

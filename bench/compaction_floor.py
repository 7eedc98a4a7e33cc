"""Compaction down to one row against a floor of 8 rows (the floor before): two engines on
the same checkpoint, alternating (bench/side_by_side.py): the whole list, groups of 1-16 lines
(requests served one by one) and shuffled calls of --calls lines (a busy server's batches).
Prints the fastest round of each way, their ratio and how many lines the two translate
differently (none should: compaction only drops finished rows).

  python bench/compaction_floor.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import side_by_side
from absl import app

from transformer_nmt.inference import batches
from transformer_nmt.inference.engine import Engine

_OPTIONS = side_by_side.define_flags(lines=500, rounds=2, calls=250)


def main(_):
  options = _OPTIONS()
  with side_by_side.patched(batches, {'MIN_ROWS': 8}):  # read when the engine is made
    before = Engine.load(options.workdir)
  now = Engine.load(options.workdir)
  print(f'beam {now.decode.beam_size}, beam_stop {now.decode.beam_stop}, '
        f'{now.concurrent_batches} decoding threads')
  side_by_side.compare({'floor of 8 rows (before)': before.translate,
                        f'floor of {batches.MIN_ROWS} row': now.translate},
                       options.lines, options.rounds, options.calls)


if __name__ == '__main__':
  app.run(main)

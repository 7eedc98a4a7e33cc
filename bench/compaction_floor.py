"""Compaction down to one row against a floor of 8 rows (the floor before): two engines on
the same checkpoint, alternating (bench/side_by_side.py): the whole list, groups of 1-16 lines
(requests served one by one) and shuffled calls of --calls lines (a busy server's batches).
Prints the fastest round of each way, their ratio and how many lines the two translate
differently (none should: compaction only drops finished rows).

  python bench/compaction_floor.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import side_by_side
from absl import app, flags

from transformer_nmt.data.batching import read_lines
from transformer_nmt.inference import batches
from transformer_nmt.inference.engine import Engine

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained or imported workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_LINES = flags.DEFINE_integer('lines', 500, 'First lines of --input to translate.')
_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Alternating rounds (after one to compile).')
_CALLS = flags.DEFINE_integer('calls', 250, 'Lines per call in the shuffled way.')


def main(_):
  with side_by_side.patched(batches, {'MIN_ROWS': 8}):  # read when the engine is made
    before = Engine.load(_WORKDIR.value)
  now = Engine.load(_WORKDIR.value)
  print(f'beam {now.decode.beam_size}, beam_stop {now.decode.beam_stop}, '
        f'{now.concurrent_batches} decoding threads')
  side_by_side.compare({'floor of 8 rows (before)': before.translate,
                        f'floor of {batches.MIN_ROWS} row': now.translate},
                       read_lines(_INPUT.value)[:_LINES.value], _ROUNDS.value, _CALLS.value)


if __name__ == '__main__':
  app.run(main)

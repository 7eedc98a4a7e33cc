"""Trimming the C heaps after every batch (before) against only once the resident memory has
grown by heap.TRIM_AFTER_GROWTH since the last trim: one engine, the two rules alternating
(bench/side_by_side.py) on the whole list, groups of 1-16 lines (requests served one by one)
and shuffled calls of --calls lines (a busy server's batches). Prints the fastest round of
each way, their ratio and the lines translated differently (none should: trimming frees
memory only).

With --nostored (the default) the process compiles its programs, as a server does that
starts without stored ones: the compiler leaves the heaps full of free chunks, which every
trim walks. With --stored it loads them from the workdir's programs/ (compiling and storing
what is missing in the first round), as a restarted server does.

  python bench/heap_trim.py --workdir W --input ../shared/data/multi30k/test2016.en
  python bench/heap_trim.py --workdir W --input ../shared/data/multi30k/test2016.en --stored
"""

import side_by_side
from absl import app, flags

from transformer_nmt.inference import heap
from transformer_nmt.inference.engine import Engine

_OPTIONS = side_by_side.define_flags(lines=500, rounds=2, calls=250)
_STORED = flags.DEFINE_bool('stored', False, "Load the programs from the workdir's "
                            'programs/ instead of compiling them in this process.')


def main(_):
  options = _OPTIONS()
  engine = Engine.load(options.workdir, programs=_STORED.value)

  def every_batch(lines: list[str]) -> list[str]:
    with side_by_side.patched(heap, {'TRIM_AFTER_GROWTH': 0}):  # read at every batch
      return engine.translate(lines)
  print(f'programs {"loaded from the store" if _STORED.value else "compiled here"}, beam '
        f'{engine.decode.beam_size}, {engine.concurrent_batches} decoding threads')
  side_by_side.compare({'trim after every batch (before)': every_batch,
                        f'trim after {heap.TRIM_AFTER_GROWTH >> 20} MiB grown': engine.translate},
                       options.lines, options.rounds, options.calls)


if __name__ == '__main__':
  app.run(main)

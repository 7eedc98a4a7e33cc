"""Beam search's reorder of the self-attention cache, two ways side by side in one process:
moving every layer's keys and values to their new beams at every step (before), and moving
only the slots that say which row holds each position (model.attention.KVCache). Two engines
on the same loaded model, one traced each way, alternating; prints the fastest round of each,
their ratio, and the lines they translate differently (none: the same values are read).

  python bench/beam_cache.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import side_by_side
from absl import app, flags

from transformer_nmt.data.batching import read_lines
from transformer_nmt.inference.engine import Engine
from transformer_nmt.model import attention

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained or imported workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_LINES = flags.DEFINE_integer('lines', 1000, 'First lines of --input to translate.')
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Alternating rounds (after one to compile).')


def main(_):
  slots = Engine.load(_WORKDIR.value)
  moved = Engine(slots.model, slots.decode)

  def moving(lines: list[str]) -> list[str]:
    # caches traced meanwhile keep no slots: each reorder gathers k and v, as on an accelerator
    with side_by_side.patched(attention, {'slots_by_default': lambda: False}):
      return moved.translate(lines)
  print(f'beam {slots.decode.beam_size}, {slots.concurrent_batches} decoding threads')
  side_by_side.compare({'keys and values moved (before)': moving, 'slots moved': slots.translate},
                       read_lines(_INPUT.value)[:_LINES.value], _ROUNDS.value)


if __name__ == '__main__':
  app.run(main)

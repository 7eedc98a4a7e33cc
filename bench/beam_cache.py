"""Beam search's reorder of the self-attention cache, two ways side by side in one process:
moving every layer's keys and values to their new beams at every step (before), and moving
only the slots that say which row holds each position (model.attention.KVCache). Two engines
on the same loaded model, one traced each way, alternating; prints the fastest round of each,
their ratio, and the lines they translate differently (none: the same values are read).

  python bench/beam_cache.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import side_by_side
from absl import app

from transformer_nmt.inference.engine import Engine
from transformer_nmt.model import attention

_OPTIONS = side_by_side.define_flags(lines=1000, rounds=3)


def main(_):
  options = _OPTIONS()
  slots = Engine.load(options.workdir)
  moved = Engine(slots.model, slots.decode)

  def moving(lines: list[str]) -> list[str]:
    # caches traced meanwhile keep no slots: each reorder gathers k and v, as on an accelerator
    with side_by_side.patched(attention, {'slots_by_default': lambda: False}):
      return moved.translate(lines)
  print(f'beam {slots.decode.beam_size}, {slots.concurrent_batches} decoding threads')
  side_by_side.compare({'keys and values moved (before)': moving, 'slots moved': slots.translate},
                       options.lines, options.rounds)


if __name__ == '__main__':
  app.run(main)

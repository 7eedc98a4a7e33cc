"""Decoding computed in bfloat16 against float32 on this CPU: two engines on the same
checkpoint, one each way, alternating (bench/side_by_side.py): the whole list, groups of 1-16
lines (requests served one by one) and shuffled calls of --calls lines (a busy server's
batches). Prints whether the CPU has bfloat16 instructions (inference/host_cpu.py), the
fastest round of each way, their ratio and how many lines the two translate differently.
Decoding's default precision follows from it (inference/loading.default_dtype).

  python bench/cpu_dtype.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import side_by_side
from absl import app

from transformer_nmt.inference import host_cpu
from transformer_nmt.inference.engine import Engine

_OPTIONS = side_by_side.define_flags(lines=400, rounds=2, calls=200)


def main(_):
  options = _OPTIONS()
  engines = {dtype: Engine.load(options.workdir, dtype=dtype)
             for dtype in ('bfloat16', 'float32')}
  print(f'bfloat16 instructions: {host_cpu.has_bfloat16()}; beam '
        f'{engines["float32"].decode.beam_size}, '
        f'{engines["float32"].concurrent_batches} decoding threads')
  side_by_side.compare({dtype: e.translate for dtype, e in engines.items()},
                       options.lines, options.rounds, options.calls)


if __name__ == '__main__':
  app.run(main)

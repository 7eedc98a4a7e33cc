"""Decoding computed in bfloat16 against float32 on this CPU: two engines on the same
checkpoint, one each way, alternating (bench/side_by_side.py): the whole list, groups of 1-16
lines (requests served one by one) and shuffled calls of --calls lines (a busy server's
batches). Prints whether the CPU has bfloat16 instructions (inference/host_cpu.py), the
fastest round of each way, their ratio and how many lines the two translate differently.
Decoding's default precision follows from it (inference/loading.default_dtype).

  python bench/cpu_dtype.py --workdir W --input ../shared/data/multi30k/test2016.en
"""

import side_by_side
from absl import app, flags

from transformer_nmt.data.batching import read_lines
from transformer_nmt.inference import host_cpu
from transformer_nmt.inference.engine import Engine

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained or imported workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_LINES = flags.DEFINE_integer('lines', 400, 'First lines of --input to translate.')
_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Alternating rounds (after one to compile).')
_CALLS = flags.DEFINE_integer('calls', 200, 'Lines per call in the shuffled way.')


def main(_):
  engines = {dtype: Engine.load(_WORKDIR.value, dtype=dtype)
             for dtype in ('bfloat16', 'float32')}
  print(f'bfloat16 instructions: {host_cpu.has_bfloat16()}; beam '
        f'{engines["float32"].decode.beam_size}, '
        f'{engines["float32"].concurrent_batches} decoding threads')
  side_by_side.compare({dtype: e.translate for dtype, e in engines.items()},
                       read_lines(_INPUT.value)[:_LINES.value], _ROUNDS.value, _CALLS.value)


if __name__ == '__main__':
  app.run(main)

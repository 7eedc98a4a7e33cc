"""Two ways of translating the same lines, timed side by side in one process (this machine
is noisy: only ratios measured together mean something), and `patched` to trace one of them
the way before. Used by batch_invariance.py, beam_cache.py, compaction_floor.py,
cpu_dtype.py, halving_sums.py, heap_trim.py and key_layout.py."""

import contextlib
import dataclasses
import random
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from absl import flags

from transformer_nmt.data.batching import read_lines
from transformer_nmt.inference.engine import Engine

Translate = Callable[[list[str]], list[str]]


@dataclasses.dataclass(frozen=True)
class Options:
  """What a side-by-side script is told: the workdir, the lines to translate, the rounds and
  the lines per shuffled call (0: no shuffled way)."""

  workdir: str
  lines: list[str]
  rounds: int
  calls: int


def define_flags(lines: int, rounds: int, calls: int = 0) -> Callable[[], Options]:
  """Defines --workdir, --input, --lines, --rounds and (with `calls`) --calls, with these
  defaults; returns what reads them once parsed."""
  workdir = flags.DEFINE_string('workdir', None, 'Trained or imported workdir.', required=True)
  given = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
  first = flags.DEFINE_integer('lines', lines, 'First lines of --input to translate.')
  round_count = flags.DEFINE_integer('rounds', rounds, 'Alternating rounds (after one to '
                                     'compile).')
  per_call = (flags.DEFINE_integer('calls', calls, 'Lines per call in the shuffled way.')
              if calls else None)
  return lambda: Options(workdir.value, read_lines(given.value)[:first.value],
                         round_count.value, 0 if per_call is None else per_call.value)


@contextlib.contextmanager
def patched(owner: Any, replacements: dict[str, Any]) -> Iterator[None]:
  """`owner`'s (a module's or a class's) attributes replaced meanwhile: programs traced then
  take the way before; the compiled programs keep it."""
  kept = {name: vars(owner)[name] for name in replacements}
  for name, value in replacements.items():
    setattr(owner, name, value)
  try:
    yield
  finally:
    for name, value in kept.items():
      setattr(owner, name, value)


def before_and_now(options: Options, patches: Sequence[tuple[Any, dict[str, Any]]],
                   before: str, now: str) -> None:
  """`compare`s the workdir's engine (`now`) with a second engine on the same loaded model
  whose programs are traced with every (owner, replacements) of `patches` in place (`patched`:
  the way `before`)."""
  engine = Engine.load(options.workdir)
  old = Engine(engine.model, engine.decode)

  def translate_before(lines: list[str]) -> list[str]:
    with contextlib.ExitStack() as stack:
      for owner, replacements in patches:
        stack.enter_context(patched(owner, replacements))
      return old.translate(lines)
  print(f'beam {engine.decode.beam_size}, {engine.concurrent_batches} decoding threads')
  compare({before: translate_before, now: engine.translate}, options.lines, options.rounds,
          options.calls)


def groups_of_1_to_16(lines: list[str]) -> list[list[str]]:
  """Consecutive groups of 1-16 lines (seeded sizes): a server's requests."""
  sizes = np.random.default_rng(0).integers(1, 17, len(lines))
  groups, start = [], 0
  for size in sizes:
    if start < len(lines):
      groups.append(lines[start:start + size])
      start += size
  return groups


def compare(translators: dict[str, Translate], lines: list[str], rounds: int,
            calls: int = 0) -> None:
  """Prints the fastest of `rounds` alternating rounds of each translator on all `lines` at
  once and on their groups of 1-16 (after one round that compiles), the ratio first / second,
  and how many lines the two translate differently. With `calls`, also the lines shuffled
  (seeded) in calls of that many: the batches of a busy server, whose requests' sentences
  come in no order of length."""
  first, second = translators
  groups = groups_of_1_to_16(lines)
  ways = {'whole list': lambda t: t(lines),
          'groups of 1-16': lambda t: [out for g in groups for out in t(g)]}
  if calls:
    shuffled = random.Random(0).sample(lines, len(lines))
    parts = [shuffled[i:i + calls] for i in range(0, len(lines), calls)]
    ways[f'shuffled, calls of {calls}'] = lambda t: [out for p in parts for out in t(p)]
  outputs = {name: ways['whole list'](t) for name, t in translators.items()}  # compiles
  for t in translators.values():
    for way_name, way in ways.items():
      if way_name != 'whole list':
        way(t)
  best: dict[tuple[str, str], float] = {}
  for _ in range(rounds):
    for way_name, way in ways.items():
      for name, t in translators.items():
        start_time = time.perf_counter()
        way(t)
        seconds = time.perf_counter() - start_time
        best[way_name, name] = min(best.get((way_name, name), seconds), seconds)
  print(f'\n{len(lines)} lines, {len(groups)} groups, fastest of {rounds} rounds\n\n'
        f'| way | {first} s | {second} s | ratio |\n| --- | ---: | ---: | ---: |')
  for way_name in ways:
    x, y = best[way_name, first], best[way_name, second]
    print(f'| {way_name} | {x:.2f} | {y:.2f} | {x / y:.2f}x |')
  print('lines translated differently by the two: '
        f'{sum(p != q for p, q in zip(outputs[first], outputs[second]))}')

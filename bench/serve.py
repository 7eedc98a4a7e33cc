"""serve.py under load, against the same server code in front of CTranslate2 and against
itself with batching across requests turned off. Loopback only; bounded in time and count.

  python bench/serve.py --workdir W --input ../shared/data/multi30k/test2016.en \
      --reference OUT.de [--soak_seconds 300]

Each server is a process of its own (serve.py; bench/serve_ctranslate2.py), started, waited
for until /health says ready, loaded, then stopped with SIGTERM (its exit code is reported).
Load: threads, one keep-alive connection each, sending requests of 1-16 consecutive input
sentences (a seeded draw) until --seconds pass or --max_requests are sent; first one client
sending one sentence at a time (latency), then each --clients count. Per phase: requests,
failures, sentences/s, latency p50/p95/p99, the server's resident memory (peak and at the
end) sampled every 0.2 s, the mean batch fill and the XLA programs compiled during the phase
(/metrics). With --reference (decode.py's translations of --input with the same settings)
every translation is compared with its line.

With --rounds N (N > 1) every --servers server is started first and kept up (an idle one
waits on its queue), then the phase of the last --clients count is run on each in turn, N
rounds: this machine's speed drifts by 10-30% within minutes, and servers loaded one after
another compare their minutes as much as their code. Prints each round's ratios and their
median.

  python bench/serve.py --workdir W --input ../shared/data/multi30k/test2016.en \
      --servers ours,ours_unbatched --clients 64 --rounds 5
"""

import concurrent.futures
import dataclasses
import http.client
import json
import pathlib
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Optional

import common
from absl import app, flags

ROOT = pathlib.Path(__file__).resolve().parents[1]

_WORKDIR = flags.DEFINE_string('workdir', None, 'Trained workdir.', required=True)
_INPUT = flags.DEFINE_string('input', None, 'Source sentences, one per line.', required=True)
_REFERENCE = flags.DEFINE_string('reference', None, "decode.py's output for --input with the "
                                 'same settings: each answer is compared with its line.')
_SERVERS = flags.DEFINE_list('servers', ['ours', 'ctranslate2', 'ours_unbatched'],
                             'Servers to load, in turn: ours (serve.py), ctranslate2 (the '
                             'same server code on CTranslate2, float32), ctranslate2_int8 (the '
                             'same in int8), ours_unbatched (serve.py '
                             '--nobatch_across_requests), ctranslate2_unbatched.')
_CLIENTS = flags.DEFINE_list('clients', ['1', '8', '64'], 'Concurrent clients per phase.')
_UNBATCHED_CLIENTS = flags.DEFINE_list('unbatched_clients', ['64'],
                                       'Client counts for the *_unbatched servers.')
_SECONDS = flags.DEFINE_float('seconds', 30, 'Length of each phase.')
_MAX_REQUESTS = flags.DEFINE_integer('max_requests', 100_000, 'Most requests of a phase.')
_SOAK = flags.DEFINE_float('soak_seconds', 0, 'Then this long a phase of 64 clients on ours.')
_BEAM = flags.DEFINE_integer('beam_size', 4, 'Beam size of every server.')
_MAX_WAIT = flags.DEFINE_float('max_wait_ms', 5.0, "The servers' --max_wait_ms.")
_OURS_FLAGS = flags.DEFINE_string('serve_flags', '', 'More flags for serve.py (ours and '
                                  "ours_unbatched), e.g. '--precompile_rows=8'.")
_ROUNDS = flags.DEFINE_integer('rounds', 1, 'Above 1: all servers up at once, the phase of '
                               'the last --clients count alternated between them this many '
                               'rounds (see the module docstring).', lower_bound=1)
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the tables into this file, '
                                'replacing its bench/serve.py section.')
_SECTION = flags.DEFINE_string('section', '', 'Name suffix of the section to replace (several '
                               'runs side by side: rounds, one client, the soak).')


@dataclasses.dataclass
class Phase:
  """What one load phase saw."""

  name: str
  seconds: float = 0.0
  requests: int = 0
  sentences: int = 0
  failures: dict = dataclasses.field(default_factory=dict)  # status or exception -> count
  mismatches: Optional[int] = None  # translations other than --reference's line
  differing: dict = dataclasses.field(default_factory=dict)  # line index -> an answer
  latencies: list = dataclasses.field(default_factory=list)
  rss_start: int = 0
  rss_peak: int = 0
  rss_end: int = 0
  rss_windows: tuple = ()  # peak RSS of the first and the last minute of a long phase
  fill: float = 0.0
  busy: float = 0.0  # the server's time in batches / the phase's time (batches at once count each)
  compiled: float = 0.0
  gc_seconds: float = 0.0  # the server's garbage collections (the process stood still)

  def row(self, server: str) -> str:
    q = (statistics.quantiles(self.latencies, n=100) if len(self.latencies) > 1
         else self.latencies * 99 or [float('nan')] * 99)
    failed = sum(self.failures.values())
    why = f' ({", ".join(f"{k}: {v}" for k, v in self.failures.items())})' if failed else ''
    return (f'| {server} | {self.name} | {self.requests} | {failed}{why} | '
            f'{self.sentences / self.seconds:.1f} | {1000 * q[49]:.0f} | {1000 * q[94]:.0f} | '
            f'{1000 * q[98]:.0f} | {self.rss_start / 2**20:.0f} / {self.rss_peak / 2**20:.0f} /'
            f' {self.rss_end / 2**20:.0f} | {self.fill:.2f} | {self.busy:.2f} | '
            f'{self.compiled:.0f} | {self.gc_seconds:.2f} | '
            f'{"-" if self.mismatches is None else self.mismatches} |')


# The targets' ratios: (server, the server it is measured against)
PAIRS = (('ours', 'ctranslate2'), ('ours', 'ctranslate2_int8'), ('ours', 'ours_unbatched'),
         ('ctranslate2', 'ctranslate2_unbatched'))
HEADER = ('| server | phase | requests | failed | sentences/s | p50 ms | p95 ms | p99 ms | '
          'RSS MiB start / peak / end | batch fill | busy | compiled | GC s | '
          'not as decode.py |\n| --- | --- |' + ' ---: |' * 12)


def rss(pid: int) -> int:
  for line in pathlib.Path(f'/proc/{pid}/status').read_text().splitlines():
    if line.startswith('VmRSS:'):
      return int(line.split()[1]) * 1024
  return 0


def metrics(port: int) -> dict[str, float]:
  conn = http.client.HTTPConnection('127.0.0.1', port, timeout=30)
  conn.request('GET', '/metrics')
  text = conn.getresponse().read().decode()
  conn.close()
  out = {}
  for line in text.splitlines():
    if line and not line.startswith('#'):
      name, value = line.rsplit(' ', 1)
      out[name] = float(value)
  return out


def gc_seconds(values: dict[str, float]) -> float:
  """nmt_gc_seconds summed over the generations (0 for a server without it)."""
  return sum(v for k, v in values.items() if k.startswith('nmt_gc_seconds{'))


def load(port: int, pid: int, lines: list[str], reference: Optional[list[str]], clients: int,
         sizes: tuple[int, int], name: str, seconds: float) -> Phase:
  """`clients` threads sending requests of sizes[0]..sizes[1] consecutive lines."""
  phase, lock = Phase(name, mismatches=None if reference is None else 0), threading.Lock()
  before = metrics(port)
  stop_at, sent = time.monotonic() + seconds, [0]
  phase.rss_start = phase.rss_peak = rss(pid)

  def client(k: int) -> None:
    rng = random.Random(k)
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=120)
    while time.monotonic() < stop_at:
      with lock:
        if sent[0] >= _MAX_REQUESTS.value:
          return
        sent[0] += 1
      n = rng.randint(*sizes)
      first = rng.randrange(len(lines) - n + 1)
      body = json.dumps({'text': lines[first:first + n]})
      t0 = time.monotonic()
      try:
        conn.request('POST', '/v1/translate', body, {'Content-Type': 'application/json'})
        response = conn.getresponse()
        answer = response.read()
        status = response.status
      except (OSError, http.client.HTTPException) as e:
        status, answer = type(e).__name__, b''
        conn.close()
        conn = http.client.HTTPConnection('127.0.0.1', port, timeout=120)
      took = time.monotonic() - t0
      with lock:
        phase.requests += 1
        if status != 200:
          phase.failures[status] = phase.failures.get(status, 0) + 1
          continue
        phase.latencies.append(took)
        texts = [t['text'] for t in json.loads(answer)['translations']]
        phase.sentences += len(texts)
        for i, text in enumerate(texts if reference is not None else []):
          if text != reference[first + i]:
            phase.mismatches += 1
            phase.differing[first + i] = text
    conn.close()

  t0, samples = time.monotonic(), []
  with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    running = [pool.submit(client, k) for k in range(clients)]
    while not all(f.done() for f in running):
      samples.append((time.monotonic() - t0, rss(pid)))
      phase.rss_peak = max(phase.rss_peak, samples[-1][1])
      time.sleep(0.2)
    for f in running:
      f.result()
  phase.seconds = time.monotonic() - t0
  phase.rss_end = rss(pid)
  if phase.seconds >= 180:  # a leak shows as a higher peak at the end than at the start
    phase.rss_windows = (max(r for t, r in samples if t < 60),
                         max(r for t, r in samples if t > phase.seconds - 60))
  after = metrics(port)
  batches = after['nmt_batch_fill_count'] - before['nmt_batch_fill_count']
  phase.fill = (after['nmt_batch_fill_sum'] - before['nmt_batch_fill_sum']) / max(batches, 1)
  busy = after['nmt_batch_seconds_total'] - before['nmt_batch_seconds_total']
  phase.busy = busy / phase.seconds
  phase.compiled = after['nmt_programs_compiled'] - before['nmt_programs_compiled']
  phase.gc_seconds = gc_seconds(after) - gc_seconds(before)
  return phase


def start(server: str, port: int) -> tuple[subprocess.Popen, float]:
  """The server process, and seconds until /health said ready."""
  common = ['--workdir', _WORKDIR.value, '--port', str(port), '--beam_size', str(_BEAM.value),
            '--max_wait_ms', str(_MAX_WAIT.value)]
  ours = ['serve.py'] + shlex.split(_OURS_FLAGS.value)
  ct2 = ['bench/serve_ctranslate2.py']
  program = {'ours': ours, 'ours_unbatched': ours + ['--nobatch_across_requests'],
             'ctranslate2': ct2, 'ctranslate2_int8': ct2 + ['--compute_type', 'int8'],
             'ctranslate2_unbatched': ct2 + ['--nobatch_across_requests']}[server]
  t0 = time.monotonic()
  process = subprocess.Popen([sys.executable] + program + common, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  while process.poll() is None:
    try:
      conn = http.client.HTTPConnection('127.0.0.1', port, timeout=5)
      conn.request('GET', '/health')
      if conn.getresponse().status == 200:
        return process, time.monotonic() - t0
    except OSError:
      pass
    time.sleep(0.5)
  raise SystemExit(f'{server} exited with {process.returncode}: {process.stderr.read()[-2000:]}')


def free_port() -> int:
  with socket.socket() as probe:
    probe.bind(('127.0.0.1', 0))
    return probe.getsockname()[1]


def stop(server: str, process: subprocess.Popen) -> str:
  process.send_signal(signal.SIGTERM)
  return f'{server}: exit code {process.wait(120)} after SIGTERM'


def serve_and_load(server: str, lines: list[str], reference: Optional[list[str]]
                   ) -> tuple[list[str], list[Phase]]:
  port = free_port()
  process, ready = start(server, port)
  notes, phases = [f'{server}: ready {ready:.1f} s after start, RSS {rss(process.pid) / 2**20:.0f}'
                   ' MiB'], []
  unbatched = server.endswith('_unbatched')
  counts = _UNBATCHED_CLIENTS.value if unbatched else _CLIENTS.value
  plan = [] if unbatched else [('1 client, 1 sentence', 1, (1, 1), _SECONDS.value)]
  plan += [(f'{c} clients, 1-16 sentences', int(c), (1, 16), _SECONDS.value) for c in counts]
  if server == 'ours' and _SOAK.value > 0:
    plan.append((f'soak: 64 clients, {_SOAK.value:.0f} s', 64, (1, 16), _SOAK.value))
  for name, clients, sizes, seconds in plan:
    phases.append(load(port, process.pid, lines, reference, clients, sizes, name, seconds))
    print(phases[-1].row(server), flush=True)
  notes.append(stop(server, process))
  for p in phases:
    if p.rss_windows:
      first, last = p.rss_windows
      notes.append(f'{server}, {p.name}: peak RSS {first / 2**20:.0f} MiB in the first minute, '
                   f'{last / 2**20:.0f} MiB in the last ({100 * (last / first - 1):+.1f}%)')
  return notes, phases


def alternate(lines: list[str], reference: Optional[list[str]]
              ) -> tuple[list[str], list[str], dict[str, list[Phase]]]:
  """--rounds: every server up at once, the last client count's phase run on each in turn.
  Returns (table rows, notes, each server's phases in round order)."""
  clients = int(_CLIENTS.value[-1])
  up, notes, rows = {}, [], []
  found: dict[str, list[Phase]] = {server: [] for server in _SERVERS.value}
  try:
    for server in _SERVERS.value:  # one at a time: starting compiles or loads programs
      port = free_port()
      process, ready = start(server, port)
      up[server] = (port, process)
      notes.append(f'{server}: ready {ready:.1f} s after start, RSS '
                   f'{rss(process.pid) / 2**20:.0f} MiB')
    for r in range(_ROUNDS.value):
      for server, (port, process) in up.items():
        phase = load(port, process.pid, lines, reference, clients, (1, 16),
                     f'round {r + 1}: {clients} clients, 1-16 sentences', _SECONDS.value)
        found[server].append(phase)
        rows.append(phase.row(server))
        print(rows[-1], flush=True)
  finally:
    notes += [stop(server, process) for server, (_, process) in up.items()]
  return rows, notes, found


def round_ratios(found: dict[str, list[Phase]]) -> list[str]:
  """Each pair's throughput ratio per round, and the median of the rounds."""
  out = []
  for a, b in PAIRS:
    if found.get(a) and found.get(b):
      each = [(p.sentences / p.seconds) / (q.sentences / q.seconds)
              for p, q in zip(found[a], found[b])]
      out.append(f'{a} / {b} sentences/s by round: '
                 + ', '.join(f'{x:.2f}x' for x in each)
                 + f'; median **{statistics.median(each):.2f}x**')
  return out


def explain(lines: list[str], reference: list[str], differing: dict[int, str]) -> list[str]:
  """Why our answers differ from decode.py's: each such line's two translations scored by the
  engine (the same model and settings, forced decoding), and whether the engine translating
  the line alone gives the server's answer."""
  if not differing:
    return []
  from transformer_nmt import Engine, load_workdir  # here: the load generator runs without JAX
  model = load_workdir(_WORKDIR.value)
  engine = Engine(model, dataclasses.replace(model.decode, beam_size=_BEAM.value))
  index = sorted(differing)
  sources = [lines[i] for i in index]
  ours = engine.score(sources, [differing[i] for i in index])
  theirs = engine.score(sources, [reference[i] for i in index])
  gaps = sorted(abs(a.score - b.score) for (_, a), (_, b) in zip(ours, theirs))
  alone = sum(engine.translate([lines[i]])[0] == differing[i] for i in index)
  return [f'{len(index)} distinct lines answered otherwise than decode.py: the two '
          f'translations\' scores (logprob / length penalty) differ by {gaps[len(gaps) // 2]:.2g}'
          f' (median) and at most {gaps[-1]:.2g}; translated alone by the engine, {alone} of '
          'them give the server\'s answer']


def one_by_one(lines: list[str], reference: Optional[list[str]]
               ) -> tuple[list[str], list[str], dict[str, list[Phase]], list[str]]:
  """Each server started, loaded through every phase and stopped in turn. Returns (table
  rows, notes, each server's phases, the ratios of the targets)."""
  rows, notes, throughput, found = [], [], {}, {}
  for server in _SERVERS.value:
    said, phases = serve_and_load(server, lines, reference)
    notes += said
    found[server] = phases
    rows += [p.row(server) for p in phases]
    for p in phases:
      throughput[(server, p.name)] = (p.sentences / p.seconds,
                                      statistics.median(p.latencies) if p.latencies else None)
  ratios = []
  top = f'{_CLIENTS.value[-1]} clients, 1-16 sentences'
  for a, b in PAIRS:
    if (a, top) in throughput and (b, top) in throughput:
      ratios.append(f'{top}: {a} / {b} sentences/s = '
                    f'{throughput[(a, top)][0] / throughput[(b, top)][0]:.2f}x')
  one = '1 client, 1 sentence'
  if ('ours', one) in throughput and ('ctranslate2', one) in throughput:
    gap = throughput[('ours', one)][1] - throughput[('ctranslate2', one)][1]
    ratios.append(f'{one}: p50 ours - ctranslate2 = {1000 * gap:.0f} ms')
  return rows, notes, found, ratios


def main(argv):
  del argv
  lines = pathlib.Path(_INPUT.value).read_text(encoding='utf-8').splitlines()
  reference = None
  if _REFERENCE.value:
    reference = pathlib.Path(_REFERENCE.value).read_text(encoding='utf-8').splitlines()
    if len(reference) != len(lines):
      raise app.UsageError(f'--reference has {len(reference)} lines, --input {len(lines)}')
  print(HEADER, flush=True)
  if _ROUNDS.value > 1:
    rows, notes, found = alternate(lines, reference)
    ratios = round_ratios(found)
  else:
    rows, notes, found, ratios = one_by_one(lines, reference)
  if reference is not None:
    differing = {i: a for server, phases in found.items() if server.startswith('ours')
                 for p in phases for i, a in p.differing.items()}
    notes += explain(lines, reference, differing)
  text = (f'{common.stamp()}\n\n{HEADER}\n' + '\n'.join(rows) + '\n\n'
          + ''.join(f'- {line}\n' for line in ratios + notes))
  print(text)
  if _MARKDOWN.value:
    name = 'bench/serve.py' + (f' {_SECTION.value}' if _SECTION.value else '')
    common.write_section(_MARKDOWN.value, name, text)


if __name__ == '__main__':
  app.run(main)

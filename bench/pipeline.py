"""The host input pipeline (issue 51): batch building per host, start-up time and peak RSS.

  python bench/pipeline.py                       # 300k pairs: a few minutes on 2 cores
  python bench/pipeline.py --pairs 4500000       # WMT14 en-de's size
  python bench/pipeline.py --train_steps 120     # also: data_wait of train.py configs/small.py

The corpus is synthetic, made at run time in a temporary directory from the newstest2014
pairs in ../shared/data/wmt14-newstest (never committed): pair i is newstest pair i mod 3003,
its words rotated by i // 3003 places so that repeats differ. One joint BPE SentencePiece
model is trained on the newstest lines first.

Printed, in this order:
- start-up: the seconds from a config to the encoded training split, and the peak RSS, of a
  process that encodes the text and stores it (data/cache.py) and of one that maps it;
- per host: milliseconds and real target tokens/s to build host 0's share of a global batch
  of --tokens_per_batch tokens per side, for 1..16 simulated hosts, bucketed and packed;
  each epoch's plan (every host plans the whole global batch) amortised over its batches;
- subword sampling (data.spm_alpha): the seconds to segment the epoch anew, which every host
  spends once per epoch, amortised over the epoch's batches;
- the feeders (4 hosts, bucketed): batches handed to a loop whose step takes --step_ms, by
  data.prefetch's thread against grain's mp_prefetch with one worker process (grain installed;
  not a requirement), in ms per batch and the share of the loop's time spent waiting;
- with --train_steps: the share of step time train.py's loop waited for data (data_wait in
  metrics.jsonl) on configs/small.py (Multi30k), bucketed and packed, subword sampling on.
"""

import json
import os
import pathlib
import resource
import signal
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from absl import app, flags, logging

if TYPE_CHECKING:
  from transformer_nmt.config import DataConfig

os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # no accelerator plugin probing in the timings

ROOT = pathlib.Path(__file__).resolve().parents[1]
NEWSTEST = ROOT.parent / 'shared' / 'data' / 'wmt14-newstest'
MULTI30K = ROOT.parent / 'shared' / 'data' / 'multi30k'  # configs/small.py's corpus

_PAIRS = flags.DEFINE_integer('pairs', 300_000, 'Training pairs of the synthetic corpus.')
_VOCAB = flags.DEFINE_integer('vocab_size', 8000, 'SentencePiece pieces (a soft limit).')
_TOKENS = flags.DEFINE_integer('tokens_per_batch', 25_000, 'Global batch, tokens per side.')
_PACK = flags.DEFINE_integer('pack_length', 128, 'Row length of the packed batches.')
_HOSTS = flags.DEFINE_list('hosts', ['1', '2', '4', '8', '16'], 'Simulated process counts.')
_BATCHES = flags.DEFINE_integer('batches', 40, 'Timed batches per setting.')
_ALPHA = flags.DEFINE_float('spm_alpha', 0.1, 'Subword sampling (BPE-dropout) probability.')
_STEP_MS = flags.DEFINE_float('step_ms', 2.0, 'Simulated step time for the feeders.')
_TRAIN_STEPS = flags.DEFINE_integer('train_steps', 0, 'train.py steps per data_wait run (0: none).')
_TRAIN_PAIRS = flags.DEFINE_integer('train_pairs', 3000, 'Multi30k pairs of the data_wait runs '
                                    '(a few epochs in --train_steps steps).')
_CHILD = flags.DEFINE_string('child', None, 'Internal: a directory to start from (start-up).')


def data_config(directory: pathlib.Path) -> 'DataConfig':
  from transformer_nmt.config import DataConfig  # here: start() times the imports
  return DataConfig(source='text', train_src=str(directory / 'train.en'),
                    train_tgt=str(directory / 'train.de'), valid_src=str(directory / 'valid.en'),
                    valid_tgt=str(directory / 'valid.de'), vocab_size=_VOCAB.value, max_len=128,
                    tokens_per_batch=_TOKENS.value, spm_alpha=_ALPHA.value).validate()


def make_corpus(directory: pathlib.Path, pairs: int) -> None:
  """train.{en,de} of `pairs` rotated newstest pairs; valid.{en,de} the first 100 as they are."""
  en = (NEWSTEST / 'newstest2014.en').read_text(encoding='utf-8').splitlines()
  de = (NEWSTEST / 'newstest2014.de').read_text(encoding='utf-8').splitlines()
  rotate = lambda line, k: ' '.join((w := line.split())[k % len(w):] + w[:k % len(w)]) \
      if line.split() else line
  for side, lines in (('en', en), ('de', de)):
    with open(directory / f'train.{side}', 'w', encoding='utf-8') as f:
      for i in range(pairs):
        f.write(rotate(lines[i % len(lines)], i // len(lines)) + '\n')
    (directory / f'valid.{side}').write_text('\n'.join(lines[:100]) + '\n', encoding='utf-8')


def start(directory: pathlib.Path) -> dict:
  """What train.py does before its first step, for the training split: read (or map), encode."""
  t0 = time.perf_counter()
  from transformer_nmt.data import corpus as corpus_lib
  imported = time.perf_counter()
  c = data_config(directory)
  corpus = corpus_lib.read_corpus(c, directory)
  toks = corpus_lib.tokenizers(c, corpus, directory)
  data = corpus_lib.encode_train(c, corpus, *toks, directory / 'data_cache')
  done = time.perf_counter()
  return {'import_s': imported - t0, 'start_s': done - imported, 'pairs': len(data),
          'max_rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def timed_start(directory: pathlib.Path) -> dict:
  out = subprocess.run([sys.executable, __file__, f'--child={directory}',
                        f'--vocab_size={_VOCAB.value}'], cwd=ROOT, capture_output=True,
                       text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def build_rate(data, count: int, pack_length: int) -> dict:
  """Host 0 of `count`: ms per share of a global batch and real target tokens/s."""
  import numpy as np

  from transformer_nmt.data import training_batches
  batches = training_batches.train_batches(data, _TOKENS.value, seed=0, row_multiple=count,
                                   pack_length=pack_length, host=(0, count))
  next(batches)  # the epoch's plan (timed by `epoch_plan`), and one batch
  t0 = time.perf_counter()
  built = [next(batches) for _ in range(_BATCHES.value)]
  seconds = (time.perf_counter() - t0) / _BATCHES.value
  tokens = sum(int(np.count_nonzero(b['tgt_segments'])) for b in built)
  return {'ms': 1e3 * seconds, 'tokens_per_s': tokens / _BATCHES.value / seconds}


def feeders(data, count: int = 4) -> dict[str, dict]:
  """Host 0 of `count`'s bucketed shares consumed by a loop whose step sleeps --step_ms:
  ms per batch and waiting share, through the prefetch thread and grain's mp_prefetch."""
  import numpy as np

  from transformer_nmt.data import batching as data_lib
  from transformer_nmt.data.prefetch import Prefetcher
  plans = data_lib.plan_batches(data.lengths, data.boundaries, _TOKENS.value,
                                np.random.default_rng([0, 0]), count)[:_BATCHES.value + 4]

  def share(i: int) -> dict:
    item = plans[i]
    rows = item.rows // count
    return data_lib.collate(data, data_lib.BatchPlan(item.examples[:rows], rows, item.length))

  def consume(batches) -> dict:
    next(batches)  # started (a worker process, a thread) and one batch
    waited, t0 = 0.0, time.perf_counter()
    for _ in range(_BATCHES.value):
      w0 = time.perf_counter()
      next(batches)
      waited += time.perf_counter() - w0
      time.sleep(_STEP_MS.value / 1e3)
    total = time.perf_counter() - t0
    return {'ms': 1e3 * total / _BATCHES.value, 'wait': waited / total}
  out = {}
  with Prefetcher(iter(map(share, range(len(plans)))), depth=4) as thread:
    out['thread (data.prefetch 4)'] = consume(thread)
  try:
    import grain
  except ImportError:
    return out
  grained = grain.MapDataset.range(len(plans)).map(share).to_iter_dataset().mp_prefetch(
      grain.MultiprocessingOptions(num_workers=1))
  out['grain mp_prefetch, 1 worker'] = consume(iter(grained))
  return out


def epoch_plan(data, pack_length: int) -> tuple[int, float]:
  """(global batches per epoch, seconds to plan an epoch), as `train_batches` plans it."""
  import numpy as np

  from transformer_nmt.data import batching as data_lib
  from transformer_nmt.data import training_batches
  t0 = time.perf_counter()
  if pack_length:
    plans = training_batches._packed_epoch(data, 0, 0, pack_length, _TOKENS.value // pack_length)
  else:
    plans = data_lib.plan_batches(data.lengths, data.boundaries, _TOKENS.value,
                                  np.random.default_rng([0, 0]))
  return len(plans), time.perf_counter() - t0


def sampling_seconds(directory: pathlib.Path) -> float:
  """One epoch of subword sampling over the training text (read beforehand)."""
  from transformer_nmt.data import corpus as corpus_lib
  c = data_config(directory)
  corpus = corpus_lib.read_corpus(c, directory)
  toks = corpus_lib.tokenizers(c, corpus, directory)
  corpus.train  # noqa: B018  read outside the timing
  epochs = corpus_lib.sampled_epochs(lambda: corpus.train, *toks, c, seed=0)
  t0 = time.perf_counter()
  epochs(1)
  return time.perf_counter() - t0


def data_wait(directory: pathlib.Path, pack_length: int) -> list[float]:
  """data_wait of each logged interval of train.py configs/small.py (subword sampling on) on
  the first --train_pairs Multi30k pairs (so that epochs, each sampled anew, end within the
  run: the share of time spent sampling does not depend on the corpus size), stopped by
  SIGTERM once --train_steps steps are logged."""
  for side in ('en', 'de'):
    lines = (MULTI30K / f'train.{side}').read_text(encoding='utf-8').splitlines()
    (directory / f'm30k.{side}').write_text('\n'.join(lines[:_TRAIN_PAIRS.value]) + '\n',
                                            encoding='utf-8')
  workdir, log = directory / f'small_{pack_length}', directory / f'small_{pack_length}.log'
  cmd = [sys.executable, 'train.py', '--config', 'configs/small.py', '--workdir', str(workdir),
         f'--config.data.train_src={directory}/m30k.en',
         f'--config.data.train_tgt={directory}/m30k.de', '--config.data.spm_alpha=0.1',
         f'--config.data.pack_length={pack_length}', '--config.train.log_every=10',
         '--config.train.num_steps=100000', '--config.train.eval_every=100000']
  with open(log, 'w') as err:
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=err, stdout=subprocess.DEVNULL)
    while f'step {_TRAIN_STEPS.value}/' not in log.read_text() and proc.poll() is None:
      time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    proc.wait()
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  return [r['data_wait'] for r in rows if 'data_wait' in r]


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if _CHILD.value:
    print(json.dumps(start(pathlib.Path(_CHILD.value))))
    return
  if not (NEWSTEST / 'newstest2014.en').exists():
    print(f'skipped: {NEWSTEST} is not present (newstest2014.en/.de make the corpus)')
    return
  with tempfile.TemporaryDirectory(prefix='bench_pipeline_') as tmp:
    run(pathlib.Path(tmp))


def run(directory: pathlib.Path) -> None:
  from transformer_nmt.data import corpus as corpus_lib
  from transformer_nmt.data.tokenizer import train_tokenizer
  make_corpus(directory, _PAIRS.value)
  t0 = time.perf_counter()
  lines = [line for side in ('en', 'de') for line in
           (NEWSTEST / f'newstest2014.{side}').read_text(encoding='utf-8').splitlines()]
  tok = train_tokenizer(lines, directory / 'spm.model', vocab_size=_VOCAB.value, model_type='bpe')
  print(f'corpus: {_PAIRS.value} pairs; SentencePiece bpe, {tok.vocab_size} pieces, trained on '
        f'the {len(lines)} newstest lines in {time.perf_counter() - t0:.1f} s')
  print('\n| start-up | seconds | peak RSS (MB) | import (s) |\n| --- | --- | --- | --- |')
  for name in ('first (encode, store)', 'cached (map, verify)'):
    s = timed_start(directory)
    print(f'| {name} | {s["start_s"]:.1f} | {s["max_rss_mb"]:.0f} | {s["import_s"]:.1f} |')
  c = data_config(directory)
  corpus = corpus_lib.read_corpus(c, directory)
  data = corpus_lib.encode_train(c, corpus, *corpus_lib.tokenizers(c, corpus, directory),
                                 directory / 'data_cache')
  sampled = sampling_seconds(directory) if _ALPHA.value else 0.0
  print(f'\nsubword sampling (alpha {_ALPHA.value}): {sampled:.1f} s per epoch, one thread')
  print('\n| batching | hosts | rows per host | ms per host batch | real tgt tokens/s per host | '
        'plan s/epoch | ms amortised | ... with sampling |\n|' + ' --- |' * 8)
  for pack_length in (0, _PACK.value):
    per_epoch, plan_s = epoch_plan(data, pack_length)
    for count in map(int, _HOSTS.value):
      r = build_rate(data, count, pack_length)
      amortised = r['ms'] + 1e3 * plan_s / per_epoch
      rows = '-' if not pack_length else _TOKENS.value // pack_length // count
      print(f'| {"packed " + str(pack_length) if pack_length else "bucketed"} | {count} | {rows} '
            f'| {r["ms"]:.2f} | {r["tokens_per_s"] / 1e6:.2f}M | {plan_s:.2f} | '
            f'{amortised:.2f} | {amortised + 1e3 * sampled / per_epoch:.2f} |')
  print(f'\n| feeder (4 hosts, bucketed, step {_STEP_MS.value:g} ms) | ms per batch | loop '
        'waiting |\n| --- | --- | --- |')
  for name, r in feeders(data).items():
    print(f'| {name} | {r["ms"]:.2f} | {100 * r["wait"]:.1f}% |')
  if _TRAIN_STEPS.value and not (MULTI30K / 'train.en').exists():
    print(f'\ndata_wait runs skipped: {MULTI30K} is not present')
  elif _TRAIN_STEPS.value:
    for pack_length in (0, 64):  # configs/small.py: data.max_len 64
      waits = data_wait(directory, pack_length)
      print(f'\ntrain.py configs/small.py, pack_length {pack_length}, spm_alpha 0.1: data_wait '
            f'per 10 steps: {", ".join(f"{100 * w:.1f}%" for w in waits)}')


if __name__ == '__main__':
  app.run(main)

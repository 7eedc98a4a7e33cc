"""The input pipeline as train.py runs it (issue 51): how long a large corpus takes to start
(the first run reads, encodes and stores the training split; a later run maps what was
stored), with the peak memory, and how much of the training loop's time goes to waiting for
data.

  python bench/pipeline.py                         # 300k pairs
  python bench/pipeline.py --pairs 4500000         # WMT14 en-de's size
  python bench/pipeline.py --train_steps 60        # also: data_wait of configs/small.py

The corpus is synthetic, made at run time in a temporary directory from the newstest2014
pairs in ../shared/data/wmt14-newstest (never committed): pair i is newstest pair i mod 3003,
its words rotated by i // 3003 places so that repeats differ. A joint BPE SentencePiece model
of --vocab_size pieces is trained on the newstest lines first and handed to train.py
(data.spm_model), so that the start-up is the data's alone.

Start-up: `train.py --config configs/small.py` on that corpus (rows of up to 128 subwords),
timed from the process's start to its log line of the training split's counts (the split is
encoded and stored, or mapped, by then), with the process's peak resident memory at that
moment (VmHWM); the process is then killed. The first run stores the split; the second, on
the same workdir, maps it.

data_wait (--train_steps N): train.py configs/small.py on the first --train_pairs Multi30k
pairs (epochs of a few dozen steps, so that several epochs are sampled anew within the run),
subword sampling on (data.spm_alpha 0.1), bucketed and packed (data.pack_length 64), stopped
by SIGTERM once N steps are logged: the share of each logged interval the loop waited for its
batch (data_wait in metrics.jsonl).
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

import common
from absl import app, flags

os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # no accelerator plugin probing in the timings
ROOT = common.ROOT
NEWSTEST = ROOT.parent / 'shared' / 'data' / 'wmt14-newstest'
MULTI30K = ROOT.parent / 'shared' / 'data' / 'multi30k'  # configs/small.py's corpus

_PAIRS = flags.DEFINE_integer('pairs', 300_000, 'Training pairs of the synthetic corpus.')
_VOCAB = flags.DEFINE_integer('vocab_size', 8000, 'SentencePiece pieces (a soft limit).')
_TRAIN_STEPS = flags.DEFINE_integer('train_steps', 0, 'train.py steps per data_wait run (0: none).')
_TRAIN_PAIRS = flags.DEFINE_integer('train_pairs', 3000, 'Multi30k pairs of the data_wait runs '
                                    '(a few epochs in --train_steps steps).')
_MARKDOWN = flags.DEFINE_string('markdown', None, 'Also write the tables into this file, '
                                'replacing its bench/pipeline.py section.')

SPLIT_LOGGED = re.compile(r'\btrain: (\d+) lines, (\d+) pairs kept')  # train.py's log line


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


def train_spm(directory: pathlib.Path) -> pathlib.Path:
  """A joint BPE model trained on the newstest lines (both sides)."""
  import sentencepiece as spm
  lines = [line for side in ('en', 'de') for line in
           (NEWSTEST / f'newstest2014.{side}').read_text(encoding='utf-8').splitlines()]
  prefix = directory / 'spm'
  spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(prefix),
                                 vocab_size=_VOCAB.value, model_type='bpe',
                                 character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                                 hard_vocab_limit=False, minloglevel=2)
  return prefix.with_suffix('.model')


def peak_rss_mb(pid: int) -> float:
  for line in pathlib.Path(f'/proc/{pid}/status').read_text().splitlines():
    if line.startswith('VmHWM:'):
      return int(line.split()[1]) / 1024
  return float('nan')


def start_up(directory: pathlib.Path, spm_model: pathlib.Path) -> dict:
  """Seconds from train.py's start to its log line of the training split, and its peak RSS
  then; the process is killed after that line."""
  cmd = [sys.executable, 'train.py', '--config', 'configs/small.py', '--workdir',
         str(directory / 'run'), f'--config.data.train_src={directory}/train.en',
         f'--config.data.train_tgt={directory}/train.de',
         f'--config.data.valid_src={directory}/valid.en',
         f'--config.data.valid_tgt={directory}/valid.de', '--config.data.max_len=128',
         f'--config.data.spm_model={spm_model}']
  t0 = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                          text=True, start_new_session=True)
  seen = []
  try:
    for line in proc.stderr:
      seen.append(line)
      found = SPLIT_LOGGED.search(line)
      if found:
        return {'seconds': time.perf_counter() - t0, 'peak_mb': peak_rss_mb(proc.pid),
                'pairs': int(found[2])}
      if ' | loss ' in line:  # training began: the line was not found
        break
  finally:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  raise RuntimeError(f'train.py ended before logging its training split: {"".join(seen)[-2000:]}')


def data_wait(directory: pathlib.Path, pack_length: int) -> list[float]:
  """data_wait of each logged interval of train.py configs/small.py (subword sampling on) on
  the first --train_pairs Multi30k pairs, stopped by SIGTERM once --train_steps steps are
  logged."""
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
  return [r['data_wait'] for r in common.read_metrics(workdir / 'metrics.jsonl')
          if 'data_wait' in r]


def main(argv):
  del argv
  if not (NEWSTEST / 'newstest2014.en').exists():
    print(f'skipped: {NEWSTEST} is not present (newstest2014.en/.de make the corpus)')
    return
  with tempfile.TemporaryDirectory(prefix='bench_pipeline_') as tmp:
    text = run(pathlib.Path(tmp))
  print(text)
  if _MARKDOWN.value:
    common.write_section(_MARKDOWN.value, 'bench/pipeline.py', text)


def run(directory: pathlib.Path) -> str:
  make_corpus(directory, _PAIRS.value)
  spm_model = train_spm(directory)
  rows = []
  for name in ('first run (encode, store)', 'second run (map the stored split)'):
    s = start_up(directory, spm_model)
    rows.append(f'| {name} | {s["pairs"]:,} | {s["seconds"]:.1f} | {s["peak_mb"]:,.0f} |')
    print(rows[-1], flush=True)
  text = (f'{common.stamp()}\n\n{_PAIRS.value:,} synthetic pairs (newstest2014 rotated), a '
          f'joint BPE model of up to {_VOCAB.value} pieces given; train.py configs/small.py, '
          'rows of up to 128 subwords.\n\n'
          '| start-up | pairs kept | seconds to the split | peak RSS MB then |\n'
          '| --- | ---: | ---: | ---: |\n' + '\n'.join(rows) + '\n')
  if _TRAIN_STEPS.value and not (MULTI30K / 'train.en').exists():
    text += f'\ndata_wait runs skipped: {MULTI30K} is not present\n'
  elif _TRAIN_STEPS.value:
    text += (f'\ntrain.py configs/small.py on the first {_TRAIN_PAIRS.value} Multi30k pairs, '
             f'data.spm_alpha 0.1, stopped after {_TRAIN_STEPS.value} steps:\n\n'
             '| batching | data_wait per 10 steps |\n| --- | --- |\n')
    for pack_length in (0, 64):  # configs/small.py: data.max_len 64
      waits = data_wait(directory, pack_length)
      name = f'packed {pack_length}' if pack_length else 'bucketed'
      text += f'| {name} | {", ".join(f"{100 * w:.1f}%" for w in waits)} |\n'
  return text


if __name__ == '__main__':
  app.run(main)

"""recipe.py (train, choose on validation, score tests, append a results row), the best
checkpoint kept by validation BLEU, and the learning-curve plot."""

import json
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, shared_compile_cache

from transformer_nmt.checkpoint import Checkpointer, loop_state
from transformer_nmt.inference import CheckpointChoice, load_workdir
from transformer_nmt.metrics import read_metrics
from transformer_nmt.plots import plot_learning_curves, series
from transformer_nmt.training.selection import RESULTS_HEADER, append_row
from transformer_nmt.workdir import Workdir


def test_best_checkpoint_is_the_highest_validation_bleu(tiny_workdir):
  rows = [r for r in read_metrics(tiny_workdir / 'metrics.jsonl') if 'eval_bleu' in r]
  assert [r['step'] for r in rows] == [10, 20]
  best = Checkpointer(tiny_workdir / 'best', read_only=True)
  (step,) = best.all_steps()  # keep=1
  assert best.metrics(step)['eval_bleu'] == pytest.approx(max(r['eval_bleu'] for r in rows))
  top = max(r['eval_bleu'] for r in rows)
  assert step == max(r['step'] for r in rows if r['eval_bleu'] == top)  # ties: the later
  best.close()
  assert load_workdir(tiny_workdir, CheckpointChoice(best=True)).steps == [step]


def test_best_checkpointer_keeps_the_highest_metric_not_the_latest(tmp_path):
  import flax
  import jax
  import jax.numpy as jnp

  @flax.struct.dataclass
  class State:
    params: dict
    opt_state: dict
    step: jnp.ndarray

  ckpt = Checkpointer(tmp_path / 'best', keep=1, best_metric='eval_bleu')
  for step, bleu in ((1, 5.0), (2, 9.0), (3, 7.0)):
    ckpt.save(step, State({'w': jnp.full((2,), float(step))}, {}, jnp.int32(step)),
              loop_state(step, jax.random.key(step)), metrics={'eval_bleu': bleu})
  ckpt.close()
  kept = Checkpointer(tmp_path / 'best', read_only=True)
  assert kept.all_steps() == [2]
  assert kept.restore_params(2)['w'].tolist() == [2.0, 2.0]
  kept.close()


def test_series_keeps_the_last_value_of_a_repeated_step(tmp_path):
  rows = [{'step': 5, 'train_loss': 3.0}, {'step': 10, 'train_loss': 2.0},
          {'step': 10, 'train_loss': 1.5, 'eval_bleu': 7.0}, {'step': 15, 'train_loss': 1.0}]
  assert series(rows, 'train_loss') == ([5, 10, 15], [3.0, 1.5, 1.0])
  assert series(rows, 'eval_bleu') == ([10], [7.0])
  path = plot_learning_curves(rows, tmp_path / 'c.png')
  assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_append_row_creates_then_appends(tmp_path):
  path = tmp_path / 'docs' / 'R.md'
  append_row(path, '| a |\n', '# Intro\n')
  append_row(path, '| b |\n', '# Intro\n')
  assert path.read_text() == '# Intro\n\n' + RESULTS_HEADER + '| a |\n| b |\n'


def run_recipe(workdir, tmp_path, *flags):
  cmd = [sys.executable, 'recipe.py', '--config', 'configs/tiny.py', '--workdir', str(workdir),
         '--results', str(tmp_path / 'docs' / 'RESULTS.md'),
         '--plots_dir', str(tmp_path / 'docs' / 'plots'), *flags]
  return subprocess.run(cmd, cwd=ROOT, env=shared_compile_cache(), capture_output=True,
                        text=True, timeout=600)


@pytest.mark.slow
def test_recipe_selects_on_validation_and_appends_rows(tiny_workdir, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(tiny_workdir, workdir)
  shutil.rmtree(workdir / 'programs', ignore_errors=True)  # other tests' decode.py runs
  # a sweep run (first, on a workdir recipe.py never wrote to) chooses on validation and
  # leaves the test sets alone; searching with the workdir's own settings, it keeps the
  # programs of its beam search for decode.py
  sweep = run_recipe(workdir, tmp_path, '--alphas', '0.6', '--average_last', '0', '--sweep')
  assert sweep.returncode == 0, sweep.stderr[-3000:]
  kept = sorted((workdir / 'programs').iterdir())
  assert len(kept) == 1 and list(kept[0].glob('*.program'))
  assert 'has reached step 20: not training' in sweep.stderr
  assert json.loads(Workdir(workdir).selection.read_text())['tests'] == {}
  assert not Workdir(workdir).hypotheses('test').exists()

  # damaged lines in metrics.jsonl (issue 52): skipped and counted, the work still recorded
  with open(Workdir(workdir).metrics, 'ab') as f:
    f.write(b'\xff\xfe not utf-8\nnull\n{"loss": 1.0}\n')
  first = run_recipe(workdir, tmp_path, '--beam_size', '2', '--alphas', '0.6,1.0',
                     '--average_last', '2', '--attention_sentences', '2', '--mbr', 'chrf')
  assert first.returncode == 0, first.stderr[-3000:]
  assert 'skipped 3 damaged line(s)' in first.stderr
  assert 'has reached step 20: not training' in first.stderr
  selection = json.loads(Workdir(workdir).selection.read_text())
  labels = [(c, s) for c, s, _ in selection['trials']]
  assert labels[:3] == [('latest', 'greedy'), ('average of last 2', 'greedy'),
                        ('best', 'greedy')]
  beams = [b for c, s, b in selection['trials'][3:5]]
  best_alpha = ('0.6', '1.0')[beams.index(max(beams))]  # the first of equals
  assert [s for _, s in labels[3:]] == ['beam 2, alpha 0.6', 'beam 2, alpha 1.0',
                                        f'beam 2, alpha {best_alpha}, MBR chrf']
  # the chosen setting is the best validation trial on the chosen checkpoint
  chosen = [b for c, _, b in selection['trials'] if c == selection['checkpoint']]
  assert selection['valid_bleu'] == max(chosen)
  assert set(selection['tests']) == {'test'}
  assert len(Workdir(workdir).hypotheses('test').read_text().splitlines()) == 20
  plots = tmp_path / 'docs' / 'plots' / 'run'
  assert sorted(p.name for p in plots.iterdir()) == ['attention_1.png', 'attention_2.png',
                                                     'curves.png']
  text = (tmp_path / 'docs' / 'RESULTS.md').read_text()
  assert text.count('| date |') == 1
  rows = [line for line in text.splitlines() if line.startswith('| 2')]
  assert len(rows) == 2 and '| not decoded |' in rows[0] and 'not decoded' not in rows[1]
  row = rows[1]
  assert '`configs/tiny.py`' in row and '| 20 |' in row and 'plots/run/curves.png' in row
  assert f"test: **{selection['tests']['test']['bleu']:.2f}**" in row
  assert 'nrefs:1|case:mixed' in row
  # a beam size other than the workdir's kept no programs (decode.py would not call them);
  # decode.py with the workdir's settings calls those the sweep run kept for the validation set
  assert sorted((workdir / 'programs').iterdir()) == kept
  decoded = subprocess.run(
      [sys.executable, 'decode.py', '--workdir', str(workdir),
       '--input', str(workdir / 'demo_data' / 'valid.en'), '--output', str(tmp_path / 'v.de')],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  loaded = re.search(r'(\d+) stored programs loaded', decoded.stderr)
  assert loaded and int(loaded[1]) > 0, decoded.stderr[-3000:]


@pytest.mark.slow
def test_recipe_rejects_bad_flags(tmp_path):
  result = run_recipe(tmp_path / 'run', tmp_path, '--alphas', '0.6,abc')
  assert result.returncode == 2
  assert 'error: --alphas=0.6,abc: expected numbers' in result.stderr
  assert 'Traceback' not in result.stderr
  result = run_recipe(tmp_path / 'run', tmp_path, '--mbr', 'bleu,ter')
  assert result.returncode == 2 and 'Traceback' not in result.stderr
  assert 'error: --mbr=bleu,ter: expected utilities among bleu,chrf' in result.stderr
  result = run_recipe(tmp_path / 'run', tmp_path, '--beam_size', '0')  # decode.py's flag, checked
  assert result.returncode == 2 and 'Traceback' not in result.stderr  # as decode.py checks it
  assert 'error: --beam_size=0 must be positive' in result.stderr
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_plot_command_writes_curves_and_attention(tiny_workdir, tmp_path):
  test_src = tiny_workdir / 'demo_data' / 'test.en'
  result = subprocess.run([sys.executable, 'plot.py', '--workdir', str(tiny_workdir),
                           '--out_dir', str(tmp_path / 'p'), '--input', str(test_src),
                           '--sentences', '2', '--beam_size', '1'], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert sorted(p.name for p in (tmp_path / 'p').iterdir()) == [
      'attention_1.png', 'attention_2.png', 'curves.png']
  missing = subprocess.run([sys.executable, 'plot.py', '--workdir', str(tmp_path / 'nothing')],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert missing.returncode == 2 and 'metrics.jsonl is missing' in missing.stderr

"""Scores: the paper-style tokenized BLEU against a hand-made example; metrics.jsonl read
past damaged lines."""

import json

import pytest

from transformer_nmt.metrics import tokenized_bleu


def test_tokenized_bleu_splits_compounds_and_tokenizes():
  # 13a splits the final period, and "Hand-Gepäck" becomes "Hand ##AT##-##AT## Gepäck"
  # (tensor2tensor's compound splitting). Hand count: hypothesis tokens
  #   Das Hand ##AT##-##AT## Gepäck ist schwer .        (7 tokens)
  # reference tokens
  #   Das Hand ##AT##-##AT## Gepäck ist leicht .        (7 tokens)
  # matches: 1-grams 6/7, 2-grams 4/6, 3-grams 3/5, 4-grams 2/4, brevity penalty 1.
  hyp, ref = ['Das Hand-Gepäck ist schwer.'], ['Das Hand-Gepäck ist leicht.']
  expected = 100 * (6 / 7 * 4 / 6 * 3 / 5 * 2 / 4) ** 0.25
  assert tokenized_bleu(hyp, ref) == pytest.approx(expected, abs=1e-6)
  assert tokenized_bleu(ref, ref) == pytest.approx(100.0)


def _damaged_metrics(path):
  good = [{'step': 50, 'loss': 3.0, 'wall_s': 10.0}, {'step': 100, 'loss': 2.5, 'wall_s': 20.0,
                                                    'eval_bleu': 5.0}]
  lines = [json.dumps(good[0]).encode(), b'\xff\xfe not utf-8', b'null', b'[1, 2]',
           b'{"loss": 1.0}', b'{"step": "7"}', b'', json.dumps(good[1]).encode(),
           b'{"step": 150, "lo']  # the last one cut short by a crash
  path.write_bytes(b'\n'.join(lines))
  return good


def test_damaged_metrics_rows_are_skipped_and_counted_once(tmp_path, caplog):
  import logging

  from transformer_nmt.metrics import read_metrics
  path = tmp_path / 'metrics.jsonl'
  good = _damaged_metrics(path)
  with caplog.at_level(logging.WARNING):
    assert read_metrics(path) == good
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert warnings == [f'{path}: skipped 6 damaged line(s) (line 2, ...)']


def test_plot_py_draws_curves_from_a_damaged_metrics_file(tmp_path):
  import subprocess
  import sys

  from conftest import ROOT
  workdir = tmp_path / 'run'
  workdir.mkdir()
  _damaged_metrics(workdir / 'metrics.jsonl')
  result = subprocess.run([sys.executable, 'plot.py', '--workdir', str(workdir), '--out_dir',
                           str(tmp_path / 'plots')], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'skipped 6 damaged line(s)' in result.stderr and 'Traceback' not in result.stderr
  assert (tmp_path / 'plots' / 'curves.png').stat().st_size > 0

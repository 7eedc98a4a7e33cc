"""Minimum Bayes risk choice (mbr.py) and decode.mbr through the Engine, on the tiny
trained workdir."""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu
from conftest import ROOT

from transformer_nmt.decoding.mbr import expected_utilities, mbr_order
from transformer_nmt.inference import Engine


def test_the_consensus_wins_over_the_likeliest_outlier():
  texts = ['a dog runs on the beach', 'a cat sleeps', 'a dog runs on the sand',
           'the dog runs on the beach']
  logprobs = np.log([0.4, 0.45, 0.1, 0.05])  # the outlier is the likeliest
  order = mbr_order(texts, logprobs, 'bleu')
  assert order[0] == 0  # the likeliest, index 1, is not chosen
  bleu = sacrebleu.metrics.BLEU(effective_order=True)
  weights = np.array([0.4, 0.45, 0.1, 0.05])
  by_hand = [sum(w * bleu.sentence_score(h, [r]).score for r, w in zip(texts, weights))
             for h in texts]
  assert expected_utilities(texts, logprobs, 'bleu') == pytest.approx(by_hand)


def test_weights_decide_between_two_and_ties_keep_the_search_order():
  texts = ['a man plays the guitar', 'two women walk in a park']  # nothing in common
  assert mbr_order(texts, [-3.0, -1.0], 'chrf') == [1, 0]  # its own weight decides
  assert mbr_order(texts, [-1.0, -3.0], 'chrf') == [0, 1]
  same = ['a man plays', 'a man plays', 'two women walk']  # two equal hypotheses tie
  assert mbr_order(same, [-2.0, -1.5, -2.0], 'bleu') == [0, 1, 2]
  assert mbr_order(['x'], [-1.0], 'bleu') == [0] and mbr_order([], [], 'bleu') == []
  with pytest.raises(ValueError, match="MBR utility 'ter'"):
    expected_utilities(texts, [0.0, 0.0], 'ter')


@pytest.mark.slow
@pytest.mark.parametrize('utility', ['bleu', 'chrf'])
def test_engine_outputs_the_mbr_choice_among_the_beams_hypotheses(loaded, lines, utility):
  decode = dataclasses.replace(loaded.decode, max_extra_len=6)  # decode.py's search below
  assert decode.beam_size == 4 and decode.mbr == 'off'
  make = lambda d, n: Engine(loaded, d, n_best=n)  # noqa: E731
  chosen = dataclasses.replace(decode, mbr=utility)
  searched = make(decode, 4).hypotheses(lines)
  reordered = make(chosen, 4).hypotheses(lines)
  outputs = make(chosen, 1).translate([''] + lines)
  assert outputs[0] == ''
  for (_, beam), (_, mbr), out in zip(searched, reordered, outputs[1:]):
    assert sorted(h.text for h in mbr) == sorted(h.text for h in beam)  # the same hypotheses
    gains = expected_utilities([h.text for h in beam], [h.logprob for h in beam], utility)
    assert mbr[0].text == beam[int(np.argmax(gains))].text == out
  one = make(chosen, 2).hypotheses(lines[:3])
  assert all(len(hyps) <= 2 for _, hyps in one)
  assert [hyps[0].text for _, hyps in one] == outputs[1:4]


@pytest.mark.slow
def test_decode_py_mbr_flag_gives_the_engines_choice(tiny_workdir, loaded, lines, tmp_path):
  source, out = tmp_path / 'in.txt', tmp_path / 'out.txt'
  source.write_text('\n'.join(lines) + '\n')
  run = subprocess.run([sys.executable, 'decode.py', '--workdir', str(tiny_workdir), '--input',
                        str(source), '--output', str(out), '--mbr', 'chrf', '--max_extra_len',
                        '6'], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  assert 'beam 4, alpha 0.6, stop bound, MBR chrf' in run.stderr
  chosen = dataclasses.replace(loaded.decode, max_extra_len=6, mbr='chrf')
  expected = Engine(loaded, chosen).translate(lines)
  assert out.read_text().splitlines() == expected


@pytest.mark.slow
def test_the_engine_outputs_whatever_mbr_order_puts_first(loaded, lines, monkeypatch):
  """On the tiny model MBR agrees with the search on these lines, so the wiring is checked
  with an order that always puts the search's last hypothesis first."""
  from transformer_nmt.inference import engine as engine_lib
  decode = dataclasses.replace(loaded.decode, max_extra_len=6)
  searched = Engine(loaded, decode, n_best=4).hypotheses(lines)
  assert any(len(hyps) > 1 for _, hyps in searched)
  monkeypatch.setattr(engine_lib, 'mbr_order', lambda texts, logprobs, utility:
                      list(range(len(texts)))[::-1])
  outputs = Engine(loaded, dataclasses.replace(decode, mbr='bleu')).translate(lines)
  assert outputs == [hyps[-1].text for _, hyps in searched]

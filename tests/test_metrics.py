"""Scores: the paper-style tokenized BLEU against a hand-made example."""

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

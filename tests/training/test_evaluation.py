"""Evaluator: validation loss and BLEU of a trained tiny model, independent of batching."""

import dataclasses

import numpy as np
import pytest

from transformer_nmt.data import batching as data_lib
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.inference import Engine, load_workdir
from transformer_nmt.metrics import corpus_bleu
from transformer_nmt.training.evaluation import Evaluator, subset


@pytest.fixture(scope='module')
def setup(tiny_workdir):
  model = load_workdir(tiny_workdir)
  demo = tiny_workdir / 'demo_data'
  src, tgt = ((demo / f'test.{lang}').read_text().splitlines() for lang in ('en', 'de'))
  data = data_lib.encode_parallel(src, tgt, model.src_tok, model.tgt_tok, max_len=None,
                                  stats=data_lib.ReadStats())
  return model, data, tgt


def _evaluator(model, tokens):
  return Evaluator(model.cfg, 0.1, model.tgt_tok, model.src_tok,
                   DecodeConfig(beam_size=4, max_extra_len=10, tokens_per_batch=tokens))


@pytest.mark.slow
def test_loss_is_the_token_mean_whatever_the_batches(setup):
  model, data, _ = setup
  whole = _evaluator(model, 4096).loss(model.params, data)
  pieces = _evaluator(model, 40).loss(model.params, data)  # several batches per bucket
  for key in ('loss', 'nll', 'perplexity', 'accuracy'):
    assert pieces[key] == pytest.approx(whole[key], rel=1e-4)
  assert whole['loss'] > whole['nll'] > 0  # label smoothing adds to the NLL
  assert whole['perplexity'] == pytest.approx(np.exp(whole['nll']), rel=1e-6)
  assert 0.0 <= whole['accuracy'] <= 1.0


@pytest.mark.slow
def test_bleu_is_greedy_in_file_order(setup):
  model, data, references = setup
  evaluator = _evaluator(model, 4096)
  assert evaluator.engine.decode.compact  # the decode section's settings, with beam 1:
  reversed_data = dataclasses.replace(data, src=data.src[::-1], tgt=data.tgt[::-1],
                                      index=data.index[::-1])
  score, hyps, signature = evaluator.bleu(model.params, data, references)
  _, reversed_hyps, _ = evaluator.bleu(model.params, reversed_data, references)
  assert reversed_hyps == hyps[::-1]  # each hypothesis stays with its example
  assert (score, signature) == corpus_bleu(hyps, [references[i] for i in data.index])
  greedy = DecodeConfig(beam_size=1, max_extra_len=10)
  direct = Engine(model, greedy).translate_ids(data.src)
  assert hyps == model.tgt_tok.decode([o.tolist() for o in direct])


def test_subset_takes_the_first_examples(setup):
  _, data, _ = setup
  assert len(subset(data, 3)) == 3 and list(subset(data, 3).index) == list(data.index[:3])
  assert subset(data, 0) is data and subset(data, len(data) + 5) is data

"""data.spm_alpha / data.spm_nbest: subword regularisation of the training pairs."""

import numpy as np
import pytest

from transformer_nmt.config import default_config
from transformer_nmt.data import batching as data_lib
from transformer_nmt.data import cache, training_batches
from transformer_nmt.data import corpus as corpus_lib
from transformer_nmt.errors import ConfigError
from transformer_nmt.typed_config import sections, validate_config


@pytest.fixture(scope='module')
def experiment(tmp_path_factory):
  from configs import tiny
  from transformer_nmt.training import loop
  config = tiny.get_config()
  config.data.update(demo_sizes=(200, 20, 10), spm_alpha=0.3)
  return loop.prepare(validate_config(config), tmp_path_factory.mktemp('sampled') / 'run'), config


def _ids(data):
  return [s.tolist() for s in data.src] + [t.tolist() for t in data.tgt]


def test_same_seed_and_epoch_same_segmentation_other_epoch_another(experiment):
  exp, _ = experiment
  first, again, second = exp.train_epochs(0), exp.train_epochs(0), exp.train_epochs(1)
  assert _ids(first) == _ids(again)
  assert _ids(first) != _ids(second) and _ids(first) != _ids(exp.train)
  tok = exp.evaluator.tokenizer  # the same sentences, other subwords
  canonical = dict(zip(exp.train.index.tolist(), tok.decode([t.tolist() for t in exp.train.tgt])))
  sampled = dict(zip(first.index.tolist(), tok.decode([t.tolist() for t in first.tgt])))
  assert len(sampled) > 0.9 * len(canonical)  # a few get longer than data.max_len
  assert all(canonical[i] == text for i, text in sampled.items() if i in canonical)


def test_validation_is_never_sampled(experiment):
  exp, config = experiment
  src_tok = exp.evaluator.src_tokenizer
  kept = [src_tok.decode([s.tolist()])[0] for s in exp.valid.src]
  assert [s.tolist()[:-1] for s in exp.valid.src] == src_tok.encode(kept)  # canonical ids


def test_resumed_batches_equal_the_uninterrupted_ones_across_epochs(experiment):
  exp, config = experiment
  batches = lambda start: training_batches.train_batches(  # noqa: E731
      exp.train, 256, seed=0, start_step=start, data_for_epoch=exp.train_epochs)
  run = batches(0)
  straight = [next(run) for _ in range(60)]
  epoch_one = len(data_lib.plan_batches(exp.train_epochs(0).lengths,
                                        exp.train_epochs(0).boundaries, 256,
                                        np.random.default_rng([0, 0])))
  assert epoch_one < 50  # the comparison below reaches into the second epoch
  resumed = batches(epoch_one - 2)
  for k in range(epoch_one - 2, 60):
    got = next(resumed)
    assert all(np.array_equal(got[key], straight[k][key]) for key in got), k


@pytest.mark.parametrize('option,value', [('spm_alpha', 1.5), ('spm_alpha', -0.1),
                                          ('spm_nbest', 0)])
def test_bad_values_are_refused(option, value):
  config = default_config()
  config.data[option] = value
  with pytest.raises(ConfigError, match=f'data.{option}='):
    validate_config(config)


def test_sampled_in_chunks_the_first_as_before_the_others_seeded_apart(experiment, monkeypatch):
  """Sampling holds one chunk's id lists at a time; a corpus of one chunk (Multi30k's 29k
  pairs) is segmented as the unchunked sampling did, so that runs resume as they were."""
  exp, config = experiment
  tok = exp.evaluator.tokenizer
  d = sections(config).data
  lines = corpus_lib.read_corpus(d, tok.path.parent).train
  sample = dict(alpha=config.data.spm_alpha, nbest=config.data.spm_nbest)
  state = np.random.SeedSequence([0, 3]).generate_state(2)  # unchunked: seeded by (seed, epoch)
  before = data_lib.parallel_ids(tok.sample(lines[0], seed=int(state[0]), **sample),
                                 tok.sample(lines[1], seed=int(state[1]), **sample), tok, tok,
                                 max_len=config.data.max_len, stats=data_lib.ReadStats())
  epochs = lambda: corpus_lib.sampled_epochs(lambda: lines, tok, tok, d, seed=0)  # noqa: E731
  assert _ids(epochs()(3)) == _ids(before)  # 200 pairs: one chunk
  monkeypatch.setattr(cache, 'CHUNK', 64)
  chunked = epochs()(3)
  assert _ids(chunked) == _ids(epochs()(3))  # deterministic
  first = [i for i, k in enumerate(chunked.index) if k < 64]
  assert [chunked.src[i].tolist() for i in first] == \
      [before.src[i].tolist() for i in range(len(before)) if before.index[i] < 64]
  assert _ids(chunked) != _ids(before)  # later chunks have seeds of their own

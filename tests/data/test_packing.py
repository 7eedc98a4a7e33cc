"""Packed rows (several pairs per row) against the same pairs one per row."""

import dataclasses

import jax
import numpy as np
import pytest

from transformer_nmt.data import batching as data_lib
from transformer_nmt.data import training_batches
from transformer_nmt.model.transformer import Transformer, init_params


def _data(lengths, vocab=24) -> data_lib.ParallelData:
  rng = np.random.default_rng(0)
  src = [np.append(rng.integers(4, vocab, n - 1), 3).astype(np.int32) for n, _ in lengths]
  tgt = [np.append(rng.integers(4, vocab, m - 1), 3).astype(np.int32) for _, m in lengths]
  return data_lib.ParallelData(src, tgt, np.arange(len(src)), 0, 2, [16], data_lib.ReadStats())


def _per_example_nll(logits, batch):
  """{(row, segment): summed NLL over that segment's target tokens}."""
  log_p = jax.nn.log_softmax(logits)
  nll = -np.take_along_axis(np.asarray(log_p), batch['tgt_out'][..., None], -1)[..., 0]
  out = {}
  for r, s in zip(*np.nonzero(batch['tgt_segments'])):
    key = (r, batch['tgt_segments'][r, s])
    out[key] = out.get(key, 0.0) + nll[r, s]
  return out


@pytest.mark.slow
def test_packed_loss_equals_unpacked_loss_per_example(tiny_cfg):
  cfg = dataclasses.replace(tiny_cfg, norm_position='pre')
  data = _data([(3, 5), (6, 2), (4, 4)])
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(0))
  forward = lambda b: model.apply({'params': params}, b['src'], b['tgt_in'], b['src_segments'],
                                  b['tgt_segments'], b['src_positions'], b['tgt_positions'])
  packed = training_batches.collate_packed(data, [[0, 1, 2]], num_rows=1, length=16)
  assert packed['src_segments'][0].tolist()[:14] == [1] * 3 + [2] * 6 + [3] * 4 + [0]
  assert packed['tgt_positions'][0, 5:9].tolist() == [0, 1, 0, 1]
  got = _per_example_nll(forward(packed), packed)
  for i in range(3):
    alone = data_lib.collate(data, data_lib.BatchPlan(np.array([i]), 1, 8))
    expected = _per_example_nll(forward(alone), alone)[(0, 1)]
    assert got[(0, i + 1)] == pytest.approx(expected, rel=1e-5)


def test_pack_rows_uses_every_example_once_within_the_length():
  lengths = [(3, 5), (6, 2), (4, 4), (7, 7), (2, 3), (5, 6)] * 5
  data = _data(lengths)
  rows = training_batches.pack_rows(data, range(len(data)), 10)
  assert sorted(i for row in rows for i in row) == list(range(len(data)))
  for row in rows:
    assert sum(lengths[i][0] for i in row) <= 10 and sum(lengths[i][1] for i in row) <= 10
  assert len(rows) < len(data)  # packing actually combines pairs
  with pytest.raises(ValueError, match='longer than the packing length'):
    training_batches.pack_rows(data, [3], 6)


def test_packed_batches_resume_exactly():
  data = _data([(3, 5), (6, 2), (4, 4), (7, 7), (2, 3), (5, 6)] * 4)
  full = training_batches.train_batches(data, 32, seed=1, pack_length=16)
  reference = [next(full) for _ in range(9)]
  resumed = training_batches.train_batches(data, 32, seed=1, start_step=5, pack_length=16)
  for expected in reference[5:]:
    got = next(resumed)
    for key in expected:
      np.testing.assert_array_equal(got[key], expected[key])
  padded = np.mean([1 - np.count_nonzero(b['tgt_segments']) / b['tgt_segments'].size
                    for b in reference])
  assert padded < 0.5

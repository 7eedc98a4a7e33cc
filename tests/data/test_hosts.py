"""Each process builds only its rows of the global batch: the shares of 1, 2, 4 or 8 simulated
processes, stacked in process order, are the single-process batch."""

import numpy as np
import pytest

from transformer_nmt.data import batching as data_lib
from transformer_nmt.data import training_batches
from transformer_nmt.data.ragged import Ragged, concatenate


def _data(n=300, seed=0, dtype=np.int32) -> data_lib.ParallelData:
  rng = np.random.default_rng(seed)
  rows = lambda: [np.append(rng.integers(4, 500, rng.integers(0, 30)), 3).astype(dtype)
                  for _ in range(n)]
  return data_lib.ParallelData(rows(), rows(), np.arange(n), 0, 2, [8, 16, 32],
                               data_lib.ReadStats())


def _reference_packed(data, rows, num_rows, length):
  """The batch built one example at a time (the loop this module had before)."""
  batch = {k: np.zeros((num_rows, length), np.int32) for k in
           ('src', 'src_segments', 'src_positions', 'tgt_in', 'tgt_out', 'tgt_segments',
            'tgt_positions')}
  for key in ('src', 'tgt_in', 'tgt_out'):
    batch[key].fill(data.pad_id)
  for r, examples in enumerate(rows):
    used = {'src': 0, 'tgt': 0}
    for segment, i in enumerate(examples, start=1):
      for side, ids in (('src', data.src[i]), ('tgt', data.tgt[i])):
        o, n = used[side], len(ids)
        batch['src' if side == 'src' else 'tgt_out'][r, o:o + n] = ids
        if side == 'tgt':
          batch['tgt_in'][r, o] = data.bos_id
          batch['tgt_in'][r, o + 1:o + n] = ids[:-1]
        batch[f'{side}_segments'][r, o:o + n] = segment
        batch[f'{side}_positions'][r, o:o + n] = np.arange(n)
        used[side] = o + n
  return batch


def _equal(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize('dtype', [np.int32, np.uint16])
def test_vectorised_collation_matches_one_example_at_a_time(dtype):
  data = _data(dtype=dtype)
  rows = training_batches.pack_rows(data, np.random.default_rng(1).permutation(len(data)), 64)
  batch = training_batches.collate_packed(data, rows[:10] + [[]], 13, 64)  # 3 rows left empty
  _equal(batch, _reference_packed(data, rows[:10] + [[]], 13, 64))
  assert (batch['src_segments'][10:] == 0).all() and batch['src'].dtype == np.int32
  plan = data_lib.BatchPlan(np.array([5, 0, 299]), 4, 32)
  _equal(data_lib.collate(data, plan), _reference_packed(data, [[5], [0], [299]], 4, 32))


@pytest.mark.parametrize('pack_length', [0, 64])
def test_host_shares_stacked_are_the_global_batch(pack_length):
  data = _data()
  tokens = 64 * 16
  batches = lambda host, start=0: training_batches.train_batches(  # noqa: E731
      data, tokens, seed=5, start_step=start, row_multiple=8, pack_length=pack_length,
      host=host)
  whole = batches((0, 1))
  reference = [next(whole) for _ in range(40)]  # several epochs
  if pack_length:  # the first batch: the first 16 rows that pack_rows makes of epoch 0
    order = np.random.default_rng([5, 0]).permutation(len(data))
    rows = training_batches.pack_rows(data, order, 64)
    _equal(reference[0], _reference_packed(data, rows[:16], 16, 64))
  for count in (2, 4, 8):
    shares = [batches((i, count)) for i in range(count)]
    for k, expected in enumerate(reference):
      parts = [next(s) for s in shares]
      assert all(p['src'].shape[0] == expected['src'].shape[0] // count for p in parts)
      _equal({key: np.concatenate([p[key] for p in parts]) for key in expected}, expected)
  resumed = batches((3, 4), start=17)  # a resumed process starts at its share of batch 17
  for expected in reference[17:25]:
    rows = expected['src'].shape[0] // 4
    _equal(next(resumed), {key: v[3 * rows:4 * rows] for key, v in expected.items()})


def test_a_host_that_cannot_split_the_rows_is_refused():
  with pytest.raises(ValueError, match='host 0 of 3'):
    next(training_batches.train_batches(_data(), 512, seed=0, row_multiple=8, host=(0, 3)))
  with pytest.raises(ValueError, match='host 2 of 2'):
    next(training_batches.train_batches(_data(), 512, seed=0, row_multiple=8, host=(2, 2)))


def test_ragged_rows_slices_and_concatenation():
  rows = [[5, 6], [], [7, 8, 9]]
  r = Ragged.from_rows(rows, end=3)
  assert [x.tolist() for x in r] == [[5, 6, 3], [3], [7, 8, 9, 3]]
  assert r.lengths.tolist() == [3, 1, 4] and r[-1].tolist() == [7, 8, 9, 3]
  tail = r[1:]
  assert len(tail) == 2 and tail[0].tolist() == [3] and tail.lengths.tolist() == [1, 4]
  both = concatenate([tail, Ragged.from_rows([[1]])])
  assert [x.tolist() for x in both] == [[3], [7, 8, 9, 3], [1]]
  assert [x.tolist() for x in r[::-2]] == [[7, 8, 9, 3], [5, 6, 3]]
  with pytest.raises(IndexError):
    r[3]

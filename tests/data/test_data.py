import numpy as np
import pytest

from transformer_nmt.data import batching as data_lib
from transformer_nmt.data import training_batches
from transformer_nmt.data.tokenizer import THREADED_LINES, Tokenizer, train_tokenizer
from transformer_nmt.errors import DataError


@pytest.fixture
def tokenizer(parallel_files, tmp_path) -> Tokenizer:
  src, tgt, _ = data_lib.read_parallel(*parallel_files)
  return train_tokenizer(src + tgt, tmp_path / 'spm.model', vocab_size=60,
                         model_type='unigram')


def test_few_lines_are_encoded_one_by_one_and_many_in_one_call(parallel_files, tokenizer,
                                                              monkeypatch):
  """Below THREADED_LINES lines SentencePiece gets each line alone (no threads started for a
  server's request), from there on the list in one threaded call: the same ids either way."""
  src, _, _ = data_lib.read_parallel(*parallel_files)
  lines = (src * THREADED_LINES)[:THREADED_LINES]
  given, encode = [], tokenizer._sp.encode
  monkeypatch.setattr(tokenizer._sp, 'encode',
                      lambda x, **kw: given.append(type(x).__name__) or encode(x, **kw))
  few, many = tokenizer.encode(lines[:-1]), tokenizer.encode(lines)
  assert given == ['str'] * (THREADED_LINES - 1) + ['list']
  assert few == many[:-1] and few[0] and all(isinstance(i, int) for i in few[0])


def test_read_parallel_skips_and_counts_empty_pairs(parallel_files):
  src, tgt, stats = data_lib.read_parallel(*parallel_files)
  assert (stats.lines, stats.kept, stats.empty) == (20, 19, 1)
  assert src[0] == 'I have 1 cats and dogs .' and tgt[0] == 'Ich habe 1 Katzen und Hunde .'


def test_lines_are_stripped(tmp_path):
  path = tmp_path / 'a.txt'
  path.write_bytes(b' leading\ntrailing  \r\n')
  assert data_lib.read_lines(path) == ['leading', 'trailing']


def test_missing_file_names_the_file(tmp_path):
  with pytest.raises(DataError, match='nope.en: no such file'):
    data_lib.read_lines(tmp_path / 'nope.en')


def test_different_line_counts_are_an_error(tmp_path):
  (tmp_path / 'a.en').write_text('one\ntwo\n')
  (tmp_path / 'a.de').write_text('eins\n')
  with pytest.raises(DataError, match='has 2 lines but .* has 1'):
    data_lib.read_parallel(tmp_path / 'a.en', tmp_path / 'a.de')


def test_invalid_utf8_names_file_and_line(tmp_path):
  path = tmp_path / 'bad.de'
  path.write_bytes('gut\nschön\n'.encode('utf-8') + b'kaputt \xff\n')
  with pytest.raises(DataError, match=r'bad\.de:3: invalid UTF-8'):
    data_lib.read_lines(path)


def test_bucket_boundaries_are_increasing_and_end_at_max_len():
  bounds = data_lib.bucket_boundaries(64)
  assert bounds[0] == 8 and bounds[-1] == 64
  assert all(a < b for a, b in zip(bounds, bounds[1:]))
  assert all(b % 4 == 0 for b in bounds)


def _encode(parallel_files, tokenizer, max_len, boundaries=None):
  src, tgt, stats = data_lib.read_parallel(*parallel_files)
  return data_lib.encode_parallel(src, tgt, tokenizer, tokenizer, max_len=max_len, stats=stats,
                                  boundaries=boundaries)


def test_long_pairs_are_skipped_and_counted(parallel_files, tokenizer):
  everything = _encode(parallel_files, tokenizer, max_len=None)
  limit = int(np.median(everything.lengths))
  data = _encode(parallel_files, tokenizer, max_len=limit)
  assert data.stats.too_long == int(np.sum(everything.lengths > limit)) > 0
  assert len(data) + data.stats.too_long == 19
  assert max(data.lengths) <= limit


def test_batches_have_fixed_shapes_budget_and_no_padding_leaks(parallel_files, tokenizer):
  data = _encode(parallel_files, tokenizer, max_len=None)
  top = int(data.lengths.max())
  data.boundaries = [top // 2, top]
  seen = []
  for plan in data_lib.plan_batches(data.lengths, data.boundaries, tokens_per_batch=4 * top):
    batch = data_lib.collate(data, plan)
    assert batch['src'].shape == (4 * top // plan.length, plan.length)
    for row, i in enumerate(plan.examples):
      n = len(data.tgt[i])
      np.testing.assert_array_equal(batch['tgt_out'][row, :n], data.tgt[i])
      assert batch['tgt_in'][row, 0] == tokenizer.bos_id
      np.testing.assert_array_equal(batch['tgt_in'][row, 1:n], data.tgt[i][:-1])
      assert (batch['tgt_out'][row, n:] == tokenizer.pad_id).all()
      segments = batch['tgt_segments'][row]
      assert (segments[n:] == 0).all() and (segments[:n] == 1).all()
      np.testing.assert_array_equal(batch['src_positions'][row, :len(data.src[i])],
                                    np.arange(len(data.src[i])))
    assert (batch['src_segments'][len(plan.examples):] == 0).all()  # filler rows are empty
    seen += list(plan.examples)
  assert sorted(seen) == list(range(len(data)))  # every example exactly once per epoch


def test_train_batches_resume_exactly(parallel_files, tokenizer):
  data = _encode(parallel_files, tokenizer, max_len=None)
  budget = 2 * int(data.lengths.max())  # 2-4 rows per batch: several batches per epoch
  full = training_batches.train_batches(data, budget, seed=3)
  reference = [next(full) for _ in range(12)]
  resumed = training_batches.train_batches(data, budget, seed=3, start_step=7)
  for expected in reference[7:]:
    got = next(resumed)
    for key in expected:
      np.testing.assert_array_equal(got[key], expected[key])


def test_padding_fraction():
  batch = {'src': np.zeros((2, 4)), 'tgt_out': np.zeros((2, 4)),
           'src_segments': np.array([[1, 1, 0, 0], [1, 1, 1, 1]]),
           'tgt_segments': np.array([[1, 0, 0, 0], [1, 1, 1, 1]])}
  assert data_lib.padding_fraction(batch) == pytest.approx(5 / 16)


def test_tokenizer_round_trip_and_special_ids(tokenizer):
  assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 2, 3)
  ids = tokenizer.encode(['Ich habe 7 Katzen .'])
  assert tokenizer.decode(ids) == ['Ich habe 7 Katzen .']
  # everything from EOS on is dropped, padding is ignored
  assert tokenizer.decode([ids[0] + [tokenizer.eos_id, 5, 6]]) == ['Ich habe 7 Katzen .']


def test_unloadable_tokenizer_is_a_clear_error(tmp_path):
  bad = tmp_path / 'x.model'
  bad.write_bytes(b'not a model')
  with pytest.raises(DataError, match='cannot load SentencePiece model'):
    Tokenizer(bad)


def test_rows_are_a_multiple_of_the_device_count():
  lengths = np.array([3, 5, 7, 9, 11] * 10)
  for plan in data_lib.plan_batches(lengths, [6, 12], tokens_per_batch=100, row_multiple=8):
    assert plan.rows % 8 == 0 and plan.rows >= 8
  plans = data_lib.plan_batches(lengths, [6, 12], tokens_per_batch=100, row_multiple=8)
  assert sorted(np.concatenate([p.examples for p in plans]).tolist()) == list(range(50))


def test_line_blocks_hand_out_blocks_and_name_a_bad_line():
  import io
  stream = io.BytesIO(b'one\ntwo \n\nfour\r\nfive')
  assert list(data_lib.line_blocks(stream, 'in', 2)) == [['one', 'two'], ['', 'four'], ['five']]
  assert list(data_lib.line_blocks(io.BytesIO(b''), 'in', 3)) == []
  blocks = data_lib.line_blocks(io.BytesIO(b'ok\nok\nbad \xff\n'), 'in.en', 2)
  assert next(blocks) == ['ok', 'ok']  # the first block is out before the bad line is read
  with pytest.raises(DataError, match='in.en:3: invalid UTF-8'):
    next(blocks)


def test_fill_batches_shares_batches_across_buckets_within_the_budget():
  lengths = np.array([5, 30, 7, 12, 9, 11, 30, 6])
  plans = data_lib.fill_batches(lengths, [8, 12, 16, 32], tokens_per_batch=64)
  # Sorted: 5 6 7 9 11 | 12 30 | 30. Six sentences padded to 12 are 72 > 64 tokens, so the
  # first batch stops at five; 12 and a 30 share one padded to 32 (64 tokens).
  assert [p.examples.tolist() for p in plans] == [[0, 7, 2, 4, 5], [3, 1], [6]]
  assert [(p.rows, p.length) for p in plans] == [(5, 12), (2, 32), (2, 32)]
  for p in plans:
    assert len(p.examples) * p.length <= 64 and p.length >= lengths[p.examples].max()
  assert len(data_lib.fill_batches(np.array([40]), [8, 48], tokens_per_batch=16)) == 1
  short = data_lib.fill_batches(np.array([5, 14, 9, 22, 7]), [8, 12, 16, 20, 28], 4096)
  assert len(short) == 1 and short[0].length == 28  # a short input is one batch


def test_fill_batches_on_a_grid_of_row_sizes():
  sizes = [1, 2, 4, 8, 12, 16, 24, 32]
  lengths = np.array([9] * 30 + [20] * 3)
  plans = data_lib.fill_batches(lengths, [12, 24], tokens_per_batch=300, row_sizes=sizes,
                                min_rows=8)
  # 300 // 12 = 25 rows fit: the largest size is 24; 6 sentences of 12 and 3 of 24 remain.
  assert [(len(p.examples), p.rows, p.length) for p in plans] == [(24, 24, 12), (9, 12, 24)]
  one = data_lib.fill_batches(np.array([5]), [8], 4096, sizes, min_rows=8)
  assert one[0].rows == 8  # at least min_rows ...
  long = data_lib.fill_batches(np.array([90, 90]), [100], 300, sizes, min_rows=8)
  assert [(len(p.examples), p.rows) for p in long] == [(2, 2)]  # ... unless the budget allows fewer

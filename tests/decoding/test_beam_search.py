import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt import ModelConfig, beam_search, greedy_search, init_params, length_penalty
from transformer_nmt.decoding.search import cache_stages
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.decoding.translate import translate

PAD, BOS, EOS = 0, 1, 2


def spec(eos_id: int = EOS, **decode) -> SearchSpec:
  """A search over this file's special ids with the decode settings `decode`."""
  return SearchSpec(BOS, eos_id, PAD, DecodeConfig(**decode))


def table_logits_fn(table: np.ndarray):
  """A Markov 'model': the next-token log-probabilities depend only on the previous token."""
  table = jnp.asarray(table)

  def logits_fn(ids, cache):
    return table[ids], cache
  return logits_fn


def random_table(seed: int, vocab: int = 5) -> np.ndarray:
  rng = np.random.default_rng(seed)
  logits = rng.normal(scale=2.0, size=(vocab, vocab))
  logits[:, [PAD, BOS]] = -1e9  # never produced
  return np.asarray(jax.nn.log_softmax(jnp.asarray(logits)))


def brute_force_best(table: np.ndarray, max_len: int, alpha: float) -> list[int]:
  """Enumerates every output (tokens then EOS, EOS forced at max_len) and scores it."""
  vocab = table.shape[0]
  best, best_score = None, -np.inf
  for n in range(max_len):  # n tokens before EOS
    for body in itertools.product(range(3, vocab), repeat=n):
      seq = list(body) + [EOS]
      prev, logp = BOS, 0.0
      for tok in seq:
        logp += table[prev, tok]
        prev = tok
      score = logp / float(length_penalty(len(seq), alpha))
      if score > best_score:
        best, best_score = seq, score
  return best


def _search(table, max_len, alpha, beam, chunk=8):
  ids, _ = beam_search(table_logits_fn(table), jnp.zeros((1,)), jnp.array([max_len]),
                       spec(beam_size=beam, alpha=alpha, chunk=chunk), max_len=max_len)
  row = np.asarray(ids)[0].tolist()
  return row[:row.index(EOS) + 1]


@pytest.mark.parametrize('seed', range(6))
@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_beam_search_finds_brute_force_best(seed, alpha):
  table = random_table(seed)
  assert _search(table, 5, alpha, beam=4) == brute_force_best(table, 5, alpha)


def test_beam_beats_greedy_on_a_garden_path_table():
  table = np.full((6, 6), -1e9)
  # From BOS: token 3 looks best (0.6) but leads to a flat distribution; 4 (0.4) leads to EOS.
  table[BOS, 3], table[BOS, 4] = np.log(0.6), np.log(0.4)
  table[3, 3:6] = np.log(1 / 3)
  table[3, EOS] = -1e9
  table[4, EOS] = 0.0
  table[5, EOS] = 0.0
  greedy = greedy_search(table_logits_fn(table), jnp.zeros((1,)), jnp.array([4]), spec(),
                         max_len=4)
  assert np.asarray(greedy)[0, 0] == 3
  assert _search(table, 4, 0.0, beam=2) == [4, EOS] == brute_force_best(table, 4, 0.0)


def test_length_penalty_formula():
  for length in (1, 5, 17):
    assert float(length_penalty(length, 0.6)) == pytest.approx(((5 + length) / 6) ** 0.6)
  assert float(length_penalty(9, 0.0)) == 1.0


@pytest.mark.slow
def test_early_stopping_matches_full_length_scan():
  for seed in range(4):
    table = random_table(seed, vocab=7)
    assert _search(table, 9, 0.6, beam=4, chunk=1) == _search(table, 9, 0.6, beam=4, chunk=64)


@pytest.fixture(scope='module')
def model():
  cfg = ModelConfig(vocab_size=30, num_layers=2, d_model=32, d_ff=64, num_heads=4)
  src = jnp.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
  return cfg, init_params(cfg, jax.random.key(0)), src, (src > 0).astype(jnp.int32)


@pytest.mark.slow
def test_beam_1_equals_greedy(model):
  cfg, params, src, seg = model
  greedy = translate(cfg, params, src, seg, spec(3, beam_size=1, max_extra_len=6))
  from transformer_nmt.decoding import ensemble
  logits_fn, cache = ensemble.step_fn(cfg, params), ensemble.start(cfg, params, src, seg, 16)
  beam1, _ = beam_search(logits_fn, cache, seg.sum(1) + 6, spec(3, beam_size=1, alpha=0.6),
                         max_len=11)
  np.testing.assert_array_equal(beam1, greedy)


@pytest.mark.slow
def test_sampling_top_1_is_greedy_and_seeded_sampling_repeats(model):
  cfg, params, src, seg = model
  greedy = translate(cfg, params, src, seg, spec(3, beam_size=1, max_extra_len=6))
  top1 = translate(cfg, params, src, seg, spec(3, temperature=1.0, top_k=1, max_extra_len=6),
                   rng=jax.random.key(5))
  np.testing.assert_array_equal(top1, greedy)
  a, b, c = (translate(cfg, params, src, seg, spec(3, temperature=2.0, max_extra_len=6),
                       rng=jax.random.key(seed))
             for seed in (1, 1, 2))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)  # near-uniform random model at temperature 2: seeds differ


@pytest.mark.slow
@pytest.mark.parametrize('chunk', [1, 3, 8])
def test_per_row_limits_and_chunking(chunk):
  """Rows with different length limits in one batch give what each gives alone."""
  table = np.array(random_table(11, vocab=6))
  table[:, EOS] -= 3.0  # make EOS unlikely so limits matter
  fn = table_logits_fn(table)
  limits = jnp.array([2, 7])
  one, three = spec(chunk=chunk), spec(beam_size=3, alpha=0.6, chunk=chunk)
  greedy = np.asarray(greedy_search(fn, jnp.zeros((2,)), limits, one, max_len=7))
  beams, _ = beam_search(fn, jnp.zeros((2,)), limits, three, max_len=7)
  for row, limit in enumerate([2, 7]):
    alone = np.asarray(greedy_search(fn, jnp.zeros((1,)), jnp.array([limit]), one,
                                     max_len=7))[0]
    np.testing.assert_array_equal(greedy[row], alone)
    assert list(greedy[row]).index(EOS) < limit
    alone_beam, _ = beam_search(fn, jnp.zeros((1,)), jnp.array([limit]), three, max_len=7)
    np.testing.assert_array_equal(np.asarray(beams)[row], np.asarray(alone_beam)[0])
  assert (np.asarray(beams)[0, 2:] == PAD).all()


@pytest.mark.slow
@pytest.mark.parametrize('beam_size', [1, 3])
def test_filler_rows_end_at_once(model, beam_size):
  """A row without source tokens (filling a bucket's last batch) yields EOS then padding, so
  it never keeps the batch decoding to its length limit."""
  cfg, params, src, seg = model
  src = jnp.concatenate([src, jnp.zeros_like(src[:1])])
  seg = jnp.concatenate([seg, jnp.zeros_like(seg[:1])])
  settings = spec(3, beam_size=beam_size, max_extra_len=6)
  out = np.asarray(translate(cfg, params, src, seg, settings))
  assert out[2].tolist() == [3] + [PAD] * (out.shape[1] - 1)
  real = np.asarray(translate(cfg, params, src[:2], seg[:2], settings))
  np.testing.assert_array_equal(out[:2], real)


def test_cache_stages_double_from_two_chunks():
  assert cache_stages(128, 8) == [16, 32, 64, 128]
  assert cache_stages(88, 8) == [16, 32, 88]  # 64 would be within 1.5x of 88: skipped
  assert cache_stages(16, 8) == [16]
  assert cache_stages(6, 2) == [4, 6]


@pytest.mark.slow
@pytest.mark.parametrize('beam_size', [1, 4])
def test_growing_cache_matches_full_length_cache(model, beam_size):
  """Decoding over caches that grow in stages (4, 8, 24 positions with chunk 2) gives the
  full-length cache's output, and the outputs run past the first stages."""
  cfg, params, src, seg = model
  settings = spec(3, beam_size=beam_size, max_extra_len=18, chunk=2)
  grown, full = (np.asarray(translate(cfg, params, src, seg, settings, grow_cache=grow))
                 for grow in (True, False))
  np.testing.assert_array_equal(grown, full)
  lengths = [list(row).index(3) if 3 in row else len(row) for row in grown]
  assert max(lengths) > 8, lengths  # the search went on into the third stage


@pytest.mark.slow
def test_step_ranks_every_extension_of_every_beam():
  """One step against a ranking of all K * V extensions: live beams are the best K non-EOS
  extensions; a row at its length limit finishes with its best EOS extension."""
  from transformer_nmt.decoding.beam import init_state, step
  batch, k, vocab, t = 3, 3, 20, 2
  rng = np.random.default_rng(0)
  logits = rng.normal(scale=3.0, size=(batch * k, vocab)).astype(np.float32)
  logprobs = rng.normal(-2.0, 1.0, size=(batch, k)).astype(np.float32)
  logprobs[2, 1] = -1.0e9  # an empty beam
  state = init_state(jnp.zeros((batch,)), batch, k, 6, PAD).replace(
      t=jnp.int32(t), logprobs=jnp.asarray(logprobs))
  max_lens = jnp.array([10, t + 1, 10])  # row 1 reaches its limit at this step
  out = step(state, lambda ids, c: (jnp.asarray(logits), c), max_lens, alpha=0.6, bos_id=BOS,
             eos_id=EOS)
  total = logprobs[:, :, None] + np.asarray(jax.nn.log_softmax(logits)).reshape(batch, k, vocab)
  for row in (0, 2):
    flat = np.where(np.arange(vocab) == EOS, -np.inf, total[row]).ravel()
    best = np.argsort(-flat, kind='stable')[:k]
    np.testing.assert_allclose(np.asarray(out.logprobs)[row], flat[best], rtol=1e-5)
    assert np.asarray(out.seqs)[row, :, t].tolist() == (best % vocab).tolist()
  eos_scores = total[1, :, EOS] / float(length_penalty(t + 1, 0.6))
  np.testing.assert_allclose(np.asarray(out.scores)[1, 0], eos_scores.max(), rtol=1e-5)
  assert np.asarray(out.finished)[1, 0, t] == EOS


@pytest.mark.slow
def test_k_finished_stop_keeps_the_first_k_finished():
  """With a length penalty that rewards length (alpha 4), 'bound' searches on to a long
  hypothesis; 'k_finished' ends once K = 2 hypotheses have finished (at step 2) and returns
  the better of those two."""
  p = np.full((5, 5), 1e-9)
  p[BOS, [3, 4]] = 0.5
  p[3, [EOS, 4]] = [0.9, 0.1]
  p[4, [EOS, 4]] = 0.5
  p[EOS, EOS] = p[PAD, PAD] = 1.0
  fn = table_logits_fn(np.log(p / p.sum(1, keepdims=True)))
  out = {stop: np.asarray(beam_search(fn, jnp.zeros((1,)), jnp.array([8]),
                                      spec(beam_size=2, alpha=4.0, beam_stop=stop),
                                      max_len=8)[0])[0].tolist()
         for stop in ('bound', 'k_finished')}
  assert out['k_finished'][:2] == [3, EOS]
  assert out['bound'].index(EOS) > 2 and set(out['bound'][:out['bound'].index(EOS)]) == {4}


def _allowed(seq: list[int], min_len: int, no_repeat: int) -> bool:
  body = seq[:-1]
  if len(body) < min_len:
    return False
  grams = [tuple(body[i:i + no_repeat]) for i in range(len(body) - no_repeat + 1)]
  return not no_repeat or len(grams) == len(set(grams))


def _constrained_best(table: np.ndarray, max_len: int, alpha: float, min_len: int,
                      no_repeat: int) -> list[int]:
  vocab = table.shape[0]
  best, best_score = None, -np.inf
  for n in range(max_len):
    for body in itertools.product(range(3, vocab), repeat=n):
      seq = list(body) + [EOS]
      if not _allowed(seq, min(min_len, max_len - 1), no_repeat):
        continue
      logp = sum(table[a, b] for a, b in zip([BOS] + seq[:-1], seq))
      score = logp / float(length_penalty(len(seq), alpha))
      if score > best_score:
        best, best_score = seq, score
  return best


@pytest.mark.parametrize('seed', range(3))
@pytest.mark.parametrize('min_len,no_repeat', [(3, 0), (2, 2), (3, 1), (4, 2)])
def test_output_controls_find_the_constrained_best(seed, min_len, no_repeat):
  """min_len and no_repeat_ngram: a beam wide enough to hold every prefix finds the best
  output among those allowed (enumerated), with the model's unrenormalised scores; greedy
  outputs obey them too."""
  table, max_len = random_table(seed, vocab=6), 5  # 3 real tokens: 27 prefixes of 3
  ids, score = beam_search(table_logits_fn(table), jnp.zeros((1,)), jnp.array([max_len]),
                           spec(beam_size=27, alpha=0.6, chunk=max_len, min_len=min_len,
                                no_repeat_ngram=no_repeat), max_len=max_len)
  row = np.asarray(ids)[0].tolist()
  found = row[:row.index(EOS) + 1]
  expected = _constrained_best(table, max_len, 0.6, min_len, no_repeat)
  assert found == expected
  logp = sum(table[a, b] for a, b in zip([BOS] + found[:-1], found))
  assert float(score[0]) == pytest.approx(logp / float(length_penalty(len(found), 0.6)),
                                          abs=1e-4)
  greedy = np.asarray(greedy_search(table_logits_fn(table), jnp.zeros((1,)),
                                    jnp.array([max_len]),
                                    spec(min_len=min_len, no_repeat_ngram=no_repeat),
                                    max_len=max_len))[0].tolist()
  assert _allowed(greedy[:greedy.index(EOS) + 1], min(min_len, max_len - 1), no_repeat)


def test_a_prefix_outranks_the_output_controls():
  """Inside its prefix the search takes the given tokens even where no_repeat_ngram would
  ban them (a prefix that repeats a bigram); the controls apply after it."""
  from transformer_nmt.decoding.beam import beam
  from transformer_nmt.decoding.search import Prefix, decode_loop, greedy
  table, max_len = random_table(1, vocab=8), 9
  given = Prefix(jnp.array([[5, 6, 5, 6]]), jnp.array([4]))
  max_lens = jnp.array([max_len])
  for search in (beam(spec(beam_size=3, alpha=0.6, no_repeat_ngram=2), max_len),
                 greedy(spec(no_repeat_ngram=2), max_len)):
    final = decode_loop(lambda s: search.step(s, table_logits_fn(table), max_lens),
                        lambda s: jnp.all(search.rows_done(s, max_lens)),
                        search.init(jnp.zeros((1,)), max_lens, given), max_len, chunk=max_len)
    row = np.asarray(search.result(final))[0].tolist()
    assert row[:4] == [5, 6, 5, 6] and EOS in row[4:], row
    after = row[3:row.index(EOS)]  # from the prefix's last token on: no bigram twice
    bigrams = list(zip(after, after[1:]))
    assert len(bigrams) == len(set(bigrams)) and (5, 6) not in bigrams[1:], row


def test_no_repeat_ngram_longer_than_the_output_bans_nothing():
  from transformer_nmt.decoding.search import constrain
  logits = jnp.zeros((1, 6))
  out = constrain(logits, jnp.array([[3, 3]]), jnp.int32(2), jnp.array([False]), eos_id=EOS,
                  no_repeat_ngram=4)
  np.testing.assert_array_equal(out, logits)


@pytest.mark.slow
@pytest.mark.parametrize('vocab, k, controls', [(8, 3, {}), (5, 4, {}), (7, 2, {'prefix': True}),
                                                (8, 3, {'min_len': 3, 'no_repeat_ngram': 2})])
def test_a_search_begun_on_one_beam_equals_one_begun_on_k(vocab, k, controls):
  """Search.begin takes a beam search's first step on one hypothesis per sentence (B rows
  through the decoder, not B*K) and widens it to K beams; after any number of steps the
  results, scores and stopping decisions equal those of the search begun on K beams (also
  with 2K > V candidates, a prefix, and the output controls). The decoder's first call
  sees B rows, the next ones B*K."""
  from transformer_nmt.decoding.beam import beam, finalize
  from transformer_nmt.decoding.search import Prefix
  batch, length = 5, 8
  rng = np.random.default_rng(vocab + k)
  logits = rng.normal(scale=2.0, size=(batch, vocab, vocab))
  logits[:, :, [PAD, BOS]] = -1e9
  logits[:, :, EOS] += np.linspace(-3.0, 2.0, batch)[:, None]
  table = jax.nn.log_softmax(jnp.asarray(logits))
  seen = []

  def logits_fn(ids, sentence):  # the cache: each hypothesis row's sentence, [N]
    seen.append(ids.shape[0])
    return table[sentence, ids], sentence
  max_lens = jnp.array([1, 3, 8, 8, 6])  # row 0 ends at its first step
  given = (Prefix(jnp.array([[4, 5], [0, 0], [3, 0], [6, 6], [0, 0]]), jnp.array([2, 0, 1, 2, 0]))
           if controls.pop('prefix', False) else None)
  search = beam(spec(beam_size=k, alpha=0.6, **controls), length)
  state = search.init(jnp.arange(batch), max_lens, given)
  for steps in range(1, length + 1):
    state = search.step(state, logits_fn, max_lens)
    if steps not in (1, 2, 4, length):  # each number of steps compiles a scan of its own
      continue
    seen.clear()
    begun = search.begin(logits_fn, jnp.arange(batch), max_lens, steps, given)
    assert seen[0] == batch and set(seen[1:]) <= {batch * k}, seen
    np.testing.assert_array_equal(search.result(begun), search.result(state))
    # equal up to float rounding: one state comes out of a compiled scan, the other not
    np.testing.assert_allclose(finalize(begun)[1], finalize(state)[1], rtol=1e-6)
    np.testing.assert_allclose(begun.scores, state.scores, rtol=1e-6)
    np.testing.assert_array_equal(search.rows_done(begun, max_lens),
                                  search.rows_done(state, max_lens))
    real = np.asarray(state.logprobs) > -1e8  # the live beams that are hypotheses
    np.testing.assert_allclose(np.asarray(begun.logprobs)[real], np.asarray(state.logprobs)[real],
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(begun.seqs)[real], np.asarray(state.seqs)[real])
    assert begun.cache.shape == (batch * k,)

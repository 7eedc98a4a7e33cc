"""Dropping finished sentences between chunks gives what the one-loop search gives."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt import ModelConfig, Transformer, init_params
from transformer_nmt.decoding.beam import beam
from transformer_nmt.decoding.search import greedy
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.decoding.translate import translate
from transformer_nmt.runtime.compaction import (
  CompactingDecoder,
  CompactingTranslate,
  batch_sizes,
  compacted_size,
  on_host,
  resized_on_host,
  take_rows,
)
from transformer_nmt.runtime.programs import ProgramStore, identity, jit_factory

pytestmark = pytest.mark.usefixtures('without_compile_cache')  # stores programs
PAD, BOS, EOS = 0, 1, 2
VOCAB = 7


def spec(**decode) -> SearchSpec:
  """A search over this file's special ids with the decode settings `decode`."""
  return SearchSpec(BOS, EOS, PAD, DecodeConfig(**decode))


@flax.struct.dataclass
class SentenceCache:
  """A stand-in decoder cache: which sentence each hypothesis row belongs to ([N])."""

  sentence: jax.Array

  def resize(self, length: int) -> 'SentenceCache':
    return self


def tables(num_sentences: int) -> jnp.ndarray:
  """Per-sentence Markov tables [B, V, V] whose EOS grows likelier at different speeds, so
  the sentences of one batch finish at different steps."""
  rng = np.random.default_rng(0)
  logits = rng.normal(scale=2.0, size=(num_sentences, VOCAB, VOCAB))
  logits[:, :, [PAD, BOS]] = -1e9
  logits[:, :, EOS] += np.linspace(-6.0, 3.0, num_sentences)[:, None]
  return jax.nn.log_softmax(jnp.asarray(logits))


def sentence_logits_fn(table):
  def logits_fn(ids, cache):
    return table[cache.sentence, ids], cache
  return logits_fn


@pytest.mark.slow
@pytest.mark.parametrize('beams, host', [(1, None), (3, None), (3, False)])
def test_compacting_decoder_matches_the_one_loop_search(beams, host):
  """On a CPU compaction runs in numpy (host None); host False: in compiled programs, as on
  other devices."""
  num, length, chunk = 16, 24, 2
  table = tables(num)
  limits = jnp.asarray(np.random.default_rng(1).integers(3, length + 1, num))
  search_of = (lambda n: greedy(spec(), n)) if beams == 1 else (
      lambda n: beam(spec(beam_size=beams, alpha=0.6), n))
  cache = SentenceCache(jnp.arange(num))
  expected = search_of(length).run(sentence_logits_fn(table), cache, limits, length, chunk)
  decoder = CompactingDecoder(search_of, sentence_logits_fn, chunk=chunk, min_rows=1,
                              host_compaction=host)
  got = decoder(table, search_of(length).init(cache, limits), limits, length)
  np.testing.assert_array_equal(got, np.asarray(expected))
  sizes = decoder.rows_per_chunk
  assert sizes[0] == num and sizes[-1] < num // 2, sizes  # it did drop finished sentences
  assert sizes == sorted(sizes, reverse=True)


def test_take_rows_keeps_sentences_and_their_hypotheses():
  state = {'t': jnp.int32(3), 'per_sentence': jnp.arange(4) * 10,
           'per_hypothesis': jnp.arange(8).reshape(8, 1)}
  got = take_rows(state, jnp.array([2, 0]), batch=4, beams=2)
  assert int(got['t']) == 3
  np.testing.assert_array_equal(got['per_sentence'], [20, 0])
  np.testing.assert_array_equal(got['per_hypothesis'][:, 0], [4, 5, 0, 1])
  with pytest.raises(ValueError, match='neither per sentence'):
    take_rows({'x': jnp.zeros(5)}, jnp.array([0]), batch=4, beams=2)


@pytest.mark.slow
def test_rows_and_caches_on_the_host_equal_the_compiled_ones():
  """On a CPU compaction gathers rows and grows caches in numpy (no program to compile):
  a model's bfloat16 decoder cache, grown, cut and gathered, equals what jit gives."""
  cfg = ModelConfig(vocab_size=24, num_layers=2, d_model=16, d_ff=32, num_heads=2,
                    dtype='bfloat16')
  params = init_params(cfg, jax.random.key(0))
  model = Transformer(cfg)
  src = jnp.asarray(np.random.default_rng(3).integers(3, 24, (4, 5)))
  seg = jnp.ones_like(src)
  memory = model.apply({'params': params}, src, seg, method=Transformer.encode)
  cache = model.apply({'params': params}, memory, seg, 8, method=Transformer.init_cache)
  _, cache = model.apply({'params': params}, src[:, 0], cache, method=Transformer.decode_step)
  state = {'t': jnp.int32(1), 'seqs': src, 'cache': cache}
  resize = lambda s, n: {**s, 'cache': s['cache'].resize(n)}  # noqa: E731
  for n in (12, 6):
    want = jax.jit(resize, static_argnums=1)(state, n)
    got = resized_on_host(state, lambda s, n=n: resize(s, n))
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
      assert np.shape(a) == b.shape and np.asarray(a).dtype == b.dtype
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  rows = np.array([3, 1], np.int32)
  want = jax.jit(take_rows, static_argnums=(2, 3))(state, rows, 4, 1)
  got = take_rows(on_host(state), rows, 4, 1)
  for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_an_array_shared_by_two_fields_is_copied_by_the_host_resize():
  """A search's init may put one array in two fields; a program cannot be handed one
  donated buffer twice, so the host resize (which passes unchanged arrays on) copies it."""
  shared = jnp.zeros((2, 3), jnp.int32)
  got = resized_on_host({'a': shared, 'b': shared}, lambda s: s)
  assert got['a'] is shared and got['b'] is not shared
  np.testing.assert_array_equal(got['b'], shared)


@pytest.mark.parametrize('live, rows, min_rows, size', [
    (100, 256, 8, 128), (129, 256, 8, 192), (200, 256, 8, 256), (100, 160, 8, 128),
    (13, 256, 8, 16), (3, 256, 8, 16), (0, 64, 8, 16), (5, 12, 8, 12), (1, 2, 1, 1),
    (3, 256, 1, 4), (2, 256, 1, 4), (5, 256, 1, 16), (17, 256, 1, 24), (25, 256, 1, 32),
    (0, 256, 1, 1)])
def test_compacted_size(live, rows, min_rows, size):
  assert compacted_size(live, rows, min_rows) == size


def test_batches_start_and_compact_on_one_ladder():
  assert batch_sizes(1) == [1] and batch_sizes(3) == [1]
  assert batch_sizes(300) == [1, 4, 16, 24, 32, 48, 64, 96, 128, 192, 256]
  ladder = batch_sizes(4096)
  assert all(compacted_size(live, 4096, 1) in ladder for live in range(4097))


@pytest.mark.slow
@pytest.mark.parametrize('beam_size', [1, 3])
def test_compacting_translate_matches_translate(beam_size):
  """A random model rarely ends early, so the rows' length limits (source length + 6) end
  them at different steps; the compacting path gives the one-loop outputs."""
  cfg = ModelConfig(vocab_size=24, num_layers=1, d_model=16, d_ff=32, num_heads=2,
                    residual_dropout=0.0, embedding_dropout=0.0)
  params = init_params(cfg, jax.random.key(0))
  lens = np.array([1, 2, 3, 5, 8, 10])
  seg = (np.arange(10)[None] < lens[:, None]).astype(np.int32)
  src = np.where(seg > 0, np.random.default_rng(2).integers(4, 24, seg.shape), PAD)
  settings = spec(beam_size=beam_size, max_extra_len=6, chunk=2)
  expected = translate(cfg, params, jnp.asarray(src), jnp.asarray(seg), settings)
  compacting = CompactingTranslate(cfg, settings, min_rows=1)
  np.testing.assert_array_equal(compacting(params, src, seg), np.asarray(expected))
  assert compacting.decoder.rows_per_chunk[-1] < len(lens)


def test_a_decoder_whose_programs_are_all_stored_compiles_none(tmp_path):
  """Compaction's own steps (which rows to keep) compile nothing: with every program in the
  store, a second decoder runs without a single compile."""
  num, length, chunk = 16, 24, 2
  table = tables(num)
  limits = jnp.asarray(np.random.default_rng(1).integers(3, length + 1, num))
  search_of = lambda n: beam(spec(beam_size=3, alpha=0.6), n)  # noqa: E731
  start = search_of(length).init(SentenceCache(jnp.arange(num)), limits)
  first = CompactingDecoder(search_of, sentence_logits_fn, chunk=chunk, min_rows=1,
                            jit=_stored_jit(tmp_path))
  expected = first(table, start, limits, length)
  assert first.rows_per_chunk[-1] < num  # it compacted
  compiles = []

  def on_event(event, duration, **_):
    if event == '/jax/core/compile/backend_compile_duration':
      compiles.append(duration)
  jax.monitoring.register_event_duration_secs_listener(on_event)
  start = search_of(length).init(SentenceCache(jnp.arange(num)), limits)
  jax.clear_caches()  # as a new process: nothing compiled in memory
  compiles.clear()
  second = CompactingDecoder(search_of, sentence_logits_fn, chunk=chunk, min_rows=1,
                             jit=_stored_jit(tmp_path))
  np.testing.assert_array_equal(second(table, start, limits, length), expected)
  assert compiles == [] and second._advance.store.loaded > 0


def _stored_jit(root):
  """The decoders' Jit on a program store in `root` (one identity for both decoders)."""
  return jit_factory(ProgramStore(root, identity(test='all stored')), None)

"""bench/decoders.py: the decoders benchmarks compare with the cached one give its outputs."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

from transformer_nmt import ModelConfig, init_params
from transformer_nmt.config import DecodeConfig
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.decoding.translate import translate

sys.path.insert(0, str(ROOT / 'bench'))
import decoders  # noqa: E402

PAD, BOS, EOS = 0, 1, 3


@pytest.fixture(scope='module')
def model():
  cfg = ModelConfig(vocab_size=30, num_layers=2, d_model=32, d_ff=64, num_heads=4)
  src = jnp.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
  return cfg, init_params(cfg, jax.random.key(0)), src, (src > 0).astype(jnp.int32)


@pytest.mark.parametrize('beam_size', [1, 4])
def test_decoders_agree(model, beam_size):
  """The uncached and the no-cross-reuse decoder give the cached decoder's outputs, also
  over a cache of the full length (no growth), greedy and beam 4."""
  cfg, params, src, seg = model
  spec = SearchSpec(BOS, EOS, PAD, DecodeConfig(beam_size=beam_size, max_extra_len=6))
  outs = [np.asarray(translate(cfg, params, src, seg, spec, decoder=decoders.DECODERS[name],
                               grow_cache=grow))
          for name in ('cached', 'no_cross_reuse', 'uncached') for grow in (True, False)]
  for out in outs[1:]:
    np.testing.assert_array_equal(out, outs[0])
  assert outs[0].shape == (2, 11)
  assert (outs[0][1, 3 + 6:] == PAD).all()  # row 2: limit = its 3 real tokens + 6


def test_translate_rows_gives_the_engines_batch_outputs(model):
  """translate_rows (bench/decode.py's one loop per batch for these decoders) returns each
  row's output without EOS, in the order of the rows."""
  cfg, params, src, seg = model
  spec = SearchSpec(BOS, EOS, PAD, DecodeConfig(beam_size=4, max_extra_len=6))
  whole = np.asarray(translate(cfg, params, src, seg, spec))
  rows = [np.asarray(src[1, :3]), np.asarray(src[0])]
  out = decoders.translate_rows(cfg, params, spec, rows, 'uncached')
  for got, want in zip(out, [whole[1], whole[0]]):
    ends = np.flatnonzero(want == EOS)
    np.testing.assert_array_equal(got, want[:ends[0]] if len(ends) else want)

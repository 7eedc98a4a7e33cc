"""decode.batch_invariant: the decoding programs' XLA options on a CPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_nmt.runtime import network
from transformer_nmt.runtime.compiler import compiler_options

pytestmark = pytest.mark.skipif(jax.default_backend() != 'cpu', reason='XLA CPU options')


def _row_sums(options: dict[str, str], rows: int, x: np.ndarray) -> np.ndarray:
  """Row 0..rows-1 sums of squares of x[:rows] [rows, 256] as one program computes them."""
  return np.asarray(jax.jit(lambda a: (a * a).sum(-1), compiler_options=options)(x[:rows]))


def test_reductions_do_not_depend_on_the_row_count():
  """LayerNorm-like row sums come out the same whatever the number of rows (YNNPACK's sum
  order depends on it: on the development machine 8 rows and 4096 rows differ)."""
  options = compiler_options(True)
  assert options == {'xla_cpu_experimental_ynn_fusion_type': 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT',
                     'xla_cpu_use_fusion_emitters': 'False'}
  x = np.random.default_rng(0).standard_normal((4096, 256)).astype(np.float32)
  many = _row_sums(options, 4096, x)
  for rows in (1, 8, 16, 1000):
    np.testing.assert_array_equal(_row_sums(options, rows, x), many[:rows])
  compiled = jax.jit(lambda a: (a * a).sum(-1), compiler_options=options).lower(
      jnp.asarray(x)).compile().as_text()
  assert '__ynn_fusion' not in compiled


def test_off_or_chosen_by_xla_flags(monkeypatch):
  assert compiler_options(False) == {}
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_experimental_ynn_fusion_type=')
  assert compiler_options(True) == {}  # the user's own choice stands


@pytest.mark.slow
@pytest.mark.parametrize('batch_invariant', [False, True])
def test_the_engine_compiles_every_program_with_them(loaded, monkeypatch, batch_invariant):
  """Each program the engine makes (translation and scoring) gets the setting's options, and
  the network they trace and the search write their sums as halvings exactly when those
  options leave sums to XLA (network.CPU_BATCH_INVARIANT, passed to both)."""
  from transformer_nmt.inference import engine as engine_lib

  seen, chosen = [], []
  real_scorer, real_translate = engine_lib.Scorer, engine_lib.CompactingTranslate
  monkeypatch.setattr(engine_lib, 'Scorer', lambda cfg, **kw: (
      chosen.append(kw['kernels']), real_scorer(cfg, **kw))[1])
  monkeypatch.setattr(engine_lib, 'CompactingTranslate', lambda cfg, spec, **kw: (
      chosen.append(spec.kernels), real_translate(cfg, spec, **kw))[1])

  def recording_jit(fn, name, static_argnums=(), donate_argnums=(), compiler_options=None):
    seen.append((name, compiler_options))
    return jax.jit(fn, static_argnums=tuple(static_argnums), compiler_options=compiler_options)

  monkeypatch.setattr(engine_lib, 'jit_factory', lambda store, sealed, made: recording_jit)
  decode = dataclasses.replace(loaded.decode, batch_invariant=batch_invariant)
  engine = engine_lib.Engine(loaded, decode)
  want = network.CPU_BATCH_INVARIANT if batch_invariant else network.CPU
  assert engine.spec.kernels is want
  assert seen
  assert all(options == compiler_options(batch_invariant) for _, options in seen), seen
  assert chosen == [want] * (1 + decode.compact), chosen

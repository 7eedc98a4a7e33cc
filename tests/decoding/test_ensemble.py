"""Ensembles (decoding/ensemble.py): one member, or two copies of one model, decode and score
as the model does; members with other vocabularies are refused."""

import copy
import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

from transformer_nmt.decoding import ensemble
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.errors import DataError
from transformer_nmt.inference import Engine, load_ensemble
from transformer_nmt.inference import loading as loading_lib


@pytest.mark.slow
def test_an_ensemble_of_copies_decodes_and_scores_as_the_model(loaded, lines):
  decode = DecodeConfig(beam_size=3, max_extra_len=6)
  single = Engine(loaded, decode, n_best=3)
  expected = single.hypotheses(lines[:4])
  for copies in (1, 2):
    members = dataclasses.replace(loaded, cfg=(loaded.cfg,) * copies,
                                  params=(loaded.params,) * copies)
    found = Engine(members, decode, n_best=3).hypotheses(lines[:4])
    for (_, mine), (_, theirs) in zip(found, expected):
      assert [h.tokens for h in mine] == [h.tokens for h in theirs]
      np.testing.assert_allclose([h.logprob for h in mine], [h.logprob for h in theirs],
                                 atol=1e-4)


@pytest.mark.slow
def test_kernels_cast_ahead_decode_as_the_float32_kernels(loaded, lines):
  """An Engine hands a bfloat16 model its Dense kernels in bfloat16 (kernels_as_computed):
  the same hypotheses and scores as the float32 kernels each Dense casts itself; a float32
  model keeps its parameters."""
  assert ensemble.kernels_as_computed(loaded.cfg, loaded.params) is loaded.params
  cfg = ensemble.with_dtype(loaded.cfg, 'bfloat16')
  cast = ensemble.kernels_as_computed(cfg, loaded.params)
  dtypes = {jax.tree_util.keystr(path): x.dtype
            for path, x in jax.tree_util.tree_leaves_with_path(cast)}
  assert {d for k, d in dtypes.items() if k.endswith("['kernel']")} == {jnp.dtype(jnp.bfloat16)}
  assert {d for k, d in dtypes.items() if not k.endswith("['kernel']")} == {jnp.dtype(jnp.float32)}
  half = dataclasses.replace(loaded, cfg=cfg)
  make = lambda: Engine(half, DecodeConfig(beam_size=2, max_extra_len=6), n_best=2)  # noqa: E731
  inside = make()
  inside.params_as_computed = lambda: loaded.params  # float32 kernels, cast in every program
  expected = inside.hypotheses(lines[:3])
  for (_, mine), (_, theirs) in zip(make().hypotheses(lines[:3]), expected):
    assert [h.tokens for h in mine] == [h.tokens for h in theirs]
    assert [h.logprob for h in mine] == [h.logprob for h in theirs]


def test_members_with_another_vocabulary_are_refused(loaded, monkeypatch):
  elsewhere = copy.copy(loaded.tgt_tok)  # another file: its fingerprint differs
  elsewhere.path = loaded.tgt_tok.path.with_name('other.model')
  monkeypatch.setattr(type(loaded.tgt_tok), 'fingerprint', property(lambda t: str(t.path)))
  fake = {'a': loaded, 'b': dataclasses.replace(loaded, tgt_tok=elsewhere)}
  monkeypatch.setattr(loading_lib, 'load_workdir', lambda w, *args: fake[w])
  with pytest.raises(DataError, match='ensemble member b has another tgt vocabulary'):
    load_ensemble(['a', 'b'])


@pytest.mark.slow
def test_decode_py_ensemble_of_two_copies(tiny_workdir, lines, tmp_path):
  source = tmp_path / 'in.txt'
  source.write_text('\n'.join(lines[:4]) + '\n')
  outs = []
  for workdirs in ([tiny_workdir], [tiny_workdir, tiny_workdir]):
    out = tmp_path / f'out{len(workdirs)}.txt'
    flags = [f'--workdir={w}' for w in workdirs]
    run = subprocess.run([sys.executable, 'decode.py', *flags, '--input', str(source),
                          '--output', str(out), '--max_extra_len', '6'], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    outs.append(out.read_text())
  assert 'ensemble of 2 models' in run.stderr
  assert outs[0] == outs[1]

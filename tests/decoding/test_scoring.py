"""Forced decoding (scoring.py), n-best hypotheses with scores, decode.py's jsonl and
--score_reference, on the tiny trained workdir."""

import json
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT

from transformer_nmt.decoding.beam import beam, length_penalty
from transformer_nmt.decoding.scoring import Scorer
from transformer_nmt.decoding.search import Prefix, decode_loop
from transformer_nmt.decoding.settings import DECODE, DecodeConfig
from transformer_nmt.decoding.spec import SearchSpec
from transformer_nmt.inference import Engine
from transformer_nmt.model.attention import NEG_INF
from transformer_nmt.model.transformer import Transformer


def _finished(loaded, lines, given=None):
  """Beam search (K = 4) over `lines` through the cached decoder, optionally from target
  prefixes `given`: the source rows and every finished hypothesis as (row, ids with EOS,
  the search's own length-normalised score)."""
  cfg, tok = loaded.cfg, loaded.src_tok
  rows = [ids + [tok.eos_id] for ids in tok.encode(lines)]
  width = max(map(len, rows))
  src = np.array([r + [tok.pad_id] * (width - len(r)) for r in rows], np.int32)
  segments = (src != tok.pad_id).astype(np.int32)
  prefix = None if given is None else Prefix(
      jnp.array([g + [tok.pad_id] * (8 - len(g)) for g in given], jnp.int32),
      jnp.array([len(g) for g in given]))
  max_len = width + 6
  model, variables = Transformer(cfg), {'params': loaded.params}

  @jax.jit
  def search(src, segments, prefix):  # the finished hypotheses [B, K, L] and their scores [B, K]
    memory = model.apply(variables, src, segments, method=Transformer.encode)
    cache = model.apply(variables, memory, segments, max_len, method=Transformer.init_cache)
    step = lambda ids, c: model.apply(variables, ids, c, method=Transformer.decode_step)  # noqa: E731
    max_lens = jnp.full((len(rows),), max_len)
    found = beam(SearchSpec(tok.bos_id, tok.eos_id, tok.pad_id,
                            DecodeConfig(beam_size=4, alpha=0.6)), max_len)
    final = decode_loop(lambda s: found.step(s, step, max_lens),
                        lambda s: jnp.all(found.rows_done(s, max_lens)),
                        found.init(cache, max_lens, prefix), max_len, chunk=max_len)
    return final.finished, final.scores
  finished, scores = map(np.asarray, search(src, segments, prefix))
  hyps = [(r, list(finished[r, j]), scores[r, j]) for r in range(len(rows)) for j in range(4)
          if scores[r, j] > NEG_INF / 2]
  return rows, [(r, np.array(f[:f.index(tok.eos_id) + 1], np.int32), score)
                for r, f, score in hyps]


def _agrees_with_forced_decoding(loaded, rows, hyps):
  tok = loaded.src_tok
  scorer = Scorer(loaded.cfg, bos_id=tok.bos_id, pad_id=tok.pad_id, tokens_per_batch=64)
  scored = scorer.score_ids(loaded.params, [np.array(rows[r], np.int32) for r, _, _ in hyps],
                            [t for _, t, _ in hyps])
  for (_, target, score), s in zip(hyps, scored):
    assert len(s.token_logprobs) == len(s.alignment) == len(target)
    assert s.logprob == pytest.approx(float(np.sum(s.token_logprobs)), abs=1e-4)
    assert s.logprob / float(length_penalty(len(target), 0.6)) == pytest.approx(score, abs=1e-3)
    assert np.all(s.token_logprobs <= 0) and np.all(s.alignment >= 0)
    assert np.all(s.alignment < len(max(rows, key=len)))


@pytest.mark.slow
def test_forced_decoding_gives_the_beam_searchs_own_scores(loaded, lines):
  """Beam search sums log-probabilities step by step through the cached decoder; the scorer
  runs the whole target through the full decoder at once. The two must agree."""
  rows, hyps = _finished(loaded, lines)
  assert sum(len(t) > 1 for _, t, _ in hyps) >= len(rows)  # not only empty translations
  _agrees_with_forced_decoding(loaded, rows, hyps)


@pytest.mark.slow
@pytest.mark.parametrize('compact', [True, False])
def test_n_best_lists(loaded, lines, compact):
  decode = DecodeConfig(beam_size=4, max_extra_len=6, compact=compact)
  found = Engine(loaded, decode, n_best=4).hypotheses([''] + lines[:4])
  best = Engine(loaded, decode).translate(lines[:4])
  assert found[0] == ([], [])  # an empty line: nothing to translate
  for (source, hyps), one in zip(found[1:], best):
    assert source[-1] == '</s>' and 1 <= len(hyps) <= 4
    assert hyps[0].text == one
    scores = [h.score for h in hyps]
    assert scores == sorted(scores, reverse=True) or np.allclose(scores, sorted(scores)[::-1],
                                                                 atol=1e-4)
    assert len({tuple(h.tokens) for h in hyps}) == len(hyps)  # distinct hypotheses
    for h in hyps:
      assert h.tokens[-1] == '</s>'
      assert len(h.tokens) == len(h.token_logprobs) == len(h.alignment)
      assert all(0 <= a < len(source) for a in h.alignment)


def _decode(*flags: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, 'decode.py', *flags], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)


@pytest.mark.slow
def test_a_line_translated_in_pieces_gives_one_whole_hypothesis(loaded):
  """n-best for a line over split_len: the pieces' best translations joined, alone
  (the first piece's alternatives would not translate the whole line)."""
  decode = DecodeConfig(beam_size=4, max_extra_len=4, split_len=8)
  line = 'He paints nineteen eggs. They played with one black car. My father came.'
  (source, hyps), = Engine(loaded, decode, n_best=3).hypotheses([line])
  assert len(hyps) == 1 and source.count('</s>') >= 2  # in pieces, each with its EOS
  assert len(hyps[0].tokens) == len(hyps[0].token_logprobs) == len(hyps[0].alignment)
  assert all(0 <= a < len(source) for a in hyps[0].alignment)
  # each piece's target subwords attend to that piece's source only (block-diagonal)
  attention = hyps[0].attention
  assert attention.shape == (len(hyps[0].tokens), len(source))
  np.testing.assert_allclose(attention.sum(axis=1), 1, atol=1e-5)
  assert hyps[0].alignment == np.argmax(attention, axis=1).tolist()
  first_eos, first_end = hyps[0].tokens.index('</s>') + 1, source.index('</s>') + 1
  assert not attention[:first_eos, first_end:].any() and not attention[first_eos:, :first_end].any()


@pytest.mark.slow
def test_jsonl_n_best_then_score_reference_agree(tiny_workdir, loaded, lines, tmp_path):
  """--score_reference's scores of decode.py's own translations equal the scores decode.py
  reported for them, and its scores of other text equal the library's (Engine.score)."""
  source = tmp_path / 'in.txt'
  source.write_text('\n'.join(lines) + '\n')
  out = tmp_path / 'out.jsonl'
  run = _decode('--workdir', str(tiny_workdir), '--input', str(source), '--output', str(out),
                '--format', 'jsonl', '--n_best', '2', '--max_extra_len', '6')
  assert run.returncode == 0, run.stderr[-2000:]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert len(rows) == len(lines) and all(1 <= len(r['hypotheses']) <= 2 for r in rows)
  german = (tiny_workdir / 'demo_data' / 'test.de').read_text().splitlines()[:len(lines)]
  # even lines: decode.py's own 1-best output; odd lines: the reference translation
  texts = [r['hypotheses'][0]['text'] if i % 2 == 0 else german[i] for i, r in enumerate(rows)]
  refs = tmp_path / 'refs.txt'
  refs.write_text(''.join(t + '\n' for t in texts))
  scores = tmp_path / 'scores.jsonl'
  run = _decode('--workdir', str(tiny_workdir), '--input', str(source), '--output', str(scores),
                '--score_reference', str(refs), '--format', 'jsonl')
  assert run.returncode == 0, run.stderr[-2000:]
  again = [json.loads(line)['hypotheses'][0] for line in scores.read_text().splitlines()]
  library = Engine(loaded, DECODE).score(lines, texts)
  for i, (row, got, (_, expected)) in enumerate(zip(rows, again, library)):
    reported = row['hypotheses'][0] if i % 2 == 0 else expected.as_json()
    assert got['tokens'] == reported['tokens'] and got['text'] == texts[i]
    assert got['logprob'] == pytest.approx(reported['logprob'], abs=1e-4)
    assert got['token_logprobs'] == pytest.approx(reported['token_logprobs'], abs=1e-4)
    assert got['alignment'] == reported['alignment']
  assert len(again[1]['tokens']) > 3  # a real sentence was scored


@pytest.mark.slow
def test_bad_n_best_and_score_reference_requests(tiny_workdir, lines, tmp_path):
  source = tmp_path / 'in.txt'
  source.write_text('\n'.join(lines) + '\n')
  out = tmp_path / 'out.txt'
  out.write_text('keep me\n')
  short = tmp_path / 'short.txt'
  short.write_text('one line\n')
  base = ('--workdir', str(tiny_workdir), '--input', str(source), '--output', str(out))
  for flags, message in [
      (('--n_best', '5', '--format', 'jsonl'), '--n_best=5 must be at most the beam size (4)'),
      (('--n_best', '2'), '--n_best=2 needs --format jsonl (text is one line per input)'),
      (('--score_reference', str(short)), f'--score_reference={short} has 1 lines but the '
                                          f'input has {len(lines)}'),
      (('--min_len', '5', '--max_len', '3'), '--min_len=5 must not exceed --max_len=3'),
      (('--prefix', str(short)), f'--prefix={short} has 1 lines but the input has {len(lines)}')]:
    run = _decode(*base, *flags)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == f'error: {message}'
    assert 'Traceback' not in run.stderr
    assert out.read_text() == 'keep me\n'


@pytest.mark.slow
def test_a_prefix_is_kept_and_scored_like_forced_decoding(loaded, lines):
  """Beam search from a target prefix: every output starts with it, the search's own scores
  (prefix tokens included) equal forced decoding's, and greedy's first token after the
  prefix is the argmax of the teacher-forced model given the prefix."""
  cfg, src_tok, tgt_tok = loaded.cfg, loaded.src_tok, loaded.tgt_tok
  lines = lines[:4]
  german = ['Ein Mann', 'Zwei', 'Die Katze', 'Mein Vater']
  given = [tgt_tok.encode([g])[0] for g in german]
  decode = DecodeConfig(beam_size=4, max_extra_len=6)
  found = Engine(loaded, decode, n_best=4).hypotheses(lines, prefixes=german)
  for (_, hyps), ids, text in zip(found, given, german):
    for h in hyps:
      assert h.tokens[:len(ids)] == tgt_tok.pieces(ids) and h.text.startswith(text)

  rows = [np.array(ids + [src_tok.eos_id], np.int32) for ids in src_tok.encode(lines)]
  greedy = Engine(loaded, DecodeConfig(beam_size=1, max_extra_len=6))
  outputs = greedy.translate_ids(rows, prefixes=[np.array(g) for g in given])
  model = Transformer(cfg)
  for row, ids, out in zip(rows, given, outputs):
    assert out[:len(ids)].tolist() == ids
    logits = model.apply({'params': loaded.params}, row[None], np.array([[tgt_tok.bos_id] + ids]))
    after = out[len(ids)] if len(out) > len(ids) else tgt_tok.eos_id  # the first free token
    assert int(np.argmax(logits[0, -1])) == after


def test_beam_scores_from_a_prefix_match_forced_decoding(loaded, lines):
  given = [loaded.tgt_tok.encode(['Ein Hund'])[0][:3]] * len(lines)
  rows, hyps = _finished(loaded, lines, given)
  assert len(hyps) >= len(rows)
  for r, target, _ in hyps:
    assert target[:len(given[r])].tolist() == given[r]
  _agrees_with_forced_decoding(loaded, rows, hyps)


@pytest.mark.slow
def test_decode_with_prefixes(tiny_workdir, lines, tmp_path):
  source, prefixes, out = tmp_path / 'in.txt', tmp_path / 'prefix.txt', tmp_path / 'out.txt'
  source.write_text('\n'.join(lines[:3]) + '\n')
  prefixes.write_text('Ein Mann\n\nZwei Hunde\n')  # the second line has none
  run = _decode('--workdir', str(tiny_workdir), '--input', str(source), '--output', str(out),
                '--prefix', str(prefixes), '--beam_size', '2', '--max_extra_len', '4')
  assert run.returncode == 0, run.stderr[-2000:]
  first, _, third = out.read_text().splitlines()
  assert first.startswith('Ein Mann') and third.startswith('Zwei Hunde')
  compiled = re.search(r'; (\d+) programs compiled, (\d+) loaded from the compile cache, '
                       r'(\d+) stored programs loaded$', run.stderr.strip())
  assert compiled and int(compiled[1]) + int(compiled[2]) + int(compiled[3]) > 0

"""decode.py and the inference pieces under it, on a workdir trained with the tiny config."""

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT

from transformer_nmt.data import batching as data_lib
from transformer_nmt.data.tokenizer import train_tokenizer
from transformer_nmt.decoding.settings import DecodeConfig
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.inference import CheckpointChoice, Engine, load_workdir
from transformer_nmt.inference.loading import average_params
from transformer_nmt.inference.long_lines import pieces


def run_decode(*flags: str, stdin: str = '') -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, 'decode.py', *flags], cwd=ROOT, input=stdin,
                        capture_output=True, text=True, timeout=300)


@pytest.fixture(scope='module')
def test_lines(tiny_workdir):
  return (tiny_workdir / 'demo_data' / 'test.en').read_text().splitlines()


def test_loads_latest_and_averages(tiny_workdir, loaded):
  assert loaded.steps == [20]
  both = load_workdir(tiny_workdir, CheckpointChoice(average_last=2))
  assert both.steps == [10, 20]
  ten = load_workdir(tiny_workdir, CheckpointChoice(step=10))
  table = lambda m: m.params['tgt_embed']['embedding']
  np.testing.assert_allclose(table(both), (table(ten) + table(loaded)) / 2, rtol=1e-6)


@pytest.mark.parametrize('choice, message', [
    ({'average_last': -1}, '--average_last=-1 must be 0 or positive'),
    ({'best': True, 'step': 10}, '--best picks one checkpoint'),
    ({'best': True, 'average_last': 2}, '--best picks one checkpoint'),
    ({'step': 10, 'average_last': 2}, 'either --checkpoint or --average_last')])
def test_a_checkpoint_choice_is_checked_when_made(choice, message):
  with pytest.raises(ConfigError, match=message):
    CheckpointChoice(**choice)
  assert CheckpointChoice().latest and not CheckpointChoice(average_last=2).latest


def test_average_params_is_the_elementwise_mean():
  trees = [{'w': np.full((2,), float(i))} for i in range(4)]
  np.testing.assert_allclose(average_params(trees)['w'], [1.5, 1.5])


@pytest.mark.slow
@pytest.mark.parametrize('beam_size', [4])  # greedy shares the batching (and costs a compile)
def test_results_do_not_depend_on_batching_or_order(loaded, test_lines, beam_size,
                                                    monkeypatch):
  lines, widths = test_lines[:12], []
  pad_rows = data_lib.pad_rows
  def padded(*args):  # records each batch's padded source length
    src, *rest = pad_rows(*args)
    widths.append(src.shape[1])
    return (src, *rest)
  monkeypatch.setattr(data_lib, 'pad_rows', padded)
  engines = {}  # one per setting, so that its programs compile once

  def run(tokens, order, grid_start=data_lib.GRID_START, concurrent=0):
    if (tokens, grid_start, concurrent) not in engines:
      decode = DecodeConfig(beam_size=beam_size, max_extra_len=5, tokens_per_batch=tokens)
      engines[tokens, grid_start, concurrent] = Engine(loaded, decode,
                                                       concurrent_batches=concurrent)
    engine = engines[tokens, grid_start, concurrent]
    monkeypatch.setattr(data_lib, 'GRID_START', grid_start)
    widths.clear()
    out = engine.translate([lines[i] for i in order])
    return [out[order.index(i)] for i in range(len(lines))]
  forward = list(range(len(lines)))
  reference, fine = run(4096, forward), list(widths)
  assert len(fine) == 2  # the one batch the 12 lines fit, cut in two for the two threads
  assert run(4096, forward, concurrent=1) == reference and len(widths) == 1
  assert run(4096, forward, concurrent=3) == reference and len(widths) == 3
  assert run(24, forward) == reference  # many small batches
  assert run(24, forward, concurrent=1) == reference  # one batch at a time
  assert run(24, forward, concurrent=3) == reference
  assert run(4096, forward[::-1]) == reference  # reversed input, order restored
  assert run(4096, forward, grid_start=64) == reference  # a coarser length grid: more padding
  assert min(widths) > min(fine) and all(w % 16 == 0 for w in widths + fine)


@pytest.mark.slow
def test_empty_lines_survive(loaded, test_lines):
  engine = Engine(loaded, DecodeConfig(beam_size=2, max_extra_len=5))
  out = engine.translate(['', test_lines[0], '', '', test_lines[1], ''])
  assert len(out) == 6
  assert out[0] == out[2] == out[3] == out[5] == ''


@pytest.mark.slow
def test_decode_cli_scores_writes_and_plots(tiny_workdir, tmp_path):
  src = tmp_path / 'in.en'
  lines = (tiny_workdir / 'demo_data' / 'test.en').read_text().splitlines()[:6]
  src.write_text('\n'.join(lines[:3] + [''] + lines[3:]) + '\n')
  ref = tmp_path / 'ref.de'
  refs = (tiny_workdir / 'demo_data' / 'test.de').read_text().splitlines()[:6]
  ref.write_text('\n'.join(refs[:3] + [''] + refs[3:]) + '\n')
  out = tmp_path / 'out.de'
  result = run_decode('--workdir', str(tiny_workdir), '--input', str(src), '--output', str(out),
                      '--reference', str(ref), '--beam_size', '2', '--average_last', '2',
                      '--tokenized_bleu', '--plot_attention', str(tmp_path / 'plots'),
                      '--plot_sentences', '2', '--max_extra_len', '5',
                      '--beam_stop', 'k_finished')
  assert result.returncode == 0, result.stderr[-3000:]
  assert len(out.read_text().splitlines()) == 7 and out.read_text().splitlines()[3] == ''
  assert 'sacreBLEU' in result.stdout and 'nrefs:1|case:mixed' in result.stdout
  assert 'chrF' in result.stdout and 'tokenized BLEU (paper-style' in result.stdout
  assert 'sentences/s' in result.stderr and 'target tokens/s' in result.stderr
  assert sorted(p.name for p in (tmp_path / 'plots').iterdir()) == ['attention_1.png',
                                                                   'attention_2.png']


@pytest.mark.slow
def test_decode_cli_reads_stdin_and_keeps_compiled_programs(tiny_workdir, test_lines):
  programs, cache = tiny_workdir / 'programs', tiny_workdir / 'compile_cache'
  shutil.rmtree(programs, ignore_errors=True)
  shutil.rmtree(cache, ignore_errors=True)
  flags = ('--workdir', str(tiny_workdir), '--beam_size', '1', '--max_extra_len', '4')
  stdin = '\n'.join(test_lines[:2]) + '\n\n'
  # compiles and stores the input's programs (no small-job programs), writes nothing
  first = run_decode(*flags, '--precompile', '--precompile_rows', '0', stdin=stdin)
  assert first.returncode == 0 and first.stdout == '', first.stderr[-3000:]
  stored = sorted(p.name for p in programs.glob('*/*.program'))
  assert any(name.startswith('advance-') for name in stored), stored  # search steps
  assert f'{len(stored)} programs compiled and stored in {programs}' in first.stderr
  assert not cache.exists()  # the store replaces JAX's cache (programs.py says why)
  result = run_decode(*flags, stdin=stdin)  # every program from the store, none compiled
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split('\n')[2] == '' and len(result.stdout.split('\n')) == 4
  assert f'0 programs compiled, 0 loaded from the compile cache, {len(stored)} stored ' \
         'programs loaded' in result.stderr, result.stderr[-2000:]
  plain = run_decode(*flags, '--noprograms', stdin=stdin)  # JAX's cache instead
  assert plain.returncode == 0 and plain.stdout == result.stdout, plain.stderr[-3000:]
  assert any(p.name.startswith('jit__advance') for p in cache.iterdir())
  # another compute precision reaches the engine: its programs are kept apart
  half = run_decode(*flags, '--dtype', 'bfloat16', stdin=stdin)
  assert half.returncode == 0 and len(half.stdout.split('\n')) == 4, half.stderr[-3000:]
  def header(run):
    return next(line for line in run.stderr.splitlines() if 'checkpoint step(s)' in line)
  assert header(half).endswith(', bfloat16') and header(result).endswith(', float32')
  assert len(list(programs.glob('*/identity.json'))) == 2
  assert len(list(programs.glob('params/*.npz'))) == 1  # both read one parameter snapshot


def _clean_failure(result, message):
  assert result.returncode == 2, result.stderr[-2000:]
  assert message in result.stderr and 'Traceback' not in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_decode_bad_input(tiny_workdir, tmp_path):
  wd = str(tiny_workdir)
  _clean_failure(run_decode('--workdir', str(tmp_path / 'nope')), 'is not a training workdir')
  _clean_failure(run_decode('--workdir', wd, '--checkpoint', '7', stdin='x\n'),
                 'no checkpoint at step 7; available: [10, 20]')
  _clean_failure(run_decode('--workdir', wd, '--average_last', '9', stdin='x\n'),
                 'keeps only 2 checkpoints')
  _clean_failure(run_decode('--workdir', wd, '--chunk', '0', stdin='x\n'),
                 'error: --chunk=0 must be positive')
  _clean_failure(run_decode('--workdir', wd, '--beam_size', '0', stdin='x\n'),
                 'error: --beam_size=0 must be positive')
  _clean_failure(run_decode('--workdir', wd, '--precompile', '--output', str(tmp_path / 'o')),
                 '--precompile stores programs and writes no translations')
  _clean_failure(run_decode('--workdir', wd, '--precompile', '--precompile_rows', '-1'),
                 'error: --precompile_rows=-1 must be 0 or positive')
  (tmp_path / 'ref').write_text('a\nb\n')
  _clean_failure(run_decode('--workdir', wd, '--reference', str(tmp_path / 'ref'), stdin='x\n'),
                 'has 2 lines but the input has 1')
  (tmp_path / 'bad.en').write_bytes(b'ok\n\xc3\x28 broken\n')
  _clean_failure(run_decode('--workdir', wd, '--input', str(tmp_path / 'bad.en')),
                 'bad.en:2: invalid UTF-8')


def test_tokenizer_checkpoint_mismatch_is_refused(tiny_workdir, tmp_path):
  copy = tmp_path / 'copy'
  shutil.copytree(tiny_workdir, copy)
  lines = (copy / 'demo_data' / 'train.en').read_text().splitlines()
  train_tokenizer(lines, copy / 'spm.model', vocab_size=120, model_type='unigram')
  with pytest.raises(DataError, match='is not the one its checkpoints were trained with'):
    load_workdir(copy)  # config.json keeps the fingerprint of the tokenizer trained with
  _clean_failure(run_decode('--workdir', str(copy), stdin='x\n'), 'is not the one its')
  stored = json.loads((copy / 'config.json').read_text())
  del stored['tokenizers']  # a workdir from before fingerprints: the vocabulary size still tells
  (copy / 'config.json').write_text(json.dumps(stored))
  with pytest.raises(DataError, match='do not belong together'):
    load_workdir(copy)


@pytest.mark.slow
def test_decode_refuses_outputs_that_would_lose_work(tiny_workdir, tmp_path):
  wd = str(tiny_workdir)
  source = tmp_path / 'in.en'
  source.write_text('a house\n')
  _clean_failure(run_decode('--workdir', wd, '--input', str(source), '--output', str(source)),
                 'is also the --input file')
  assert source.read_text() == 'a house\n'
  (tmp_path / 'ref.de').write_text('ein Haus\n')
  _clean_failure(run_decode('--workdir', wd, '--input', str(source), '--reference',
                            str(tmp_path / 'ref.de'), '--output', str(tmp_path / 'ref.de')),
                 'is also the --reference file')
  _clean_failure(run_decode('--workdir', wd, '--input', str(source), '--output',
                            str(tmp_path / 'missing' / 'out.de')), 'does not exist')
  _clean_failure(run_decode('--workdir', wd, '--input', str(source), '--output', str(tmp_path)),
                 'is a directory')


@pytest.mark.slow
def test_long_lines_are_translated_in_pieces(loaded, test_lines):
  sentence = test_lines[0].rstrip('.') + '.'
  short = len(loaded.src_tok.encode([sentence])[0]) + 1
  engine = Engine(loaded, DecodeConfig(beam_size=1, max_extra_len=5, split_len=2 * short))
  alone = engine.translate([sentence])[0]
  long_line, pair_line = ' '.join([sentence] * 50), ' '.join([sentence] * 2)
  encode = lambda text: loaded.src_tok.encode([text])[0]  # noqa: E731
  parts, cut = pieces(loaded.src_tok, long_line, encode(long_line), 2 * short, 1024)
  assert cut == 0 and parts == [encode(pair_line)] * 25  # whole sentences, two a piece
  pair = engine.translate([pair_line])[0]
  out = engine.translate(['', long_line, sentence])
  assert out[0] == '' and out[2] == alone
  assert out[1] == ' '.join([pair] * 25 if pair else [])
  assert (engine.lines_split, engine.sentences_cut) == (1, 0)
  # a sentence longer than split_len stays whole up to max_len, then is cut, nothing dropped
  ids = encode(sentence)
  assert pieces(loaded.src_tok, sentence, ids, 3, len(ids) + 1) == ([ids], 0)
  parts, cut = pieces(loaded.src_tok, sentence, ids, 3, 3)
  assert cut == 1 and sum(parts, []) == ids and all(len(p) <= 2 for p in parts)


@pytest.mark.slow
def test_a_line_longer_than_the_training_lines_is_split_by_default(loaded):
  """A line of many sentences, far over data.max_len (48 for the tiny run) but under
  decode.max_input_len, is split at sentence ends (a model ends early on lines longer than
  it trained on)."""
  sentence = 'He played with twenty-one yellow apples.'
  engine = Engine(loaded, DecodeConfig(beam_size=1, max_extra_len=5))
  assert engine.split_len == 48
  encode = lambda text: loaded.src_tok.encode([text])[0]  # noqa: E731
  line = ' '.join([sentence] * 30)
  assert 48 < len(encode(line)) < engine.decode.max_input_len
  engine.translate([line])
  assert engine.lines_split == 1


@pytest.mark.slow
def test_a_5000_word_line_decodes_within_the_batch_bound(tiny_workdir, tmp_path):
  source = tmp_path / 'long.en'
  words = (tiny_workdir / 'demo_data' / 'test.en').read_text().split()
  source.write_text(' '.join((words * (5000 // len(words) + 1))[:5000]) + '\n')
  result = run_decode('--workdir', str(tiny_workdir), '--input', str(source), '--beam_size', '1',
                      '--max_input_len', '64', '--batch_tokens', '512')
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.count('\n') == 1  # one line out for the one line in
  assert '1 line(s) over 48 source subwords translated in pieces' in result.stderr


@pytest.mark.slow
def test_streaming_in_blocks_gives_the_same_file(tiny_workdir, tmp_path, loaded, test_lines):
  lines = test_lines[:7] + [''] + test_lines[7:12]  # 13 lines, one of them empty
  src = tmp_path / 'in.en'
  src.write_text('\n'.join(lines) + '\n')
  decode = DecodeConfig(beam_size=2, max_extra_len=5)
  whole = Engine(loaded, decode).translate(lines)
  for block in ('1', '5', '0'):
    out = tmp_path / f'out{block}.de'
    heaps = ('--malloc_heaps', '1') if block == '5' else ()  # one malloc heap: the same lines
    result = run_decode('--workdir', str(tiny_workdir), '--input', str(src), '--output', str(out),
                        '--beam_size', '2', '--max_extra_len', '5', '--buffer_lines', block,
                        *heaps)
    assert result.returncode == 0, result.stderr[-3000:]
    assert out.read_text().split('\n')[:-1] == whole, block  # same lines, same order
    assert '13 sentences in' in result.stderr
  piped = run_decode('--workdir', str(tiny_workdir), '--beam_size', '2', '--max_extra_len', '5',
                     '--buffer_lines', '4', stdin=src.read_text())
  assert piped.stdout.split('\n')[:-1] == whole
  _clean_failure(run_decode('--workdir', str(tiny_workdir), '--buffer_lines', '-1', stdin='x\n'),
                 '--buffer_lines=-1 must be 0')
  _clean_failure(run_decode('--workdir', str(tiny_workdir), '--concurrent_batches', '-1',
                            stdin='x\n'), '--concurrent_batches=-1 must be 0')
  _clean_failure(run_decode('--workdir', str(tiny_workdir), '--malloc_heaps', '-2', stdin='x\n'),
                 '--malloc_heaps=-2 must be -1')


@pytest.mark.slow
def test_output_controls_bound_every_output(loaded, test_lines):
  """min_len, max_len and no_repeat_ngram through the Engine (compacting path): the tiny
  model would end most outputs at once and repeat itself otherwise."""
  decode = DecodeConfig(beam_size=2, max_extra_len=20, min_len=3, max_len=5, no_repeat_ngram=1)
  engine = Engine(loaded, decode)
  rows = [np.array(ids + [loaded.src_tok.eos_id], np.int32)
          for ids in loaded.src_tok.encode(test_lines[:8])]
  for out in engine.translate_ids(rows):
    assert 3 <= len(out) <= 5 and len(set(out.tolist())) == len(out), out


@pytest.mark.slow
def test_resume_after_a_kill_ends_with_the_uninterrupted_file(tiny_workdir, test_lines, tmp_path):
  """--resume: a run killed while waiting for input leaves OUTPUT.partial with the blocks it
  wrote (plus, here, half a line); the next run continues after the last complete line and
  ends with the file an uninterrupted run writes."""
  import os
  import signal
  import time
  lines = test_lines[:9]
  source = tmp_path / 'in.en'
  source.write_text('\n'.join(lines) + '\n')
  flags = ['--workdir', str(tiny_workdir), '--beam_size', '1', '--max_extra_len', '5',
           '--buffer_lines', '3']
  whole = tmp_path / 'whole.de'
  assert run_decode(*flags, '--input', str(source), '--output', str(whole)).returncode == 0
  out = tmp_path / 'out.de'
  partial = tmp_path / 'out.de.partial'
  proc = subprocess.Popen([sys.executable, 'decode.py', *flags, '--resume', '--output',
                           str(out)], cwd=ROOT, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdin.write(''.join(line + '\n' for line in lines[:6]).encode())
  proc.stdin.flush()  # two blocks; the process then waits for a third
  # Wait for the record, not the partial's lines: a block's lines reach the partial before
  # the record counts them, and a kill between the two resumes after the block before.
  record = tmp_path / 'out.de.partial.json'
  deadline = time.time() + 240
  while (json.loads(record.read_text())['lines'] if record.exists() else 0) < 6:
    assert time.time() < deadline and proc.poll() is None
    time.sleep(0.2)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  with open(partial, 'a') as f:
    f.write('half a li')  # as if killed in the middle of a write
  assert not out.exists()
  result = run_decode(*flags, '--resume', '--input', str(source), '--output', str(out))
  assert result.returncode == 0, result.stderr[-2000:]
  assert f'resuming after the 6 lines in {partial}' in result.stderr
  assert out.read_text() == whole.read_text() and not partial.exists()


@pytest.mark.slow
def test_precompile_that_cannot_store_fails_in_one_line(tiny_workdir, tmp_path, test_lines):
  work = tmp_path / 'run'  # the trained workdir's files, and a file where programs/ would go
  work.mkdir()
  for entry in tiny_workdir.iterdir():
    if entry.name in ('config.json', 'checkpoints') or entry.name.startswith('spm'):
      (work / entry.name).symlink_to(entry)
  (work / 'programs').write_text('not a directory')
  result = run_decode('--workdir', str(work), '--precompile', '--beam_size', '1',
                      '--max_extra_len', '4', stdin=test_lines[0] + '\n')
  _clean_failure(result, f'--precompile: the programs could not be stored in {work / "programs"}')
  assert 'Not keeping compiled programs' in result.stderr


def test_a_job_of_one_batch_is_cut_into_one_batch_per_thread():
  from transformer_nmt.inference.batches import SPLIT_SENTENCES, split_for_threads
  boundaries, sizes = [8, 16, 24, 32], [1, 2, 4, 8, 12, 16]
  lengths = np.array([20, 3, 9, 5, 30, 7, 12, 4, 6, 11])
  plans = data_lib.fill_batches(lengths, boundaries, 4096, sizes)
  assert len(plans) == 1 and plans[0].rows == 12
  parts = split_for_threads(plans, lengths, boundaries, sizes, threads=2)
  # neighbouring lengths, equal counts, each part's rows and padded length from the grids
  assert [p.examples.tolist() for p in parts] == [[1, 7, 3, 8, 5], [2, 9, 6, 0, 4]]
  assert [(p.rows, p.length) for p in parts] == [(8, 8), (8, 32)]
  assert len(split_for_threads(plans, lengths, boundaries, sizes, threads=3)) == 2  # 4 each
  assert split_for_threads(plans, lengths, boundaries, sizes, threads=1) == plans
  few = data_lib.fill_batches(lengths[:2 * SPLIT_SENTENCES - 1], boundaries, 4096, sizes)
  assert split_for_threads(few, lengths, boundaries, sizes, threads=2) == few
  many = data_lib.fill_batches(lengths, boundaries, 64, sizes)  # several batches already
  assert len(many) > 1 and split_for_threads(many, lengths, boundaries, sizes, 2) == many


def test_batches_in_threads_come_back_in_order_and_stop_with_the_caller():
  from transformer_nmt.inference.batches import in_order
  started = []
  def square(i):
    started.append(i)
    time.sleep(0.002 * (3 - i % 3))  # later batches often finish first
    return i * i
  assert list(in_order(square, 7, 2)) == [i * i for i in range(7)]
  assert list(in_order(square, 3, 1)) == [0, 1, 4]
  started.clear()
  batches = in_order(square, 100, 2)
  assert next(batches) == 0
  batches.close()  # e.g. an error while the caller handled batch 0
  assert len(started) <= 3, started  # the rest never started

"""Every user mistake the programs are known to meet ends in one line on stderr ('error: ...',
naming the file or option) and exit code 2, never a traceback: one case per mistake, each a
subprocess that fails before anything is compiled (issues 44 and 52)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import ROOT

PY = sys.executable
TRAIN = [PY, 'train.py', '--config', 'configs/tiny.py', '--workdir', '{tmp}/run']
DECODE = [PY, 'decode.py', '--workdir', '{wd}']
RECIPE = [PY, 'recipe.py', '--config', 'configs/tiny.py', '--workdir', '{tmp}/run',
          '--results', '{tmp}/RESULTS.md', '--plots_dir', '{tmp}/plots']


def closed(stream: str, *command: str) -> list[str]:
  """`command` run with stdin ('<') or stdout ('>') closed, as `<&-` / `>&-` do in a shell."""
  return ['bash', '-c', f'exec "$@" {stream}&-', 'closed', *command]


# (command, stdin, the message its one line holds); {tmp}: a fresh directory, {wd}: the tiny
# trained workdir, {bad}: a copy of it whose config.json has a string for an integer.
CASES = {
    # train.py: config values, files, flags (tests/test_cli.py has more of each)
    'train: divisibility': (TRAIN + ['--config.model.num_heads=3'], '',
                            'model.d_model=32 is not divisible by model.num_heads=3'),
    'train: dropout range': (TRAIN + ['--config.model.residual_dropout=-0.1'], '',
                             'model.residual_dropout=-0.1 must be in [0, 1)'),
    'train: typo in an option': (TRAIN + ['--config.model.d_modle=5'], '',
                                 '--config.model.d_modle: no such config option; did you mean '
                                 'd_model?'),
    'train: typo in a section': (TRAIN + ['--config.modle.d_model=5'], '',
                                 '--config.modle.d_model: no such config option; did you mean '
                                 'model?'),
    'train: typo in a flag': (TRAIN + ['--num_step=5'], '', "Unknown command line flag 'num_step'"),
    'train: badly typed value': (TRAIN + ['--config.train.num_steps=abc'], '',
                                 "--config.train.num_steps=abc: invalid literal for int()"),
    'train: negative demo sizes': (TRAIN + ['--config.data.demo_sizes=(-1,5,5)'], '',
                                   'data.demo_sizes=(-1, 5, 5) must be three counts'),
    'train: bad direction': ([PY, 'train.py', '--config=configs/multi30k.py:xx-de', '--workdir',
                              '{tmp}/run'], '', "direction 'xx-de': expected SOURCE-TARGET"),
    'train: missing file': (TRAIN + ['--config.data.source=text',
                                     '--config.data.train_src={tmp}/missing.en',
                                     '--config.data.train_tgt={tmp}/in.en',
                                     '--config.data.valid_src={tmp}/in.en',
                                     '--config.data.valid_tgt={tmp}/in.en'], '',
                            'missing.en: no such file'),
    'train: process flags': (TRAIN + ['--num_processes=2', '--process_id=2'], '',
                             '--process_id=2 must be in [0, --num_processes=2)'),
    'recipe: bad alphas': (RECIPE + ['--alphas', '0.6,abc'], '',
                           '--alphas=0.6,abc: expected numbers'),
    'recipe: alpha nan': (RECIPE + ['--alphas', '0.6,nan'], '',
                          '--alphas=0.6,nan: each must be a finite number, 0 or more'),
    # decode.py: flags, search settings, files
    'decode: typo in a flag': (DECODE + ['--beam_szie', '3'], '',
                               "Unknown command line flag 'beam_szie'. Did you mean: beam_size"),
    'decode: not a workdir': ([PY, 'decode.py', '--workdir', '{tmp}/nope'], '',
                              'is not a training workdir'),
    'decode: beam size 0': (DECODE + ['--beam_size', '0'], 'x\n', '--beam_size=0 must be positive'),
    'decode: negative beam size': (DECODE + ['--beam_size=-3'], 'x\n',
                                   '--beam_size=-3 must be positive'),
    'decode: alpha nan': (DECODE + ['--alpha', 'nan'], 'x\n',
                          '--alpha=nan must be a finite number, 0 or more'),
    'decode: alpha inf': (DECODE + ['--alpha', 'inf'], 'x\n',
                          '--alpha=inf must be a finite number, 0 or more'),
    'decode: negative alpha': (DECODE + ['--alpha=-1'], 'x\n',
                               '--alpha=-1.0 must be a finite number, 0 or more'),
    'decode: temperature inf': (DECODE + ['--temperature', 'inf'], 'x\n',
                                '--temperature=inf must be a finite number'),
    'decode: negative max_extra_len': (DECODE + ['--max_extra_len=-1'], 'x\n',
                                       '--max_extra_len=-1 must be 0 (off) or positive'),
    'decode: seed too large': (DECODE + ['--temperature=1', '--seed=100000000000000000000'],
                               'x\n', '--seed=100000000000000000000 must be below 2**31'),
    'decode: negative average_last': (DECODE + ['--average_last=-1'], 'x\n',
                                      '--average_last=-1 must be 0 or positive'),
    'decode: negative plot_sentences': (DECODE + ['--plot_sentences=-1', '--plot_attention',
                                                  '{tmp}/plots'], 'x\n',
                                        '--plot_sentences=-1 must be 0 or positive'),
    'decode: chunk 0': (DECODE + ['--chunk', '0'], 'x\n', '--chunk=0 must be positive'),
    'decode: negative buffer': (DECODE + ['--buffer_lines', '-1'], 'x\n',
                                '--buffer_lines=-1 must be 0'),
    'decode: no such checkpoint': (DECODE + ['--checkpoint', '7'], 'x\n',
                                   'no checkpoint at step 7; available: [10, 20]'),
    'decode: invalid UTF-8': (DECODE + ['--input', '{tmp}/bad.en'], '', 'bad.en:2: invalid UTF-8'),
    'decode: output is the input': (DECODE + ['--input', '{tmp}/in.en', '--output',
                                              '{tmp}/in.en'], '', 'is also the --input file'),
    'decode: output is a directory': (DECODE + ['--output', '{tmp}'], 'x\n', 'is a directory'),
    'decode: output is the tokenizer': (DECODE + ['--output', '{wd}/spm.model'], 'x\n',
                                        'spm.model is a file of the workdir'),
    'decode: output in the checkpoints': (DECODE + ['--output', '{wd}/checkpoints/20/x'], 'x\n',
                                          'is a file of the workdir'),
    'decode: closed stdin': (closed('<', *DECODE), None, '--input=- reads stdin, which is closed'),
    'decode: closed stdout': (closed('>', *DECODE, '--input', '{tmp}/in.en'), None,
                              '--output=- writes to stdout, which is closed'),
    'decode: config.json badly typed': ([PY, 'decode.py', '--workdir', '{bad}'], 'x\n',
                                        "model.num_heads='2' should be of type int"),
    'export: config.json badly typed': ([PY, 'export_ctranslate2.py', '--workdir', '{bad}',
                                         '--out', '{tmp}/ct2'], '',
                                        "model.num_heads='2' should be of type int"),
    'export: typo in a flag': ([PY, 'export_ctranslate2.py', '--workdir', '{wd}', '--outt', 'x'],
                               '', "Unknown command line flag 'outt'"),
    'plot: typo in a flag': ([PY, 'plot.py', '--workdri', '{wd}'], '',
                             "Unknown command line flag 'workdri'"),
}


@pytest.fixture(scope='module')
def badly_typed_workdir(tiny_workdir, tmp_path_factory) -> pathlib.Path:
  """The tiny workdir's files, its config.json with a string where an integer belongs."""
  copy = tmp_path_factory.mktemp('badly_typed') / 'run'
  copy.mkdir()
  for entry in tiny_workdir.iterdir():
    if entry.name in ('checkpoints', 'spm.model'):
      (copy / entry.name).symlink_to(entry)
  config = json.loads((tiny_workdir / 'config.json').read_text())
  config['resolved_model']['num_heads'] = str(config['resolved_model']['num_heads'])
  (copy / 'config.json').write_text(json.dumps(config))
  return copy


@pytest.mark.parametrize('case', CASES)
def test_a_user_mistake_is_one_line_without_a_traceback(case, tiny_workdir, badly_typed_workdir,
                                                        tmp_path):
  command, stdin, message = CASES[case]
  (tmp_path / 'in.en').write_text('a house\n')
  (tmp_path / 'bad.en').write_bytes(b'ok\n\xc3\x28 broken\n')
  places = {'tmp': tmp_path, 'wd': tiny_workdir, 'bad': badly_typed_workdir}
  command = [part.format(**places) for part in command]
  stdin = {'stdin': subprocess.DEVNULL} if stdin is None else {'input': stdin}
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS='cpu'), **stdin)
  output = result.stdout + result.stderr
  assert 'Traceback' not in output, output[-3000:]
  last = result.stderr.rstrip('\n').splitlines()[-1] if result.stderr.strip() else ''
  assert last.startswith('error: ') and message in last, result.stderr[-2000:]
  assert result.returncode == 2, result.stderr[-2000:]
  assert not (tmp_path / 'run').exists()  # nothing written by a refused run

"""Train a Transformer: python train.py --config configs/demo.py --workdir demo_run

Any config value can be overridden, e.g. --config.model.num_layers=2. A second run on the
same workdir resumes from its latest checkpoint. SIGTERM (preemption) or Ctrl-C stops the run
after the current step with a checkpoint of it (exit code 130); on many processes, all stop at
the same step.
"""

import logging

from absl import app, flags
from ml_collections import config_flags

from transformer_nmt.cli import (
  CompileCounter,
  config_flag_parser,
  fail,
  main_running,
  use_compile_cache,
)

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/demo.py', 'Config file (Python).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics, tokenizer.',
                               required=True)
_COORDINATOR = flags.DEFINE_string('coordinator_address', '', 'host:port of process 0, for '
                                   'multi-process training (with --num_processes, --process_id).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', 1, 'Number of processes.')
_PROCESS_ID = flags.DEFINE_integer('process_id', 0, 'This process, 0..num_processes-1.')
_AUTO_DISTRIBUTED = flags.DEFINE_bool('distributed', False, 'Let JAX detect the processes '
                                      '(TPU pods, SLURM, Open MPI).')
_COMPILE_CACHE = flags.DEFINE_bool('compile_cache', True, 'Keep compiled programs in '
                                   'WORKDIR/compile_cache (or in $JAX_COMPILATION_CACHE_DIR, '
                                   'shared by every run), so a resumed run loads its train '
                                   'and eval steps instead of compiling them again.')


def run() -> None:
  if not 0 <= _PROCESS_ID.value < _NUM_PROCESSES.value:
    fail(f'--process_id={_PROCESS_ID.value} must be in [0, --num_processes={_NUM_PROCESSES.value})')
  if _NUM_PROCESSES.value > 1 and not _COORDINATOR.value:
    fail('--num_processes > 1 needs --coordinator_address=HOST:PORT of process 0')
  from transformer_nmt import sharding  # after flag parsing: keeps --help fast
  from transformer_nmt.training import loop as trainer
  from transformer_nmt.typed_config import validate_config
  if _COMPILE_CACHE.value:
    from transformer_nmt.workdir import Workdir
    use_compile_cache(str(Workdir(_WORKDIR.value).compile_cache))
  sharding.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                                  _AUTO_DISTRIBUTED.value)
  compiles = CompileCounter()
  trainer.train_and_evaluate(validate_config(_CONFIG.value), _WORKDIR.value)
  logging.info('Done: %s', compiles.summary())  # a resumed run should compile nothing


if __name__ == '__main__':
  app.run(main_running(run, resumes=True), flags_parser=config_flag_parser(_CONFIG))

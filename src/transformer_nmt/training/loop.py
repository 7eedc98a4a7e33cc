"""train_and_evaluate(config, workdir): the training loop, built from the library's pieces.

`config` is the run's typed `Sections` (typed_config.validate_config, done once by the program).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
from typing import Any, Callable, Iterator, Mapping, Optional

import jax
import jax.numpy as jnp

from transformer_nmt import sharding
from transformer_nmt.checkpoint import Checkpointer, loop_state
from transformer_nmt.config import EvalConfig, ModelConfig, TrainConfig
from transformer_nmt.data import batching as data_lib
from transformer_nmt.data import corpus as corpus_lib
from transformer_nmt.data.prefetch import Prefetcher
from transformer_nmt.data.tokenizer import Tokenizer
from transformer_nmt.data.training_batches import train_batches
from transformer_nmt.errors import ConfigError, DataError
from transformer_nmt.metrics import MetricWriter, read_metrics
from transformer_nmt.model.transformer import count_params
from transformer_nmt.stored_config import model_as_trained
from transformer_nmt.training.early_stopping import EarlyStopping
from transformer_nmt.training.evaluation import EvaluationInterrupted, Evaluator, subset
from transformer_nmt.training.init_from import (
  check_init_from,
  check_tokenizers,
  copy_tokenizers,
  has_checkpoint,
  start_from,
)
from transformer_nmt.training.jitted import (
  accumulation_steps,
  make_mesh,
  make_step,
  state_shardings,
)
from transformer_nmt.training.memory import check_batch_fits
from transformer_nmt.training.preemption import Stopped, StopRequest
from transformer_nmt.training.profiling import Profile
from transformer_nmt.training.progress import Progress
from transformer_nmt.training.state import create_train_state
from transformer_nmt.typed_config import Sections, model_config_from_dict
from transformer_nmt.workdir import RESOLVED_MODEL, Workdir


def check_devices(t: TrainConfig) -> None:
  """The one check that needs this run's devices: FSDP's axis must divide them."""
  if t.shard_params and t.fsdp_devices and jax.device_count() % t.fsdp_devices:
    raise ConfigError(f'train.fsdp_devices={t.fsdp_devices} must be 0 (all devices) or divide '
                      f'the {jax.device_count()} devices')


@dataclasses.dataclass
class Experiment:
  """Everything the loop needs, prepared (and validated) before training starts."""

  model_cfg: ModelConfig
  train: data_lib.ParallelData
  valid: data_lib.ParallelData
  test: Optional[data_lib.ParallelData]
  valid_refs: list[str]
  test_refs: Optional[list[str]]
  evaluator: Evaluator
  host_sharded: bool = False  # train holds this process's share only (see corpus.Corpus)
  # epoch -> the training pairs segmented anew (data.spm_alpha > 0), else None
  train_epochs: Optional[Callable[[int], data_lib.ParallelData]] = None


def prepare(config: Sections, workdir: pathlib.Path,
            hold: Optional[contextlib.ExitStack] = None) -> Experiment:
  """Reads data, sets up tokenizers in the workdir and writes the resolved config.

  Nothing is written before the config (validated by the program: `validate_config`), the
  devices and the data have been checked; from the first write on, process 0 holds the
  workdir's lock in `hold` (see `Workdir.lock`).
  """
  check_devices(config.train)
  starting_from = config.train.init_from and not has_checkpoint(workdir)  # else: its own
  if starting_from:
    check_init_from(config)
  if workdir.exists() and not workdir.is_dir():
    raise DataError(f'--workdir={workdir} is a file, not a directory')
  for place in (Workdir(workdir).checkpoints, Workdir(workdir).best):
    if place.exists() and not place.is_dir():  # Orbax would train for nothing, then hang
      raise DataError(f'{place} is a file, not a directory of checkpoints: move it away')
  # Before the data are read: reading a demo corpus writes it into the workdir.
  _check_model(config.model, workdir)
  check_batch_fits(config.data, jax.process_count())
  if (config.data.source == 'tfds' and jax.process_count() > 1
      and not config.data.pack_length):
    raise ConfigError("data.source='tfds' with several processes reads one shard per process; "
                      'set data.pack_length (e.g. 256) so that every process builds batches of '
                      'the same shape')
  if hold is not None:  # before anything is read or written (see Workdir.lock)
    sharding.on_leader(lambda: hold.enter_context(Workdir(workdir).lock()))
  corpus = corpus_lib.read_corpus(config.data, workdir)
  if Workdir(workdir).existing_tokenizer_paths() is None:
    corpus.train  # a new run reads (so checks) its training text before writing anything
  workdir.mkdir(parents=True, exist_ok=True)
  Workdir(workdir).check_tokenizers()  # before a missing one would be trained anew
  if starting_from and not config.data.spm_model:  # an imported model's, with its piece table
    sharding.on_leader(lambda: copy_tokenizers(config.train.init_from, workdir))
  src_tok, tgt_tok = corpus_lib.tokenizers(config.data, corpus, workdir)
  _check_shared_vocabulary(config.model, src_tok, tgt_tok)
  if starting_from:  # the ones in use: a file the workdir already holds wins over spm_model
    check_tokenizers(config.train.init_from, {'src': src_tok.fingerprint,
                                              'tgt': tgt_tok.fingerprint},
                     f'the SentencePiece model in {workdir}')
  model_cfg = model_config_from_dict(config.model, vocab_size=tgt_tok.vocab_size,
                                     src_vocab_size=src_tok.vocab_size)
  sharding.on_leader(lambda: _check_and_write_config(
      config, model_cfg, workdir, {'src': src_tok.fingerprint, 'tgt': tgt_tok.fingerprint}))
  cache_dir = (pathlib.Path(config.data.cache_dir or Workdir(workdir).data_cache)
               if config.data.cache else None)
  splits = {name: corpus_lib.encode(lines, src_tok, tgt_tok, config.data, False)
            for name, lines in (('valid', corpus.valid), ('test', corpus.test))
            if lines is not None}
  splits['train'] = corpus_lib.encode_train(config.data, corpus, src_tok, tgt_tok, cache_dir)
  for name, split in splits.items():
    s = split.stats
    logging.info('%s: %d lines, %d pairs kept, %d skipped (empty side), %d skipped (over %d '
                 'tokens)', name, s.lines, s.kept, s.empty, s.too_long, config.data.max_len)
  evaluator = Evaluator(model_cfg, config.train.label_smoothing, tgt_tok, src_tok, config.decode)
  epochs = (corpus_lib.sampled_epochs(lambda: corpus.train, src_tok, tgt_tok, config.data,
                                      config.train.seed) if config.data.spm_alpha > 0 else None)
  return Experiment(model_cfg, splits['train'], splits['valid'], splits.get('test'),
                    corpus.valid[1], corpus.test[1] if corpus.test else None, evaluator,
                    corpus.host_sharded, epochs)


def _check_shared_vocabulary(model: Mapping[str, Any], src_tok: Tokenizer,
                             tgt_tok: Tokenizer) -> None:
  """model.share_embeddings needs one id space on both sides: one SentencePiece model, or
  two with one piece table (an imported Marian model's)."""
  if not model.get('share_embeddings', True) or src_tok.path == tgt_tok.path:
    return
  if not (src_tok.table and tgt_tok.table and src_tok.table.path == tgt_tok.table.path):
    raise ConfigError('data.joint_vocab=False gives source and target their own vocabularies; '
                      'it needs model.share_embeddings=False')


def _check_and_write_config(config: Sections, model_cfg: ModelConfig,
                            workdir: pathlib.Path, tokenizers: dict[str, str]) -> None:
  """Writes config.json; refuses a workdir whose checkpoints belong to another model config
  or other tokenizers."""
  wd = Workdir(workdir)
  wd.check_tokenizers(tokenizers)
  _refuse_another_model(workdir, model_cfg)
  wd.write_config(config.to_dict(), model_cfg, tokenizers)


def _check_model(model: Mapping[str, Any], workdir: pathlib.Path) -> None:
  """`_refuse_another_model` before the tokenizers are known: the model section compared
  with the vocabulary sizes the workdir was trained with (a changed vocabulary is the
  tokenizer check's to refuse)."""
  wd = Workdir(workdir)
  if not (wd.config.exists() and wd.checkpoints.exists()):
    return
  old = wd.read_config().get(RESOLVED_MODEL, {})
  if 'vocab_size' in old:
    _refuse_another_model(workdir, model_config_from_dict(
        model, vocab_size=old['vocab_size'],
        src_vocab_size=old.get('src_vocab_size') or old['vocab_size']))


def _refuse_another_model(workdir: pathlib.Path, model_cfg: ModelConfig) -> None:
  """Raises ConfigError naming the differences when the workdir's checkpoints belong to a
  model other than `model_cfg`."""
  wd = Workdir(workdir)
  if not (wd.config.exists() and wd.checkpoints.exists()):
    return
  model = dataclasses.asdict(model_cfg)
  old = model_as_trained(wd.read_config().get(RESOLVED_MODEL, {}))
  diff = sorted(k for k in set(old) | set(model) if old.get(k) != model.get(k))
  if diff:
    values = ', '.join(f'{k} {old.get(k)!r} there, {model.get(k)!r} now' for k in diff)
    raise ConfigError(f'{workdir} holds checkpoints of a different model ({values}); set '
                      'model.* to match, or use a new --workdir')


def evaluate(exp: Experiment, params: Any, eval_cfg: EvalConfig, step: int,
             final: bool = False) -> dict:
  """Validation loss and greedy BLEU, logged.

  `eval_bleu` is always on the same first `eval.bleu_sentences` validation sentences, so that
  evaluations compare (and pick the best checkpoint); the final evaluation adds `valid_bleu`
  on the whole validation set and `test_bleu` when there is a test set.
  """
  ev = exp.evaluator
  loss = ev.loss(params, exp.valid)
  sample = subset(exp.valid, eval_cfg.bleu_sentences)
  bleu, _, signature = ev.bleu(params, sample, exp.valid_refs)
  row = {'eval_loss': loss['loss'], 'eval_nll': loss['nll'], 'eval_perplexity': loss['perplexity'],
         'eval_accuracy': loss['accuracy'], 'eval_bleu': bleu}
  if final:
    row['valid_bleu'] = (bleu if len(sample) == len(exp.valid)
                         else ev.bleu(params, exp.valid, exp.valid_refs)[0])
    if exp.test is not None:
      row['test_bleu'], _, _ = ev.bleu(params, exp.test, exp.test_refs)
  logging.info('eval at step %d: %s  [%s]', step,
               ', '.join(f'{k} {v:.4g}' for k, v in row.items()), signature)
  return row


def _evaluate_and_keep_best(exp: Experiment, config: Sections, state: Any,
                            step: int, ckpt: Checkpointer, best: Optional[Checkpointer],
                            loop: dict) -> dict:
  """`evaluate`'s row; the state is also saved in best/ when `best` is given (it keeps the
  checkpoint with the highest eval_bleu)."""
  row = evaluate(exp, sharding.local_copy(state.eval_params), config.eval, step,
                 final=step == config.train.num_steps)
  if best is not None:
    ckpt.check_for_errors()  # no second save after a failed one (a full disk)
    best.save(step, state, loop, metrics={'eval_bleu': row['eval_bleu']})
  return row


def train_and_evaluate(config: Sections, workdir: str) -> None:
  """Trains, resuming from the workdir's latest checkpoint, and evaluates at the end.

  `config`: the run's sections, as `validate_config` gives them (config.json stores them).

  Process 0 holds the workdir's lock from its first write to the end of the run: a second
  run on the same workdir stops at once.
  """
  stop = StopRequest()
  with contextlib.ExitStack() as hold, stop.watching():
    _train_and_evaluate(config, workdir, hold, stop)


def _train_and_evaluate(config: Sections, workdir: str,
                        hold: contextlib.ExitStack, stop: StopRequest) -> None:
  workdir_path = pathlib.Path(workdir)
  exp = prepare(config, workdir_path, hold)
  if not stop.multi_process:  # evaluations must end together on many processes
    exp.evaluator.interrupted = stop.requested
  t = config.train
  rng = jax.random.key(t.seed)
  state = create_train_state(exp.model_cfg, t, jax.random.fold_in(rng, 0))
  logging.info('Model: %s parameters', f'{count_params(state.params):,}')
  mesh = make_mesh(t)
  if mesh.size > 1:
    logging.info('Data parallel over %d devices (%s)', mesh.size, jax.default_backend())
  placement = state_shardings(state, mesh)
  # Placed before restoring: a checkpoint then restores straight into the mesh's shardings
  # (restored arrays on one local device could not move to other hosts' devices).
  state = jax.device_put(state, placement)
  ckpt = Checkpointer(Workdir(workdir).checkpoints, keep=t.keep_checkpoints)
  best = Checkpointer(Workdir(workdir).best, keep=1, best_metric='eval_bleu') if t.keep_best \
      else None
  writer = MetricWriter(workdir_path, enabled=sharding.is_leader())
  try:  # the checkpointers are closed (their saves finished) however the run ends
    restored = ckpt.restore_latest_readable(state)
    data_position, dropout_key = 0, jax.random.fold_in(rng, 1)
    if restored is not None:
      state, loop = restored
      data_position = int(loop['data_position'])
      dropout_key = jax.random.wrap_key_data(loop['dropout_key'])
      logging.info('Resumed from checkpoint at step %d', int(state.step))
    elif t.init_from:
      state = start_from(state, t.init_from)
    _train_loop(exp, config, state, placement, data_position, mesh, ckpt, best, writer,
                dropout_key, stop)
  finally:
    with contextlib.ExitStack() as closing:  # each one closed, even when another one raises
      closing.callback(writer.close)
      if best is not None:
        closing.callback(best.close)
      closing.callback(ckpt.close)


@jax.jit
def _count_real(segments: jax.Array) -> jax.Array:
  """Real (non-padding) positions of a global [B, L] segment-id array."""
  return jnp.count_nonzero(segments)


def _input_pipeline(exp: Experiment, config: Sections,
                    data_position: int) -> Iterator[data_lib.Batch]:
  """This process's rows of the global batches from `data_position` on."""
  if exp.host_sharded:  # each process batches its own shard: its rows of the global batch
    tokens, devices, host = (config.data.tokens_per_batch // jax.process_count(),
                             jax.local_device_count(), (0, 1))
  else:  # every process plans the same global batch and builds only its own rows of it
    tokens, devices, host = (config.data.tokens_per_batch, jax.device_count(),
                             (jax.process_index(), jax.process_count()))
  return train_batches(exp.train, tokens, config.train.seed, data_position,
                                row_multiple=devices, pack_length=config.data.pack_length,
                                data_for_epoch=exp.train_epochs, host=host)


def _train_loop(exp: Experiment, config: Sections, state: Any,
                placement: Any, data_position: int, mesh: Any, ckpt: Checkpointer,
                best: Optional[Checkpointer], writer: MetricWriter, dropout_rng: jax.Array,
                stop: StopRequest) -> None:
  """Steps from state.step to train.num_steps with logging, evaluation and checkpoints.
  When `stop` says so at a step boundary (SIGTERM, Ctrl-C; evaluation gives up between its
  batches), the last completed step is checkpointed and `Stopped` raised. Training also ends
  once `train.patience` evaluations in a row bring no better validation BLEU.
  `best`, if given, keeps the checkpoint with the highest validation BLEU. `data_position`
  counts the micro-batches consumed so far; it and `dropout_rng` are saved with every
  checkpoint."""
  t = config.train
  start = int(state.step)
  early = EarlyStopping.from_history(t.patience, read_metrics(writer.path), start)
  if early.stopped:
    logging.info('Stopped early before (no better validation BLEU in %d evaluations since step '
                 '%d); raise train.patience to go on', early.since, early.best_step)
    return
  accumulate = accumulation_steps(t, config.data)
  if accumulate > 1:
    logging.info('Global batch: %d micro-batches of %d tokens per side (about %d tokens)',
                 accumulate, config.data.tokens_per_batch,
                 accumulate * config.data.tokens_per_batch)
  step_fn = make_step(exp.model_cfg, t, mesh, accumulate, placement)
  progress = Progress(t.num_steps, start, writer.last('wall_s', start))
  profile = Profile(Workdir(writer.path.parent).profile, t.profile_steps)
  saved = lambda: loop_state(data_position, dropout_rng)  # noqa: E731
  batches = Prefetcher(_input_pipeline(exp, config, data_position), config.data.prefetch)
  try:
    for step in range(start + 1, t.num_steps + 1):
      waited = batches.waited
      micro = [next(batches) for _ in range(accumulate)]
      profile.before(step)
      placed = [sharding.shard_batch(b, mesh) for b in micro]
      state, metrics = step_fn(state, placed, dropout_rng)
      profile.after(step, state)
      data_position += accumulate  # only once the step has completed
      # counted over the global batch (a process holds only its rows); read at the next log
      metrics['src_tokens'] = sum(_count_real(b['src_segments']) for b in placed)
      progress.add(metrics, micro, batches.waited - waited)
      row = progress.log(step) if step % t.log_every == 0 or step == t.num_steps else {}
      if step % t.checkpoint_every == 0 or step == t.num_steps:
        ckpt.save(step, state, saved())
      if step % t.eval_every == 0 or step == t.num_steps:
        with progress.outside_training(), contextlib.suppress(EvaluationInterrupted):
          row.update(_evaluate_and_keep_best(exp, config, state, step, ckpt, best, saved()))
      if row:
        writer.write(step, row)
      if stop.should_stop(step):
        ckpt.save(step, state, saved(), force=True)
        logging.info('Stopped on request: saved checkpoint at step %d; run again to resume', step)
        raise Stopped
      if 'eval_bleu' in row and early.update(step, row['eval_bleu']):
        ckpt.save(step, state, saved(), force=True)
        logging.info('Stopped early at step %d: no better validation BLEU in %d evaluations '
                     '(best %.2f at step %d)', step, early.since, early.best, early.best_step)
        return
  except Stopped:
    raise
  except KeyboardInterrupt:  # `state` and `data_position` are the last completed step's
    ckpt.save(int(state.step), state, saved(), force=True)
    logging.info('Interrupted: saved checkpoint at step %d; run again to resume', int(state.step))
    raise
  finally:
    batches.close()  # the batches built ahead are dropped: data_position counts consumed ones
    profile.close()
  if start >= t.num_steps:  # nothing left to train: report the restored model
    logging.info('Checkpoint is at step %d >= train.num_steps; evaluating only', start)
    writer.write(start, evaluate(exp, sharding.local_copy(state.eval_params), config.eval, start,
                                 final=True))

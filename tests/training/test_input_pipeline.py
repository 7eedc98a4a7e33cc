"""The training loop with batches built ahead (data.prefetch) trains exactly as without, and
reports how long it waited for data."""

import json

import pytest

from configs import tiny
from transformer_nmt.training import loop as trainer
from transformer_nmt.typed_config import validate_config


def _rows(workdir):
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.slow
def test_prefetching_changes_no_loss_and_logs_the_data_wait(tmp_path):
  losses = {}
  for depth in (0, 3):
    c = tiny.get_config()
    # Packed rows and subword sampling: epochs of about 10 batches, so 24 steps re-sample
    # the pairs (in the thread) twice.
    c.data.update(prefetch=depth, pack_length=48, spm_alpha=0.2, demo_sizes=(300, 8, 8))
    c.train.update(num_steps=24, log_every=4, eval_every=24, checkpoint_every=24)
    c.eval.update(bleu_sentences=0)  # the losses are compared, not translations
    trainer.train_and_evaluate(validate_config(c), str(tmp_path / str(depth)))
    rows = [r for r in _rows(tmp_path / str(depth)) if 'train_loss' in r]
    assert all(0.0 <= r['data_wait'] < 1.0 for r in rows)
    losses[depth] = [r['train_loss'] for r in rows]
  assert len(losses[0]) == 6 and losses[0] == losses[3]

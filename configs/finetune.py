"""Fine-tuning the model of a workdir (e.g. an OPUS-MT model brought in by import_marian.py)
on your own parallel text:

    python train.py --config configs/finetune.py:runs/opus_en_de --workdir runs/opus_tuned \
        --config.data.train_src=train.en --config.data.train_tgt=train.de \
        --config.data.valid_src=valid.en --config.data.valid_tgt=valid.de

The argument after the colon is the workdir to start from (train.init_from): the new run takes
its model options as trained and its tokenizers (an imported model's SentencePiece models and
piece table are copied into the new workdir; for one of our runs give data.spm_model), with a
fresh optimizer and step count. The learning rate is eq. 3 scaled down with a short warmup
and a linear cooldown, as fine-tuning a trained model wants (a fresh run's peak would undo
much of what it learnt).
"""

import json
import pathlib

import ml_collections

from transformer_nmt.config import PROGRAM_SET, default_config
from transformer_nmt.stored_config import model_as_trained
from transformer_nmt.workdir import RESOLVED_MODEL, Workdir


def get_config(workdir: str = '') -> ml_collections.ConfigDict:
  if not workdir:
    raise ValueError('configs/finetune.py needs the workdir to start from: '
                     '--config configs/finetune.py:WORKDIR')
  stored = json.loads(pathlib.Path(Workdir(workdir).config).read_text(encoding='utf-8'))
  c = default_config()
  c.model.update({k: v for k, v in model_as_trained(stored[RESOLVED_MODEL]).items()
                  if k not in PROGRAM_SET})
  # vocab_size: the model's, for aot_compile.py, which builds the model without tokenizers
  # (training takes it from the tokenizers it copies)
  c.data.update(source='text', joint_vocab=stored.get('data', {}).get('joint_vocab', True),
                max_len=128, vocab_size=Workdir(workdir).read_model_config().vocab_size)
  c.decode.update(stored.get('decode', {}))
  # Peak learning rate 0.05 x d_model^-0.5 x 200^-0.5 (1.6e-4 at d_model 512).
  c.train.update(init_from=workdir, num_steps=2000, warmup_steps=200,
                 learning_rate_multiplier=0.05, cooldown_steps=1000, eval_every=500,
                 checkpoint_every=500, log_every=50)
  c.eval.update(bleu_sentences=300)
  return c

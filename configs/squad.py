"""SQuAD fine-tuning: `configs/squad.py:version=1.1[,init=hf:DIR,...]` (or version=2.0).

Arguments: version (1.1 | 2.0), train, dev (JSON files), split (train on this share of the dev
articles, evaluate on the rest: for when no training file is at hand), and the shared ones of
configs/finetune.py. The paper's settings: seq 384, stride 128, 2-3 epochs, lr 3e-5 (v1.1, batch
32) or 5e-5 (v2.0, batch 48). The dev file defaults to $BERT_JAX_DATA/squad/dev-v<version>.json.
"""

import os

from configs import base
from configs import finetune

ARGUMENTS = {**finetune.ARGUMENTS, 'version': 'task.version', 'train': 'task.train_file',
             'dev': 'task.dev_file', 'split': 'task.split_dev_fraction'}


def get_config(arg=None):
  config = finetune.get_config()
  task = config.task
  task.kind = 'squad'
  task.name = 'squad'
  task.version = '1.1'  # '1.1' or '2.0' (unanswerable questions, no-answer threshold).
  # Without a training file: train on this share of the dev articles, evaluate on the rest.
  task.split_dev_fraction = 0.0
  task.doc_stride = 128  # Tokens between the starts of a long context's windows.
  task.max_query_length = 64  # Question tokens kept.
  task.n_best_size = 20  # Start and end candidates considered per window.
  task.max_answer_length = 30  # Longest answer, in tokens.
  task.null_score_diff_threshold = 0.0  # SQuAD 2.0: predict no answer above this score gap.
  config.data.max_seq_length = 384
  config.train.learning_rate = 3e-5
  config.train.num_epochs = 2.0
  config.train.log_every = 50
  if arg:
    base.apply_arguments(config, arg, ARGUMENTS)
  if config.task.version not in ('1.1', '2.0'):
    raise ValueError(f'Unknown SQuAD version {config.task.version!r}; valid: 1.1, 2.0.')
  if not config.task.dev_file and finetune.data_root():
    config.task.dev_file = os.path.join(finetune.data_root(), 'squad',
                                        f'dev-v{config.task.version}.json')
  return config

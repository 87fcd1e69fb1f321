"""SWAG multiple choice: `configs/swag.py[:data_dir=DIR,init=hf:DIR,seeds=5,...]`.

Each of the four endings is a row `[CLS] sent1 [SEP] sent2 ending [SEP]`, scored from its pooled
[CLS] state; softmax cross-entropy over the four, accuracy on val.csv. The paper's settings are
the defaults: lr 2e-5, 3 epochs, batch 16 (questions, so 64 rows a step), seq 128. Arguments:
data_dir (SWAG's folder with train.csv and val.csv; default $BERT_JAX_DATA/swag) and the shared
ones of configs/finetune.py (init, seeds, lr, epochs, batch, seq, vocab).
"""

import os

from configs import base
from configs import finetune

ARGUMENTS = {**finetune.ARGUMENTS, 'data_dir': 'task.data_dir'}


def get_config(arg=None):
  config = finetune.get_config()
  config.task.kind = 'swag'
  config.task.name = 'swag'
  config.data.max_seq_length = 128
  config.train.learning_rate = 2e-5
  config.train.num_epochs = 3.0
  config.train.batch_size = 16
  if finetune.data_root():
    config.task.data_dir = os.path.join(finetune.data_root(), 'swag')
  if arg:
    base.apply_arguments(config, arg, ARGUMENTS)
  return config

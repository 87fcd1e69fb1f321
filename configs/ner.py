"""CoNLL-2003 NER: `configs/ner.py[:init=hf:DIR,features=4,...]`.

Token classification on the first piece of each word (fine-tuning), or with features=N the
paper's feature-based mode: the frozen encoder's last N layers concatenated, a two-layer BiLSTM
and a classifier on top. Arguments: features, train, dev, test (CoNLL files) and the shared ones
of configs/finetune.py. Files default to $BERT_JAX_DATA/conll2003/eng.{train,testa,testb}.
"""

import os

from configs import base
from configs import finetune

ARGUMENTS = {**finetune.ARGUMENTS, 'features': 'task.feature_layers', 'train': 'task.train_file',
             'dev': 'task.dev_file', 'test': 'task.test_file'}


def get_config(arg=None):
  config = finetune.get_config()
  config.task.kind = 'ner'
  config.task.name = 'conll2003'
  config.data.lowercase = True
  config.data.max_seq_length = 128
  config.train.learning_rate = 5e-5
  config.train.num_epochs = 3.0
  root = finetune.data_root()
  if root:
    folder = os.path.join(root, 'conll2003')
    config.task.train_file = os.path.join(folder, 'eng.train')
    config.task.dev_file = os.path.join(folder, 'eng.testa')
    test = os.path.join(folder, 'eng.testb')
    config.task.test_file = test if os.path.isfile(test) else ''
  if arg:
    base.apply_arguments(config, arg, ARGUMENTS)
  if config.task.feature_layers and 'lr=' not in (arg or ''):
    config.train.learning_rate = 1e-3  # Only the BiLSTM and classifier train.
  return config

"""GLUE fine-tuning: `configs/glue.py:task=mrpc[,init=hf:DIR,seeds=5,lrs=paper,...]`.

Arguments: task (cola, sst2, mrpc, qqp, mnli, qnli, rte, wnli, stsb), source (files | tfds), and
the shared ones of configs/finetune.py (init, seeds, lr, lrs, epochs, batch, seq, vocab;
`lrs=paper` selects the rate on dev among the paper's 5e-5, 4e-5, 3e-5 and 2e-5). The task's
folder defaults to $BERT_JAX_DATA/glue/<GLUE folder name>; set --config.task.data_dir otherwise.
"""

import os

from configs import base
from configs import finetune

# GLUE's folder name of each task (glue_data/<folder>/{train,dev,test}.tsv).
FOLDERS = {'cola': 'CoLA', 'sst2': 'SST-2', 'mrpc': 'MRPC', 'qqp': 'QQP', 'mnli': 'MNLI',
           'qnli': 'QNLI', 'rte': 'RTE', 'wnli': 'WNLI', 'stsb': 'STS-B'}
ARGUMENTS = {**finetune.ARGUMENTS, 'task': 'task.name', 'source': 'task.source'}


def get_config(arg=None):
  config = finetune.get_config()
  config.task.kind = 'glue'
  config.task.source = 'files'  # 'files' (data_dir holds train.tsv, dev.tsv) or 'tfds' (glue/*).
  if arg:
    base.apply_arguments(config, arg, ARGUMENTS)
  name = config.task.name
  if name not in FOLDERS:
    raise ValueError(f'Unknown GLUE task {name!r}; valid tasks are {", ".join(FOLDERS)}.')
  if finetune.data_root():
    config.task.data_dir = os.path.join(finetune.data_root(), 'glue', FOLDERS[name])
  return config

"""What the shipped sweeps share: the small recipe, one prepared corpus, the held-out masks,
and the fine-tuning tasks and settings."""

import ml_collections

from configs import finetune

# Every pretraining run of a sweep: the corpus prepared once in the sweep's workdir, the
# held-out set masked the paper's way whatever an arm trains with.
PRETRAIN = {'data': {'prepared': 'corpus'}, 'masking': {'eval': 'reference'}}

# GLUE tasks with a train and a dev set in $BERT_JAX_DATA/glue; scored on dev, as the paper's
# ablations are.
TASKS = 'sst2,mrpc,stsb'


def sweep(name: str, title: str, description: str) -> ml_collections.ConfigDict:
  """A sweep on configs/small.py with the shared settings; the caller adds its arms."""
  config = ml_collections.ConfigDict()
  config.name = name
  config.title = title
  config.description = description
  config.base = 'configs/small.py'
  config.steps = 0  # configs/small.py's budget.
  # '' runs this recipe; 'tiny' every arm at configs/tiny.py's shape, minutes on a laptop
  # (bert_jax/sweep/sizes.py).
  config.size = ''
  config.evaluations = 10
  config.pretrain = PRETRAIN
  config.finetune = ml_collections.ConfigDict()
  config.finetune.config = 'configs/glue.py'
  config.finetune.tasks = TASKS
  config.finetune.seeds = 3
  config.finetune.at_steps = ''
  # The paper's protocol: every seed of every arm and task fine-tunes at each of these rates
  # and the best median on dev is reported (bert_jax/train/lr_grid.py).
  config.finetune.learning_rates = finetune.PAPER_LEARNING_RATES
  # The paper's settings (batch 32, 3 epochs); bf16 compute. learning_rate serves a sweep that
  # sets learning_rates=''.
  config.finetune.overrides = {'train': {'learning_rate': 5e-5, 'batch_size': 32,
                                         'num_epochs': 3.0},
                               'model': {'dtype': 'bfloat16'},
                               'task': {'write_predictions': False}}
  # SST-2's sentences fit in 64 tokens; its first 20,000 training phrases (of 67,349) keep a
  # sweep's fine-tuning to minutes.
  config.finetune.task_overrides = {'sst2': {'data': {'max_seq_length': 64},
                                             'task': {'max_train_examples': 20000}}}
  config.paper = ml_collections.ConfigDict({'source': '', 'columns': []})
  config.order = ''
  config.notes = []
  return config


def with_arms(sweep: ml_collections.ConfigDict, arms: dict) -> ml_collections.ConfigDict:
  """Sets sweep.arms and sweep.order (the report's row order: `arms`' order)."""
  sweep.arms = arms
  sweep.order = ','.join(arms)
  return sweep

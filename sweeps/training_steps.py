"""Training steps (BERT section 5.2 / Figure 5): one run, fine-tuned from checkpoints along the
way (WORKDIR@STEP) and from its last step: downstream accuracy against pretraining steps.

  python -m bert_jax.sweep run --sweep=sweeps/training_steps.py --workdir=runs/training_steps
"""

from sweeps import common


def get_config():
  sweep = common.sweep(
      'training_steps', 'Training steps (BERT 5.2)',
      'One pretraining run, fine-tuned from its checkpoints at a quarter, half and three '
      'quarters of its steps and from its last step. The checkpoints along the way are '
      'mid-schedule: their learning rate has not decayed, as in the paper\'s figure 5.')
  common.with_arms(sweep, {'bert': {'label': 'MLM + NSP'}})
  sweep.finetune.at_steps = '5000,10000,15000'
  return sweep

"""A sweep at another size: `--sweep.size=tiny` runs any sweep's arms at configs/tiny.py's shape,
on the built-in corpus, in minutes on a laptop's CPU.

The arms keep what they compare (objectives, masking, rows, tokenizer kind, the ratios of their
depths, widths and head counts); what shrinks is what every arm shares: the base config, the
step budget, the widths an arm sets, the vocab an arm trains, and fine-tuning's rows, seeds and
rate grid. Its scores show that the sweep runs and what its report looks like, not the paper's
effects: the report says so under its tables.
"""

import copy
import math

from bert_jax.core import cli
from configs import base as base_config

SIZES = ('', 'tiny')  # '': the sweep file's own recipe.
TINY_BASE = 'configs/tiny.py'
# Pretraining steps of a sweep that runs its base's budget (sweep.steps=0; a sweep that sets
# steps gets them in proportion to that budget): about 40 s of a tiny BERT on 2 CPU cores.
TINY_STEPS = 300
# The widths an arm sets (hidden=, model.intermediate_size, model.embedding_size) are divided by
# this: the recipe's 768 becomes 96, its 256 becomes 32, divisible by every head count the
# shipped sweeps use (3, 4, 12).
TINY_WIDTH_DIVISOR = 8
# Fine-tuning: the first rows of each task, one seed at one rate. A tiny model takes a larger
# rate than the paper's grid for BERT-Base: on SST-2 from configs/tiny.py's model (4,000 rows,
# 2 epochs; notebooks/bert_jax_demo.ipynb) 1e-4, 3e-4, 5e-4 and 1e-3 scored 56.8, 68.9 (3 epochs),
# 67.2 and 50.9 (diverged).
TINY_TRAIN_EXAMPLES = 2000
TINY_LEARNING_RATE = '5e-4'
TINY_FINETUNE_BATCH = 32


class SizeError(ValueError):
  """A sweep.size this module does not know."""


def resized(sweep):
  """(a copy of `sweep` at its sweep.size, with size cleared so it applies once; the size) or
  (`sweep` itself, '') when it has none."""
  size = str(sweep.get('size', '') or '')
  if size not in SIZES:
    raise SizeError(f'sweep.size={size!r}: expected one of '
                    f'{", ".join(repr(s) for s in SIZES)} (\'\' runs the sweep file\'s recipe).')
  if not size:
    return sweep, ''
  sweep = copy.deepcopy(sweep)
  shrink_to_tiny(sweep)
  return sweep, size


def shrink_to_tiny(sweep, trained_vocab: int = base_config.TINY['vocab']) -> None:
  """`sweep` at size tiny, in place (module docstring): configs/tiny.py as the base, with the
  original base's vocab file (an arm from random initialisation needs one); TINY_STEPS for the
  base's budget (a sweep.steps in proportion), at_steps scaled with the budget; arms' widths
  divided by TINY_WIDTH_DIVISOR and trained vocabs at size=tiny's; fine-tuning on
  TINY_TRAIN_EXAMPLES rows, one seed, one rate, rows of the tiny model's length, in float32 as it
  pretrains."""
  original = cli.load_config_spec(sweep.base)
  tiny = cli.load_config_spec(TINY_BASE)
  budget = int(sweep.get('steps', 0) or 0) or original.train.num_steps
  # A sweep that runs its base's budget gets TINY_STEPS; one that sets another, in proportion.
  steps = max(2, round(TINY_STEPS * budget / original.train.num_steps))
  sweep.base = TINY_BASE
  sweep.steps = steps
  pretrain = sweep.pretrain.to_dict() if sweep.get('pretrain') else {}
  data = pretrain.setdefault('data', {})
  model = pretrain.setdefault('model', {})
  if original.data.vocab_file:
    data.setdefault('vocab_file', original.data.vocab_file)
    model.setdefault('vocab_size', original.model.vocab_size)
  sweep.pretrain = pretrain
  sweep.arms = {name: _tiny_arm(arm, trained_vocab)
                for name, arm in sweep.arms.to_dict().items()}
  finetune = sweep.finetune
  at_steps = [int(s) for s in str(finetune.get('at_steps', '') or '').split(',') if s.strip()]
  if at_steps:
    scaled = sorted({min(steps - 1, max(1, round(s * steps / budget))) for s in at_steps})
    finetune.at_steps = ','.join(map(str, scaled))
  finetune.seeds = 1
  finetune.learning_rates = TINY_LEARNING_RATE
  overrides = finetune.overrides.to_dict() if finetune.get('overrides') else {}
  overrides.setdefault('model', {})['dtype'] = tiny.model.dtype
  overrides.setdefault('data', {})['max_seq_length'] = tiny.data.max_seq_length
  overrides.setdefault('train', {})['batch_size'] = TINY_FINETUNE_BATCH
  overrides.setdefault('task', {})['max_train_examples'] = TINY_TRAIN_EXAMPLES
  finetune.overrides = overrides
  # A task's own row cap gives way to the tiny one; its own row length (SQuAD's 384) to what
  # the tiny model's positions hold.
  task_overrides = finetune.task_overrides.to_dict() if finetune.get('task_overrides') else {}
  for nested in task_overrides.values():
    nested.get('task', {}).pop('max_train_examples', None)
    if 'max_seq_length' in nested.get('data', {}):
      nested['data']['max_seq_length'] = min(nested['data']['max_seq_length'],
                                             tiny.model.max_position_embeddings)
  finetune.task_overrides = {task: {k: v for k, v in nested.items() if v}
                             for task, nested in task_overrides.items()}
  sweep.notes = list(sweep.get('notes') or []) + [
      f'Run at size tiny ({TINY_BASE}, {steps} pretraining steps, fine-tuning on the first '
      f'{TINY_TRAIN_EXAMPLES:,} rows of each task, one seed): a check that the sweep runs and '
      'reports, not a measure of the effects the paper\'s columns show.']


def _tiny_arm(arm: dict, trained_vocab: int) -> dict:
  """An arm's widths / TINY_WIDTH_DIVISOR and a vocab it trains `trained_vocab` wide."""
  args = [a.strip() for a in str(arm.get('args', '') or '').split(',') if a.strip()]
  arm['args'] = ','.join(
      f'hidden={_narrow(int(a.split("=", 1)[1]))}' if a.startswith('hidden=') else a
      for a in args)
  model = arm.get('pretrain', {}).get('model', {})
  for key in ('intermediate_size', 'embedding_size'):
    if model.get(key):
      model[key] = _narrow(model[key])
  data = arm.get('pretrain', {}).get('data', {})
  if data.get('tokenizer_vocab_size'):
    # DeBERTa's spare rows above its tokenizer's vocab stay.
    spare = max(0, model.get('vocab_size', 0) - data['tokenizer_vocab_size'])
    data['tokenizer_vocab_size'] = trained_vocab
    model['vocab_size'] = trained_vocab + spare
  return arm


def _narrow(width: int) -> int:
  return max(1, math.ceil(width / TINY_WIDTH_DIVISOR))

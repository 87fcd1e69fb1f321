"""What every registered task kind owes, checked over tasks.available(): a kind registered before
collection (a built-in one, or one a plugin registers: test_conformance_proof.py) is checked here
with no edit to this file.

Every kind: its config file (where it has one) and each config a sweep fine-tunes it with load
as a config of that kind, and its own settings (TaskKind.ranges, .choices) are config.task keys
of its config file whose defaults are valid. On the data under BERT_JAX_DATA (the first of its
sweep's tasks whose data are there): the task it builds encodes a train split holding its head's
targets and an eval split, and a random micro encoder's outputs on the eval split score its main
metric, with predictions; its baseline, where it has one, scores the same metric.
"""

import functools

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import sharding
from bert_jax import tasks
from bert_jax.core import cli
from bert_jax.models import heads
from bert_jax.tasks import base as tasks_base
from bert_jax.train import finetune
from conftest import shared_data_dir

KINDS = tasks.available()
MICRO_ENCODER = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
LENGTH, TRAIN_EXAMPLES = 64, 16


def config_files(kind: str) -> dict[str, str]:
  """{what it is: config file} of the kind: its own (where it has one), then each sweep task's."""
  own = tasks.get(kind).config_file
  return {**({'config_file': own} if own else {}), **tasks.get(kind).sweep_configs()}


@pytest.mark.parametrize('kind', KINDS)
def test_its_config_files_load_as_its_kind(kind):
  for name, where in config_files(kind).items():
    assert cli.load_config_spec(where).task.kind == kind, (name, where)


@pytest.mark.parametrize('kind', KINDS)
def test_its_settings_are_task_keys_of_its_config_file_and_its_defaults_valid(kind):
  task = cli.load_config_spec(tasks.config_file(kind)).task
  settings = tasks.get(kind)
  for key in {**settings.ranges, **settings.choices}:
    section, _, leaf = key.partition('.')
    assert section == 'task' and leaf in task, (key, tasks.config_file(kind))
  for key, valid in settings.choices.items():
    assert task[key.partition('.')[2]] in valid, key
  for key, valid in settings.ranges.items():
    assert valid.test(task[key.partition('.')[2]]), (key, valid.text)


def data_config(where: str):
  """A fine-tuning config of `where` on the BERT vocab, a micro encoder, few train examples."""
  config = cli.load_config_spec(where)
  config.data.vocab_file = str(shared_data_dir() / 'vocab' / 'bert-base-uncased-vocab.txt')
  config.data.max_seq_length = LENGTH
  config.model.update(MICRO_ENCODER)
  config.task.max_train_examples = TRAIN_EXAMPLES
  return config


@functools.cache
def built(kind: str):
  """(config, task, train split, eval splits) of the kind's first sweep task whose data are under
  BERT_JAX_DATA; None when none is."""
  for where in tasks.get(kind).sweep_configs().values():
    config = data_config(where)
    try:
      config_lib.validate_finetune(config)
      task = finetune.build_task(config)
      tokenizer = finetune.load_tokenizer(config)
      return config, task, task.train_split(tokenizer, LENGTH), task.eval_splits(tokenizer, LENGTH)
    except (config_lib.ConfigError, tasks_base.TaskError):
      continue
  return None


def outputs_on(config, task, split):
  """A random micro encoder with the task's head: its outputs on every row of `split`, as the
  trainer predicts them."""
  model = finetune.build_model(config, task)
  mesh = sharding.create_mesh(config.mesh)
  rules = sharding.logical_axis_rules(config.mesh.preset)
  tx, _ = finetune.create_optimizer(config.train, 1, False)
  runner = finetune.SeedRun(config, task, model, tx, mesh, rules, None)
  with sharding.activation_rules(mesh, rules):
    return runner.predict(runner.fresh_state(0).params, split, 256)


@pytest.mark.slow  # Reads and encodes a task's files.
@pytest.mark.parametrize('kind', KINDS)
def test_its_task_encodes_its_heads_targets_and_scores_its_main_metric(kind):
  found = built(kind)
  if found is None:
    pytest.skip(f'no task of kind {kind!r} has its data under BERT_JAX_DATA '
                f'({", ".join(tasks.get(kind).sweep_configs())})')
  config, task, train, evals = found
  assert task.head in heads.HEADS and task.num_outputs >= 1
  rows = len(train.features['input_ids'])
  assert rows > 0
  assert set(heads.TARGETS[task.head]) <= set(train.features), sorted(train.features)
  for key in heads.TARGETS[task.head]:
    assert len(train.features[key]) == rows, key
  assert evals
  for name, split in evals.items():
    metrics, predictions = task.score(name, split, outputs_on(config, task, split))
    assert np.isfinite(metrics[task.main_metric]), metrics
    assert predictions is not None and len(predictions) > 0
    baseline = task.baseline(train, split)
    assert baseline is None or np.isfinite(baseline[task.main_metric]), baseline

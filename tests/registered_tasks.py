"""A pytest plugin (`-p registered_tasks`) that registers two task kinds from outside bert_jax
before collection, as a user's package would, for tests/test_conformance_proof.py:

- 'cue_word': test_task_registry.py's CueWordTask (which cue word a made-up sentence holds), the
  config a sweep fine-tunes it with being this file's get_config;
- 'cue_word_unlabelled': the same task whose train split lacks the labels its head trains on.

This file is also their config file: `tests/registered_tasks.py:kind=cue_word`.
"""

import dataclasses

from bert_jax import tasks

UNLABELLED = 'cue_word_unlabelled'


def get_config(arg=None):
  """configs/finetune.py as a config of the kind `arg` names (kind=NAME)."""
  from configs import finetune  # pylint: disable=g-import-not-at-top
  config = finetune.get_config()
  config.task.kind = (arg or 'kind=cue_word').partition('=')[2]
  return config


def pytest_configure(config):
  del config
  # Its conftest is loaded now.
  import test_task_registry  # pylint: disable=g-import-not-at-top

  class Unlabelled(test_task_registry.CueWordTask):

    def train_split(self, tokenizer, max_seq_length):
      split = super().train_split(tokenizer, max_seq_length)
      features = {k: v for k, v in split.features.items() if k != 'label'}
      return dataclasses.replace(split, features=features)

  for name, task in (('cue_word', test_task_registry.CueWordTask), (UNLABELLED, Unlabelled)):
    tasks.register(tasks.TaskKind(
        name, test_task_registry.check_cue_word,
        lambda config, task=task: task(config.task.max_train_examples),
        sweep_configs=lambda name=name: {name: f'tests/registered_tasks.py:kind={name}'}))

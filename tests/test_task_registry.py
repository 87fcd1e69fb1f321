"""The task kinds registry (bert_jax/tasks): the built-in kinds, their checks and builders found by
config.task.kind, and a kind registered from this file, with no edit under bert_jax/, fine-tuned
end to end."""

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import tasks
from bert_jax.tasks import base as tasks_base
from bert_jax.tasks import glue
from bert_jax.train import finetune
from configs import finetune as finetune_config

CUES = {1: ('good', 'great', 'fine', 'nice'), 0: ('bad', 'awful', 'poor', 'sad')}
FILLER = ('the', 'movie', 'plot', 'was', 'very', 'film', 'story', 'acting')


def cue_rows(n: int, seed: int):
  """(sentence, label) pairs whose label says which cue word the sentence holds."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    label = int(rng.integers(2))
    words = list(rng.choice(FILLER, size=int(rng.integers(2, 6))))
    words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(CUES[label])))
    rows.append((' '.join(words), label))
  return rows


class CueWordTask(tasks_base.Task):
  """A test-only task: which cue word a generated sentence holds (no files)."""
  name = 'cue_word'
  head = 'classification'
  num_outputs = 2
  main_metric = 'accuracy'

  def __init__(self, max_train_examples: int = 0):
    self.max_train_examples = max_train_examples

  def _split(self, tokenizer, max_seq_length, n, seed):
    examples = [glue.Example(str(i), text, None, str(label))
                for i, (text, label) in enumerate(cue_rows(n, seed))]
    return glue.encode(examples, tokenizer, max_seq_length, ('0', '1'))

  def train_split(self, tokenizer, max_seq_length):
    return self._split(tokenizer, max_seq_length, self.max_train_examples or 256, 0)

  def eval_splits(self, tokenizer, max_seq_length):
    return {'dev': self._split(tokenizer, max_seq_length, 64, 1)}

  def score(self, split_name, split, outputs):
    predicted = np.argmax(np.asarray(outputs['logits']), axis=-1)  # [n]
    accuracy = 100.0 * float(np.mean(predicted == split.features['label']))
    return {'accuracy': accuracy}, [int(p) for p in predicted]

  def write_predictions(self, split_name, predictions, directory):
    return []


def check_cue_word(config):
  if config.task.max_train_examples > 1000:
    raise config_lib.ConfigError(f'config.task.max_train_examples='
                                 f'{config.task.max_train_examples}: cue_word makes at most 1000.')


@pytest.fixture(name='cue_word')
def fixture_cue_word():
  tasks.register(tasks.TaskKind(
      'cue_word', check_cue_word, lambda config: CueWordTask(config.task.max_train_examples),
      sweep_configs=lambda: {'cue_word': 'configs/cue_word.py'}))
  yield
  tasks.unregister('cue_word')


@pytest.fixture(name='vocab_file')
def fixture_vocab_file(tmp_path):
  path = tmp_path / 'vocab.txt'
  words = sorted({w for ws in CUES.values() for w in ws} | set(FILLER))
  path.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + words) + '\n')
  return str(path)


def cue_word_config(vocab_file):
  """A 2-layer, 32-wide encoder from random initialisation on the cue_word task."""
  config = finetune_config.get_config()
  config.task.kind = 'cue_word'
  config.data.vocab_file = vocab_file
  config.data.max_seq_length = 16
  config.model.update(vocab_size=32, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64)
  config.train.update(batch_size=16, learning_rate=5e-3, num_epochs=3.0, log_every=4)
  return config


def test_the_builtin_kinds_and_the_configs_a_sweep_fine_tunes_them_with():
  assert tasks.available() == ['glue', 'ner', 'squad', 'swag']
  configs = tasks.sweep_configs()
  assert configs['sst2'] == 'configs/glue.py:task=sst2'
  assert configs['squad1.1'] == configs['squad'] == 'configs/squad.py'
  assert configs['conll2003'] == 'configs/ner.py' and configs['swag'] == 'configs/swag.py'
  assert set(glue.TASKS) <= set(configs)


def test_an_unknown_kind_is_refused_naming_every_registered_one(vocab_file, cue_word):
  config = cue_word_config(vocab_file)
  config.task.kind = 'cue_words'
  with pytest.raises(config_lib.ConfigError,
                     match=r"config.task.kind='cue_words' is not valid; choose one of "
                           r"\('cue_word', 'glue', 'ner', 'squad', 'swag'\)"):
    config_lib.validate_finetune(config)


def test_a_registered_kind_s_check_runs_in_validation(vocab_file, cue_word):
  config = cue_word_config(vocab_file)
  config_lib.validate_finetune(config)
  config.task.max_train_examples = 5000
  with pytest.raises(config_lib.ConfigError, match='cue_word makes at most 1000'):
    config_lib.validate_finetune(config)


def test_a_kind_registered_here_is_built_by_the_trainer(vocab_file, cue_word):
  config = cue_word_config(vocab_file)
  config.task.max_train_examples = 32
  task = finetune.build_task(config)
  assert isinstance(task, CueWordTask) and task.max_train_examples == 32


@pytest.mark.slow
def test_a_kind_registered_here_fine_tunes_end_to_end(tmp_path, vocab_file, cue_word):
  results = finetune.run(cue_word_config(vocab_file), str(tmp_path / 'run'))
  # Chance is 50%; the cue word decides the label.
  assert results['median']['dev']['accuracy'] > 90.0, results['median']

"""The contract between a fine-tuning task and the trainer (bert_jax/train/finetune.py).

A task reads its files, turns examples into fixed-shape numpy features, and turns the model's
outputs on those features back into the task's predictions and official metrics. The trainer
only batches features, runs the model with the head the task names, and hands outputs back.

Heads and the feature keys each needs (all arrays share the leading row axis n; S =
config.data.max_seq_length):
  every head:        input_ids, input_mask, segment_ids  [n, S] int32
                     ([n, C, S] for 'multiple_choice': a row per choice of C)
  'classification':  label [n] int32 (class index)                     -> outputs 'logits' [n, C]
  'regression':      label [n] float32                                 -> outputs 'logits' [n, 1]
  'token':           labels [n, S] int32, label_weights [n, S] float32
                     (1.0 on the first piece of each word, else 0.0)   -> outputs 'logits' [n, S, C]
  'span':            start_positions, end_positions [n] int32
                     (0, the [CLS] position, when the answer is not in the window or there is
                     none)                                             -> outputs 'start_logits',
                                                                          'end_logits' [n, S]
  'multiple_choice': label [n] int32 (index of the right choice)       -> outputs 'logits' [n, C]
Metrics are percentages (0-100), as the paper reports them.
"""

import dataclasses
import os
from typing import Any

import numpy as np

from bert_jax.core import errors
from bert_jax.core import schema
from bert_jax.core import files
from bert_jax.models import heads

HEADS = heads.HEADS  # The fine-tuning heads a task may name (models/heads.py).


@dataclasses.dataclass
class EncodedSplit:
  """One split of a task, encoded."""
  features: dict[str, np.ndarray]  # Model inputs and targets; leading axis = rows.
  meta: Any = None  # What score() needs to map rows back to examples (ids, offsets, words, ...).
  num_examples: int = 0  # Examples before encoding (a SQuAD example may give several rows).

  @property
  def num_rows(self) -> int:
    return len(self.features['input_ids'])


def write_index_predictions(path: str, values) -> str:
  """Writes `index<TAB>prediction` rows (floats to 6 decimals), GLUE's prediction layout."""
  rows = [f'{index}\t{value:.6f}\n' if isinstance(value, float) else f'{index}\t{value}\n'
          for index, value in enumerate(values)]
  files.write_text(path, 'index\tprediction\n' + ''.join(rows))
  return path


def check_path(key: str, value: str, what: str, directory: bool = False) -> None:
  """ConfigError unless config.`key` names an existing file (or `directory`), `what` it should
  be."""
  exists = os.path.isdir(value) if directory else os.path.isfile(value)
  if not value:
    raise errors.ConfigError(f'config.{key} is empty; set it to {what} (or set BERT_JAX_DATA to '
                             'the shared data folder before loading the config).')
  if not exists:
    raise errors.ConfigError(f'config.{key}={value!r} does not exist; it should be {what}.')


# The config.task keys every kind reads, and their valid values: how many training examples, the
# dev share split off, and the head (models/heads.py: a feature-based BiLSTM, or one on top).
RANGES = {
    'task.max_train_examples': schema.NON_NEGATIVE,
    'task.feature_layers': schema.NON_NEGATIVE, 'task.feature_lstm_units': schema.POSITIVE,
    'task.feature_lstm_layers': schema.POSITIVE, 'task.lstm_layers': schema.NON_NEGATIVE,
    'task.lstm_units': schema.POSITIVE,
}


def check_head(task) -> None:
  """config.task's head: a BiLSTM on the fine-tuned encoder, or the feature-based mode's own."""
  if task.lstm_layers and task.feature_layers:
    raise errors.ConfigError(
        f'config.task.lstm_layers={task.lstm_layers} with config.task.feature_layers='
        f'{task.feature_layers}: the feature-based mode has its own BiLSTM '
        '(config.task.feature_lstm_layers); set lstm_layers=0 for it, or feature_layers=0 to '
        'fine-tune the encoder with a BiLSTM on top.')


def refuse_feature_layers(task, what: str) -> None:
  """ConfigError when config.task.feature_layers is set for a kind that is not NER's: `what`
  says what to do instead."""
  if task.feature_layers:
    raise errors.ConfigError(f'config.task.feature_layers={task.feature_layers}: the '
                             f'feature-based mode tags tokens (NER); {what}.')


class TaskError(ValueError):
  """Task data that cannot be read or used: names the file (and line) and what is wrong."""


class Task:
  """Interface of a task; glue.GlueTask, ner.NerTask, squad.SquadTask and swag.SwagTask implement
  it."""
  name: str  # e.g. 'sst2', 'squad1.1', 'conll2003'
  head: str  # One of HEADS.
  num_outputs: int  # Classes (1 for regression, 2 for span: start and end; choices C).
  main_metric: str  # The metric results.json leads with, e.g. 'accuracy', 'f1', 'spearman'.

  def train_split(self, tokenizer, max_seq_length: int) -> EncodedSplit:
    raise NotImplementedError

  def eval_splits(self, tokenizer, max_seq_length: int) -> dict[str, EncodedSplit]:
    """Evaluation splits by name: usually {'dev': ...}; MNLI {'dev_matched', 'dev_mismatched'}."""
    raise NotImplementedError

  def score(self, split_name: str, split: EncodedSplit,
            outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], Any]:
    """(metrics, predictions) of the model's outputs on every row of `split`, in row order."""
    raise NotImplementedError

  def write_predictions(self, split_name: str, predictions: Any, directory: str) -> list[str]:
    """Writes the predictions in the task's submission format; returns the paths written."""
    raise NotImplementedError

  # What baseline() scores: a model that ignores its input (its words in results.json).
  baseline_kind = ''

  def baseline(self, train: EncodedSplit, split: EncodedSplit) -> dict[str, float] | None:
    """The metrics on `split` of a model that ignores its input and answers what `train` makes
    most likely (GLUE: the majority class), the floor a fine-tuned model must rise above; None
    where the task defines none (SQuAD, NER)."""
    del train, split
    return None

"""SWAG: the paper's multiple-choice task (a context and four possible endings), from SWAG's CSVs.

Each example gives four rows, one per ending, encoded as the paper's and the original SWAG runs:
`[CLS] sent1 [SEP] sent2 ending [SEP]` (GLUE's pair encoding and truncation, segment B being
sent2 and the ending joined by a space). The model scores each row from its pooled [CLS] state;
a softmax over the four scores picks the ending. The files are SWAG's regular format
(github.com/rowanz/swagaf, data/train.csv and val.csv): a header naming at least sent1, sent2,
ending0..ending3 and label; other columns (video-id, fold-ind, startphrase, gold-source, the
unnamed index) are read past.
"""

import csv
import dataclasses
import os

import numpy as np

from bert_jax.core import files
from bert_jax import tasks as tasks_lib
from bert_jax.tasks import base
from bert_jax.tasks import glue
from bert_jax.tasks import scoring

CHOICES = 4  # Endings per example.
ENDINGS = tuple(f'ending{i}' for i in range(CHOICES))
TEXT_COLUMNS = ('sent1', 'sent2') + ENDINGS
LABEL_COLUMN = 'label'
SPLIT_FILES = {'train': 'train.csv', 'dev': 'val.csv'}
_LABELS = tuple(str(i) for i in range(CHOICES))


@dataclasses.dataclass(frozen=True)
class Example:
  """One SWAG question: the context (sent1), the start of the ending (sent2), four endings."""
  guid: str  # The row's position in its file (0, 1, ...).
  sent1: str
  sent2: str
  endings: tuple[str, ...]  # CHOICES endings.
  label: int  # Index of the right ending.


def read_examples(path: str) -> list[Example]:
  """Reads a SWAG CSV (train.csv, val.csv); a malformed row raises TaskError with file and line."""
  try:
    with open(path, encoding='utf-8-sig', newline='') as f:
      reader = csv.reader(f)
      header = next(reader, None)
      if header is None:
        raise base.TaskError(f'{path}: empty file; expected a SWAG CSV with the header columns '
                             f'{list(TEXT_COLUMNS) + [LABEL_COLUMN]}.')
      missing = [c for c in TEXT_COLUMNS + (LABEL_COLUMN,) if c not in header]
      if missing:
        raise base.TaskError(f'{path}:{reader.line_num}: the header {header} lacks the columns '
                             f'{missing} of a SWAG CSV.')
      column = {name: header.index(name) for name in TEXT_COLUMNS + (LABEL_COLUMN,)}
      examples = []
      line = reader.line_num + 1  # A record's first line (a quoted field may hold newlines).
      for fields in reader:
        where, line = f'{path}:{line}', reader.line_num + 1
        if len(fields) != len(header):
          raise base.TaskError(f'{where}: expected {len(header)} comma-separated fields '
                               f'({header}), found {len(fields)}.')
        label = fields[column[LABEL_COLUMN]].strip()
        if label not in _LABELS:
          raise base.TaskError(f'{where}: the label {label!r} is not an ending index; expected '
                               f'one of {list(_LABELS)}.')
        examples.append(Example(
            guid=str(len(examples)), sent1=fields[column['sent1']],
            sent2=fields[column['sent2']],
            endings=tuple(fields[column[name]] for name in ENDINGS), label=int(label)))
  except UnicodeDecodeError as e:
    raise base.TaskError(f'{path}: not UTF-8 text ({e}).') from e
  except csv.Error as e:
    raise base.TaskError(f'{path}: unreadable CSV ({e}).') from e
  return examples


def _segment_b(sent2: str, ending: str) -> str:
  """sent2 and the ending, as one text (SWAG splits a sentence between them)."""
  return ' '.join(text for text in (sent2, ending) if text)


def encode(examples: list[Example], tokenizer, max_seq_length: int) -> base.EncodedSplit:
  """Features [n, CHOICES, S]: row c of example i is `[CLS] sent1 [SEP] sent2 ending_c [SEP]` in
  the tokenizer's layout (RoBERTa's `<s> a </s></s> b </s>`), truncated as a GLUE pair."""
  pairs = [glue.Example(f'{e.guid}-{c}', e.sent1, _segment_b(e.sent2, ending), None)
           for e in examples for c, ending in enumerate(e.endings)]
  rows = glue.encode(pairs, tokenizer, max_seq_length, None).features  # [n * CHOICES, S] each
  n = len(examples)
  features = {k: rows[k].reshape(n, CHOICES, max_seq_length)
              for k in ('input_ids', 'input_mask', 'segment_ids')}
  features['label'] = np.array([e.label for e in examples], np.int32)  # [n]
  return base.EncodedSplit(features, [e.guid for e in examples], n)


class SwagTask(base.Task):
  """SWAG from its folder: train.csv and val.csv (the dev split)."""
  name = 'swag'
  head = 'multiple_choice'
  num_outputs = CHOICES
  main_metric = 'accuracy'

  def __init__(self, data_dir: str, max_train_examples: int = 0):
    if not data_dir:
      raise base.TaskError('SWAG needs data_dir, the folder holding train.csv and val.csv.')
    self.data_dir = os.path.expanduser(data_dir)
    self.max_train_examples = max_train_examples

  def _examples(self, split_name):
    path = os.path.join(self.data_dir, SPLIT_FILES[split_name])
    if not os.path.isfile(path):
      raise base.TaskError(f'{path} does not exist; the SWAG folder should hold '
                           f'{" and ".join(SPLIT_FILES.values())} (SWAG\'s regular CSVs).')
    return read_examples(path)

  def train_split(self, tokenizer, max_seq_length: int) -> base.EncodedSplit:
    examples = self._examples('train')
    if self.max_train_examples > 0:
      examples = examples[:self.max_train_examples]
    return encode(examples, tokenizer, max_seq_length)

  def eval_splits(self, tokenizer, max_seq_length: int) -> dict[str, base.EncodedSplit]:
    return {'dev': encode(self._examples('dev'), tokenizer, max_seq_length)}

  def score(self, split_name: str, split: base.EncodedSplit,
            outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], list[int]]:
    """Accuracy in percent and the chosen ending of each example."""
    logits = np.asarray(outputs['logits'], np.float32)  # [n, CHOICES]
    if logits.shape != (split.num_rows, CHOICES):
      raise ValueError(f'{self.name} {split_name}: logits of shape {logits.shape} for '
                       f'{split.num_rows} examples of {CHOICES} endings.')
    predicted = np.argmax(logits, axis=-1)  # [n]
    metrics = {'accuracy': 100.0 * scoring.accuracy(predicted, split.features['label'])}
    return metrics, [int(p) for p in predicted]

  def write_predictions(self, split_name: str, predictions: list[int],
                        directory: str) -> list[str]:
    """Writes `index<TAB>prediction` rows: each example's row in its file and chosen ending."""
    files.makedirs(directory)  # A gs:// workdir's too.
    return [base.write_index_predictions(
        os.path.join(directory, f'{self.name}_{split_name}.tsv'), predictions)]


def check_config(config) -> None:
  """A SWAG run's settings: its CSV folder, and no feature-based mode."""
  task = config.task
  base.check_path('task.data_dir', task.data_dir, "SWAG's folder with train.csv and val.csv "
                  '(the full dataset is not in the shared data: supply it)', directory=True)
  base.refuse_feature_layers(task, 'SWAG fine-tunes the whole model (set it to 0)')


def build(config) -> SwagTask:
  return SwagTask(config.task.data_dir, max_train_examples=config.task.max_train_examples)


tasks_lib.register(tasks_lib.TaskKind('swag', check_config, build,
                                      sweep_configs=lambda: {'swag': 'configs/swag.py'},
                                      config_file='configs/swag.py'))

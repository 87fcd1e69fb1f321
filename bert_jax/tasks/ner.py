"""CoNLL-2003 NER: reader, first-piece token features, entity-level scoring, conlleval output.

As the paper, each word is labelled on its first WordPiece only; the other pieces, [CLS], [SEP]
and padding carry weight 0. Sentences longer than a row are split at word boundaries, so every
word that has a piece gets exactly one prediction.
"""

import dataclasses
import os
from typing import Optional

import numpy as np

from bert_jax import tasks as tasks_lib
from bert_jax.core import errors
from bert_jax.core import files
from bert_jax.tasks import base
from bert_jax.tasks import scoring

# The raw CoNLL-2003 tags (IOB1: B- only between two adjacent entities of one type).
LABELS = ('O', 'B-LOC', 'B-MISC', 'B-ORG', 'B-PER', 'I-LOC', 'I-MISC', 'I-ORG', 'I-PER')
_FIELDS = 4  # word, POS, chunk, NER
_FORMAT = "a CoNLL-2003 file ('word POS chunk NER' per line, a blank line between sentences)"


@dataclasses.dataclass(frozen=True)
class Sentence:
  """Words of one sentence and their gold tags."""
  words: list[str]
  tags: list[str]


@dataclasses.dataclass
class NerMeta:
  """Maps the rows of an encoded split back to sentences and words."""
  sentences: list[Sentence]  # The encoded sentences (gold tags included).
  row_sentence: np.ndarray  # [rows] int32: the sentence of each row.
  row_words: list[np.ndarray]  # Per row, int32 word index of each labelled position.
  row_positions: list[np.ndarray]  # Per row, int32 column of each labelled position.
  zero_piece_words: int  # Words that normalise to no piece: never predicted, decoded as 'O'.


def read_conll(path: str) -> list[Sentence]:
  """Reads a CoNLL-2003 file; -DOCSTART- lines are skipped, bad lines raise TaskError."""
  sentences = []
  words, tags = [], []

  def end_sentence():
    if words:
      sentences.append(Sentence(list(words), list(tags)))
      words.clear()
      tags.clear()

  try:
    with open(path, encoding='utf-8') as f:
      for line_number, line in enumerate(f, 1):
        fields = line.split()
        if not fields or fields[0] == '-DOCSTART-':
          end_sentence()
          continue
        if len(fields) != _FIELDS:
          raise base.TaskError(f'{path}:{line_number}: expected {_FIELDS} fields (word POS '
                               f'chunk NER), found {len(fields)}: {line.rstrip()!r}.')
        if fields[3] not in LABELS:
          raise base.TaskError(f'{path}:{line_number}: unknown NER tag {fields[3]!r}; '
                               f'expected one of {list(LABELS)}.')
        words.append(fields[0])
        tags.append(fields[3])
  except UnicodeDecodeError as e:
    raise base.TaskError(f'{path}: not UTF-8 text ({e}).') from e
  end_sentence()
  return sentences


def _pack_words(kept, room):
  """Splits the words with pieces into runs whose kept pieces fit in `room`, in order."""
  runs, run, used = [], [], 0
  for word in np.flatnonzero(kept):
    if used + kept[word] > room:
      runs.append(run)
      run, used = [], 0
    run.append(word)
    used += kept[word]
  if run:
    runs.append(run)
  return runs


def encode(sentences: list[Sentence], tokenizer, max_seq_length: int,
           labels: tuple[str, ...] = LABELS) -> base.EncodedSplit:
  """Encodes `[CLS] pieces [SEP]` rows (RoBERTa's `<s> pieces </s>`), the tag of each word on its
  first piece."""
  room = max_seq_length - 2
  if room < 1:
    raise ValueError(f'max_seq_length={max_seq_length} leaves no room between [CLS] and [SEP].')
  label_index = {tag: i for i, tag in enumerate(labels)}
  encoded = tokenizer.encode_words([sentence.words for sentence in sentences])
  rows = []  # (sentence, piece ids, first-piece columns, word indices, label indices)
  zero_piece_words = 0
  for index, (sentence, (ids, word_of_piece)) in enumerate(zip(sentences, encoded)):
    # Pieces come in word order, so word w owns ids[start[w]:start[w] + count[w]].
    count = np.bincount(word_of_piece, minlength=len(sentence.words))  # [words]
    start = np.cumsum(count) - count  # [words]
    zero_piece_words += int(np.sum(count == 0))
    kept = np.minimum(count, room)  # A word longer than a row keeps its first pieces.
    for run in _pack_words(kept, room):
      run = np.asarray(run, np.int64)
      run_ids = np.concatenate([ids[start[w]:start[w] + kept[w]] for w in run])
      columns = 1 + np.cumsum(kept[run]) - kept[run]  # [words in run], after [CLS]
      tags = [sentence.tags[w] for w in run]
      unknown = sorted(set(tags) - set(label_index))
      if unknown:
        raise base.TaskError(f'Sentence {index}: tags {unknown} are not in {list(labels)}.')
      rows.append((index, run_ids, columns, run, [label_index[t] for t in tags]))
  n = len(rows)
  input_ids = np.full((n, max_seq_length), tokenizer.special.pad, np.int32)  # [rows, S]
  input_mask = np.zeros((n, max_seq_length), np.int32)  # [rows, S]
  label_ids = np.zeros((n, max_seq_length), np.int32)  # [rows, S]
  label_weights = np.zeros((n, max_seq_length), np.float32)  # [rows, S]
  for r, (_, run_ids, columns, _, tag_ids) in enumerate(rows):
    length = len(run_ids)
    input_ids[r, 0] = tokenizer.special.cls
    input_ids[r, 1:length + 1] = run_ids
    input_ids[r, length + 1] = tokenizer.special.sep
    input_mask[r, :length + 2] = 1
    label_ids[r, columns] = tag_ids
    label_weights[r, columns] = 1.0
  features = {'input_ids': input_ids, 'input_mask': input_mask,
              'segment_ids': np.zeros((n, max_seq_length), np.int32),
              'labels': label_ids, 'label_weights': label_weights}
  meta = NerMeta(sentences=sentences,
                 row_sentence=np.array([row[0] for row in rows], np.int32),
                 row_words=[row[3].astype(np.int32) for row in rows],
                 row_positions=[row[2].astype(np.int32) for row in rows],
                 zero_piece_words=zero_piece_words)
  return base.EncodedSplit(features, meta, len(sentences))


def decode(split: base.EncodedSplit, logits: np.ndarray,
           labels: tuple[str, ...] = LABELS) -> list[list[str]]:
  """Predicted tags per sentence: argmax at each word's first piece; 'O' for pieceless words."""
  meta = split.meta
  predicted = np.argmax(np.asarray(logits), axis=-1)  # [rows, S]
  tags = [['O'] * len(sentence.words) for sentence in meta.sentences]
  for row, (sentence, words, positions) in enumerate(
      zip(meta.row_sentence, meta.row_words, meta.row_positions)):
    for word, label in zip(words, predicted[row, positions]):
      tags[sentence][word] = labels[label]
  return tags


class NerTask(base.Task):
  """CoNLL-2003 English NER from its eng.train / eng.testa (/ eng.testb) files."""
  name = 'conll2003'
  head = 'token'
  num_outputs = len(LABELS)
  main_metric = 'f1'

  def __init__(self, train_file: str, dev_file: str, test_file: str = '',
               max_train_examples: int = 0):
    self.files = {'train': train_file, 'dev': dev_file, 'test': test_file}
    self.max_train_examples = max_train_examples

  def _sentences(self, split_name):
    path = os.path.expanduser(self.files[split_name])
    if not path:
      raise base.TaskError(f'No {split_name} file given; expected {_FORMAT}.')
    if not os.path.isfile(path):
      raise base.TaskError(f'{split_name} file {path} does not exist; expected {_FORMAT}.')
    return read_conll(path)

  def train_split(self, tokenizer, max_seq_length: int) -> base.EncodedSplit:
    sentences = self._sentences('train')
    if self.max_train_examples > 0:
      sentences = sentences[:self.max_train_examples]
    return encode(sentences, tokenizer, max_seq_length)

  def eval_splits(self, tokenizer, max_seq_length: int) -> dict[str, base.EncodedSplit]:
    return {'dev': encode(self._sentences('dev'), tokenizer, max_seq_length)}

  def test_split(self, tokenizer, max_seq_length: int) -> Optional[base.EncodedSplit]:
    """The test split (eng.testb), or None when no test_file was given."""
    if not self.files['test']:
      return None
    return encode(self._sentences('test'), tokenizer, max_seq_length)

  def test_splits(self, tokenizer, max_seq_length: int) -> dict[str, base.EncodedSplit]:
    """{'test': split} when a test_file was given, else {} (as GlueTask.test_splits)."""
    split = self.test_split(tokenizer, max_seq_length)
    return {} if split is None else {'test': split}

  def score(self, split_name: str, split: base.EncodedSplit,
            outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], list[list[str]]]:
    """Entity-level precision/recall/F1 in percent (conlleval's) and the tags per sentence."""
    logits = outputs['logits']  # [rows, S, C]
    if len(logits) != split.num_rows:
      raise ValueError(f'{self.name} {split_name}: {len(logits)} rows of logits for '
                       f'{split.num_rows} rows of features.')
    predictions = decode(split, logits)
    gold = [sentence.tags for sentence in split.meta.sentences]
    scores = scoring.entity_scores(gold, predictions)
    metrics = {name: 100.0 * float(scores[name]) for name in ('precision', 'recall', 'f1')}
    return metrics, predictions

  def write_predictions(self, split_name: str, predictions: list[list[str]],
                        directory: str) -> list[str]:
    """Writes `word gold pred` lines, a blank line between sentences (conlleval's input)."""
    sentences = self._sentences(split_name)
    if split_name == 'train' and self.max_train_examples > 0:
      sentences = sentences[:self.max_train_examples]
    if [len(s.words) for s in sentences] != [len(p) for p in predictions]:
      raise base.TaskError(f'{len(predictions)} predicted sentences do not match the '
                           f'{len(sentences)} sentences of {self.files[split_name]}.')
    files.makedirs(directory)  # A gs:// workdir's too.
    path = os.path.join(directory, f'{self.name}_{split_name}.txt')
    files.write_text(path, ''.join(
        ''.join(f'{word} {gold} {predicted}\n'
                for word, gold, predicted in zip(sentence.words, sentence.tags, tags)) + '\n'
        for sentence, tags in zip(sentences, predictions)))
    return [path]


def check_config(config) -> None:
  """A CoNLL-2003 run's settings: its files, and a feature-based mode within the encoder."""
  task = config.task
  base.check_path('task.train_file', task.train_file, 'the CoNLL-2003 training file (eng.train)')
  base.check_path('task.dev_file', task.dev_file, 'the CoNLL-2003 dev file (eng.testa)')
  if task.test_file:
    base.check_path('task.test_file', task.test_file, 'the CoNLL-2003 test file (eng.testb)')
  if task.feature_layers > config.model.num_layers:
    raise errors.ConfigError(f'config.task.feature_layers={task.feature_layers} exceeds the '
                             f'encoder\'s {config.model.num_layers} layers.')


def build(config) -> NerTask:
  t = config.task
  return NerTask(t.train_file, t.dev_file, t.test_file, max_train_examples=t.max_train_examples)


tasks_lib.register(tasks_lib.TaskKind(
    'ner', check_config, build,
    sweep_configs=lambda: {'conll2003': 'configs/ner.py', 'ner': 'configs/ner.py'},
    config_file='configs/ner.py'))

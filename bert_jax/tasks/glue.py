"""GLUE tasks: TSV and TFDS readers, BERT's pair encoding, the paper's metrics, submission files.

Rows follow the original run_classifier.py: `[CLS] a [SEP] b [SEP]`, segment 0 through the first
[SEP] and 1 after it, the longer of a/b popped from its end until the pair fits (b on ties), a
single sentence cut to max_seq_length - 2, zero padding.
"""

import csv
import dataclasses
import math
import os
from typing import Optional, Union

import numpy as np

from bert_jax.core import files
from bert_jax import tasks as tasks_lib
from bert_jax.core import errors
from bert_jax.tasks import base
from bert_jax.tasks import scoring

@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """How one GLUE task is read, scored and submitted."""
  folder: str  # Folder name in GLUE's glue_data/, e.g. 'SST-2'.
  text_a: str  # Header column of the first text.
  text_b: Optional[str]  # Header column of the second text; None for single sentences.
  label: str  # Header column of the label in train/dev files (absent from test files).
  labels: Optional[tuple[str, ...]]  # Class names as the files spell them; None: regression.
  metrics: tuple[str, ...]  # Reported metrics; the first is the main one.
  tfds_name: str  # TFDS dataset, e.g. 'glue/sst2'.
  tfds_text: tuple[str, ...]  # TFDS feature of text_a (and text_b).
  tfds_labels: Optional[tuple[str, ...]]  # Our label for each TFDS class index.
  eval_files: tuple[tuple[str, str], ...] = (('dev', 'dev.tsv'),)  # (split, file).
  test_files: tuple[tuple[str, str], ...] = (('test', 'test.tsv'),)  # (split, file).
  submissions: tuple[tuple[str, str], ...] = ()  # (test split, leaderboard file name).
  paper: tuple[tuple[str, float, float], ...] = ()  # (test split, Base, Large) main metric.
  id_column: str = 'index'  # Column of the example id, where a file has one.
  # Column count and indices of train/dev files that have no header (CoLA).
  headerless: Optional[dict[str, int]] = None

  @property
  def head(self) -> str:
    return 'regression' if self.labels is None else 'classification'

  @property
  def main_metric(self) -> str:
    return self.metrics[0]


_BINARY = ('0', '1')
_NLI = ('entailment', 'not_entailment')

# Every GLUE task of the paper's Table 1 (WNLI is in GLUE; the paper leaves it out of its table).
# Paper numbers are the GLUE test scores of BERT-Base and BERT-Large (PAPER.md).
TASKS = {
    'cola': TaskSpec(
        folder='CoLA', text_a='sentence', text_b=None, label='label', labels=_BINARY,
        metrics=('mcc',), tfds_name='glue/cola', tfds_text=('sentence',), tfds_labels=_BINARY,
        submissions=(('test', 'CoLA.tsv'),), paper=(('test', 52.1, 60.5),),
        # train/dev: source, label, original-label ('*' or empty), sentence; no header.
        headerless={'columns': 4, 'label': 1, 'text_a': 3}),
    'sst2': TaskSpec(
        folder='SST-2', text_a='sentence', text_b=None, label='label', labels=_BINARY,
        metrics=('accuracy',), tfds_name='glue/sst2', tfds_text=('sentence',),
        tfds_labels=_BINARY, submissions=(('test', 'SST-2.tsv'),),
        paper=(('test', 93.5, 94.9),)),
    'mrpc': TaskSpec(
        folder='MRPC', text_a='#1 String', text_b='#2 String', label='Quality', labels=_BINARY,
        metrics=('f1', 'accuracy'), tfds_name='glue/mrpc', tfds_text=('sentence1', 'sentence2'),
        tfds_labels=_BINARY, submissions=(('test', 'MRPC.tsv'),),
        paper=(('test', 88.9, 89.3),)),
    'qqp': TaskSpec(
        folder='QQP', text_a='question1', text_b='question2', label='is_duplicate',
        labels=_BINARY, metrics=('f1', 'accuracy'), tfds_name='glue/qqp',
        tfds_text=('question1', 'question2'), tfds_labels=_BINARY,
        submissions=(('test', 'QQP.tsv'),), paper=(('test', 71.2, 72.1),), id_column='id'),
    'mnli': TaskSpec(
        folder='MNLI', text_a='sentence1', text_b='sentence2', label='gold_label',
        labels=('contradiction', 'entailment', 'neutral'), metrics=('accuracy',),
        tfds_name='glue/mnli', tfds_text=('premise', 'hypothesis'),
        tfds_labels=('entailment', 'neutral', 'contradiction'),
        eval_files=(('dev_matched', 'dev_matched.tsv'), ('dev_mismatched', 'dev_mismatched.tsv')),
        test_files=(('test_matched', 'test_matched.tsv'),
                    ('test_mismatched', 'test_mismatched.tsv')),
        submissions=(('test_matched', 'MNLI-m.tsv'), ('test_mismatched', 'MNLI-mm.tsv')),
        paper=(('test_matched', 84.6, 86.7), ('test_mismatched', 83.4, 85.9))),
    'qnli': TaskSpec(
        folder='QNLI', text_a='question', text_b='sentence', label='label', labels=_NLI,
        metrics=('accuracy',), tfds_name='glue/qnli', tfds_text=('question', 'sentence'),
        tfds_labels=_NLI, submissions=(('test', 'QNLI.tsv'),), paper=(('test', 90.5, 92.7),)),
    'rte': TaskSpec(
        folder='RTE', text_a='sentence1', text_b='sentence2', label='label', labels=_NLI,
        metrics=('accuracy',), tfds_name='glue/rte', tfds_text=('sentence1', 'sentence2'),
        tfds_labels=_NLI, submissions=(('test', 'RTE.tsv'),), paper=(('test', 66.4, 70.1),)),
    'wnli': TaskSpec(
        folder='WNLI', text_a='sentence1', text_b='sentence2', label='label', labels=_BINARY,
        metrics=('accuracy',), tfds_name='glue/wnli', tfds_text=('sentence1', 'sentence2'),
        tfds_labels=_BINARY, submissions=(('test', 'WNLI.tsv'),)),
    'stsb': TaskSpec(
        folder='STS-B', text_a='sentence1', text_b='sentence2', label='score', labels=None,
        metrics=('spearman', 'pearson'), tfds_name='glue/stsb',
        tfds_text=('sentence1', 'sentence2'), tfds_labels=None,
        submissions=(('test', 'STS-B.tsv'),), paper=(('test', 85.8, 86.5),)),
}

# Our split names -> TFDS's.
_TFDS_SPLITS = {'dev': 'validation', 'dev_matched': 'validation_matched',
                'dev_mismatched': 'validation_mismatched'}


@dataclasses.dataclass(frozen=True)
class Example:
  """One GLUE example; label is None where the file has none (test)."""
  guid: str
  text_a: str
  text_b: Optional[str]
  label: Optional[Union[str, float]]  # Class name as the file spells it, or the STS-B score.


@dataclasses.dataclass
class GlueMeta:
  """What score() needs of an encoded split."""
  guids: list[str]  # Example id of each row.
  labelled: bool  # False for test splits: the label feature is a placeholder 0.
  # (test split, rows) in row order, for a split made of several test files (MNLI); else None.
  parts: Optional[list[tuple[str, int]]] = None


def get_spec(task_name: str) -> TaskSpec:
  """The spec of `task_name` ('sst2'; GLUE's folder names such as 'SST-2' work too)."""
  key = task_name.lower().replace('-', '')
  if key not in TASKS:
    raise base.TaskError(f'Unknown GLUE task {task_name!r}; valid names: {sorted(TASKS)}.')
  return TASKS[key]


def _read_tsv(path):
  """Yields (line number, fields) of a tab-separated file, quotes taken literally."""
  # GLUE's TSVs are not quoted ('"' is text, as in MRPC), and MRPC starts with a UTF-8 BOM.
  try:
    with open(path, encoding='utf-8-sig', newline='') as f:
      reader = csv.reader(f, delimiter='\t', quoting=csv.QUOTE_NONE)
      for fields in reader:
        yield reader.line_num, fields
  except UnicodeDecodeError as e:
    raise base.TaskError(f'{path}: not UTF-8 text ({e}).') from e
  except csv.Error as e:
    raise base.TaskError(f'{path}: unreadable TSV ({e}).') from e


def _parse_label(spec, value, where):
  """The label of a file as our Example holds it; raises TaskError naming `where` if invalid."""
  if spec.labels is None:
    try:
      score = float(value)
    except ValueError:
      score = math.nan
    if not math.isfinite(score):
      raise base.TaskError(f'{where}: the score {value!r} is not a finite number.')
    return score
  if value not in spec.labels:
    raise base.TaskError(f'{where}: unknown label {value!r}; expected one of {list(spec.labels)}.')
  return value


def read_examples(task_name: str, path: str) -> list[Example]:
  """Reads a GLUE train/dev/test TSV; a malformed row raises TaskError with file and line."""
  spec = get_spec(task_name)
  rows = _read_tsv(path)
  first = next(rows, None)
  if first is None:
    raise base.TaskError(f'{path}: empty file; expected a GLUE {spec.folder} TSV.')
  name = os.path.basename(path)
  if spec.headerless and first[1][:1] != [spec.id_column]:
    # CoLA train/dev: no header, so the first line is already an example.
    layout = spec.headerless
    columns, header_columns = layout['columns'], None
    rows = _chain(first, rows)
  else:
    header_columns = first[1]
    columns = len(header_columns)
    needed = [spec.text_a] + ([spec.text_b] if spec.text_b else [])
    missing = [c for c in needed if c not in header_columns]
    if missing:
      raise base.TaskError(f'{path}:{first[0]}: the header {header_columns} lacks the columns '
                           f'{missing} of a GLUE {spec.folder} file.')
    layout = {key: header_columns.index(column)
              for key, column in (('text_a', spec.text_a), ('text_b', spec.text_b),
                                  ('label', spec.label), ('guid', spec.id_column))
              if column in header_columns}
  examples = []
  for line, fields in rows:
    where = f'{path}:{line}'
    if len(fields) != columns:
      expected = f' ({header_columns})' if header_columns else ''
      raise base.TaskError(f'{where}: expected {columns} tab-separated columns{expected}, '
                           f'found {len(fields)}.')
    label = _parse_label(spec, fields[layout['label']], where) if 'label' in layout else None
    guid = fields[layout['guid']] if 'guid' in layout else f'{name}-{line}'
    text_b = fields[layout['text_b']] if 'text_b' in layout else None
    examples.append(Example(guid, fields[layout['text_a']], text_b, label))
  return examples


def _chain(first, rows):
  """Yields `first`, then the rest of `rows`."""
  yield first
  yield from rows


def read_tfds(task_name: str, split: str, data_dir: str = '') -> list[Example]:
  """Reads a split from TFDS ('train', 'dev'/'validation', 'test', MNLI 'dev_matched', ...)."""
  spec = get_spec(task_name)
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise base.TaskError(
        f'Reading {spec.tfds_name} needs tensorflow_datasets (and tensorflow), which are not '
        'installed: pip install tensorflow tensorflow-datasets, or read the GLUE TSV files '
        "(source='files').") from e
  tfds_split = _TFDS_SPLITS.get(split, split)
  dataset = tfds.load(spec.tfds_name, split=tfds_split, data_dir=data_dir or None)
  records = sorted(tfds.as_numpy(dataset), key=lambda record: int(record['idx']))
  examples = []
  for record in records:
    texts = [_text(record[feature]) for feature in spec.tfds_text]
    value = record['label']
    # TFDS marks the missing labels of test splits with -1.
    if tfds_split.startswith('test') or value < 0:
      label = None
    elif spec.tfds_labels is None:
      label = float(value)
    else:
      label = spec.tfds_labels[int(value)]
    examples.append(Example(str(int(record['idx'])), texts[0],
                            texts[1] if len(texts) > 1 else None, label))
  return examples


def _text(value):
  """A TFDS string feature (bytes) as str."""
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def truncated_lengths(len_a: np.ndarray, len_b: np.ndarray, budget: np.ndarray):
  """Lengths of a and b after _truncate_seq_pair pops the longer (b on ties) down to `budget`.

  Closed form of the one-token-at-a-time loop: the shorter side survives whole when it fits in
  half the budget; otherwise both end at half, a keeping the odd token (b is popped on ties).
  """
  len_a, len_b, budget = (np.asarray(x, np.int64) for x in (len_a, len_b, budget))
  fits = len_a + len_b <= budget
  short = np.minimum(len_a, len_b)
  one_side = 2 * short <= budget  # Only the longer side is popped.
  a = np.where(fits, len_a,
               np.where(one_side, np.where(len_a > len_b, budget - len_b, len_a),
                        (budget + 1) // 2))
  b = np.where(fits, len_b,
               np.where(one_side, np.where(len_a > len_b, len_b, budget - len_a), budget // 2))
  return a, b


def _scatter(ids, rows, start_column, keep_lengths, target):
  """Writes the first keep_lengths[r] ids of each row's list at target[r, start_column[r]:]."""
  lengths = np.array([len(x) for x in ids], np.int64)  # [n]
  flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)  # [sum lengths]
  row = np.repeat(rows, lengths)
  position = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
  keep = position < keep_lengths[row]
  target[row[keep], start_column[row[keep]] + position[keep]] = flat[keep]


def encode(examples: list[Example], tokenizer, max_seq_length: int,
           label_list: Optional[tuple[str, ...]]) -> base.EncodedSplit:
  """Encodes examples as BERT's run_classifier.py does, in the tokenizer's layout (RoBERTa's
  `<s> a </s></s> b </s>`); label_list None means regression."""
  special = tokenizer.special
  if max_seq_length < special.overhead(pair=True):
    raise ValueError(f'max_seq_length={max_seq_length} cannot hold [CLS] a [SEP] b [SEP].')
  n = len(examples)
  texts = [e.text_a for e in examples] + [e.text_b or '' for e in examples]
  pieces = tokenizer.encode_sentences(texts)  # One batched call for a and b.
  pieces_a, pieces_b = pieces[:n], pieces[n:]
  len_a = np.array([len(p) for p in pieces_a], np.int64)  # [n]
  len_b = np.array([len(p) for p in pieces_b], np.int64)  # [n]
  # As the original, an empty second text makes a single-sentence row.
  paired = len_b > 0
  keep_a, keep_b = truncated_lengths(
      len_a, len_b, max_seq_length - np.where(paired, special.overhead(pair=True),
                                              special.overhead(pair=False)))
  rows = np.arange(n)
  input_ids = np.full((n, max_seq_length), special.pad, np.int32)  # [n, S]
  input_ids[:, 0] = special.cls
  _scatter(pieces_a, rows, np.ones(n, np.int64), keep_a, input_ids)
  input_ids[rows, keep_a + 1] = special.sep
  for extra in range(1, special.separators):  # RoBERTa's second </s> before b.
    input_ids[rows[paired], (keep_a + 1 + extra)[paired]] = special.sep
  start_b = keep_a + 1 + special.separators  # [n]
  _scatter(pieces_b, rows, start_b, keep_b, input_ids)
  input_ids[rows[paired], (start_b + keep_b)[paired]] = special.sep
  length = np.where(paired, start_b + keep_b + 1, keep_a + 2)  # [n] tokens before padding
  column = np.arange(max_seq_length)[None, :]  # [1, S]
  input_mask = (column < length[:, None]).astype(np.int32)  # [n, S]
  # [n, S]: 1 from the first piece of b through its [SEP]; singles stay all 0.
  segment_ids = ((column >= (keep_a + 2)[:, None]) & (input_mask == 1)).astype(np.int32)
  if not special.segment_b:  # RoBERTa: segment 0 throughout, as its tokenizer.
    segment_ids[:] = 0
  if label_list is None:
    label = np.array([0.0 if e.label is None else e.label for e in examples], np.float32)
  else:
    index = {name: i for i, name in enumerate(label_list)}
    unknown = {e.label for e in examples if e.label is not None and e.label not in index}
    if unknown:
      raise base.TaskError(f'Labels {sorted(unknown)} are not in the label list {label_list}.')
    label = np.array([0 if e.label is None else index[e.label] for e in examples], np.int32)
  features = {'input_ids': input_ids, 'input_mask': input_mask, 'segment_ids': segment_ids,
              'label': label}
  meta = GlueMeta([e.guid for e in examples], all(e.label is not None for e in examples))
  return base.EncodedSplit(features, meta, n)


def compute_metrics(spec: TaskSpec, predictions: np.ndarray, labels: np.ndarray):
  """The task's metrics in percent, as the paper reports them."""
  functions = {'accuracy': scoring.accuracy, 'f1': scoring.binary_f1,
               'mcc': scoring.matthews_corrcoef, 'pearson': scoring.pearson,
               'spearman': scoring.spearman}
  return {name: 100.0 * float(functions[name](predictions, labels)) for name in spec.metrics}


def majority_baseline(spec: TaskSpec, train_labels, eval_labels) -> dict[str, float]:
  """The task's metrics (percent) of always answering the most frequent training label (ties:
  the lower class index), scored on `eval_labels`: MRPC's dev is 68% paraphrases, so answering
  "paraphrase" scores F1 81.2. Regression (STS-B): a constant prediction, whose Pearson and
  Spearman correlations are undefined (a constant has no variance); reported as 0."""
  if spec.labels is None:
    return {name: 0.0 for name in spec.metrics}
  counts = np.bincount(np.asarray(train_labels, np.int64).reshape(-1),
                       minlength=len(spec.labels))
  majority = int(np.argmax(counts))
  labels = np.asarray(eval_labels).reshape(-1)
  return compute_metrics(spec, np.full(labels.shape, majority), labels)


class GlueTask(base.Task):
  """A GLUE task read from its GLUE folder (train.tsv, dev.tsv, test.tsv) or from TFDS."""

  def __init__(self, name: str, data_dir: str = '', source: str = 'files',
               max_train_examples: int = 0):
    self.spec = get_spec(name)
    self.name = name.lower().replace('-', '')
    self.head = self.spec.head
    self.num_outputs = 1 if self.spec.labels is None else len(self.spec.labels)
    self.main_metric = self.spec.main_metric
    if source not in ('files', 'tfds'):
      raise base.TaskError(f"source={source!r}: use 'files' (GLUE TSVs) or 'tfds'.")
    if source == 'files' and not data_dir:
      raise base.TaskError(f'GLUE task {self.name} needs data_dir, the GLUE {self.spec.folder} '
                           f'folder holding {self._expected_files()}.')
    self.data_dir = os.path.expanduser(data_dir)
    self.source = source
    self.max_train_examples = max_train_examples
    self._file_labels = None  # The whole train file's labels, once max_train_examples cut it.

  def _expected_files(self):
    names = ['train.tsv'] + [f for _, f in self.spec.eval_files]
    return ', '.join(names) + ' (and optionally ' + ', '.join(
        f for _, f in self.spec.test_files) + ')'

  def _path(self, file_name):
    return os.path.join(self.data_dir, file_name)

  def _examples(self, split_name, file_name, labelled=True):
    if self.source == 'tfds':
      where = f'TFDS {self.spec.tfds_name} {split_name}'
      examples = read_tfds(self.name, split_name, self.data_dir)
    else:
      where = self._path(file_name)
      if not os.path.isfile(where):
        raise base.TaskError(f'{where} does not exist; the GLUE {self.spec.folder} folder '
                             f'should hold {self._expected_files()}.')
      examples = read_examples(self.name, where)
    # A train/dev file without its label column reads as a test file: that must not pass.
    if labelled and any(e.label is None for e in examples):
      raise base.TaskError(f'{where}: {split_name} examples need labels (the '
                           f'{self.spec.label!r} column); found none.')
    return examples

  def _encode(self, examples, tokenizer, max_seq_length):
    return encode(examples, tokenizer, max_seq_length, self.spec.labels)

  def train_split(self, tokenizer, max_seq_length: int) -> base.EncodedSplit:
    examples = self._examples('train', 'train.tsv')
    if 0 < self.max_train_examples < len(examples):
      # The baseline's majority comes from the whole file: MRPC's first 16 rows are mostly
      # "not paraphrase", its file and dev set 68% paraphrases.
      self._file_labels = [e.label for e in examples]
      examples = examples[:self.max_train_examples]
    return self._encode(examples, tokenizer, max_seq_length)

  def eval_splits(self, tokenizer, max_seq_length: int) -> dict[str, base.EncodedSplit]:
    return {split: self._encode(self._examples(split, file_name), tokenizer, max_seq_length)
            for split, file_name in self.spec.eval_files}

  def _test_examples(self):
    """(split, examples) of each test file present, in the spec's order."""
    parts = []
    for split, file_name in self.spec.test_files:
      if self.source == 'files' and not os.path.isfile(self._path(file_name)):
        continue
      examples = self._examples(split, file_name, labelled=False)
      # Submissions are written by row position, GLUE's test index (0, 1, ...): check it is.
      for position, example in enumerate(examples):
        if example.guid != str(position):
          raise base.TaskError(f'{self.name} {split}: example {position} has index '
                               f'{example.guid!r}; GLUE test files number rows 0, 1, ...')
      parts.append((split, examples))
    return parts

  def test_splits(self, tokenizer, max_seq_length: int) -> dict[str, base.EncodedSplit]:
    """Test splits whose file exists, by name ({'test'}; MNLI 'test_matched'/'_mismatched')."""
    return {split: self._encode(examples, tokenizer, max_seq_length)
            for split, examples in self._test_examples()}

  def test_split(self, tokenizer, max_seq_length: int) -> Optional[base.EncodedSplit]:
    """Every test file present as one split (MNLI: matched rows, then mismatched), or None.

    For MNLI, score() then returns its predictions by part ({'test_matched': [...], ...}) and
    write_predictions() writes one leaderboard file per part.
    """
    parts = self._test_examples()
    if not parts:
      return None
    split = self._encode([e for _, examples in parts for e in examples], tokenizer,
                         max_seq_length)
    if len(self.spec.test_files) > 1:
      split.meta.parts = [(name, len(examples)) for name, examples in parts]
    return split

  def score(self, split_name: str, split: base.EncodedSplit,
            outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], Union[list, dict]]:
    """Metrics in percent (none for unlabelled splits) and each row's label name or score."""
    logits = np.asarray(outputs['logits'], np.float32)  # [n, C]
    if len(logits) != split.num_rows:
      raise ValueError(f'{self.name} {split_name}: {len(logits)} rows of logits for '
                       f'{split.num_rows} examples.')
    if self.spec.labels is None:
      predicted = logits.reshape(len(logits), -1)[:, 0]  # [n]
      predictions = [float(x) for x in predicted]
    else:
      predicted = np.argmax(logits, axis=-1)  # [n]
      predictions = [self.spec.labels[i] for i in predicted]
    metrics = {}
    if split.meta is None or split.meta.labelled:
      metrics = compute_metrics(self.spec, predicted, split.features['label'])
    if split.meta is not None and split.meta.parts is not None:
      ends = np.cumsum([count for _, count in split.meta.parts])
      predictions = {name: predictions[end - count:end]
                     for (name, count), end in zip(split.meta.parts, ends)}
    return metrics, predictions

  @property
  def baseline_kind(self) -> str:
    if self.spec.labels is None:
      return 'constant prediction (its correlations are undefined: reported as 0)'
    if self._file_labels is not None:
      return (f'majority class of the whole training file ({len(self._file_labels)} rows; the '
              f'run trained on its first {self.max_train_examples})')
    return 'majority class of the training rows'

  def baseline(self, train: base.EncodedSplit, split: base.EncodedSplit) -> dict[str, float]:
    """majority_baseline of the training file's labels (all of them, also where
    max_train_examples cut the rows trained on), on `split`."""
    labels = train.features['label']
    if self._file_labels is not None and self.spec.labels is not None:
      labels = [self.spec.labels.index(label) for label in self._file_labels]
    return majority_baseline(self.spec, labels, split.features['label'])

  def write_predictions(self, split_name: str, predictions: Union[list, dict[str, list]],
                        directory: str) -> list[str]:
    """Writes `index<TAB>prediction` rows; test splits get GLUE's leaderboard file names.

    `predictions` is score()'s: a list, or for MNLI's test_split a list per test split.
    """
    parts = predictions.items() if isinstance(predictions, dict) else [(split_name, predictions)]
    submissions = dict(self.spec.submissions)
    files.makedirs(directory)  # A gs:// workdir's too.
    paths = []
    for part, values in parts:
      path = os.path.join(directory, submissions.get(part, f'{self.name}_{part}.tsv'))
      paths.append(base.write_index_predictions(path, values))
    return paths


def check_config(config) -> None:
  """A GLUE run's settings: a GLUE task, its folder (files) and no feature-based mode."""
  task = config.task
  if task.name not in TASKS:
    raise errors.ConfigError(f'config.task.name={task.name!r} is not a GLUE task; choose one of '
                             f'{tuple(TASKS)}.')
  if task.source == 'files':
    base.check_path('task.data_dir', task.data_dir, 'the GLUE task folder with train.tsv and '
                    'dev.tsv (or set config.task.source=tfds)', directory=True)
  base.refuse_feature_layers(task, 'GLUE fine-tunes the whole model (set it to 0)')


def build(config) -> GlueTask:
  t = config.task
  return GlueTask(t.name, data_dir=t.data_dir, source=t.source,
                  max_train_examples=t.max_train_examples)


tasks_lib.register(tasks_lib.TaskKind(
    'glue', check_config, build,
    sweep_configs=lambda: {name: f'configs/glue.py:task={name}' for name in TASKS},
    config_file='configs/glue.py', choices={'task.source': ('files', 'tfds')}))

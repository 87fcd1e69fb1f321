"""SQuAD v1.1 and v2.0: reading, sliding-window features, span decoding and official scoring.

Follows the original BERT run_squad.py (read_squad_examples, convert_examples_to_features,
write_predictions), with one modern change: answers are located through the character offsets of
the WordPiece pieces (as Hugging Face's offset mappings do), so an answer's characters map straight
to piece positions and a predicted span maps straight back to the original text, with no
whitespace tokenisation or de-tokenisation heuristics.

Only the official dev set of v1.1 is available here, so SquadTask can split the dev articles:
train on some, score on the rest (split_dev_fraction).
"""

import dataclasses
import json
import math
import os
from typing import Any

from absl import logging
import numpy as np

from bert_jax import tasks as tasks_lib
from bert_jax.core import errors
from bert_jax.core import files
from bert_jax.core import schema
from bert_jax.tasks import base

VERSIONS = ('1.1', '2.0')
# null_odds of a question whose rows admit no non-null span at all: the null answer is the only
# candidate, so its odds are as large as can be (finite, so the JSON stays standard).
_NO_SPAN_ODDS = 1e9


@dataclasses.dataclass
class Example:
  """One question about one paragraph."""
  qas_id: str
  question: str
  context: str
  answers: list[tuple[str, int]]  # (text, start character in context); [] when impossible.
  is_impossible: bool
  article_index: int  # Index of the article in the file's 'data' list.


@dataclasses.dataclass
class SquadMeta:
  """What postprocess and score need to map rows back to examples (n rows, S positions)."""
  examples: list[Example]
  example_index: np.ndarray  # [n] int32: the example each row is a window of.
  offsets: np.ndarray  # [n, S, 2] int32: (char start, char end) in the context; -1 off-context.
  token_is_max_context: np.ndarray  # [n, S] bool: the window where this piece has most context.
  dataset: list[dict[str, Any]] | None = None  # The articles, for official scoring.


def answer_matches(example: Example) -> bool:
  """Whether the first answer's text is found at its start character in the context."""
  if not example.answers:
    return True
  text, start = example.answers[0]
  return example.context[start:start + len(text)] == text


def _fail(path, where, what):
  raise base.TaskError(f'{path}: {where}: {what}')


def read_squad(path: str) -> tuple[list[Example], list[dict[str, Any]]]:
  """Returns (examples, the JSON's 'data' list) of a SQuAD v1.1 or v2.0 file."""
  path = os.path.expanduser(path)
  try:
    with open(path, encoding='utf-8') as f:
      document = json.load(f)
  except OSError as e:
    raise base.TaskError(f'{path}: cannot read the SQuAD file: {e}') from e
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise base.TaskError(f'{path}: not valid SQuAD JSON: {e}') from e
  if not isinstance(document, dict) or not isinstance(document.get('data'), list):
    raise base.TaskError(f'{path}: expected a JSON object with a "data" list of articles.')
  dataset = document['data']
  examples = []
  mismatched = []
  for a, article in enumerate(dataset):
    title = article.get('title', '') if isinstance(article, dict) else ''
    where_article = f'article {a} ({title!r})'
    if not isinstance(article, dict) or not isinstance(article.get('paragraphs'), list):
      _fail(path, where_article, 'lacks a "paragraphs" list')
    for p, paragraph in enumerate(article['paragraphs']):
      where_paragraph = f'{where_article}, paragraph {p}'
      if (not isinstance(paragraph, dict) or not isinstance(paragraph.get('context'), str)
          or not isinstance(paragraph.get('qas'), list)):
        _fail(path, where_paragraph, 'needs a "context" string and a "qas" list')
      context = paragraph['context']
      for q, qa in enumerate(paragraph['qas']):
        where = f'{where_paragraph}, question {q}'
        if not isinstance(qa, dict):
          _fail(path, where, 'is not a JSON object')
        for key in ('id', 'question', 'answers'):
          if key not in qa:
            _fail(path, where, f'lacks {key!r}')
        where = f'{where} (id {qa["id"]!r})'
        if not isinstance(qa['question'], str) or not isinstance(qa['answers'], list):
          _fail(path, where, '"question" must be a string and "answers" a list')
        is_impossible = bool(qa.get('is_impossible', False))
        answers = []
        for answer in qa['answers']:
          if (not isinstance(answer, dict) or not isinstance(answer.get('text'), str)
              or not isinstance(answer.get('answer_start'), int)):
            _fail(path, where, f'answer {answer!r} needs a "text" string and an int '
                  '"answer_start"')
          answers.append((answer['text'], answer['answer_start']))
        if not is_impossible and not answers:
          _fail(path, where, 'has no answers and is not marked "is_impossible"')
        example = Example(qas_id=str(qa['id']), question=qa['question'], context=context,
                          answers=[] if is_impossible else answers,
                          is_impossible=is_impossible, article_index=a)
        if not answer_matches(example):
          mismatched.append(example.qas_id)
        examples.append(example)
  if mismatched:
    logging.warning('%s: %d of %d questions have a first answer whose text is not found at its '
                    'answer_start (e.g. %s); they are skipped for training, kept for evaluation.',
                    path, len(mismatched), len(examples), mismatched[:5])
  logging.info('Read %d SQuAD questions from %d articles: %s', len(examples), len(dataset), path)
  return examples, dataset


def read_tfds(version: str, split: str) -> tuple[list[Example], list[dict[str, Any]]]:
  """Returns (examples, a SQuAD-format 'data' list) of tfds 'squad/v1.1' or 'squad/v2.0'."""
  if version not in VERSIONS:
    raise base.TaskError(f'SQuAD version {version!r} is not one of {VERSIONS}.')
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise base.TaskError('read_tfds needs tensorflow_datasets (pip install tensorflow-datasets); '
                         'or give the SQuAD JSON files (train_file, dev_file).') from e
  split = {'dev': 'validation'}.get(split, split)

  def text(value):
    return value.decode('utf-8') if isinstance(value, bytes) else str(value)

  # Rebuild the official nesting (article -> paragraph -> qas) so the official scorer can run.
  articles = {}  # title -> {context -> qas list}
  article_index = {}  # title -> position in the rebuilt 'data' list
  examples = []
  for record in tfds.as_numpy(tfds.load(f'squad/v{version}', split=split)):
    title, context = text(record['title']), text(record['context'])
    paragraphs = articles.setdefault(title, {})
    article_index.setdefault(title, len(article_index))
    answers = [(text(t), int(s)) for t, s in zip(record['answers']['text'],
                                                 record['answers']['answer_start'])]
    is_impossible = bool(record.get('is_impossible', False))
    qa = {'id': text(record['id']), 'question': text(record['question']),
          'answers': [{'text': t, 'answer_start': s} for t, s in answers]}
    if version == '2.0':
      qa['is_impossible'] = is_impossible
    paragraphs.setdefault(context, []).append(qa)
    examples.append(Example(qas_id=qa['id'], question=qa['question'], context=context,
                            answers=[] if is_impossible else answers,
                            is_impossible=is_impossible,
                            article_index=article_index[title]))
  dataset = [{'title': title, 'paragraphs': [{'context': c, 'qas': qas}
                                             for c, qas in paragraphs.items()]}
             for title, paragraphs in articles.items()]
  return examples, dataset


def split_articles(dataset: list[dict[str, Any]], examples: list[Example], fraction: float = 0.5,
                   seed: int = 0) -> tuple[list[Example], list[Example], list[dict[str, Any]]]:
  """Splits by article: (train examples, eval examples, the eval articles for scoring).

  `fraction` of the article titles (at least one, never all) go to training. The split depends
  only on the set of titles and the seed, not on the file's order; articles sharing a title stay
  together so no paragraph is seen on both sides.
  """
  if not 0.0 < fraction < 1.0:
    raise base.TaskError(f'split fraction {fraction} must be in (0, 1): the share of articles '
                         'used for training.')
  titles = sorted({_title(article, a) for a, article in enumerate(dataset)})
  if len(titles) < 2:
    raise base.TaskError(f'Cannot split {len(titles)} article(s) into train and eval parts.')
  order = np.random.default_rng(seed).permutation(len(titles))
  num_train = min(max(int(round(fraction * len(titles))), 1), len(titles) - 1)
  train_titles = {titles[i] for i in order[:num_train]}
  is_train = [_title(article, a) in train_titles for a, article in enumerate(dataset)]
  train = [example for example in examples if is_train[example.article_index]]
  evaluation = [example for example in examples if not is_train[example.article_index]]
  eval_dataset = [article for a, article in enumerate(dataset) if not is_train[a]]
  return train, evaluation, eval_dataset


def _title(article, index):
  """The article's title; untitled articles are told apart by position."""
  title = article.get('title') if isinstance(article, dict) else None
  return title if isinstance(title, str) and title else f'<untitled article {index}>'


def _window_starts(num_pieces, max_pieces, doc_stride):
  """(start, length) of the windows over the context: run_squad.py's doc-span loop."""
  spans = []
  start = 0
  while True:
    length = min(num_pieces - start, max_pieces)
    spans.append((start, length))
    # Also one (empty) window for an empty context, so every example yields a row.
    if start + length >= num_pieces:
      return spans
    start += min(length, doc_stride)


def max_context_mask(spans: list[tuple[int, int]], num_pieces: int) -> np.ndarray:
  """[windows, num_pieces] bool: run_squad.py's _check_is_max_context for every piece at once.

  A piece's score in a window is min(left context, right context) + 0.01 * window length; it is
  scored only in its best window, the first one on ties (the original's strict '>').
  """
  starts = np.asarray([s for s, _ in spans], np.int64)[:, None]  # [W, 1]
  lengths = np.asarray([n for _, n in spans], np.int64)[:, None]  # [W, 1]
  ends = starts + lengths - 1
  position = np.arange(num_pieces)[None, :]  # [1, num_pieces]
  inside = (position >= starts) & (position <= ends)  # [W, num_pieces]
  score = np.minimum(position - starts, ends - position) + 0.01 * lengths
  best = np.argmax(np.where(inside, score, -np.inf), axis=0)  # [num_pieces]
  return inside & (best[None, :] == np.arange(len(spans))[:, None])


def _answer_pieces(starts, ends, char_start, char_end):
  """(first, last) piece overlapping [char_start, char_end); first > last if none does."""
  first = int(np.searchsorted(ends, char_start, side='right'))  # First piece ending after it.
  last = int(np.searchsorted(starts, char_end, side='left')) - 1  # Last piece starting before.
  return first, last


def encode(examples: list[Example], tokenizer, max_seq_length: int = 384, doc_stride: int = 128,
           max_query_length: int = 64, training: bool = False) -> base.EncodedSplit:
  """Encodes `[CLS] question [SEP] context window [SEP]` rows (the tokenizer's layout: RoBERTa's
  `<s> question </s></s> context </s>`), several per long context.

  Positions point at the first answer's first and last piece when a window holds all of it, else
  at 0 ([CLS]); impossible questions get 0/0. With `training`, examples whose first answer is not
  found at its answer_start (or covers no piece) are skipped, as the original does.
  """
  if doc_stride < 1 or max_query_length < 1:
    raise base.TaskError(f'doc_stride ({doc_stride}) and max_query_length ({max_query_length}) '
                         'must be positive.')
  special = tokenizer.special
  questions = tokenizer.encode_sentences([example.question for example in examples])
  # Paragraphs have several questions each: tokenise every distinct context once.
  context_ids = {}
  for example in examples:
    context_ids.setdefault(example.context, len(context_ids))
  contexts = tokenizer.encode_with_offsets(list(context_ids))

  rows = []  # (example index, question ids, context index, window start, window length, max).
  positions = []  # (start, end) per row.
  skipped = 0
  for index, example in enumerate(examples):
    question = questions[index][:max_query_length]
    max_pieces = max_seq_length - len(question) - special.overhead(pair=True)
    if max_pieces < 1:
      raise base.TaskError(f'max_seq_length={max_seq_length} leaves no room for the context '
                           f'after a {len(question)}-piece question; raise it or lower '
                           'max_query_length.')
    context = context_ids[example.context]
    _, offsets = contexts[context]
    answer = None  # (first piece, last piece) of the answer in the context.
    if example.answers and not example.is_impossible:
      text, char_start = example.answers[0]
      answer = _answer_pieces(offsets[:, 0], offsets[:, 1], char_start, char_start + len(text))
      if answer[0] > answer[1]:
        answer = None
      if training and (answer is None or not answer_matches(example)):
        skipped += 1
        continue
    spans = _window_starts(len(offsets), max_pieces, doc_stride)
    if len(spans) == 1:
      is_max = np.ones([1, len(offsets)], bool)
    else:
      is_max = max_context_mask(spans, len(offsets))
    for w, (start, length) in enumerate(spans):
      rows.append((index, question, context, start, length, is_max[w, start:start + length]))
      if answer is not None and start <= answer[0] and answer[1] < start + length:
        # Context pieces begin after [CLS], the question and [SEP] (RoBERTa: two).
        first = len(question) + 1 + special.separators
        positions.append((answer[0] - start + first, answer[1] - start + first))
      else:
        positions.append((0, 0))
  if skipped:
    logging.warning('Skipped %d of %d training questions whose answer is not found in the '
                    'context at its answer_start.', skipped, len(examples))

  n = len(rows)
  input_ids = np.full([n, max_seq_length], special.pad, np.int32)
  input_mask = np.zeros([n, max_seq_length], np.int32)
  segment_ids = np.zeros([n, max_seq_length], np.int32)
  example_index = np.zeros([n], np.int32)
  offsets_out = np.full([n, max_seq_length, 2], -1, np.int32)
  token_is_max_context = np.zeros([n, max_seq_length], bool)
  for r, (index, question, context, start, length, is_max) in enumerate(rows):
    ids, offsets = contexts[context]
    first = len(question) + 1 + special.separators  # The window's first context piece.
    last = first + length  # Position of the final [SEP].
    input_ids[r, 0] = special.cls
    input_ids[r, 1:len(question) + 1] = question
    input_ids[r, len(question) + 1:first] = special.sep
    input_ids[r, first:last] = ids[start:start + length]
    input_ids[r, last] = special.sep
    input_mask[r, :last + 1] = 1
    # The context's segment starts after the question's [SEP]; RoBERTa's rows are segment 0.
    segment_ids[r, len(question) + 2:last + 1] = int(special.segment_b)
    example_index[r] = index
    offsets_out[r, first:last] = offsets[start:start + length]
    token_is_max_context[r, first:last] = is_max
  positions = np.asarray(positions, np.int32).reshape(n, 2)
  features = {'input_ids': input_ids, 'input_mask': input_mask, 'segment_ids': segment_ids,
              'start_positions': positions[:, 0].copy(), 'end_positions': positions[:, 1].copy()}
  meta = SquadMeta(examples=examples, example_index=example_index, offsets=offsets_out,
                   token_is_max_context=token_is_max_context)
  return base.EncodedSplit(features=features, meta=meta, num_examples=len(examples))


def _softmax(scores):
  """Probabilities of a list of scores, as the original's _compute_softmax."""
  if not scores:
    return []
  top = max(scores)
  exps = [math.exp(score - top) for score in scores]
  total = sum(exps)
  return [e / total for e in exps]


def postprocess(examples: list[Example], split: base.EncodedSplit, start_logits: np.ndarray,
                end_logits: np.ndarray, n_best_size: int = 20, max_answer_length: int = 30,
                version_2: bool = False, null_score_diff_threshold: float = 0.0
                ) -> tuple[dict[str, str], dict[str, float], dict[str, list[dict[str, Any]]]]:
  """(predictions, null_odds, nbest) by qas_id: run_squad.py's write_predictions.

  Candidates are the top n_best start and end positions of every row of an example; a span must
  lie in the context window, start at a piece scored in that window (token_is_max_context), end
  at or after its start and be at most max_answer_length pieces. Its text is the original context
  between the pieces' character offsets. For v2, null_odds[qid] = min over rows of the [CLS]
  score minus the best span's score, and the prediction is '' when it exceeds the threshold.
  """
  meta = split.meta
  start_logits = np.asarray(start_logits, np.float64)  # [n, S]; Python floats in the original.
  end_logits = np.asarray(end_logits, np.float64)  # [n, S]
  n, seq_length = start_logits.shape
  if n != split.num_rows or end_logits.shape != (n, seq_length):
    raise ValueError(f'Logits {start_logits.shape} and {end_logits.shape} do not match the '
                     f'{split.num_rows} rows of the split.')
  k = min(n_best_size, seq_length)
  rows = np.arange(n)[:, None]
  # Stable sorts keep the original's tie order (lower position first).
  top_starts = np.argsort(-start_logits, axis=1, kind='stable')[:, :k]  # [n, k]
  top_ends = np.argsort(-end_logits, axis=1, kind='stable')[:, :k]  # [n, k]
  start_ok = (meta.offsets[rows, top_starts, 0] >= 0) & meta.token_is_max_context[rows, top_starts]
  end_ok = meta.offsets[rows, top_ends, 0] >= 0
  length = top_ends[:, None, :] - top_starts[:, :, None] + 1  # [n, k, k]
  valid = (start_ok[:, :, None] & end_ok[:, None, :] & (length >= 1)
           & (length <= max_answer_length))
  cand_row, cand_i, cand_j = np.nonzero(valid)  # Row-major: the original's loop order.
  cand_start = top_starts[cand_row, cand_i]
  cand_end = top_ends[cand_row, cand_j]
  cand_start_logit = start_logits[cand_row, cand_start]
  cand_end_logit = end_logits[cand_row, cand_end]
  cand_score = cand_start_logit + cand_end_logit
  cand_example = meta.example_index[cand_row]
  # Group by example, best first; lexsort is stable, so ties keep the loop order.
  order = np.lexsort((-cand_score, cand_example))
  cand_example = cand_example[order]
  bounds = np.searchsorted(cand_example, np.arange(len(examples) + 1))
  char_start = meta.offsets[cand_row, cand_start, 0][order].tolist()
  char_end = meta.offsets[cand_row, cand_end, 1][order].tolist()
  cand_start_logit = cand_start_logit[order].tolist()
  cand_end_logit = cand_end_logit[order].tolist()
  cand_score = cand_score[order].tolist()

  if version_2:
    # The null score of an example is its smallest [CLS] score over rows (first row on ties).
    null_scores = start_logits[:, 0] + end_logits[:, 0]  # [n]
    null_by_example = {}
    for r in range(n):
      index = int(meta.example_index[r])
      if index not in null_by_example or null_scores[r] < null_by_example[index][0]:
        null_by_example[index] = (float(null_scores[r]), float(start_logits[r, 0]),
                                  float(end_logits[r, 0]))

  predictions, null_odds, nbest = {}, {}, {}
  for index, example in enumerate(examples):
    begin, end = int(bounds[index]), int(bounds[index + 1])
    null = null_by_example.get(index) if version_2 else None
    entries = []  # (text, start_logit, end_logit), best first, distinct texts.
    seen = set()
    null_pending = null is not None
    for c in range(begin, end):
      if len(entries) >= n_best_size:
        break
      if null_pending and cand_score[c] < null[0]:
        # The original sorts the null candidate in with the spans (after equal scores).
        entries.append(('', null[1], null[2]))
        seen.add('')
        null_pending = False
        if len(entries) >= n_best_size:
          break
      text = example.context[char_start[c]:char_end[c]]
      if text in seen:
        continue
      seen.add(text)
      entries.append((text, cand_start_logit[c], cand_end_logit[c]))
    if null is not None and '' not in seen:
      entries.append(('', null[1], null[2]))
    if not entries:
      entries.append(('', 0.0, 0.0))  # The original's 'empty' placeholder.
    probabilities = _softmax([s + e for _, s, e in entries])
    nbest[example.qas_id] = [
        {'text': text, 'probability': p, 'start_logit': s, 'end_logit': e}
        for (text, s, e), p in zip(entries, probabilities)]
    best_non_null = next((entry for entry in entries if entry[0]), None)
    if not version_2:
      predictions[example.qas_id] = entries[0][0]
      continue
    if null is None:  # An example without rows (skipped for training): nothing to predict.
      predictions[example.qas_id] = ''
      null_odds[example.qas_id] = _NO_SPAN_ODDS
      continue
    if best_non_null is None:
      odds = _NO_SPAN_ODDS
    else:
      odds = null[0] - best_non_null[1] - best_non_null[2]
    null_odds[example.qas_id] = odds
    predictions[example.qas_id] = (
        '' if best_non_null is None or odds > null_score_diff_threshold else best_non_null[0])
  return predictions, null_odds, nbest


def best_non_null(nbest: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
  """The best non-empty answer per qid ('' if none): predictions before the null threshold."""
  return {qid: next((entry['text'] for entry in entries if entry['text']), '')
          for qid, entries in nbest.items()}


class SquadTask(base.Task):
  """SQuAD v1.1 or v2.0 as a 'span' task; can train and score on halves of one dev file."""
  head = 'span'
  num_outputs = 2
  main_metric = 'f1'

  def __init__(self, version: str = '1.1', train_file: str = '', dev_file: str = '',
               split_dev_fraction: float = 0.0, seed: int = 0, doc_stride: int = 128,
               max_query_length: int = 64, n_best_size: int = 20, max_answer_length: int = 30,
               null_score_diff_threshold: float = 0.0, max_train_examples: int = 0):
    if version not in VERSIONS:
      raise base.TaskError(f'SQuAD version {version!r} is not one of {VERSIONS}.')
    if not dev_file:
      raise base.TaskError('SQuAD needs dev_file (e.g. dev-v1.1.json) to evaluate on.')
    if not train_file and split_dev_fraction <= 0.0:
      raise base.TaskError(
          'SQuAD needs training data: give train_file (e.g. train-v1.1.json), or set '
          'split_dev_fraction in (0, 1) to train on that share of the dev articles and evaluate '
          'on the rest.')
    if train_file and split_dev_fraction > 0.0:
      raise base.TaskError('Give either train_file or split_dev_fraction, not both: with a '
                           'train_file the whole dev_file is evaluated.')
    self.name = f'squad{version}'
    self.version = version
    self.train_file = train_file
    self.dev_file = dev_file
    self.split_dev_fraction = split_dev_fraction
    self.seed = seed
    self.doc_stride = doc_stride
    self.max_query_length = max_query_length
    self.n_best_size = n_best_size
    self.max_answer_length = max_answer_length
    self.null_score_diff_threshold = null_score_diff_threshold
    self.max_train_examples = max_train_examples
    self._examples = None  # (train examples, eval examples, eval articles), read once.

  def _read(self):
    """Reads (and splits) the files once."""
    if self._examples is None:
      dev_examples, dev_dataset = read_squad(self.dev_file)
      if self.train_file:
        train_examples, _ = read_squad(self.train_file)
        self._examples = (train_examples, dev_examples, dev_dataset)
      else:
        self._examples = split_articles(dev_dataset, dev_examples, self.split_dev_fraction,
                                        self.seed)
        logging.info('Split %s by article: %d questions to train on, %d to evaluate.',
                     self.dev_file, len(self._examples[0]), len(self._examples[1]))
    return self._examples

  def _encode(self, examples, tokenizer, max_seq_length, training):
    return encode(examples, tokenizer, max_seq_length=max_seq_length,
                  doc_stride=self.doc_stride, max_query_length=self.max_query_length,
                  training=training)

  def train_split(self, tokenizer, max_seq_length: int) -> base.EncodedSplit:
    examples = self._read()[0]
    if self.max_train_examples:
      examples = examples[:self.max_train_examples]
    return self._encode(examples, tokenizer, max_seq_length, training=True)

  def eval_splits(self, tokenizer, max_seq_length: int) -> dict[str, base.EncodedSplit]:
    _, examples, dataset = self._read()
    split = self._encode(examples, tokenizer, max_seq_length, training=False)
    split.meta.dataset = dataset
    return {'dev': split}

  def score(self, split_name: str, split: base.EncodedSplit,
            outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], Any]:
    from bert_jax.tasks import scoring  # pylint: disable=g-import-not-at-top
    meta = split.meta
    predictions, null_odds, nbest = postprocess(
        meta.examples, split, outputs['start_logits'], outputs['end_logits'],
        n_best_size=self.n_best_size, max_answer_length=self.max_answer_length,
        version_2=self.version == '2.0',
        null_score_diff_threshold=self.null_score_diff_threshold)
    if meta.dataset is None:
      raise ValueError(f'Split {split_name!r} has no articles to score against.')
    if self.version == '1.1':
      metrics = scoring.squad_v1_evaluate(meta.dataset, predictions)
    else:
      # Scoring the best non-null answers with the null odds as na_probs gives the official
      # numbers of `predictions` at this threshold (the script blanks the same answers) and an
      # exact best-threshold sweep, which the blanked predictions would bias.
      metrics = scoring.squad_v2_evaluate(meta.dataset, best_non_null(nbest), na_probs=null_odds,
                                          na_prob_thresh=self.null_score_diff_threshold)
    metrics = {key: float(value) for key, value in metrics.items()}
    return metrics, {'predictions': predictions, 'null_odds': null_odds, 'nbest': nbest}

  def write_predictions(self, split_name: str, predictions: Any, directory: str) -> list[str]:
    directory = os.path.expanduser(directory)
    files.makedirs(directory)  # A gs:// workdir's too.
    prefix = '' if split_name == 'dev' else f'{split_name}_'
    outputs = [('predictions.json', predictions['predictions']),
               ('nbest_predictions.json', predictions['nbest'])]
    if self.version == '2.0':
      outputs.append(('null_odds.json', predictions['null_odds']))
    paths = []
    for name, content in outputs:
      path = os.path.join(directory, prefix + name)
      files.write_text(path, json.dumps(content, indent=2, ensure_ascii=False) + '\n')
      paths.append(path)
    return paths


def check_config(config) -> None:
  """A SQuAD run's settings: its files (or a share of dev to train on) and room for a context."""
  task = config.task
  base.check_path('task.dev_file', task.dev_file, 'the SQuAD dev JSON (dev-v1.1.json)')
  if task.train_file:
    base.check_path('task.train_file', task.train_file, 'the SQuAD training JSON')
  elif not task.split_dev_fraction:
    raise errors.ConfigError(
        'config.task.train_file is empty and config.task.split_dev_fraction is 0: give a SQuAD '
        'training JSON, or train on a share of the dev articles (e.g. '
        '--config.task.split_dev_fraction=0.5).')
  if task.max_query_length + 3 >= config.data.max_seq_length:
    raise errors.ConfigError(f'config.task.max_query_length={task.max_query_length} leaves no '
                             f'room for the context in config.data.max_seq_length='
                             f'{config.data.max_seq_length}.')
  base.refuse_feature_layers(task, 'set it to 0 for SQuAD')


def build(config) -> SquadTask:
  t = config.task
  return SquadTask(
      version=t.version, train_file=t.train_file, dev_file=t.dev_file,
      split_dev_fraction=t.split_dev_fraction, seed=config.seed, doc_stride=t.doc_stride,
      max_query_length=t.max_query_length, n_best_size=t.n_best_size,
      max_answer_length=t.max_answer_length,
      null_score_diff_threshold=t.null_score_diff_threshold,
      max_train_examples=t.max_train_examples)


tasks_lib.register(tasks_lib.TaskKind(
    'squad', check_config, build,
    sweep_configs=lambda: {'squad': 'configs/squad.py', 'squad1.1': 'configs/squad.py'},
    config_file='configs/squad.py',
    ranges={'task.split_dev_fraction': schema.BELOW_ONE, 'task.doc_stride': schema.POSITIVE, 'task.max_query_length': schema.POSITIVE,
            'task.n_best_size': schema.POSITIVE, 'task.max_answer_length': schema.POSITIVE,
            'task.null_score_diff_threshold': schema.ANY_SIGN},
    choices={'task.version': ('1.1', '2.0')}))

"""The official metrics of BERT's fine-tuning tasks, in numpy and pure Python.

GLUE: accuracy, F1 of class 1, Matthews correlation (sklearn semantics); Pearson and Spearman
correlation (scipy semantics). SQuAD: the official v1.1 and v2.0 evaluation scripts. CoNLL-2003:
entity-level micro precision/recall/F1 with seqeval 1.2.2's default (non-strict) chunking.

Scalar metrics here are fractions in [0, 1]; the SQuAD evaluators return percentages (0-100), as
the official scripts do.
"""

import collections
import re
import string
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

# GLUE -------------------------------------------------------------------------------------------


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
  """Returns predictions and labels as 1-D arrays of one length, refusing empty input."""
  p = np.asarray(predictions).reshape(-1)
  t = np.asarray(labels).reshape(-1)
  if p.shape != t.shape:
    raise ValueError(f'{p.size} predictions but {t.size} labels.')
  if p.size == 0:
    raise ValueError('No examples to score.')
  return p, t


def accuracy(predictions, labels) -> float:
  """Returns the fraction of predictions equal to their labels."""
  p, t = _pair(predictions, labels)
  return float(np.mean(p == t))


def binary_f1(predictions, labels) -> float:
  """Returns the F1 of class 1 (sklearn's f1_score default; 0.0 when it is undefined)."""
  p, t = _pair(predictions, labels)
  tp = int(np.sum((p == 1) & (t == 1)))
  denom = int(np.sum(t == 1)) + int(np.sum(p == 1))
  # sklearn >= 1.3 computes 2tp / (true + predicted), not from rounded precision and recall;
  # zero_division='warn' gives 0.0 when nothing is true or predicted positive.
  return 2.0 * tp / denom if denom else 0.0


def matthews_corrcoef(predictions, labels) -> float:
  """Returns the Matthews correlation coefficient (sklearn's multiclass form; 0.0 if undefined)."""
  p, t = _pair(predictions, labels)
  classes, codes = np.unique(np.concatenate([t, p]), return_inverse=True)
  k = len(classes)
  t_codes, p_codes = codes[:t.size], codes[t.size:]
  confusion = np.zeros((k, k), np.int64)
  np.add.at(confusion, (t_codes, p_codes), 1)
  t_sum = confusion.sum(axis=1, dtype=np.float64)
  p_sum = confusion.sum(axis=0, dtype=np.float64)
  n_correct = np.trace(confusion, dtype=np.float64)
  n = p_sum.sum()
  cov_ytyp = n_correct * n - np.dot(t_sum, p_sum)
  cov_ypyp = n**2 - np.dot(p_sum, p_sum)
  cov_ytyt = n**2 - np.dot(t_sum, t_sum)
  # One side constant (e.g. a classifier that always says 1) leaves MCC undefined; sklearn says 0.
  if cov_ypyp * cov_ytyt == 0:
    return 0.0
  return float(cov_ytyp / np.sqrt(cov_ypyp * cov_ytyt))


def pearson(x, y) -> float:
  """Returns Pearson's r (scipy.stats.pearsonr's statistic; nan when either input is constant)."""
  x, y = _pair(x, y)
  if x.size < 2:
    raise ValueError('Pearson correlation needs at least 2 points.')
  xm = x.astype(np.float64) - np.mean(x, dtype=np.float64)
  ym = y.astype(np.float64) - np.mean(y, dtype=np.float64)
  nx, ny = np.linalg.norm(xm), np.linalg.norm(ym)
  if nx == 0 or ny == 0:
    return float('nan')
  # Normalising before the dot product, as scipy does, keeps |r| <= 1 up to rounding; clip the rest.
  return float(np.clip(np.dot(xm / nx, ym / ny), -1.0, 1.0))


def _average_ranks(values: np.ndarray) -> np.ndarray:
  """Returns 1-based ranks, ties sharing their average rank (scipy.stats.rankdata 'average')."""
  order = np.argsort(values, kind='stable')
  sorted_values = values[order]
  # starts[g] is the sorted position where tie group g begins; ends[g] one past its end.
  is_new = np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]])
  starts = np.flatnonzero(is_new)
  ends = np.append(starts[1:], len(values))
  group_rank = 0.5 * (starts + 1 + ends)  # Mean of the 1-based positions starts+1 .. ends.
  ranks = np.empty(len(values), np.float64)
  ranks[order] = np.repeat(group_rank, ends - starts)
  return ranks


def spearman(x, y) -> float:
  """Returns Spearman's rho: Pearson's r of the average ranks (scipy.stats.spearmanr)."""
  x, y = _pair(x, y)
  return pearson(_average_ranks(x), _average_ranks(y))


# SQuAD ------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r'\b(a|an|the)\b', re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def squad_normalize(text: str) -> str:
  """Returns the official SQuAD normalize_answer of text."""
  text = text.lower()
  text = ''.join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(' ', text)
  return ' '.join(text.split())


def squad_exact_match(prediction: str, gold: str) -> float:
  """Returns 1.0 when prediction and gold normalize to the same string, else 0.0."""
  return float(squad_normalize(prediction) == squad_normalize(gold))


def squad_f1(prediction: str, gold: str, v2: bool = False) -> float:
  """Returns the official token-level F1 (v1.1 script, or v2.0's when v2: empty matches empty)."""
  pred_tokens = squad_normalize(prediction).split()
  gold_tokens = squad_normalize(gold).split()
  if v2 and (not pred_tokens or not gold_tokens):
    # v2.0 scores abstentions: an empty answer is right exactly when the gold is empty too.
    return float(pred_tokens == gold_tokens)
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = 1.0 * num_same / len(pred_tokens)
  recall = 1.0 * num_same / len(gold_tokens)
  return (2 * precision * recall) / (precision + recall)


def _questions(dataset: Iterable[Mapping[str, Any]]):
  """Yields every question (qa dict) of a SQuAD 'data' list, in file order."""
  for article in dataset:
    for paragraph in article['paragraphs']:
      yield from paragraph['qas']


def squad_v1_evaluate(dataset: Sequence[Mapping[str, Any]],
                      predictions: Mapping[str, str]) -> dict[str, float]:
  """Returns {'exact_match', 'f1'} in percent, as the official evaluate-v1.1.py."""
  exact_match = f1 = 0.0
  total = 0
  for qa in _questions(dataset):
    total += 1
    if qa['id'] not in predictions:
      continue  # The official script prints 'Unanswered question ... will receive score 0.'.
    golds = [answer['text'] for answer in qa['answers']]
    prediction = predictions[qa['id']]
    exact_match += max(squad_exact_match(prediction, gold) for gold in golds)
    f1 += max(squad_f1(prediction, gold) for gold in golds)
  if not total:
    raise ValueError('The dataset has no questions.')
  return {'exact_match': 100.0 * exact_match / total, 'f1': 100.0 * f1 / total}


def _best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float],
                    na_probs: Mapping[str, float],
                    has_answer: Mapping[str, bool]) -> tuple[float, float]:
  """Returns (best score in percent, its na_prob threshold): evaluate-v2.0.py find_best_thresh."""
  # Threshold below every na_prob: every question is called unanswerable, so only the
  # unanswerable ones score. Raising it past each question in na_prob order answers it instead.
  cur_score = sum(1 for qid in has_answer if not has_answer[qid])
  best_score = cur_score
  best_thresh = 0.0
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):
    if qid not in scores:
      continue
    if has_answer[qid]:
      diff = scores[qid]
    else:
      # The raw prediction string decides, as in the official script (not its normalized form).
      diff = -1 if predictions[qid] else 0
    cur_score += diff
    if cur_score > best_score:
      best_score = cur_score
      best_thresh = na_probs[qid]
  return 100.0 * best_score / len(scores), best_thresh


def squad_v2_evaluate(dataset: Sequence[Mapping[str, Any]], predictions: Mapping[str, str],
                      na_probs: Mapping[str, float] | None = None,
                      na_prob_thresh: float = 1.0) -> dict[str, float]:
  """Returns the official evaluate-v2.0.py main()'s dict (percentages; best_* with na_probs)."""
  has_answer = {}
  exact_raw, f1_raw = {}, {}
  for qa in _questions(dataset):
    qid = qa['id']
    has_answer[qid] = bool(qa['answers'])
    golds = [a['text'] for a in qa['answers'] if squad_normalize(a['text'])]
    if not golds:
      golds = ['']  # Unanswerable: the only right answer is no answer.
    if qid not in predictions:
      continue
    exact_raw[qid] = max(squad_exact_match(predictions[qid], gold) for gold in golds)
    f1_raw[qid] = max(squad_f1(predictions[qid], gold, v2=True) for gold in golds)
  missing = [qid for qid in has_answer if qid not in exact_raw]
  if missing:
    # The official script skips them in get_raw_scores, then fails with a KeyError in the
    # HasAns/NoAns breakdown: there is no official number to mirror, so say which are missing.
    raise ValueError(f'{len(missing)} questions have no prediction, e.g. {missing[:3]}.')
  if not has_answer:
    raise ValueError('The dataset has no questions.')

  probs = na_probs if na_probs is not None else {qid: 0.0 for qid in predictions}

  def thresholded(raw):
    # A question whose no-answer probability passes the threshold counts as answered "no
    # answer": right exactly when it is unanswerable.
    return {qid: float(not has_answer[qid]) if probs[qid] > na_prob_thresh else score
            for qid, score in raw.items()}

  exact, f1 = thresholded(exact_raw), thresholded(f1_raw)

  def summary(qids, prefix=''):
    return {f'{prefix}exact': 100.0 * sum(exact[q] for q in qids) / len(qids),
            f'{prefix}f1': 100.0 * sum(f1[q] for q in qids) / len(qids),
            f'{prefix}total': len(qids)}

  result = summary(list(exact))
  has_ans_qids = [qid for qid, v in has_answer.items() if v]
  no_ans_qids = [qid for qid, v in has_answer.items() if not v]
  if has_ans_qids:
    result.update(summary(has_ans_qids, 'HasAns_'))
  if no_ans_qids:
    result.update(summary(no_ans_qids, 'NoAns_'))
  if na_probs is not None:
    result['best_exact'], result['best_exact_thresh'] = _best_threshold(
        predictions, exact_raw, na_probs, has_answer)
    result['best_f1'], result['best_f1_thresh'] = _best_threshold(
        predictions, f1_raw, na_probs, has_answer)
  return result


# CoNLL-2003 NER ---------------------------------------------------------------------------------


def _split_tag(tag: str) -> tuple[str, str]:
  """Returns (prefix letter, entity type) of a tag, as seqeval 1.2.2's get_entities splits it."""
  # 'B-PER' -> ('B', 'PER'); 'O' and bare 'B' get the type '_'; 'I-A-B' keeps 'A-B'.
  return tag[0], tag[1:].split('-', maxsplit=1)[-1] or '_'


def _chunk_ends(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
  """Returns whether a chunk ended before the current token (seqeval's end_of_chunk)."""
  if prev_tag in ('E', 'S'):
    return True
  if prev_tag in ('B', 'I') and tag in ('B', 'S', 'O'):
    return True
  return prev_tag not in ('O', '.') and prev_type != type_


def _chunk_starts(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
  """Returns whether a chunk starts at the current token (seqeval's start_of_chunk)."""
  if tag in ('B', 'S'):
    return True
  # An I-/E- after O, E- or S- opens a chunk: this is what makes IOB1 (I- first) work.
  if prev_tag in ('E', 'S', 'O') and tag in ('E', 'I'):
    return True
  return tag not in ('O', '.') and prev_type != type_


def conll_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """Returns the (type, start, end inclusive) chunks of one tag sequence, as seqeval 1.2.2."""
  prev_tag, prev_type = 'O', ''
  begin = 0
  chunks = []
  # A trailing 'O' closes an entity that runs to the end of the sentence.
  for i, chunk in enumerate(list(tags) + ['O']):
    tag, type_ = _split_tag(chunk)
    if _chunk_ends(prev_tag, tag, prev_type, type_):
      chunks.append((prev_type, begin, i - 1))
    if _chunk_starts(prev_tag, tag, prev_type, type_):
      begin = i
    prev_tag, prev_type = tag, type_
  return chunks


def entity_scores(true_sequences: Sequence[Sequence[str]],
                  pred_sequences: Sequence[Sequence[str]]) -> dict[str, float]:
  """Returns micro-averaged entity {'precision', 'recall', 'f1'} as seqeval 1.2.2 does."""
  if len(true_sequences) != len(pred_sequences):
    raise ValueError(f'{len(true_sequences)} true sequences but {len(pred_sequences)} predicted.')
  flat_true, flat_pred = [], []
  for i, (true_tags, pred_tags) in enumerate(zip(true_sequences, pred_sequences)):
    if len(true_tags) != len(pred_tags):
      raise ValueError(f'Sentence {i}: {len(true_tags)} true tags but {len(pred_tags)} predicted.')
    # seqeval joins the sentences with an 'O' after each and chunks the whole; doing the same
    # keeps chunks inside sentences and matches it even on odd tags (an 'O' carries type '_').
    flat_true += list(true_tags) + ['O']
    flat_pred += list(pred_tags) + ['O']
  true_chunks = set(conll_entities(flat_true))
  pred_chunks = set(conll_entities(flat_pred))
  tp = len(true_chunks & pred_chunks)
  precision = tp / len(pred_chunks) if pred_chunks else 0.0
  recall = tp / len(true_chunks) if true_chunks else 0.0
  # seqeval forms F1 from precision and recall, not from counts; the same order keeps the last bit.
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {'precision': precision, 'recall': recall, 'f1': f1}

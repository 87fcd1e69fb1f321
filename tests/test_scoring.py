"""Tests for bert_jax.tasks.scoring: hand-computed cases and parity with the official scorers."""

import collections
import json
import math
import re
import string
import warnings

from conftest import shared_data_dir
import numpy as np
import pytest

from bert_jax.tasks import scoring

# GLUE: hand-computed cases ----------------------------------------------------------------------


def test_accuracy():
  assert scoring.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
  assert scoring.accuracy(np.array([2, 0, 1]), np.array([2, 0, 1])) == 1.0
  with pytest.raises(ValueError):
    scoring.accuracy([1, 0], [1])
  with pytest.raises(ValueError):
    scoring.accuracy([], [])


def test_binary_f1():
  # tp=2 (positions 0, 4), fp=1 (1), fn=1 (2): P = R = 2/3, F1 = 2/3.
  assert scoring.binary_f1([1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == pytest.approx(2 / 3)
  # tp=1, fp=0, fn=2: P=1, R=1/3, F1 = 2*1*(1/3)/(4/3) = 1/2.
  assert scoring.binary_f1([1, 0, 0], [1, 1, 1]) == pytest.approx(0.5)
  # No positive predicted or true: undefined, sklearn's zero_division gives 0.0.
  assert scoring.binary_f1([0, 0, 0], [0, 0, 0]) == 0.0
  assert scoring.binary_f1([1, 1], [0, 0]) == 0.0
  assert scoring.binary_f1([0, 0], [1, 1]) == 0.0


def test_matthews_corrcoef():
  # Confusion matrix tp=3, tn=2, fp=1, fn=2:
  # MCC = (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (6 - 2) / sqrt(4*5*3*4)
  #     = 4 / sqrt(240) = 0.2581988897...
  labels = [1, 1, 1, 0, 0, 1, 1, 0]
  preds = [1, 1, 1, 0, 0, 0, 0, 1]
  assert scoring.matthews_corrcoef(preds, labels) == pytest.approx(4 / math.sqrt(240))
  assert scoring.matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]) == pytest.approx(1.0)
  assert scoring.matthews_corrcoef([1, 0, 0, 1], [0, 1, 1, 0]) == pytest.approx(-1.0)
  # A constant prediction leaves MCC undefined: 0.0, as sklearn (CoLA's degenerate classifier).
  assert scoring.matthews_corrcoef([1, 1, 1, 1], [0, 1, 1, 0]) == 0.0
  assert scoring.matthews_corrcoef([1, 1], [1, 1]) == 0.0


def test_pearson():
  # xm = [-1, 0, 1], ym = [-7/3, -1/3, 8/3]: r = 5 / (sqrt(2) * sqrt(114)/3) = 15 / sqrt(228).
  assert scoring.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(15 / math.sqrt(228))
  assert scoring.pearson([1, 2, 3], [6, 4, 2]) == pytest.approx(-1.0)
  assert math.isnan(scoring.pearson([1, 1, 1], [1, 2, 3]))  # Constant input, as scipy: nan.
  with pytest.raises(ValueError):
    scoring.pearson([1], [2])


def test_spearman_with_ties():
  # Average ranks: x -> [1, 2.5, 2.5, 4], y -> [1, 3, 2, 4]; centred [-1.5, 0, 0, 1.5] and
  # [-1.5, .5, -.5, 1.5]: rho = 4.5 / sqrt(4.5 * 5) = 0.9486832980...
  assert scoring.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
  # Monotone but not linear: rank correlation is exactly 1 while Pearson is not.
  x = np.array([0.1, 0.5, 2.0, 3.0, 10.0])
  assert scoring.spearman(x, x**3) == pytest.approx(1.0)
  assert scoring.pearson(x, x**3) < 0.99
  # Three-way tie at the top: ranks [1, 3, 3, 3].
  assert scoring.spearman([5, 9, 9, 9], [1, 2, 3, 4]) == pytest.approx(
      scoring.pearson([1, 3, 3, 3], [1, 2, 3, 4]))


# GLUE: parity with sklearn and scipy ------------------------------------------------------------


@pytest.mark.parametrize('seed', range(5))
def test_classification_parity_with_sklearn(seed):
  metrics = pytest.importorskip('sklearn.metrics')
  rng = np.random.default_rng(seed)
  n = int(rng.integers(5, 300))
  labels = rng.integers(0, 2, n)
  preds = np.where(rng.random(n) < 0.7, labels, 1 - labels)
  assert scoring.accuracy(preds, labels) == pytest.approx(metrics.accuracy_score(labels, preds),
                                                          abs=1e-15)
  assert scoring.binary_f1(preds, labels) == pytest.approx(metrics.f1_score(labels, preds),
                                                           abs=1e-15)
  assert scoring.matthews_corrcoef(preds, labels) == pytest.approx(
      metrics.matthews_corrcoef(labels, preds), abs=1e-12)
  # MNLI-like three classes for the multiclass MCC form.
  labels3 = rng.integers(0, 3, n)
  preds3 = np.where(rng.random(n) < 0.5, labels3, rng.integers(0, 3, n))
  assert scoring.matthews_corrcoef(preds3, labels3) == pytest.approx(
      metrics.matthews_corrcoef(labels3, preds3), abs=1e-12)


@pytest.mark.parametrize('seed', range(5))
def test_correlation_parity_with_scipy(seed):
  stats = pytest.importorskip('scipy.stats')
  rng = np.random.default_rng(seed)
  n = int(rng.integers(3, 300))
  x = rng.normal(size=n)
  y = 0.6 * x + rng.normal(size=n)
  assert scoring.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
  assert scoring.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
  # STS-B-like scores on a 0..5 grid in steps of 0.2: many ties.
  xt = np.round(rng.uniform(0, 5, n) * 5) / 5
  yt = np.round(np.clip(xt + rng.normal(scale=1.0, size=n), 0, 5))
  assert scoring.spearman(xt, yt) == pytest.approx(stats.spearmanr(xt, yt)[0], abs=1e-12)
  assert scoring.pearson(xt, yt) == pytest.approx(stats.pearsonr(xt, yt)[0], abs=1e-12)


# SQuAD: hand-computed cases ---------------------------------------------------------------------


def test_squad_normalize():
  # lower -> "the  cat's!", punctuation out -> "the  cats", article out -> "   cats" -> "cats".
  assert scoring.squad_normalize("The  Cat's!") == 'cats'
  assert scoring.squad_normalize('An apple a day\tkeeps THE doctor away.') == (
      'apple day keeps doctor away')
  assert scoring.squad_normalize('theater anaconda') == 'theater anaconda'  # Whole words only.
  # Punctuation goes before articles, so "the,cat" fuses into one token and keeps its "the".
  assert scoring.squad_normalize('the,cat') == 'thecat'
  assert scoring.squad_normalize('a-b') == 'ab'
  assert scoring.squad_normalize(' The. ') == ''


def test_squad_exact_match():
  assert scoring.squad_exact_match('The Cat', 'cat!') == 1.0
  assert scoring.squad_exact_match('cats', 'cat') == 0.0
  assert scoring.squad_exact_match('', 'the') == 1.0  # Both normalize to ''.


def test_squad_f1():
  # Tokens [cat, sat, on, mat] vs [cat, on, mat]: 3 shared, P = 3/4, R = 1, F1 = 6/7.
  assert scoring.squad_f1('the cat sat on the mat', 'a cat on a mat') == pytest.approx(6 / 7)
  # Counter overlap: "cat" counts once, P = 1/3, R = 1, F1 = 1/2.
  assert scoring.squad_f1('cat cat cat', 'cat') == pytest.approx(0.5)
  assert scoring.squad_f1('dog', 'cat') == 0.0
  # v1.1 gives 0 when nothing overlaps, empty included; v2.0 scores empty against empty as 1.
  assert scoring.squad_f1('', '') == 0.0
  assert scoring.squad_f1('', '', v2=True) == 1.0
  assert scoring.squad_f1('the', '', v2=True) == 1.0
  assert scoring.squad_f1('cat', '', v2=True) == 0.0
  assert scoring.squad_f1('', 'cat', v2=True) == 0.0
  assert scoring.squad_f1('the cat', 'cat', v2=True) == 1.0


def _qa(qid, *answers):
  """Returns a SQuAD question dict with the given answer texts."""
  return {'id': qid, 'question': '?', 'answers': [{'text': t, 'answer_start': 0} for t in answers]}


def _dataset(*qas):
  """Returns a SQuAD 'data' list holding the given questions in one paragraph."""
  return [{'title': 't', 'paragraphs': [{'context': 'c', 'qas': list(qas)}]}]


def test_squad_v1_evaluate_by_hand():
  data = _dataset(_qa('q1', 'Denver Broncos', 'Broncos'), _qa('q2', 'blue whale'),
                  _qa('q3', 'Paris'))
  # q1: max over golds -> "broncos" matches the second exactly (EM 1, F1 1).
  # q2: "whale" vs "blue whale": P = 1, R = 1/2, F1 = 2/3, EM 0. q3: missing, scores 0.
  result = scoring.squad_v1_evaluate(data, {'q1': 'the Broncos', 'q2': 'whale'})
  assert result['exact_match'] == pytest.approx(100 / 3)
  assert result['f1'] == pytest.approx(100 * (1 + 2 / 3) / 3)
  assert set(result) == {'exact_match', 'f1'}


def _threshold_dataset():
  """Returns a 4-question v2 dataset, its predictions and no-answer probabilities."""
  data = _dataset(_qa('q1', 'Paris'), _qa('q2', 'blue whale'), _qa('q3'), _qa('q4'))
  preds = {'q1': 'Paris', 'q2': 'whale', 'q3': '', 'q4': 'London'}
  na_probs = {'q1': 0.1, 'q2': 0.6, 'q3': 0.9, 'q4': 0.7}
  return data, preds, na_probs


def test_squad_v2_evaluate_by_hand():
  data, preds, na_probs = _threshold_dataset()
  # Raw exact: q1 1, q2 0, q3 1 ('' vs ''), q4 0. Raw F1: 1, 2/3, 1, 0.
  result = scoring.squad_v2_evaluate(data, preds)
  expected = {'exact': 50.0, 'f1': 100 * (8 / 3) / 4, 'total': 4,
              'HasAns_exact': 50.0, 'HasAns_f1': 100 * (5 / 3) / 2, 'HasAns_total': 2,
              'NoAns_exact': 50.0, 'NoAns_f1': 50.0, 'NoAns_total': 2}
  assert list(result) == list(expected)
  assert result == pytest.approx(expected)

  # Threshold 0.5 turns q2 (0.6), q4 (0.7) and q3 (0.9) into abstentions: q2 loses (it has an
  # answer), q4 now scores 1, q3 stays 1. Exact and F1: [1, 0, 1, 1] -> 75.
  #
  # find_best_thresh starts from 2 (abstain on all: the two unanswerables score) and walks the
  # questions by na_prob q1 .1, q2 .6, q4 .7, q3 .9, answering each:
  #   exact: q1 +1 -> 3 (best, thresh .1); q2 +0 -> 3; q4 "London" -1 -> 2; q3 '' +0 -> 2.
  #   f1:    q1 +1 -> 3 (best, .1); q2 +2/3 -> 3.667 (best, .6); q4 -1; q3 +0.
  result = scoring.squad_v2_evaluate(data, preds, na_probs=na_probs, na_prob_thresh=0.5)
  expected = {'exact': 75.0, 'f1': 75.0, 'total': 4,
              'HasAns_exact': 50.0, 'HasAns_f1': 50.0, 'HasAns_total': 2,
              'NoAns_exact': 100.0, 'NoAns_f1': 100.0, 'NoAns_total': 2,
              'best_exact': 75.0, 'best_exact_thresh': 0.1,
              'best_f1': 100 * (11 / 3) / 4, 'best_f1_thresh': 0.6}
  assert list(result) == list(expected)
  assert result == pytest.approx(expected)


def test_squad_v2_evaluate_subsets_and_missing():
  # Only answerable questions: no NoAns_* keys, as the official script.
  result = scoring.squad_v2_evaluate(_dataset(_qa('q1', 'x y')), {'q1': 'x'})
  assert list(result) == ['exact', 'f1', 'total', 'HasAns_exact', 'HasAns_f1', 'HasAns_total']
  # An answer that normalizes to nothing leaves [''] as the gold, yet the question still counts
  # as HasAns (bool of the raw answers list), exactly as the official script.
  result = scoring.squad_v2_evaluate(_dataset(_qa('q1', 'The')), {'q1': ''})
  assert result['HasAns_exact'] == 100.0 and 'NoAns_total' not in result
  # The official script crashes on missing predictions; we say which.
  with pytest.raises(ValueError, match='no prediction'):
    scoring.squad_v2_evaluate(_dataset(_qa('q1', 'x'), _qa('q2')), {'q1': 'x'})


# SQuAD v1.1: parity with the official script on the real dev set ------------------------------
#
# Faithful transcription of the published SQuAD v1.1 evaluation script (evaluate-v1.1.py,
# https://rajpurkar.github.io/SQuAD-explorer/): normalize_answer, f1_score, exact_match_score,
# metric_max_over_ground_truths and evaluate, logic unchanged (2-space indentation; the
# stderr message for unanswered questions dropped).


def _ref_v1_normalize_answer(s):
  """Lower text and remove punctuation, articles and extra whitespace."""
  def remove_articles(text):
    return re.sub(r'\b(a|an|the)\b', ' ', text)

  def white_space_fix(text):
    return ' '.join(text.split())

  def remove_punc(text):
    exclude = set(string.punctuation)
    return ''.join(ch for ch in text if ch not in exclude)

  def lower(text):
    return text.lower()

  return white_space_fix(remove_articles(remove_punc(lower(s))))


def _ref_v1_f1_score(prediction, ground_truth):
  """Official v1.1 f1_score."""
  prediction_tokens = _ref_v1_normalize_answer(prediction).split()
  ground_truth_tokens = _ref_v1_normalize_answer(ground_truth).split()
  common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0
  precision = 1.0 * num_same / len(prediction_tokens)
  recall = 1.0 * num_same / len(ground_truth_tokens)
  f1 = (2 * precision * recall) / (precision + recall)
  return f1


def _ref_v1_exact_match_score(prediction, ground_truth):
  """Official v1.1 exact_match_score."""
  return (_ref_v1_normalize_answer(prediction) == _ref_v1_normalize_answer(ground_truth))


def _ref_v1_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
  """Official v1.1 metric_max_over_ground_truths."""
  scores_for_ground_truths = []
  for ground_truth in ground_truths:
    score = metric_fn(prediction, ground_truth)
    scores_for_ground_truths.append(score)
  return max(scores_for_ground_truths)


def _ref_v1_evaluate(dataset, predictions):
  """Official v1.1 evaluate."""
  f1 = exact_match = total = 0
  for article in dataset:
    for paragraph in article['paragraphs']:
      for qa in paragraph['qas']:
        total += 1
        if qa['id'] not in predictions:
          continue
        ground_truths = list(map(lambda x: x['text'], qa['answers']))
        prediction = predictions[qa['id']]
        exact_match += _ref_v1_metric_max_over_ground_truths(
            _ref_v1_exact_match_score, prediction, ground_truths)
        f1 += _ref_v1_metric_max_over_ground_truths(
            _ref_v1_f1_score, prediction, ground_truths)
  exact_match = 100.0 * exact_match / total
  f1 = 100.0 * f1 / total
  return {'exact_match': exact_match, 'f1': f1}


def _perturbed_predictions(dataset, seed):
  """Returns predictions mixing right, partial, padded, empty, wrong and missing answers."""
  rng = np.random.default_rng(seed)
  predictions = {}
  for article in dataset:
    for paragraph in article['paragraphs']:
      context_words = paragraph['context'].split()
      for qa in paragraph['qas']:
        gold = qa['answers'][0]['text']
        words = gold.split()
        kind = int(rng.integers(0, 8))
        if kind == 0:
          predictions[qa['id']] = gold
        elif kind == 1:  # Truncated: F1 in (0, 1) for multi-word answers.
          predictions[qa['id']] = ' '.join(words[:max(1, len(words) // 2)])
        elif kind == 2:  # Articles, case and punctuation that normalization strips.
          predictions[qa['id']] = f'The {gold.upper()}, .'
        elif kind == 3:  # Extra words: F1 < 1, EM 0.
          predictions[qa['id']] = f'{gold} and an answer'
        elif kind == 4:
          predictions[qa['id']] = ''
        elif kind == 5:  # A random span of the context, usually wrong, sometimes overlapping.
          start = int(rng.integers(0, len(context_words)))
          length = int(rng.integers(1, 6))
          predictions[qa['id']] = ' '.join(context_words[start:start + length])
        elif kind == 6:  # The last gold answer (max over golds must find it).
          predictions[qa['id']] = qa['answers'][-1]['text']
        # kind 7: no prediction at all, scores 0.
  return predictions


@pytest.mark.slow
def test_squad_v1_parity_with_official_script_on_dev():
  path = shared_data_dir() / 'squad' / 'dev-v1.1.json'
  with open(path, encoding='utf-8') as f:
    dataset = json.load(f)['data']
  predictions = _perturbed_predictions(dataset, seed=0)
  ours = scoring.squad_v1_evaluate(dataset, predictions)
  reference = _ref_v1_evaluate(dataset, predictions)
  assert ours == reference  # Exactly, not approximately.
  assert 20 < ours['exact_match'] < 80 and ours['exact_match'] < ours['f1'] < 90
  # Right answers alone score 100.
  golds = {qa['id']: qa['answers'][0]['text']
           for article in dataset for p in article['paragraphs'] for qa in p['qas']}
  assert scoring.squad_v1_evaluate(dataset, golds) == {'exact_match': 100.0, 'f1': 100.0}


# SQuAD v2.0: parity with the official script's core on a synthetic dataset ----------------------
#
# Faithful transcription of the core of the published SQuAD v2.0 evaluation script
# (evaluate-v2.0.py, https://rajpurkar.github.io/SQuAD-explorer/): make_qid_to_has_ans,
# normalize_answer, get_tokens, compute_exact, compute_f1, get_raw_scores, apply_no_ans_threshold,
# make_eval_dict, merge_eval, find_best_thresh, find_all_best_thresh and the scoring part of main()
# (file reading, printing and plotting dropped; logic unchanged).


def _ref_v2_make_qid_to_has_ans(dataset):
  """Official v2.0 make_qid_to_has_ans."""
  qid_to_has_ans = {}
  for article in dataset:
    for p in article['paragraphs']:
      for qa in p['qas']:
        qid_to_has_ans[qa['id']] = bool(qa['answers'])
  return qid_to_has_ans


def _ref_v2_normalize_answer(s):
  """Lower text and remove punctuation, articles and extra whitespace."""
  def remove_articles(text):
    regex = re.compile(r'\b(a|an|the)\b', re.UNICODE)
    return re.sub(regex, ' ', text)

  def white_space_fix(text):
    return ' '.join(text.split())

  def remove_punc(text):
    exclude = set(string.punctuation)
    return ''.join(ch for ch in text if ch not in exclude)

  def lower(text):
    return text.lower()

  return white_space_fix(remove_articles(remove_punc(lower(s))))


def _ref_v2_get_tokens(s):
  """Official v2.0 get_tokens."""
  if not s:
    return []
  return _ref_v2_normalize_answer(s).split()


def _ref_v2_compute_exact(a_gold, a_pred):
  """Official v2.0 compute_exact."""
  return int(_ref_v2_normalize_answer(a_gold) == _ref_v2_normalize_answer(a_pred))


def _ref_v2_compute_f1(a_gold, a_pred):
  """Official v2.0 compute_f1."""
  gold_toks = _ref_v2_get_tokens(a_gold)
  pred_toks = _ref_v2_get_tokens(a_pred)
  common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
  num_same = sum(common.values())
  if len(gold_toks) == 0 or len(pred_toks) == 0:
    # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
    return int(gold_toks == pred_toks)
  if num_same == 0:
    return 0
  precision = 1.0 * num_same / len(pred_toks)
  recall = 1.0 * num_same / len(gold_toks)
  f1 = (2 * precision * recall) / (precision + recall)
  return f1


def _ref_v2_get_raw_scores(dataset, preds):
  """Official v2.0 get_raw_scores."""
  exact_scores = {}
  f1_scores = {}
  for article in dataset:
    for p in article['paragraphs']:
      for qa in p['qas']:
        qid = qa['id']
        gold_answers = [a['text'] for a in qa['answers'] if _ref_v2_normalize_answer(a['text'])]
        if not gold_answers:
          # For unanswerable questions, only correct answer is empty string
          gold_answers = ['']
        if qid not in preds:
          continue
        a_pred = preds[qid]
        # Take max over all gold answers
        exact_scores[qid] = max(_ref_v2_compute_exact(a, a_pred) for a in gold_answers)
        f1_scores[qid] = max(_ref_v2_compute_f1(a, a_pred) for a in gold_answers)
  return exact_scores, f1_scores


def _ref_v2_apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
  """Official v2.0 apply_no_ans_threshold."""
  new_scores = {}
  for qid, s in scores.items():
    pred_na = na_probs[qid] > na_prob_thresh
    if pred_na:
      new_scores[qid] = float(not qid_to_has_ans[qid])
    else:
      new_scores[qid] = s
  return new_scores


def _ref_v2_make_eval_dict(exact_scores, f1_scores, qid_list=None):
  """Official v2.0 make_eval_dict."""
  if not qid_list:
    total = len(exact_scores)
    return collections.OrderedDict([
        ('exact', 100.0 * sum(exact_scores.values()) / total),
        ('f1', 100.0 * sum(f1_scores.values()) / total),
        ('total', total),
    ])
  else:
    total = len(qid_list)
    return collections.OrderedDict([
        ('exact', 100.0 * sum(exact_scores[k] for k in qid_list) / total),
        ('f1', 100.0 * sum(f1_scores[k] for k in qid_list) / total),
        ('total', total),
    ])


def _ref_v2_merge_eval(main_eval, new_eval, prefix):
  """Official v2.0 merge_eval."""
  for k in new_eval:
    main_eval['%s_%s' % (prefix, k)] = new_eval[k]


def _ref_v2_find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
  """Official v2.0 find_best_thresh."""
  num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
  cur_score = num_no_ans
  best_score = cur_score
  best_thresh = 0.0
  qid_list = sorted(na_probs, key=lambda k: na_probs[k])
  for _, qid in enumerate(qid_list):
    if qid not in scores:
      continue
    if qid_to_has_ans[qid]:
      diff = scores[qid]
    else:
      if preds[qid]:
        diff = -1
      else:
        diff = 0
    cur_score += diff
    if cur_score > best_score:
      best_score = cur_score
      best_thresh = na_probs[qid]
  return 100.0 * best_score / len(scores), best_thresh


def _ref_v2_find_all_best_thresh(main_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans):
  """Official v2.0 find_all_best_thresh."""
  best_exact, exact_thresh = _ref_v2_find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
  best_f1, f1_thresh = _ref_v2_find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
  main_eval['best_exact'] = best_exact
  main_eval['best_exact_thresh'] = exact_thresh
  main_eval['best_f1'] = best_f1
  main_eval['best_f1_thresh'] = f1_thresh


def _ref_v2_main(dataset, preds, na_prob_file_probs, na_prob_thresh):
  """The scoring part of official v2.0 main(); na_prob_file_probs=None means no --na-prob-file."""
  if na_prob_file_probs is not None:
    na_probs = na_prob_file_probs
  else:
    na_probs = {k: 0.0 for k in preds}
  qid_to_has_ans = _ref_v2_make_qid_to_has_ans(dataset)  # maps qid to True/False
  has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
  no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
  exact_raw, f1_raw = _ref_v2_get_raw_scores(dataset, preds)
  exact_thresh = _ref_v2_apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans,
                                                na_prob_thresh)
  f1_thresh = _ref_v2_apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
  out_eval = _ref_v2_make_eval_dict(exact_thresh, f1_thresh)
  if has_ans_qids:
    has_ans_eval = _ref_v2_make_eval_dict(exact_thresh, f1_thresh, qid_list=has_ans_qids)
    _ref_v2_merge_eval(out_eval, has_ans_eval, 'HasAns')
  if no_ans_qids:
    no_ans_eval = _ref_v2_make_eval_dict(exact_thresh, f1_thresh, qid_list=no_ans_qids)
    _ref_v2_merge_eval(out_eval, no_ans_eval, 'NoAns')
  if na_prob_file_probs is not None:
    _ref_v2_find_all_best_thresh(out_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans)
  return out_eval


_WORDS = ('the river denver broncos super bowl a an of in blue whale paris museum city '
          'nineteen sixty two tesla coil energy war treaty king queen').split()


def _synthetic_v2(seed, num_questions=300):
  """Returns a synthetic v2 dataset (a third unanswerable), predictions and na_probs."""
  rng = np.random.default_rng(seed)

  def phrase(lo, hi):
    return ' '.join(rng.choice(_WORDS, int(rng.integers(lo, hi))))

  qas, preds, na_probs = [], {}, {}
  for i in range(num_questions):
    qid = f'q{i}'
    kind = int(rng.integers(0, 3))
    if kind == 0:
      golds = []  # Unanswerable.
    else:
      golds = [phrase(1, 5) for _ in range(int(rng.integers(1, 4)))]
      if rng.random() < 0.05:
        golds = ['The']  # Answerable, but every gold normalizes to ''.
    qas.append(_qa(qid, *golds))
    pick = int(rng.integers(0, 6))
    if pick == 0 and golds:
      preds[qid] = str(rng.choice(golds))
    elif pick == 1 and golds:
      preds[qid] = golds[0].split()[0] + ' ' + phrase(0, 3)
    elif pick == 2:
      preds[qid] = ''
    elif pick == 3:
      preds[qid] = rng.choice(['a', 'The.', ' '])  # Non-empty but normalizes to ''.
    else:
      preds[qid] = phrase(1, 4)
    # Coarse probabilities give ties, which find_best_thresh resolves by sort order.
    na_probs[qid] = float(np.round(rng.random(), 1))
  return _dataset(*qas), preds, na_probs


@pytest.mark.parametrize('seed', range(3))
def test_squad_v2_parity_with_official_script(seed):
  dataset, preds, na_probs = _synthetic_v2(seed)
  for probs, thresh in ((None, 1.0), (na_probs, 1.0), (na_probs, 0.5), (na_probs, 0.0)):
    ours = scoring.squad_v2_evaluate(dataset, preds, na_probs=probs, na_prob_thresh=thresh)
    reference = _ref_v2_main(dataset, preds, probs, thresh)
    assert list(ours) == list(reference)
    assert ours == dict(reference)  # Exactly, not approximately.
  assert 0 < ours['HasAns_f1'] < 100 and 0 < ours['NoAns_exact'] < 100


# CoNLL-2003 NER ---------------------------------------------------------------------------------

# (tags, chunks) fixtures; the chunks are what seqeval 1.2.2's get_entities returns for them.
_CHUNK_CASES = [
    # IOB1, as the raw CoNLL-2003 files: I- opens an entity after O; B- only splits two adjacent
    # entities of one type; an entity at the end of the sentence still closes.
    (['I-PER', 'I-PER', 'O', 'I-LOC', 'B-LOC', 'O', 'I-ORG'],
     [('PER', 0, 1), ('LOC', 3, 3), ('LOC', 4, 4), ('ORG', 6, 6)]),
    # IOB2 with two adjacent PER entities.
    (['B-PER', 'I-PER', 'B-PER', 'O', 'B-MISC', 'I-MISC'],
     [('PER', 0, 1), ('PER', 2, 2), ('MISC', 4, 5)]),
    # A stray I- after a different type starts a new entity.
    (['B-PER', 'I-LOC', 'I-LOC', 'O'], [('PER', 0, 0), ('LOC', 1, 2)]),
    (['I-PER', 'B-PER', 'I-PER', 'I-LOC'], [('PER', 0, 0), ('PER', 1, 2), ('LOC', 3, 3)]),
    # IOBES: S- is a whole entity, E- closes one, an I- after E- opens the next.
    (['S-PER', 'B-LOC', 'E-LOC', 'I-LOC', 'E-LOC', 'O', 'S-MISC'],
     [('PER', 0, 0), ('LOC', 1, 2), ('LOC', 3, 4), ('MISC', 6, 6)]),
    # Bare prefixes without a type get seqeval's type '_'; I- after O still opens one.
    (['O', 'I', 'I', 'O', 'B', 'I'], [('_', 1, 2), ('_', 4, 5)]),
    (['O', 'O'], []),
    ([], []),
]


@pytest.mark.parametrize('tags,chunks', _CHUNK_CASES)
def test_conll_entities(tags, chunks):
  assert scoring.conll_entities(tags) == chunks


# Three sentences: 8 true chunks (4 + 3 + 1), 6 predicted (3 + 2 + 1), 3 shared (PER 0-1 and
# ORG 6-6 of sentence 0, MISC 4-5 of sentence 1): P = 3/6, R = 3/8, F1 = 2PR/(P+R) = 3/7.
_NER_TRUE = [
    ['I-PER', 'I-PER', 'O', 'I-LOC', 'B-LOC', 'O', 'I-ORG'],
    ['B-PER', 'I-PER', 'B-PER', 'O', 'B-MISC', 'I-MISC'],
    ['O', 'B-ORG', 'I-ORG', 'O'],
]
_NER_PRED = [
    ['B-PER', 'I-PER', 'O', 'I-LOC', 'I-LOC', 'O', 'I-ORG'],  # LOC 3-4 merges two true LOCs.
    ['B-PER', 'I-PER', 'I-PER', 'O', 'B-MISC', 'I-MISC'],  # PER 0-2 merges two true PERs.
    ['B-ORG', 'I-ORG', 'I-ORG', 'O'],  # ORG 0-2 overshoots ORG 1-2.
]


def test_entity_scores_fixture():
  # seqeval 1.2.2's precision_score, recall_score and f1_score on _NER_TRUE/_NER_PRED gave
  # 0.5, 0.375 and 0.42857142857142855.
  result = scoring.entity_scores(_NER_TRUE, _NER_PRED)
  assert result == {'precision': 0.5, 'recall': 0.375, 'f1': 0.42857142857142855}
  assert scoring.entity_scores(_NER_TRUE, _NER_TRUE) == {'precision': 1.0, 'recall': 1.0,
                                                         'f1': 1.0}
  # No entities anywhere, or none predicted: seqeval (zero_division='warn') gives 0.0 for all.
  assert scoring.entity_scores([['O']], [['O']]) == {'precision': 0.0, 'recall': 0.0, 'f1': 0.0}
  assert scoring.entity_scores([['B-PER']], [['O']]) == {'precision': 0.0, 'recall': 0.0,
                                                         'f1': 0.0}
  # Chunks never run across sentences: I-PER ending one and starting the next are two entities.
  assert scoring.entity_scores([['I-PER'], ['I-PER']], [['I-PER'], ['I-PER']])['precision'] == 1.0
  assert scoring.entity_scores([['I-PER', 'I-PER']], [['I-PER', 'B-PER']])['f1'] == 0.0
  with pytest.raises(ValueError):
    scoring.entity_scores([['O', 'O']], [['O']])


_TAGS = ['O', 'O', 'O', 'B-PER', 'I-PER', 'E-PER', 'S-PER', 'B-LOC', 'I-LOC', 'I-ORG', 'B-ORG',
         'I-MISC']


def test_parity_with_seqeval():
  seqeval_metrics = pytest.importorskip('seqeval.metrics')
  get_entities = pytest.importorskip('seqeval.metrics.sequence_labeling').get_entities
  for tags, _ in _CHUNK_CASES:
    assert scoring.conll_entities(tags) == get_entities(tags)
  rng = np.random.default_rng(0)
  for _ in range(200):
    true = [[str(t) for t in rng.choice(_TAGS, int(rng.integers(0, 10)))]
            for _ in range(int(rng.integers(1, 5)))]
    # Mostly right, so the scores usually land strictly between 0 and 1.
    pred = [[str(rng.choice(_TAGS)) if rng.random() < 0.3 else t for t in s] for s in true]
    for s in true + pred:
      assert scoring.conll_entities(s) == get_entities(s)
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')  # seqeval warns where a score is undefined (0.0).
      expected = {'precision': seqeval_metrics.precision_score(true, pred),
                  'recall': seqeval_metrics.recall_score(true, pred),
                  'f1': seqeval_metrics.f1_score(true, pred)}
    assert scoring.entity_scores(true, pred) == {k: float(v) for k, v in expected.items()}

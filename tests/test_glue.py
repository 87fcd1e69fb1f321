"""Tests for bert_jax.tasks.glue."""

import collections
import re
import sys
import types

from conftest import shared_data_dir
import numpy as np
import pytest

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import base
from bert_jax.tasks import glue

_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'cat', 'sat', 'on', 'mat', 'a',
           'dog', 'ran', '.', '"')
ID = {token: i for i, token in enumerate(_TOKENS)}
CLS, SEP = ID['[CLS]'], ID['[SEP]']

_MNLI_TRAIN_HEADER = ('index', 'promptID', 'pairID', 'genre', 'sentence1_binary_parse',
                      'sentence2_binary_parse', 'sentence1_parse', 'sentence2_parse',
                      'sentence1', 'sentence2', 'label1', 'gold_label')
_MNLI_DEV_HEADER = _MNLI_TRAIN_HEADER[:-1] + ('label2', 'label3', 'label4', 'label5',
                                              'gold_label')
_STSB_HEADER = ('index', 'genre', 'filename', 'year', 'old_index', 'source1', 'source2',
                'sentence1', 'sentence2', 'score')


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
  """A lowercasing tokenizer over a vocab of whole words."""
  path = tmp_path_factory.mktemp('vocab') / 'vocab.txt'
  path.write_text(''.join(token + '\n' for token in _TOKENS), encoding='utf-8')
  return tokenizer_lib.WordPieceTokenizer(str(path), lowercase=True)


def write_tsv(path, rows, bom=False):
  """Writes tab-joined rows, one per line; returns the path as a string."""
  text = ''.join('\t'.join(row) + '\n' for row in rows)
  path.write_text(('\ufeff' if bom else '') + text, encoding='utf-8')
  return str(path)


def mnli_row(index, a, b, labels):
  return (str(index), '0', f'{index}e', 'fiction', '( a )', '( b )', '(ROOT a)', '(ROOT b)',
          a, b) + tuple(labels)


def reference_truncation(len_a, len_b, budget):
  """BERT's _truncate_seq_pair on lengths: pop the longer (b on ties) one at a time."""
  while len_a + len_b > budget:
    if len_a > len_b:
      len_a -= 1
    else:
      len_b -= 1
  return len_a, len_b


def test_truncation_matches_pop_from_longer_loop():
  a, b, budget = np.meshgrid(np.arange(13), np.arange(13), np.arange(0, 13), indexing='ij')
  got_a, got_b = glue.truncated_lengths(a.ravel(), b.ravel(), budget.ravel())
  expected = [reference_truncation(*x) for x in zip(a.ravel(), b.ravel(), budget.ravel())]
  np.testing.assert_array_equal(np.stack([got_a, got_b], 1), np.array(expected))


def test_pair_layout_golden(tokenizer):
  examples = [glue.Example('0', 'the cat sat on the mat', 'a dog ran', '1'),
              glue.Example('1', 'the cat', 'a dog', '0')]
  split = glue.encode(examples, tokenizer, 10, ('0', '1'))
  t = ID
  # 6 + 3 pieces in a budget of 7: a (the longer) loses its last 2 pieces, b stays whole.
  np.testing.assert_array_equal(split.features['input_ids'], [
      [CLS, t['the'], t['cat'], t['sat'], t['on'], SEP, t['a'], t['dog'], t['ran'], SEP],
      [CLS, t['the'], t['cat'], SEP, t['a'], t['dog'], SEP, 0, 0, 0]])
  np.testing.assert_array_equal(split.features['segment_ids'], [
      [0, 0, 0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(split.features['input_mask'], [
      [1] * 10, [1] * 7 + [0] * 3])
  np.testing.assert_array_equal(split.features['label'], [1, 0])
  assert split.features['label'].dtype == np.int32
  assert all(v.dtype == np.int32 for k, v in split.features.items())
  assert split.num_examples == 2 and split.meta.guids == ['0', '1'] and split.meta.labelled


def test_pair_truncation_ties_pop_b(tokenizer):
  # 6 + 3 pieces in 5: a drops to 3 (= b), then the tie pops b.
  [row] = glue.encode([glue.Example('0', 'the cat sat on the mat', 'a dog ran', '1')],
                      tokenizer, 8, ('0', '1')).features['input_ids']
  t = ID
  np.testing.assert_array_equal(row, [CLS, t['the'], t['cat'], t['sat'], SEP, t['a'], t['dog'],
                                      SEP])


def test_single_sentence_truncates_to_two_less(tokenizer):
  split = glue.encode([glue.Example('0', 'the cat sat on the mat', None, None)], tokenizer, 5,
                      ('0', '1'))
  t = ID
  np.testing.assert_array_equal(split.features['input_ids'],
                                [[CLS, t['the'], t['cat'], t['sat'], SEP]])
  np.testing.assert_array_equal(split.features['segment_ids'], [[0] * 5])
  # A test example (no label) is encoded with the placeholder label 0.
  assert split.features['label'].tolist() == [0] and not split.meta.labelled


def test_empty_second_text_is_a_single_sentence(tokenizer):
  [row] = glue.encode([glue.Example('0', 'the cat', '', '1')], tokenizer, 6,
                      ('0', '1')).features['input_ids']
  np.testing.assert_array_equal(row, [CLS, ID['the'], ID['cat'], SEP, 0, 0])


def test_regression_labels_are_float32(tokenizer):
  split = glue.encode([glue.Example('0', 'the cat', 'a dog', 3.25)], tokenizer, 8, None)
  assert split.features['label'].dtype == np.float32
  assert split.features['label'].tolist() == [3.25]


def test_cola_reads_headerless_train_and_headed_test(tmp_path):
  train = write_tsv(tmp_path / 'train.tsv', [('gj04', '1', '', 'the cat sat .'),
                                             ('gj04', '0', '*', 'cat the sat .')])
  test = write_tsv(tmp_path / 'test.tsv', [('index', 'sentence'), ('0', 'the dog ran .')])
  assert glue.read_examples('cola', train) == [
      glue.Example('train.tsv-1', 'the cat sat .', None, '1'),
      glue.Example('train.tsv-2', 'cat the sat .', None, '0')]
  assert glue.read_examples('CoLA', test) == [glue.Example('0', 'the dog ran .', None, None)]


def test_mrpc_bom_and_quotes(tmp_path):
  header = ('Quality', '#1 ID', '#2 ID', '#1 String', '#2 String')
  path = write_tsv(tmp_path / 'dev.tsv', [header, ('1', '11', '12', 'the "cat', 'a dog"'),
                                          ('0', '13', '14', '"the" mat', 'ran')], bom=True)
  assert glue.read_examples('mrpc', path) == [
      glue.Example('dev.tsv-2', 'the "cat', 'a dog"', '1'),
      glue.Example('dev.tsv-3', '"the" mat', 'ran', '0')]


def test_stsb_float_scores_and_bad_score(tmp_path):
  good = write_tsv(tmp_path / 'dev.tsv', [_STSB_HEADER, ('0', 'main-captions', 'MSRvid', '2012',
                                                         '0000', 'none', 'none', 'the cat',
                                                         'a cat', '4.750')])
  [example] = glue.read_examples('stsb', good)
  assert example.label == 4.75 and example.text_b == 'a cat' and example.guid == '0'
  bad = write_tsv(tmp_path / 'bad.tsv', [_STSB_HEADER, ('0',) * 9 + ('4.0',),
                                         ('1',) * 9 + ('high',)])
  with pytest.raises(base.TaskError, match=re.escape(f'{bad}:3') + ".*'high'"):
    glue.read_examples('sts-b', bad)


def test_wrong_column_count_names_file_and_line(tmp_path):
  path = write_tsv(tmp_path / 'train.tsv', [('sentence', 'label'), ('the cat', '1'),
                                            ('the dog', '0', 'extra')])
  with pytest.raises(base.TaskError, match=re.escape(f'{path}:3') + '.*expected 2.*found 3'):
    glue.read_examples('sst2', path)


def test_unknown_label_names_file_and_line(tmp_path):
  path = write_tsv(tmp_path / 'dev.tsv', [('index', 'question', 'sentence', 'label'),
                                          ('0', 'a', 'b', 'entailment'),
                                          ('1', 'a', 'b', 'maybe')])
  with pytest.raises(base.TaskError, match=re.escape(f'{path}:3') + ".*'maybe'"):
    glue.read_examples('qnli', path)


def test_unknown_task_lists_valid_names():
  with pytest.raises(base.TaskError, match='squad.*cola.*stsb'):
    glue.GlueTask('squad', data_dir='/nonexistent')


def write_mnli(directory):
  write_tsv(directory / 'train.tsv', [_MNLI_TRAIN_HEADER,
                                      mnli_row(0, 'the cat', 'a cat', ['neutral', 'neutral']),
                                      mnli_row(1, 'the dog', 'a dog', ['entailment'] * 2),
                                      mnli_row(2, 'the mat', 'a cat', ['contradiction'] * 2)])
  write_tsv(directory / 'dev_matched.tsv', [
      _MNLI_DEV_HEADER, mnli_row(0, 'the cat sat', 'a cat', ['entailment'] * 6)])
  write_tsv(directory / 'dev_mismatched.tsv', [
      _MNLI_DEV_HEADER, mnli_row(0, 'the dog', 'a cat', ['contradiction'] * 6),
      mnli_row(1, 'the dog', 'a dog', ['neutral'] * 6)])


def test_mnli_has_two_dev_splits_in_bert_label_order(tmp_path, tokenizer):
  write_mnli(tmp_path)
  task = glue.GlueTask('mnli', str(tmp_path))
  assert (task.head, task.num_outputs, task.main_metric) == ('classification', 3, 'accuracy')
  splits = task.eval_splits(tokenizer, 8)
  assert sorted(splits) == ['dev_matched', 'dev_mismatched']
  # contradiction, entailment, neutral = 0, 1, 2, as the original BERT's MnliProcessor.
  assert splits['dev_matched'].features['label'].tolist() == [1]
  assert splits['dev_mismatched'].features['label'].tolist() == [0, 2]
  assert task.train_split(tokenizer, 8).features['label'].tolist() == [2, 1, 0]
  assert task.test_splits(tokenizer, 8) == {} and task.test_split(tokenizer, 8) is None


def test_max_train_examples_keeps_the_first(tmp_path, tokenizer):
  write_mnli(tmp_path)
  split = glue.GlueTask('mnli', str(tmp_path), max_train_examples=2).train_split(tokenizer, 8)
  assert split.num_rows == 2 and split.meta.guids == ['0', '1']


def test_missing_file_names_it_and_the_expected_folder(tmp_path, tokenizer):
  task = glue.GlueTask('sst2', str(tmp_path))
  with pytest.raises(base.TaskError, match=re.escape(str(tmp_path / 'train.tsv')) +
                     '.*SST-2.*train.tsv, dev.tsv'):
    task.train_split(tokenizer, 8)
  assert task.test_split(tokenizer, 8) is None


def test_dev_file_without_label_column_is_refused(tmp_path, tokenizer):
  write_tsv(tmp_path / 'dev.tsv', [('index', 'sentence'), ('0', 'the cat')])
  with pytest.raises(base.TaskError, match="dev.tsv.*'label'"):
    glue.GlueTask('sst2', str(tmp_path)).eval_splits(tokenizer, 8)


def test_score_classification_metrics_in_percent(tmp_path, tokenizer):
  write_tsv(tmp_path / 'dev.tsv', [('Quality', '#1 ID', '#2 ID', '#1 String', '#2 String')] +
            [(label, '1', '2', 'the cat', 'a dog') for label in '1011'])
  task = glue.GlueTask('mrpc', str(tmp_path))
  split = task.eval_splits(tokenizer, 8)['dev']
  logits = np.array([[0., 1.], [1., 0.], [1., 0.], [0., 1.]], np.float32)  # -> 1 0 0 1
  metrics, predictions = task.score('dev', split, {'logits': logits})
  # 2 true positives, 3 gold positives, 2 predicted: F1 = 4/5; 3 of 4 right.
  assert metrics == pytest.approx({'f1': 80.0, 'accuracy': 75.0})
  assert predictions == ['1', '0', '0', '1']


def test_score_cola_mcc_and_stsb_correlations(tokenizer):
  cola = glue.GlueTask('cola', '/unused')
  examples = [glue.Example(str(i), 'the cat', None, label) for i, label in enumerate('0110')]
  split = glue.encode(examples, tokenizer, 6, ('0', '1'))
  logits = np.array([[1., 0.], [0., 1.], [1., 0.], [1., 0.]])  # -> 0 1 0 0
  metrics, _ = cola.score('dev', split, {'logits': logits})
  # TP=1 TN=2 FP=0 FN=1: (1*2 - 0) / sqrt(1 * 2 * 3 * 2).
  assert metrics == pytest.approx({'mcc': 100 * 2 / np.sqrt(12)})
  stsb = glue.GlueTask('stsb', '/unused')
  examples = [glue.Example(str(i), 'the cat', 'a dog', s) for i, s in enumerate([0., 2., 5.])]
  split = glue.encode(examples, tokenizer, 8, None)
  metrics, predictions = stsb.score('dev', split, {'logits': np.array([[1.], [2.], [30.]])})
  assert metrics['spearman'] == pytest.approx(100.0)
  assert 0 < metrics['pearson'] < 100.0
  assert predictions == [1.0, 2.0, 30.0] and stsb.main_metric == 'spearman'


def test_test_split_scores_nothing_and_writes_submission(tmp_path, tokenizer):
  write_tsv(tmp_path / 'test.tsv', [('index', 'question', 'sentence'), ('0', 'the cat', 'a dog'),
                                    ('1', 'the mat', 'a cat')])
  task = glue.GlueTask('qnli', str(tmp_path))
  split = task.test_split(tokenizer, 8)
  assert split.features['label'].tolist() == [0, 0]
  metrics, predictions = task.score('test', split, {'logits': np.array([[0., 1.], [1., 0.]])})
  assert metrics == {} and predictions == ['not_entailment', 'entailment']
  [path] = task.write_predictions('test', predictions, str(tmp_path / 'out'))
  assert path.endswith('/QNLI.tsv')
  with open(path, encoding='utf-8') as f:
    assert f.read() == 'index\tprediction\n0\tnot_entailment\n1\tentailment\n'


def test_mnli_test_split_writes_both_leaderboard_files(tmp_path, tokenizer):
  header = _MNLI_TRAIN_HEADER[:-2]
  write_tsv(tmp_path / 'test_matched.tsv', [header, mnli_row(0, 'the cat', 'a cat', []),
                                            mnli_row(1, 'the dog', 'a dog', [])])
  write_tsv(tmp_path / 'test_mismatched.tsv', [header, mnli_row(0, 'the mat', 'a cat', [])])
  task = glue.GlueTask('mnli', str(tmp_path))
  assert sorted(task.test_splits(tokenizer, 8)) == ['test_matched', 'test_mismatched']
  split = task.test_split(tokenizer, 8)  # Matched rows, then mismatched.
  assert split.num_rows == 3 and split.meta.parts == [('test_matched', 2),
                                                      ('test_mismatched', 1)]
  logits = np.eye(3)[[2, 1, 0]]
  metrics, predictions = task.score('test', split, {'logits': logits})
  assert metrics == {} and predictions == {'test_matched': ['neutral', 'entailment'],
                                           'test_mismatched': ['contradiction']}
  paths = task.write_predictions('test', predictions, str(tmp_path / 'out'))
  assert [p.rsplit('/', 1)[1] for p in paths] == ['MNLI-m.tsv', 'MNLI-mm.tsv']
  with open(paths[0], encoding='utf-8') as f:
    assert f.read() == 'index\tprediction\n0\tneutral\n1\tentailment\n'
  with open(paths[1], encoding='utf-8') as f:
    assert f.read() == 'index\tprediction\n0\tcontradiction\n'


def test_stsb_submission_and_dev_file_names(tmp_path):
  task = glue.GlueTask('stsb', str(tmp_path))
  [path] = task.write_predictions('test', [1.5, 4.25], str(tmp_path))
  assert path.endswith('/STS-B.tsv')
  with open(path, encoding='utf-8') as f:
    assert f.read() == 'index\tprediction\n0\t1.500000\n1\t4.250000\n'
  assert task.write_predictions('dev', [2.0], str(tmp_path))[0].endswith('/stsb_dev.tsv')


def test_table_covers_the_paper_tasks():
  assert sorted(glue.TASKS) == ['cola', 'mnli', 'mrpc', 'qnli', 'qqp', 'rte', 'sst2', 'stsb',
                                'wnli']
  submissions = {f for spec in glue.TASKS.values() for _, f in spec.submissions}
  assert submissions == {'CoLA.tsv', 'SST-2.tsv', 'MRPC.tsv', 'QQP.tsv', 'MNLI-m.tsv',
                         'MNLI-mm.tsv', 'QNLI.tsv', 'RTE.tsv', 'WNLI.tsv', 'STS-B.tsv'}
  assert dict((s, (b, l)) for s, b, l in glue.TASKS['mnli'].paper) == {
      'test_matched': (84.6, 86.7), 'test_mismatched': (83.4, 85.9)}
  assert glue.TASKS['qqp'].main_metric == 'f1' and glue.TASKS['cola'].main_metric == 'mcc'


def test_read_tfds_without_the_package_says_so(monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # Makes the import fail.
  with pytest.raises(base.TaskError, match='tensorflow_datasets.*not installed'):
    glue.read_tfds('sst2', 'train')


def test_read_tfds_maps_labels_and_orders_by_idx(monkeypatch):
  records = {
      'validation_matched': [
          {'idx': 1, 'premise': b'the dog', 'hypothesis': b'a dog', 'label': 0},
          {'idx': 0, 'premise': b'the cat', 'hypothesis': b'a cat', 'label': 2}],
      'test_matched': [{'idx': 0, 'premise': b'the cat', 'hypothesis': b'a', 'label': -1}]}
  calls = []

  def load(name, split, data_dir):
    calls.append((name, split, data_dir))
    return records[split]

  fake = types.SimpleNamespace(load=load, as_numpy=lambda dataset: dataset)
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', fake)
  # TFDS's MNLI classes are (entailment, neutral, contradiction): 2 is contradiction.
  assert glue.read_tfds('mnli', 'dev_matched') == [
      glue.Example('0', 'the cat', 'a cat', 'contradiction'),
      glue.Example('1', 'the dog', 'a dog', 'entailment')]
  assert glue.read_tfds('mnli', 'test_matched') == [glue.Example('0', 'the cat', 'a', None)]
  assert calls[0] == ('glue/mnli', 'validation_matched', None)


@pytest.fixture(scope='module')
def bert_tokenizer():
  path = shared_data_dir() / 'vocab' / 'bert-base-uncased-vocab.txt'
  return tokenizer_lib.WordPieceTokenizer(str(path), lowercase=True)


@pytest.mark.slow
def test_shared_sst2_counts(bert_tokenizer):
  task = glue.GlueTask('sst2', str(shared_data_dir() / 'glue' / 'SST-2'))
  train = task.train_split(bert_tokenizer, 128)
  dev = task.eval_splits(bert_tokenizer, 128)['dev']
  assert (train.num_rows, dev.num_rows) == (67_349, 872)
  assert np.bincount(dev.features['label']).tolist() == [428, 444]
  assert np.all(train.features['input_ids'][:, 0] == bert_tokenizer.special.cls)
  assert np.all(train.features['segment_ids'] == 0)


def test_shared_mrpc_counts_and_first_row(bert_tokenizer):
  folder = shared_data_dir() / 'glue' / 'MRPC'
  train = glue.read_examples('mrpc', str(folder / 'train.tsv'))
  assert len(train) == 3_668
  assert collections.Counter(e.label for e in train) == {'1': 2_474, '0': 1_194}
  task = glue.GlueTask('mrpc', str(folder))
  dev = task.eval_splits(bert_tokenizer, 128)['dev']
  assert dev.num_rows == 408 and np.bincount(dev.features['label']).tolist() == [129, 279]
  # The BOM is gone and the quote kept: "The foodservice ... starts the second sentence.
  text = bert_tokenizer.decode(dev.features['input_ids'][0][dev.features['input_mask'][0] == 1])
  assert text.startswith('[CLS] he said the foodservice pie business')
  assert '[SEP] " the foodservice pie business does not fit' in text
  assert text.endswith('[SEP]')


def test_shared_stsb_and_qnli_dev_counts(bert_tokenizer):
  glue_dir = shared_data_dir() / 'glue'
  stsb = glue.GlueTask('stsb', str(glue_dir / 'STS-B')).eval_splits(bert_tokenizer, 128)['dev']
  assert stsb.num_rows == 1_500 and stsb.features['label'].dtype == np.float32
  assert 0.0 <= stsb.features['label'].min() and stsb.features['label'].max() <= 5.0
  qnli = glue.read_examples('qnli', str(glue_dir / 'QNLI' / 'dev.tsv'))
  assert len(qnli) == 5_463
  assert collections.Counter(e.label for e in qnli) == {'entailment': 2_702,
                                                        'not_entailment': 2_761}


# ---- The majority-class baseline: what a model that ignores its input scores. ----


def test_majority_baseline_of_a_two_thirds_positive_pair_task():
  # Always "paraphrase" on a dev set of 2/3 paraphrases: precision 2/3, recall 1, F1 0.8.
  metrics = glue.majority_baseline(glue.TASKS['mrpc'], [1, 1, 0, 1, 0], [1, 0, 1])
  assert metrics == pytest.approx({'f1': 80.0, 'accuracy': 100 * 2 / 3})


def test_majority_baseline_takes_the_training_majority_not_the_devs():
  # Train is mostly negative, dev mostly positive: the baseline answers 0 and scores F1 0.
  metrics = glue.majority_baseline(glue.TASKS['qqp'], [0, 0, 1], [1, 1, 1, 0])
  assert metrics == {'f1': 0.0, 'accuracy': 25.0}


def test_majority_baseline_ties_go_to_the_lower_class_and_three_classes_count():
  assert glue.majority_baseline(glue.TASKS['sst2'], [1, 0], [0, 0, 1]) == pytest.approx(
      {'accuracy': 100 * 2 / 3})
  # MNLI's label order: contradiction, entailment, neutral.
  assert glue.majority_baseline(glue.TASKS['mnli'], [2, 2, 1, 0], [2, 1, 1, 0]) == {
      'accuracy': 25.0}


def test_a_constant_has_no_correlation_and_no_mcc():
  assert glue.majority_baseline(glue.TASKS['stsb'], [0.5, 3.2, 4.8], [1.0, 2.0]) == {
      'spearman': 0.0, 'pearson': 0.0}
  assert glue.majority_baseline(glue.TASKS['cola'], [1, 1, 0], [1, 0, 0]) == {'mcc': 0.0}


def test_a_glue_task_scores_the_baseline_of_its_train_rows_on_a_split(tmp_path):
  task = glue.GlueTask('mrpc', data_dir=str(tmp_path))
  train = base.EncodedSplit({'input_ids': np.zeros((4, 3)), 'label': np.array([1, 1, 1, 0])})
  dev = base.EncodedSplit({'input_ids': np.zeros((3, 3)), 'label': np.array([0, 1, 1])})
  assert task.baseline(train, dev) == pytest.approx({'f1': 80.0, 'accuracy': 100 * 2 / 3})
  assert task.baseline_kind == 'majority class of the training rows'
  assert 'reported as 0' in glue.GlueTask('stsb', data_dir=str(tmp_path)).baseline_kind


def test_a_cut_training_file_keeps_the_whole_files_majority_for_the_baseline(tmp_path,
                                                                            tokenizer):
  # The first two rows say "not paraphrase" (0), the file as a whole "paraphrase" (1).
  rows = [('0', 'a b', 'c d'), ('0', 'e f', 'g h')] + [('1', 'i j', 'k l')] * 3
  with open(tmp_path / 'train.tsv', 'w') as f:
    f.write('Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n')
    for i, (label, a, b) in enumerate(rows):
      f.write(f'{label}\t{i}\t{i}\t{a}\t{b}\n')
  dev = base.EncodedSplit({'input_ids': np.zeros((3, 3)), 'label': np.array([0, 1, 1])})
  cut = glue.GlueTask('mrpc', data_dir=str(tmp_path), max_train_examples=2)
  train = cut.train_split(tokenizer, 16)
  assert list(train.features['label']) == [0, 0]  # Trained on the first two rows only...
  assert cut.baseline(train, dev) == pytest.approx({'f1': 80.0, 'accuracy': 100 * 2 / 3})
  assert cut.baseline_kind == ('majority class of the whole training file (5 rows; the run '
                               'trained on its first 2)')
  whole = glue.GlueTask('mrpc', data_dir=str(tmp_path))
  assert whole.baseline(whole.train_split(tokenizer, 16), dev) == cut.baseline(train, dev)
  assert whole.baseline_kind == 'majority class of the training rows'

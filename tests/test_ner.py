"""Tests for bert_jax.tasks.ner."""

import re

from conftest import shared_data_dir
import numpy as np
import pytest

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import base
from bert_jax.tasks import ner

_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'john', 'lives', 'in', 'london', 'un',
           '##believ', '##able', '.')
ID = {token: i for i, token in enumerate(_TOKENS)}
TAG = {tag: i for i, tag in enumerate(ner.LABELS)}


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
  """A lowercasing tokenizer; 'unbelievable' is the three pieces un ##believ ##able."""
  path = tmp_path_factory.mktemp('vocab') / 'vocab.txt'
  path.write_text(''.join(token + '\n' for token in _TOKENS), encoding='utf-8')
  return tokenizer_lib.WordPieceTokenizer(str(path), lowercase=True)


def write_conll(path, sentences):
  """Writes sentences of (word, tag) pairs in the 4-column format, with a -DOCSTART- line."""
  lines = ['-DOCSTART- -X- O O', '']
  for sentence in sentences:
    lines += [f'{word} NNP I-NP {tag}' for word, tag in sentence] + ['']
  path.write_text('\n'.join(lines) + '\n', encoding='utf-8')
  return str(path)


def perfect_logits(split):
  """Logits [rows, S, C] whose argmax is the gold label at every labelled position."""
  return 10.0 * np.eye(len(ner.LABELS), dtype=np.float32)[split.features['labels']]


def test_read_conll_skips_docstart_and_splits_sentences(tmp_path):
  path = write_conll(tmp_path / 'eng.train', [[('John', 'I-PER'), ('lives', 'O')],
                                              [('London', 'I-LOC')]])
  assert ner.read_conll(path) == [ner.Sentence(['John', 'lives'], ['I-PER', 'O']),
                                  ner.Sentence(['London'], ['I-LOC'])]


def test_wrong_field_count_names_file_and_line(tmp_path):
  path = tmp_path / 'bad'
  path.write_text('John NNP I-NP I-PER\nlives VBZ I-VP\n', encoding='utf-8')
  with pytest.raises(base.TaskError, match=re.escape(f'{path}:2') + '.*expected 4.*found 3'):
    ner.read_conll(str(path))


def test_unknown_tag_names_file_and_line(tmp_path):
  path = tmp_path / 'bad'
  path.write_text('\nJohn NNP I-NP I-PER\n\nlives VBZ I-VP I-FOO\n', encoding='utf-8')
  with pytest.raises(base.TaskError, match=re.escape(f'{path}:4') + ".*'I-FOO'"):
    ner.read_conll(str(path))


def test_label_sits_on_the_first_of_three_pieces(tokenizer):
  sentence = ner.Sentence(['John', 'unbelievable', 'London'], ['I-PER', 'B-MISC', 'I-LOC'])
  split = ner.encode([sentence], tokenizer, 9)
  t = ID
  np.testing.assert_array_equal(split.features['input_ids'], [[
      2, t['john'], t['un'], t['##believ'], t['##able'], t['london'], 3, 0, 0]])
  np.testing.assert_array_equal(split.features['input_mask'], [[1] * 7 + [0] * 2])
  np.testing.assert_array_equal(split.features['segment_ids'], [[0] * 9])
  np.testing.assert_array_equal(split.features['label_weights'], [[0, 1, 1, 0, 0, 1, 0, 0, 0]])
  np.testing.assert_array_equal(split.features['labels'], [[
      0, TAG['I-PER'], TAG['B-MISC'], 0, 0, TAG['I-LOC'], 0, 0, 0]])
  assert split.features['label_weights'].dtype == np.float32
  assert split.features['labels'].dtype == np.int32
  assert split.meta.row_sentence.tolist() == [0]
  assert split.meta.row_words[0].tolist() == [0, 1, 2]
  assert split.meta.row_positions[0].tolist() == [1, 2, 5]


def test_long_sentence_splits_at_words_and_predicts_each_once(tokenizer):
  words = 'John lives in London unbelievable . John'.split()  # 1 1 1 1 3 1 1 pieces
  tags = ['I-PER', 'O', 'O', 'I-LOC', 'O', 'O', 'I-PER']
  short = ner.Sentence(['London'], ['I-LOC'])
  split = ner.encode([ner.Sentence(words, tags), short], tokenizer, 6)  # 4 pieces a row
  assert split.num_rows == 4 and split.num_examples == 2
  assert split.meta.row_sentence.tolist() == [0, 0, 0, 1]
  assert [w.tolist() for w in split.meta.row_words] == [[0, 1, 2, 3], [4, 5], [6], [0]]
  np.testing.assert_array_equal(split.features['input_ids'][1], [
      2, ID['un'], ID['##believ'], ID['##able'], ID['.'], 3])
  metrics, predictions = ner.NerTask('', '').score('dev', split,
                                                   {'logits': perfect_logits(split)})
  assert predictions == [tags, ['I-LOC']]
  assert metrics == {'precision': 100.0, 'recall': 100.0, 'f1': 100.0}


def test_word_longer_than_a_row_keeps_its_first_pieces(tokenizer):
  split = ner.encode([ner.Sentence(['unbelievable', 'John'], ['I-MISC', 'I-PER'])],
                     tokenizer, 4)
  np.testing.assert_array_equal(split.features['input_ids'], [
      [2, ID['un'], ID['##believ'], 3], [2, ID['john'], 3, 0]])
  np.testing.assert_array_equal(split.features['labels'][:, 1], [TAG['I-MISC'], TAG['I-PER']])
  np.testing.assert_array_equal(split.features['label_weights'], [[0, 1, 0, 0], [0, 1, 0, 0]])


def test_zero_piece_word_is_counted_and_decoded_as_o(tokenizer):
  sentence = ner.Sentence(['John', '\x07', 'London'], ['I-PER', 'I-PER', 'I-LOC'])
  split = ner.encode([sentence], tokenizer, 8)
  assert split.meta.zero_piece_words == 1
  assert split.meta.row_words[0].tolist() == [0, 2]
  assert split.features['label_weights'].sum() == 2
  _, [predicted] = ner.NerTask('', '').score('dev', split, {'logits': perfect_logits(split)})
  assert predicted == ['I-PER', 'O', 'I-LOC']


def test_known_wrong_prediction_gives_expected_f1(tokenizer):
  sentence = ner.Sentence(['John', 'lives', 'London', 'London'], ['I-PER', 'O', 'I-LOC', 'I-LOC'])
  split = ner.encode([sentence], tokenizer, 8)
  logits = perfect_logits(split)
  # The last word becomes O: PER is found, LOC (2 words) is cut to 1 word, so it is wrong.
  logits[0, 4] = 10.0 * np.eye(len(ner.LABELS))[TAG['O']]
  metrics, [predicted] = ner.NerTask('', '').score('dev', split, {'logits': logits})
  assert predicted == ['I-PER', 'O', 'I-LOC', 'O']
  assert metrics == pytest.approx({'precision': 50.0, 'recall': 50.0, 'f1': 50.0})


def test_task_splits_and_conlleval_output(tmp_path, tokenizer):
  sentences = [[('John', 'I-PER'), ('lives', 'O')], [('London', 'I-LOC')]]
  train = write_conll(tmp_path / 'eng.train', sentences)
  dev = write_conll(tmp_path / 'eng.testa', sentences)
  task = ner.NerTask(train, dev, max_train_examples=1)
  assert (task.name, task.head, task.num_outputs, task.main_metric) == (
      'conll2003', 'token', 9, 'f1')
  assert task.train_split(tokenizer, 8).num_examples == 1
  assert task.test_split(tokenizer, 8) is None and task.test_splits(tokenizer, 8) == {}
  split = task.eval_splits(tokenizer, 8)['dev']
  _, predictions = task.score('dev', split, {'logits': perfect_logits(split)})
  [path] = task.write_predictions('dev', predictions, str(tmp_path / 'out'))
  with open(path, encoding='utf-8') as f:
    assert f.read() == 'John I-PER I-PER\nlives O O\n\nLondon I-LOC I-LOC\n\n'


def test_missing_file_is_named(tmp_path, tokenizer):
  task = ner.NerTask(str(tmp_path / 'eng.train'), '', test_file=str(tmp_path / 'eng.testb'))
  with pytest.raises(base.TaskError, match=re.escape(str(tmp_path / 'eng.train'))):
    task.train_split(tokenizer, 8)
  with pytest.raises(base.TaskError, match='eng.testb.*does not exist'):
    task.test_split(tokenizer, 8)


def test_shared_conll_counts():
  folder = shared_data_dir() / 'conll2003'
  train = ner.read_conll(str(folder / 'eng.train'))
  dev = ner.read_conll(str(folder / 'eng.testa'))
  assert (len(train), len(dev)) == (14_041, 3_250)
  assert sum(len(s.words) for s in train) == 203_621
  assert sum(len(s.words) for s in dev) == 51_362


def test_shared_dev_encodes_every_word_once():
  data = shared_data_dir()
  tokenizer = tokenizer_lib.WordPieceTokenizer(
      str(data / 'vocab' / 'bert-base-uncased-vocab.txt'), lowercase=True)
  task = ner.NerTask('', str(data / 'conll2003' / 'eng.testa'))
  split = task.eval_splits(tokenizer, 128)['dev']
  meta = split.meta
  assert split.num_examples == 3_250 and split.num_rows >= 3_250
  predicted = sum(len(words) for words in meta.row_words)
  assert predicted + meta.zero_piece_words == 51_362
  assert split.features['label_weights'].sum() == predicted
  assert meta.zero_piece_words == 0  # Every eng.testa word has a piece in the uncased vocab.
  metrics, _ = task.score('dev', split, {'logits': perfect_logits(split)})
  assert metrics['f1'] == 100.0

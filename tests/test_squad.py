"""Tests for bert_jax.tasks.squad: reading, windows, answer positions, decoding and scoring."""

import json
import sys
import time

from conftest import shared_data_dir
import numpy as np
import pytest

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import base
from bert_jax.tasks import scoring
from bert_jax.tasks import squad

_LETTERS = [chr(ord('a') + i) for i in range(26)]
_WORDS = ['the', 'cafe', 'muller', 'opened', 'in', 'denver', '1990', '##s', 'who', 'what',
          'when', 'did', 'nothing', '.', ',', '?', "'"] + _LETTERS


def normalize(text):
  """SQuAD's answer normalisation where the scoring module has it."""
  normalize_fn = getattr(scoring, 'squad_normalize', None)
  return normalize_fn(text) if normalize_fn else text.lower().strip()


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  """An uncased tokenizer over a hand-made vocab: every word below is one piece."""
  path = tmp_path_factory.mktemp('vocab') / 'vocab.txt'
  path.write_text(''.join(token + '\n'
                          for token in list(tokenizer_lib.SPECIAL_TOKENS) + _WORDS),
                  encoding='utf-8')
  return tokenizer_lib.WordPieceTokenizer(str(path), lowercase=True)


def example(question, context, answer=None, qas_id='q0', impossible=False, article=0):
  """An Example whose answer is the first occurrence of `answer` in the context."""
  answers = [] if answer is None else [(answer, context.index(answer))]
  return squad.Example(qas_id=qas_id, question=question, context=context, answers=answers,
                       is_impossible=impossible, article_index=article)


def oracle_logits(split, value=10.0):
  """Start/end logits [n, S] that peak at each row's gold positions (rows holding the answer)."""
  start = np.zeros(split.features['input_ids'].shape, np.float32)
  end = np.zeros_like(start)
  rows = np.flatnonzero(split.features['start_positions'] != 0)
  start[rows, split.features['start_positions'][rows]] = value
  end[rows, split.features['end_positions'][rows]] = value
  return start, end


def token(tokenizer, split, row, position):
  return tokenizer.id_to_token(int(split.features['input_ids'][row, position]))


# Golden cases ----------------------------------------------------------------------------------


def test_answer_maps_to_pieces_and_back_to_original_spelling(tiny):
  ex = example('Who opened?', 'The Café Müller opened in Denver.', 'Café Müller')
  split = squad.encode([ex], tiny, max_seq_length=16, training=True)
  f = split.features
  # [CLS] who opened ? [SEP] the cafe muller opened in denver . [SEP] [PAD]...
  assert [tiny.id_to_token(i) for i in f['input_ids'][0, :13]] == [
      '[CLS]', 'who', 'opened', '?', '[SEP]', 'the', 'cafe', 'muller', 'opened', 'in', 'denver',
      '.', '[SEP]']
  assert f['input_mask'][0].tolist() == [1] * 13 + [0] * 3
  assert f['segment_ids'][0].tolist() == [0] * 5 + [1] * 8 + [0] * 3
  assert (f['start_positions'][0], f['end_positions'][0]) == (6, 7)
  meta = split.meta
  assert meta.example_index.tolist() == [0]
  assert meta.offsets[0, 6].tolist() == [4, 8] and meta.offsets[0, 7].tolist() == [9, 15]
  assert (meta.offsets[0, :5] == -1).all() and (meta.offsets[0, 12:] == -1).all()
  assert meta.token_is_max_context[0].tolist() == [False] * 5 + [True] * 7 + [False] * 4
  predictions, null_odds, nbest = squad.postprocess([ex], split, *oracle_logits(split))
  assert predictions == {'q0': 'Café Müller'}  # Original case and accents, not 'cafe muller'.
  assert null_odds == {}
  assert nbest['q0'][0]['text'] == 'Café Müller'
  assert abs(sum(entry['probability'] for entry in nbest['q0']) - 1.0) < 1e-9


def test_answer_inside_a_word_takes_its_pieces(tiny):
  ex = example('When?', 'Denver in 1990s.', '1990')
  split = squad.encode([ex], tiny, max_seq_length=16, training=True)
  # [CLS] when ? [SEP] denver in 1990 ##s . [SEP]
  assert (split.features['start_positions'][0], split.features['end_positions'][0]) == (6, 6)
  predictions, _, _ = squad.postprocess([ex], split, *oracle_logits(split))
  assert predictions == {'q0': '1990'}


def test_question_is_truncated(tiny):
  ex = example('Who opened in Denver?', 'The cafe opened.', 'cafe')
  split = squad.encode([ex], tiny, max_seq_length=16, max_query_length=2, training=True)
  assert [token(tiny, split, 0, p) for p in range(5)] == ['[CLS]', 'who', 'opened', '[SEP]',
                                                          'the']
  assert split.features['segment_ids'][0, :4].tolist() == [0, 0, 0, 0]
  assert (split.features['start_positions'][0], split.features['end_positions'][0]) == (5, 5)


def test_long_context_gives_strided_windows(tiny):
  context = ' '.join(_LETTERS[:20])  # 20 one-piece words.
  ex = example('Who?', context, 'k')  # Piece 10.
  # S=12 with a 2-piece question leaves 12 - 2 - 3 = 7 pieces a window; stride 3.
  split = squad.encode([ex], tiny, max_seq_length=12, doc_stride=3, training=True)
  assert split.num_rows == 6 and split.num_examples == 1
  first_pieces = [token(tiny, split, r, 4) for r in range(6)]
  assert first_pieces == ['a', 'd', 'g', 'j', 'm', 'p']  # Windows start 3 pieces apart.
  lengths = split.features['input_mask'].sum(axis=1) - 5  # Less [CLS] who ? [SEP] ... [SEP].
  assert lengths.tolist() == [7, 7, 7, 7, 7, 5]  # The last window, 15..19, ends the context.
  # 'k' (piece 10) lies in windows 6..12 and 9..15 only, at 4 + 10 - window start.
  assert split.features['start_positions'].tolist() == [0, 0, 8, 5, 0, 0]
  assert split.features['end_positions'].tolist() == [0, 0, 8, 5, 0, 0]
  assert split.meta.example_index.tolist() == [0] * 6
  predictions, _, _ = squad.postprocess([ex], split, *oracle_logits(split))
  assert predictions == {'q0': 'k'}


def test_answer_split_across_windows_is_0_0(tiny):
  context = ' '.join(_LETTERS[:20])
  ex = example('Who?', context, 'f g h i j k l m')  # Pieces 5..12: longer than any window.
  split = squad.encode([ex], tiny, max_seq_length=12, doc_stride=3, training=True)
  assert split.features['start_positions'].tolist() == [0] * split.num_rows
  assert split.features['end_positions'].tolist() == [0] * split.num_rows


def original_is_max_context(doc_spans, cur_span_index, position):
  """run_squad.py's _check_is_max_context, transcribed: spans are (start, length)."""
  best_score = None
  best_span_index = None
  for span_index, (start, length) in enumerate(doc_spans):
    end = start + length - 1
    if position < start or position > end:
      continue
    num_left_context = position - start
    num_right_context = end - position
    score = min(num_left_context, num_right_context) + 0.01 * length
    if best_score is None or score > best_score:
      best_score = score
      best_span_index = span_index
  return cur_span_index == best_span_index


def test_token_is_max_context_matches_the_original_rule():
  # Hand case: windows 0..7 and 3..10 of 11 pieces. Piece 5 ties (min(5, 2) = min(2, 5)) and
  # stays with the first window; piece 6 has more context in the second.
  spans = [(0, 8), (3, 8)]
  mask = squad.max_context_mask(spans, 11)
  assert mask[:, 5].tolist() == [True, False]
  assert mask[:, 6].tolist() == [False, True]
  assert mask[0].tolist() == [True] * 6 + [False] * 5
  assert mask[1].tolist() == [False] * 6 + [True] * 5
  rng = np.random.default_rng(0)
  for _ in range(200):
    num_pieces = int(rng.integers(1, 60))
    max_pieces = int(rng.integers(1, 20))
    stride = int(rng.integers(1, 25))
    spans = squad._window_starts(num_pieces, max_pieces, stride)
    mask = squad.max_context_mask(spans, num_pieces)
    expected = [[original_is_max_context(spans, w, p) for p in range(num_pieces)]
                for w in range(len(spans))]
    assert mask.tolist() == expected


def test_window_loop_matches_the_original():
  assert squad._window_starts(20, 7, 3) == [(0, 7), (3, 7), (6, 7), (9, 7), (12, 7), (15, 5)]
  assert squad._window_starts(10, 7, 10) == [(0, 7), (7, 3)]  # The stride is capped at a window.
  assert squad._window_starts(5, 7, 3) == [(0, 5)]
  assert squad._window_starts(0, 7, 3) == [(0, 0)]


def test_postprocess_rules(tiny):
  ex = example('Who?', 'The cafe opened in Denver.', 'Denver')
  split = squad.encode([ex], tiny, max_seq_length=16)
  # [CLS] who ? [SEP] the(4) cafe opened in denver(8) .(9) [SEP](10)
  start = np.zeros([1, 16], np.float32)
  end = np.zeros([1, 16], np.float32)
  start[0, 1], end[0, 1] = 50, 50  # In the question: never a span.
  start[0, 8], end[0, 5] = 20, 19  # End before start: skipped.
  end[0, 9] = 10
  predictions, _, nbest = squad.postprocess([ex], split, start, end)
  assert predictions == {'q0': 'Denver.'}
  assert len({entry['text'] for entry in nbest['q0']}) == len(nbest['q0'])  # Distinct texts.
  predictions, _, _ = squad.postprocess([ex], split, start, end, max_answer_length=1)
  assert predictions == {'q0': 'Denver'}


def original_write_predictions(examples, split, start_logits, end_logits, n_best_size,
                               max_answer_length, version_2, threshold):
  """run_squad.py's write_predictions loop, transcribed over our rows (texts from the offsets)."""
  meta = split.meta
  predictions, null_odds, nbest_texts = {}, {}, {}
  for index, ex in enumerate(examples):
    prelim = []
    score_null, null = 1000000, None
    for r in np.flatnonzero(meta.example_index == index):
      starts = [float(x) for x in start_logits[r]]
      ends = [float(x) for x in end_logits[r]]
      best_starts = [i for i, _ in sorted(enumerate(starts), key=lambda x: x[1],
                                          reverse=True)][:n_best_size]
      best_ends = [i for i, _ in sorted(enumerate(ends), key=lambda x: x[1],
                                        reverse=True)][:n_best_size]
      if version_2 and starts[0] + ends[0] < score_null:
        score_null, null = starts[0] + ends[0], (r, starts[0], ends[0])
      for s in best_starts:
        for e in best_ends:
          if meta.offsets[r, s, 0] < 0 or meta.offsets[r, e, 0] < 0:
            continue
          if not meta.token_is_max_context[r, s] or e < s or e - s + 1 > max_answer_length:
            continue
          prelim.append((r, s, e, starts[s], ends[e]))
    if version_2:
      prelim.append((null[0], 0, 0, null[1], null[2]))
    prelim = sorted(prelim, key=lambda x: x[3] + x[4], reverse=True)
    nbest, seen = [], set()
    for r, s, e, start_logit, end_logit in prelim:
      if len(nbest) >= n_best_size:
        break
      text = ex.context[meta.offsets[r, s, 0]:meta.offsets[r, e, 1]] if s > 0 else ''
      if text in seen:
        continue
      seen.add(text)
      nbest.append((text, start_logit, end_logit))
    if version_2 and '' not in seen:
      nbest.append(('', null[1], null[2]))
    if not nbest:
      nbest.append(('', 0.0, 0.0))
    nbest_texts[ex.qas_id] = [text for text, _, _ in nbest]
    best = next((entry for entry in nbest if entry[0]), None) if version_2 else nbest[0]
    if not version_2:
      predictions[ex.qas_id] = best[0]
    elif best is None:  # The original fails here; ours abstains with odds as high as can be.
      null_odds[ex.qas_id] = squad._NO_SPAN_ODDS
      predictions[ex.qas_id] = ''
    else:
      null_odds[ex.qas_id] = score_null - best[1] - best[2]
      predictions[ex.qas_id] = '' if null_odds[ex.qas_id] > threshold else best[0]
  return predictions, null_odds, nbest_texts


@pytest.mark.parametrize('version_2', [False, True])
def test_postprocess_matches_the_original_loop(tiny, version_2):
  rng = np.random.default_rng(1)
  examples = []
  for i in range(12):
    words = rng.choice(_LETTERS, size=int(rng.integers(3, 30)))
    context = ' '.join(words)
    examples.append(example('Who opened?', context, str(words[-1]), qas_id=f'q{i}'))
  split = squad.encode(examples, tiny, max_seq_length=14, doc_stride=4)
  assert split.num_rows > 2 * len(examples)  # Many windows, overlapping.
  # Logits rounded to one decimal: many ties, which both must break alike.
  start = np.round(rng.normal(size=(split.num_rows, 14)), 1).astype(np.float32)
  end = np.round(rng.normal(size=(split.num_rows, 14)), 1).astype(np.float32)
  for n_best_size, max_answer_length in ((20, 30), (3, 2)):
    ours = squad.postprocess(examples, split, start, end, n_best_size=n_best_size,
                             max_answer_length=max_answer_length, version_2=version_2)
    theirs = original_write_predictions(examples, split, start, end, n_best_size,
                                        max_answer_length, version_2, 0.0)
    assert ours[0] == theirs[0]
    assert ours[1] == pytest.approx(theirs[1])
    assert {qid: [e['text'] for e in entries] for qid, entries in ours[2].items()} == theirs[2]


# SQuAD 2.0 ------------------------------------------------------------------------------------


def test_v2_null_answer_and_threshold(tiny):
  examples = [example('Who?', 'The cafe opened in Denver.', qas_id='none', impossible=True),
              example('Who?', 'The cafe opened in Denver.', 'Denver', qas_id='denver')]
  split = squad.encode(examples, tiny, max_seq_length=16, training=True)
  assert split.features['start_positions'].tolist() == [0, 8]
  start = np.zeros([2, 16], np.float32)
  end = np.zeros([2, 16], np.float32)
  start[0, 0], end[0, 0] = 5, 5  # Impossible: [CLS] wins, null score 10 over a best span of 3.
  start[0, 5], end[0, 5] = 2, 1
  start[1, 8], end[1, 8] = 6, 6  # Answerable: 'Denver' (12) beats the null score (0).
  predictions, null_odds, nbest = squad.postprocess(examples, split, start, end, version_2=True)
  assert predictions == {'none': '', 'denver': 'Denver'}
  assert null_odds['none'] == pytest.approx(7.0) and null_odds['none'] > 0
  assert null_odds['denver'] == pytest.approx(-12.0)
  assert nbest['none'][0]['text'] == '' and nbest['none'][1]['text'] == 'cafe'
  assert '' in {entry['text'] for entry in nbest['denver']}
  # A threshold above the odds answers anyway; one below -12 abstains on both.
  predictions, _, _ = squad.postprocess(examples, split, start, end, version_2=True,
                                        null_score_diff_threshold=8.0)
  assert predictions == {'none': 'cafe', 'denver': 'Denver'}
  predictions, _, _ = squad.postprocess(examples, split, start, end, version_2=True,
                                        null_score_diff_threshold=-13.0)
  assert predictions == {'none': '', 'denver': ''}


def test_v2_null_score_is_the_minimum_over_windows(tiny):
  ex = example('Who?', ' '.join(_LETTERS[:20]), 'k', qas_id='k')
  split = squad.encode([ex], tiny, max_seq_length=12, doc_stride=3)
  n = split.num_rows
  start = np.zeros([n, 12], np.float32)
  end = np.zeros([n, 12], np.float32)
  start[:, 0] = np.arange(n) + 3.0  # Row 0 has the smallest [CLS] score: 3 + 0.
  start[2, 8], end[2, 8] = 2, 2  # 'k' in row 2: span score 4.
  _, null_odds, _ = squad.postprocess([ex], split, start, end, version_2=True)
  assert null_odds['k'] == pytest.approx(3.0 - 4.0)


# Reading, splitting and errors ------------------------------------------------------------------


def squad_file(tmp_path, dataset, name='data.json', version='1.1'):
  path = tmp_path / name
  path.write_text(json.dumps({'version': version, 'data': dataset}), encoding='utf-8')
  return str(path)


def synthetic_dataset(num_articles=6, impossible=False):
  """Articles of one paragraph: 'the cafe opened in <letter> .' asking for the letter."""
  dataset = []
  for a in range(num_articles):
    letter = _LETTERS[a + 1]  # Not 'a': SQuAD's normalisation drops it as an article.
    context = f'The cafe opened in {letter}.'
    qas = [{'id': f'q{a}', 'question': 'Who opened?',
            'answers': [{'text': letter, 'answer_start': len(context) - 2}]}]
    if impossible:
      qas[0]['is_impossible'] = False
      qas.append({'id': f'n{a}', 'question': 'What did nothing?', 'answers': [],
                  'plausible_answers': [{'text': 'cafe', 'answer_start': 4}],
                  'is_impossible': True})
    dataset.append({'title': f'Article_{a}', 'paragraphs': [{'context': context, 'qas': qas}]})
  return dataset


def test_read_squad_v1_and_v2(tmp_path):
  examples, dataset = squad.read_squad(squad_file(tmp_path, synthetic_dataset(3)))
  assert len(examples) == 3 and len(dataset) == 3
  assert examples[1] == squad.Example('q1', 'Who opened?', 'The cafe opened in c.', [('c', 19)],
                                      False, 1)
  examples, _ = squad.read_squad(squad_file(tmp_path, synthetic_dataset(2, impossible=True),
                                            version='v2.0'))
  assert [(e.qas_id, e.is_impossible, e.answers) for e in examples] == [
      ('q0', False, [('b', 19)]), ('n0', True, []), ('q1', False, [('c', 19)]), ('n1', True, [])]


def test_mismatched_answer_is_kept_for_eval_and_skipped_for_training(tmp_path, tiny):
  dataset = synthetic_dataset(2)
  dataset[0]['paragraphs'][0]['qas'][0]['answers'][0]['answer_start'] = 3  # Wrong place.
  examples, _ = squad.read_squad(squad_file(tmp_path, dataset))
  assert not squad.answer_matches(examples[0]) and squad.answer_matches(examples[1])
  train = squad.encode(examples, tiny, max_seq_length=16, training=True)
  assert train.meta.example_index.tolist() == [1] and train.num_examples == 2
  evaluation = squad.encode(examples, tiny, max_seq_length=16, training=False)
  assert evaluation.meta.example_index.tolist() == [0, 1]


def test_missing_id_names_file_and_position(tmp_path):
  dataset = synthetic_dataset(2)
  del dataset[1]['paragraphs'][0]['qas'][0]['id']
  path = squad_file(tmp_path, dataset)
  with pytest.raises(base.TaskError) as error:
    squad.read_squad(path)
  message = str(error.value)
  assert path in message and "article 1 ('Article_1')" in message
  assert 'paragraph 0, question 0' in message and "'id'" in message


def test_malformed_files_raise_task_error(tmp_path):
  path = tmp_path / 'broken.json'
  path.write_text('{"data": [', encoding='utf-8')
  with pytest.raises(base.TaskError, match='broken.json'):
    squad.read_squad(str(path))
  dataset = synthetic_dataset(1)
  del dataset[0]['paragraphs'][0]['qas'][0]['answers'][0]['text']
  with pytest.raises(base.TaskError, match=r"question 0 \(id 'q0'\)"):
    squad.read_squad(squad_file(tmp_path, dataset))
  dataset = synthetic_dataset(1)
  dataset[0]['paragraphs'][0]['qas'][0]['answers'] = []
  with pytest.raises(base.TaskError, match='no answers'):
    squad.read_squad(squad_file(tmp_path, dataset))


def test_split_articles_is_disjoint_deterministic_and_complete(tmp_path):
  examples, dataset = squad.read_squad(squad_file(tmp_path, synthetic_dataset(9)))
  train, evaluation, eval_dataset = squad.split_articles(dataset, examples, 0.5, seed=0)
  again = squad.split_articles(dataset, examples, 0.5, seed=0)
  assert again == (train, evaluation, eval_dataset)
  train_articles = {e.article_index for e in train}
  eval_articles = {e.article_index for e in evaluation}
  assert not train_articles & eval_articles
  assert train_articles | eval_articles == set(range(9))
  assert len(train_articles) == 4  # round(0.5 * 9)
  assert {a['title'] for a in eval_dataset} == {dataset[i]['title'] for i in eval_articles}
  # The file's order does not matter, only the titles and the seed.
  reversed_examples, reversed_dataset = squad.read_squad(
      squad_file(tmp_path, synthetic_dataset(9)[::-1], name='reversed.json'))
  _, _, reversed_eval = squad.split_articles(reversed_dataset, reversed_examples, 0.5, seed=0)
  assert {a['title'] for a in reversed_eval} == {a['title'] for a in eval_dataset}
  other = squad.split_articles(dataset, examples, 0.5, seed=1)[2]
  assert [a['title'] for a in other] != [a['title'] for a in eval_dataset]
  with pytest.raises(base.TaskError):
    squad.split_articles(dataset, examples, 1.0)


def test_read_tfds_without_tensorflow_datasets(monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # Makes the import fail.
  with pytest.raises(base.TaskError, match='tensorflow_datasets'):
    squad.read_tfds('1.1', 'validation')


# SquadTask ----------------------------------------------------------------------------------------


def test_task_needs_training_data():
  with pytest.raises(base.TaskError, match='split_dev_fraction'):
    squad.SquadTask(dev_file='dev.json')
  with pytest.raises(base.TaskError, match='version'):
    squad.SquadTask(version='3.0', dev_file='dev.json', split_dev_fraction=0.5)


@pytest.mark.parametrize('version', ['1.1', '2.0'])
def test_task_trains_and_scores_on_split_dev(tmp_path, tiny, version):
  dev_file = squad_file(tmp_path, synthetic_dataset(8, impossible=version == '2.0'),
                        version=version)
  task = squad.SquadTask(version=version, dev_file=dev_file, split_dev_fraction=0.5)
  assert (task.name, task.head, task.num_outputs, task.main_metric) == (
      f'squad{version}', 'span', 2, 'f1')
  train = task.train_split(tiny, 16)
  splits = task.eval_splits(tiny, 16)
  assert list(splits) == ['dev']
  dev = splits['dev']
  train_ids = {e.qas_id for e in train.meta.examples}
  dev_ids = {e.qas_id for e in dev.meta.examples}
  assert train_ids and dev_ids and not train_ids & dev_ids
  start, end = oracle_logits(dev)
  if version == '2.0':
    impossible = [e.is_impossible for e in dev.meta.examples]
    rows = np.flatnonzero(np.asarray(impossible)[dev.meta.example_index])
    start[rows, 0] = end[rows, 0] = 10.0
  metrics, predictions = task.score('dev', dev, {'start_logits': start, 'end_logits': end})
  if version == '1.1':
    assert metrics == {'exact_match': 100.0, 'f1': 100.0}
  else:
    assert metrics['exact'] == metrics['f1'] == 100.0
    assert metrics['HasAns_f1'] == metrics['NoAns_f1'] == 100.0
    assert 'best_f1_thresh' in metrics and metrics['best_f1'] == 100.0
  paths = task.write_predictions('dev', predictions, str(tmp_path / 'out'))
  names = sorted(p.rsplit('/', 1)[1] for p in paths)
  expected = ['nbest_predictions.json', 'predictions.json']
  assert names == sorted(expected + (['null_odds.json'] if version == '2.0' else []))
  with open(paths[0], encoding='utf-8') as f:
    written = json.load(f)
  assert written == predictions['predictions'] and set(written) == dev_ids


# The real dev set ---------------------------------------------------------------------------------


@pytest.fixture(scope='module')
def dev_set():
  data = shared_data_dir()
  examples, dataset = squad.read_squad(str(data / 'squad' / 'dev-v1.1.json'))
  uncased = tokenizer_lib.WordPieceTokenizer(
      str(data / 'vocab' / 'bert-base-uncased-vocab.txt'), lowercase=True)
  return examples, dataset, uncased


@pytest.mark.slow
def test_dev_round_trip_and_oracle(dev_set):
  examples, dataset, uncased = dev_set
  assert len(examples) == 10570
  began = time.perf_counter()
  split = squad.encode(examples, uncased, max_seq_length=384, doc_stride=128, training=True)
  seconds = time.perf_counter() - began
  print(f'encoded {len(examples)} dev questions into {split.num_rows} rows in {seconds:.1f} s')
  assert seconds < 30
  f = split.features
  assert f['input_ids'].shape == (split.num_rows, 384)
  rows = np.flatnonzero(f['start_positions'] != 0)
  offsets = split.meta.offsets
  agree = 0
  for r in rows:
    ex = examples[split.meta.example_index[r]]
    text = ex.context[offsets[r, f['start_positions'][r], 0]:offsets[r, f['end_positions'][r], 1]]
    agree += normalize(text) == normalize(ex.answers[0][0])
  print(f'{agree} of {len(rows)} answer rows give back the normalised gold answer')
  assert agree >= 0.99 * len(rows)
  predictions, _, _ = squad.postprocess(examples, split, *oracle_logits(split))
  metrics = scoring.squad_v1_evaluate(dataset, predictions)
  print(f'oracle on dev at 384/128: EM {metrics["exact_match"]:.2f} F1 {metrics["f1"]:.2f}')
  assert metrics['exact_match'] >= 95 and metrics['f1'] >= 97


def test_dev_long_contexts_at_128(dev_set):
  examples, _, uncased = dev_set
  long_examples = [e for e in examples if len(e.context) > 1500][:300]
  split = squad.encode(long_examples, uncased, max_seq_length=128, doc_stride=64, training=True)
  rows_per_example = np.bincount(split.meta.example_index, minlength=len(long_examples))
  assert rows_per_example.min() >= 2 and rows_per_example.max() >= 4
  predictions, _, _ = squad.postprocess(long_examples, split, *oracle_logits(split))
  recovered = [max(normalize(predictions[e.qas_id]) == normalize(text) for text, _ in e.answers)
               for e in long_examples]
  print(f'oracle recovers {sum(recovered)} of {len(long_examples)} answers of long contexts '
        'split over several windows')
  assert np.mean(recovered) >= 0.95
  # Some answer beyond the first window is found from a later one.
  later = [i for i, ex in enumerate(long_examples)
           if recovered[i] and split.features['start_positions'][
               np.flatnonzero(split.meta.example_index == i)[0]] == 0]
  assert later

"""RoBERTa's FULL-SENTENCES rows (data.rows='full_sentences'): whole sentences filling each row,
across documents with a separator between them, in memory and streamed, resumable."""

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax.data import pipeline
from bert_jax.data import pretraining
from bert_jax.data import streaming
from configs import base

import test_sop

SPECIAL = test_sop.SPECIAL
SEQ = 32
ROOM = SEQ - 2  # Tokens between [CLS] and the closing [SEP].


def documents_with_long_sentences(num_documents=50):
  """Numbered documents (test_sop's) of short sentences, some with a sentence over ROOM."""
  rng = np.random.default_rng(1)
  documents = []
  for d in range(num_documents):
    lengths = rng.integers(1, 12, rng.integers(1, 7))
    if d % 7 == 3:
      lengths[rng.integers(len(lengths))] = 2 * ROOM + 5
    ids = 5 + test_sop.STRIDE * d + np.arange(lengths.sum())
    documents.append(np.split(ids.astype(np.int32), np.cumsum(lengths)[:-1]))
  return documents


def sentence_bounds(documents):
  """{document: [(first index, last index) of each sentence]}."""
  bounds = {}
  for d, document in enumerate(documents):
    ends = np.cumsum([len(s) for s in document])
    bounds[d] = [(int(e - len(s)), int(e - 1)) for s, e in zip(document, ends)]
  return bounds


def runs(row_ids):
  """The text of a row between [CLS] and [SEP], cut at the separators: one run per document."""
  assert row_ids[0] == SPECIAL.cls and row_ids[-1] == SPECIAL.sep
  text = row_ids[1:-1]
  assert len(text) <= ROOM
  parts = np.split(text, np.flatnonzero(text == SPECIAL.sep))
  parts = parts[:1] + [part[1:] for part in parts[1:]]  # Without the separators.
  assert all(len(part) for part in parts), 'an empty run'
  return parts


def check_row(row_ids, bounds):
  """Every run is whole sentences of one document (a sentence over ROOM: ROOM-token pieces);
  a run after a separator starts its document, one before a separator ends it. Returns the
  row's runs as (document, first index, last index)."""
  placed, row_runs = [], runs(row_ids)
  for k, run in enumerate(row_runs):
    d, first, last = test_sop.where(run)
    sentences = bounds[d]
    starts = {a for a, _ in sentences} | {a + m for a, b in sentences
                                            for m in range(ROOM, b - a + 1, ROOM)}
    ends = {b for _, b in sentences} | {a + m - 1 for a, b in sentences
                                          for m in range(ROOM, b - a + 1, ROOM)}
    assert first in starts and last in ends, 'a sentence is split across rows'
    if k > 0:
      assert first == 0, 'no separator before a document\'s first sentence'
    if k < len(row_runs) - 1:
      assert last == sentences[-1][1], 'a separator inside a document'
    placed.append((d, first, last))
  return placed


def first_piece_length(d, first, bounds):
  """Length of the sentence (or piece) that starts at `first` in document d."""
  for a, b in bounds[d]:
    if a <= first <= b:
      return min(ROOM, b - first + 1)
  raise AssertionError(first)


def stream_settings(**overrides):
  values = dict(special=SPECIAL, vocab_size=65536, max_seq_length=SEQ, max_predictions=5,
                batch_size=6, nsp=False, short_seq_prob=0.1, mask_rate=0.0,
                mask_token_fraction=0.8, random_token_fraction=0.1, rows='full_sentences')
  values.update(overrides)
  return streaming.StreamSettings(**values)


def stream(directory, seed=0, **overrides):
  store = streaming.DocumentStore(directory)
  order = streaming.document_order(len(store), seed)
  return streaming.PretrainingBatches(order.to_iter_dataset(streaming.read_options()), store,
                                      stream_settings(**overrides), seed)


def test_streamed_rows_are_full_sentences_filled_across_documents(tmp_path):
  documents = documents_with_long_sentences()
  bounds = sentence_bounds(documents)
  directory = test_sop.write_documents(tmp_path / 'prepared', documents)
  iterator = iter(stream(directory))
  rows = [row for _ in range(20) for row in next(iterator)['input_ids']]  # Past one epoch.
  placed = []
  for row in rows:
    length = int((row != SPECIAL.pad).sum())
    placed.append((check_row(row[:length], bounds), length))
  crossing = 0
  for (runs_now, length), (runs_next, _) in zip(placed, placed[1:]):
    crossing += len(runs_now) > 1
    d, first, _ = runs_next[0]
    # Full: the next row's first sentence (and its separator, if it starts a document) would
    # not have fitted.
    separator = 1 if first == 0 else 0
    assert length - 2 + separator + first_piece_length(d, first, bounds) > ROOM
    # Contiguous: the next row goes on where this one stopped, or with the next document.
    d_now, _, last_now = runs_now[-1]
    if first > 0:
      assert d == d_now and first == last_now + 1
    else:
      assert last_now == bounds[d_now][-1][1]
  assert crossing > len(rows) // 4
  # Segment ids: one segment per row.
  assert not next(iterator)['segment_ids'].any()


def test_in_memory_rows_are_full_sentences_and_cover_every_sentence_once():
  documents = documents_with_long_sentences()
  bounds = sentence_bounds(documents)
  instances = pretraining.create_full_sentence_instances(
      documents, np.random.default_rng(0), max_seq_length=SEQ, separator=SPECIAL.sep)
  covered = []
  for instance in instances:
    ids, _ = pretraining.assemble(instance, SPECIAL)
    covered += [(d, i) for d, first, last in check_row(ids, bounds)
                for i in range(first, last + 1)]
  every = [(d, i) for d, document in enumerate(documents)
           for i in range(sum(len(s) for s in document))]
  assert sorted(covered) == every


def test_full_sentence_rows_mask_no_separator():
  documents = documents_with_long_sentences()
  settings = pretraining.MaskingSettings(
      special=SPECIAL, vocab_size=65536, max_seq_length=SEQ, max_predictions=5, nsp=False,
      short_seq_prob=0.1, mask_rate=0.15, mask_token_fraction=0.8, random_token_fraction=0.1,
      rows='full_sentences')
  examples = pipeline.build_examples(documents, np.random.default_rng(0), settings)
  weights = examples['masked_lm_weights'] > 0
  assert weights.sum(1).min() >= 1
  assert not np.isin(examples['masked_lm_ids'][weights], [SPECIAL.cls, SPECIAL.sep]).any()
  assert not examples['segment_ids'].any() and not examples['next_sentence_labels'].any()


def test_resumed_full_sentence_stream_continues_with_the_same_batches(tmp_path):
  directory = test_sop.write_documents(tmp_path / 'prepared', documents_with_long_sentences())
  iterator = iter(stream(directory, mask_rate=0.15))
  for _ in range(5):
    next(iterator)
  state = iterator.get_state()
  expected = [next(iterator) for _ in range(3)]
  resumed = iter(stream(directory, mask_rate=0.15))
  resumed.set_state(state)
  for a, b in zip(expected, [next(resumed) for _ in range(3)]):
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize('key, value', [('objectives', 'mlm,nsp'), ('data.packing', True),
                                        ('data.dupe_factor', 2)])
def test_full_sentences_refuse_pairs_packing_and_static_masks(key, value):
  config = base.get_config()
  config.objectives = 'mlm'
  config.data.rows = 'full_sentences'
  section, _, name = key.rpartition('.')
  (config[section] if section else config)[name] = value
  with pytest.raises(config_lib.ConfigError, match=key.split('.')[-1]):
    pretraining.MaskingSettings.from_config(config, SPECIAL, 99, None,
                                            objectives.resolve(config))


@pytest.mark.slow
@pytest.mark.parametrize('path', ['in_memory', 'prepared'])
def test_roberta_rows_train_a_few_steps(tmp_path, path):
  import conftest  # pylint: disable=g-import-not-at-top
  import test_streaming  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  recipe = {'data.rows': 'full_sentences', 'train.num_steps': 4, 'train.warmup_steps': 2,
            'train.log_every': 2, 'train.eval_every': 4, 'train.checkpoint_every': 4}
  if path == 'in_memory':
    config = conftest.micro_config(tmp_path, **recipe)
  else:
    prepared = test_streaming.write_prepared_with_vocab(tmp_path / 'prepared', 60)
    config = test_streaming.tiny_config(prepared, **recipe)
  config.objectives = 'mlm'
  last_eval = pretrain.train_and_evaluate(config, str(tmp_path / 'run'))
  assert np.isfinite(last_eval['mlm_loss']) and 'nsp_loss' not in last_eval

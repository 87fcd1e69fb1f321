"""The in-memory stream: deterministic epochs, exact resume from a position, a fixed eval set,
the next epoch built beside the current one."""

import threading

import numpy as np
import pytest

from bert_jax.core import errors
from bert_jax.data import pipeline
from bert_jax.data import pretraining

SPECIAL = pretraining.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def synthetic_documents(num_docs=40, seed=0):
  rng = np.random.default_rng(seed)
  return [[rng.integers(5, 99, rng.integers(3, 12)).astype(np.int32)
           for _ in range(rng.integers(2, 9))] for _ in range(num_docs)]


def settings(**overrides):
  values = dict(special=SPECIAL, vocab_size=99, max_seq_length=23, max_predictions=4, nsp=True,
                short_seq_prob=0.1, mask_rate=0.15, mask_token_fraction=0.8,
                random_token_fraction=0.1, is_continuation=None)
  values.update(overrides)
  return pretraining.MaskingSettings(**values)


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_same_batches(a, b):
  assert len(a) == len(b)
  for (batch_a, _), (batch_b, _) in zip(a, b):
    for key in batch_a:
      np.testing.assert_array_equal(batch_a[key], batch_b[key])


def test_batches_have_fixed_shapes_and_dtypes():
  stream = pipeline.PretrainingStream(synthetic_documents(), settings(), batch_size=5, seed=0)
  batch, _ = next(stream.batches({'epoch': 0, 'batch': 0}))
  assert batch['input_ids'].shape == (5, 23) and batch['input_ids'].dtype == np.int32
  assert batch['masked_lm_positions'].shape == (5, 4)
  assert batch['masked_lm_weights'].dtype == np.float32
  assert batch['next_sentence_labels'].shape == (5,)


def test_resume_from_a_position_gives_the_uninterrupted_batches():
  docs = synthetic_documents()
  uninterrupted = take(pipeline.PretrainingStream(docs, settings(), 7, seed=3).batches(
      {'epoch': 0, 'batch': 0}), 40)  # Crosses several epochs.
  stop = 17
  position = uninterrupted[stop - 1][1]
  resumed = take(pipeline.PretrainingStream(docs, settings(), 7, seed=3).batches(position),
                 40 - stop)
  assert_same_batches(uninterrupted[stop:], resumed)


def recording_build(built: list, fail_epochs: int | None = None):
  """build_examples, noting (epoch count so far, thread name) as each epoch is built; the
  epoch `fail_epochs` raises instead."""
  def build(documents, rng, settings):
    if len(built) == fail_epochs:
      built.append(('failed', threading.current_thread().name))
      raise errors.ConfigError('the third epoch does not build')
    built.append((len(built), threading.current_thread().name))
    return pipeline.build_examples(documents, rng, settings)
  return build


def test_the_next_epoch_is_built_in_a_thread_and_its_batches_are_the_same():
  docs = synthetic_documents()  # 40 documents: 15-17 batches of 7 an epoch.
  built = []
  stream = pipeline.PretrainingStream(docs, settings(), 7, seed=3, build=recording_build(built))
  batches = take(stream.batches({'epoch': 0, 'batch': 0}), 56)  # Into the fourth epoch.
  assert [position['epoch'] for _, position in batches][-1] == 3
  # Epoch 0 is built where the stream starts; each later one in its own thread, started once
  # BUILD_AHEAD_AFTER batches of the epoch before had been read.
  assert built[0] == (0, threading.current_thread().name)
  assert [name for _, name in built[1:]] == ['epoch-1', 'epoch-2', 'epoch-3', 'epoch-4']
  # The same batches as epochs built one by one in this thread.
  plain = pipeline.PretrainingStream(docs, settings(), 7, seed=3)
  build = plain._build_epoch  # pylint: disable=protected-access
  rows = {epoch: build(epoch) for epoch in range(4)}
  for batch, position in batches:
    window = slice(7 * (position['batch'] - 1), 7 * position['batch'])
    for key, values in batch.items():
      np.testing.assert_array_equal(values, rows[position['epoch']][key][window])


def test_a_run_that_stops_within_its_first_batches_builds_no_epoch_ahead():
  built = []
  stream = pipeline.PretrainingStream(synthetic_documents(), settings(), 7, seed=3,
                                      build=recording_build(built))
  take(stream.batches({'epoch': 0, 'batch': 0}), pipeline.BUILD_AHEAD_AFTER - 1)
  assert len(built) == 1


def test_an_epoch_built_ahead_that_fails_raises_where_the_stream_reaches_it():
  built = []
  stream = pipeline.PretrainingStream(synthetic_documents(), settings(), 7, seed=3,
                                      build=recording_build(built, fail_epochs=2))
  batches = stream.batches({'epoch': 0, 'batch': 0})
  read = []
  with pytest.raises(errors.ConfigError, match='the third epoch does not build'):
    while True:
      read.append(next(batches)[1])
  # Every batch of epochs 0 and 1 was read before the error.
  assert read[-1]['epoch'] == 1 and read[-1]['batch'] == stream.batches_per_epoch(1)
  assert built[-1] == ('failed', 'epoch-2')


def test_epochs_differ_and_seeds_differ_but_each_is_reproducible():
  docs = synthetic_documents()
  stream = pipeline.PretrainingStream(docs, settings(), 5, seed=0)
  again = pipeline.PretrainingStream(docs, settings(), 5, seed=0)
  other = pipeline.PretrainingStream(docs, settings(), 5, seed=1)
  np.testing.assert_array_equal(stream.epoch_examples(0)['input_ids'],
                                again.epoch_examples(0)['input_ids'])
  first = stream.epoch_examples(0)['input_ids'].copy()
  assert not np.array_equal(first[:5], stream.epoch_examples(1)['input_ids'][:5])
  assert not np.array_equal(first[:5], other.epoch_examples(0)['input_ids'][:5])


def test_eval_set_is_fixed_and_held_out():
  docs = synthetic_documents(num_docs=50)
  train, held_out = pipeline.split_documents(docs, eval_fraction=0.1, seed=0)
  assert len(held_out) == 5 and len(train) == 45
  train_ids = {id(d) for d in train}
  assert not any(id(d) in train_ids for d in held_out)
  a = pipeline.eval_batches(held_out, settings(), 4, 3, seed=0)
  b = pipeline.eval_batches(held_out, settings(), 4, 3, seed=0)
  assert len(a) == 3
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x['input_ids'], y['input_ids'])


def test_too_small_corpus_is_a_clear_error():
  docs = synthetic_documents(num_docs=2)
  stream = pipeline.PretrainingStream(docs, settings(), batch_size=500, seed=0)
  # A ConfigError: bert_jax.main ends the run with its one line.
  with pytest.raises(errors.ConfigError, match='fewer than batch_size=500'):
    next(stream.batches({'epoch': 0, 'batch': 0}))
  with pytest.raises(errors.ConfigError,
                     match=r'The held-out documents \(0\) yield 0 examples, fewer than '
                           r'train.batch_size=4; raise data.eval_fraction'):
    pipeline.eval_batches([], settings(), 4, 1, seed=0)


def test_most_frequent_label_baseline():
  batch = {'masked_lm_ids': np.array([[7, 7, 9], [7, 5, 0]]),
           'masked_lm_weights': np.array([[1., 1., 1.], [1., 1., 0.]], np.float32)}
  assert pipeline.most_frequent_label(batch) == 7
  assert pipeline.baseline_accuracy([batch], 7) == pytest.approx(3 / 5)

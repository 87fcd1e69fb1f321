"""Sentence-order prediction's data (ALBERT): consecutive segments of one document, swapped for
half the pairs, in memory and streamed (packed or not); NSP's pairs stay as they were."""

import hashlib
import os

import numpy as np
import pytest
from array_record.python import array_record_module

from bert_jax import objectives
from bert_jax.data import pretraining
from bert_jax.data import records
from bert_jax.data import streaming
from configs import base

SPECIAL = pretraining.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
STRIDE = 1000  # Document d holds the ids 5 + STRIDE * d + (its token's index in d).


def numbered_documents(num_documents=60, seed=0, sentences=8, length=12):
  """Documents whose ids say where each token sits: document id // STRIDE, index id % STRIDE."""
  rng = np.random.default_rng(seed)
  documents = []
  for d in range(num_documents):
    lengths = rng.integers(1, length, rng.integers(1, sentences))
    ids = 5 + STRIDE * d + np.arange(lengths.sum())
    documents.append(np.split(ids.astype(np.int32), np.cumsum(lengths)[:-1]))
  return documents


def where(tokens):
  """(document, first index, last index) of a segment that is one run of a document."""
  documents = np.unique((tokens - 5) // STRIDE)
  assert len(documents) == 1, 'a segment mixes documents'
  index = (tokens - 5) % STRIDE
  assert (np.diff(index) == 1).all(), 'a segment is not a run of its document'
  return int(documents[0]), int(index[0]), int(index[-1])


def check_sop_pair(tokens_a, tokens_b, label, truncated_at=None):
  """A and B are runs of one document, B after A (label 0) or A after B (label 1), touching
  unless the pair was truncated (its length reached truncated_at)."""
  doc_a, first_a, last_a = where(tokens_a)
  doc_b, first_b, last_b = where(tokens_b)
  assert doc_a == doc_b, 'B comes from another document'
  (first, last), (second, _) = (((first_a, last_a), (first_b, last_b)) if label == 0
                                else ((first_b, last_b), (first_a, last_a)))
  assert second > last
  if truncated_at is None or len(tokens_a) + len(tokens_b) < truncated_at:
    assert second == last + 1


def sop_instances(documents, seed, max_seq_length=64, short_seq_prob=0.1):
  return pretraining.create_instances(
      documents, np.random.default_rng(seed), max_seq_length=max_seq_length,
      short_seq_prob=short_seq_prob, nsp=True, pair_kind='order')


@pytest.mark.parametrize('max_seq_length', [512, 24])
def test_sop_pairs_are_consecutive_segments_of_one_document(max_seq_length):
  documents = numbered_documents()
  instances = sop_instances(documents, 0, max_seq_length, short_seq_prob=0.3)
  assert len(instances) >= 40
  for inst in instances:
    check_sop_pair(inst.tokens_a, inst.tokens_b, int(inst.is_random_next),
                   truncated_at=max_seq_length - 3)
  # NSP on the same documents draws B from other documents: the check above tells them apart.
  nsp = pretraining.create_instances(documents, np.random.default_rng(0), max_seq_length=512,
                                     short_seq_prob=0.3, nsp=True)
  assert any(where(i.tokens_a)[0] != where(i.tokens_b)[0] for i in nsp)


def test_sop_labels_are_balanced():
  instances = []
  for seed in range(20):
    instances += sop_instances(numbered_documents(seed=seed), seed, max_seq_length=24)
  n = len(instances)
  swapped = np.mean([inst.is_random_next for inst in instances])
  assert n > 1000 and abs(swapped - 0.5) < 4 * np.sqrt(0.25 / n)


def test_a_one_sentence_chunk_makes_no_sop_pair():
  documents = [[np.arange(5, 30, dtype=np.int32)], [np.arange(1005, 1030, dtype=np.int32)]]
  assert not sop_instances(documents, 0, max_seq_length=32, short_seq_prob=0.0)


def test_nsp_instances_are_unchanged():
  """NSP's pairs and single segments of these documents and seed, pinned."""
  rng = np.random.default_rng(0)
  documents = [[rng.integers(5, 99, rng.integers(1, 15)).astype(np.int32)
                for _ in range(rng.integers(1, 9))] for _ in range(60)]
  h = hashlib.sha256()
  for nsp in (True, False):
    for inst in pretraining.create_instances(documents, np.random.default_rng(4),
                                             max_seq_length=24, short_seq_prob=0.3, nsp=nsp):
      h.update(inst.tokens_a.astype(np.int64).tobytes())
      h.update(b'|')
      h.update(inst.tokens_b.astype(np.int64).tobytes())
      h.update(b'1' if inst.is_random_next else b'0')
  assert h.hexdigest()[:16] == '6599c9dd26e9c74f'


def test_the_objectives_choose_the_pairs():
  config = base.get_config()
  settings = {}
  for names in ('mlm,nsp', 'mlm,sop', 'mlm'):
    config.objectives = names
    settings[names] = pretraining.MaskingSettings.from_config(
        config, SPECIAL, 99, None, objectives.resolve(config))
  assert settings['mlm,nsp'].nsp and settings['mlm,nsp'].pair_kind == 'next'
  assert settings['mlm,sop'].nsp and settings['mlm,sop'].pair_kind == 'order'
  assert not settings['mlm'].nsp
  assert objectives.get('sop').batch_spec(objectives.BatchShape(8, 2)).keys() == {
      'next_sentence_labels'}


def write_documents(directory, documents):
  """A prepared corpus of `documents` in two shards."""
  os.makedirs(directory, exist_ok=True)
  entries = []
  for index, part in enumerate((documents[::2], documents[1::2])):
    name = records.SHARD_PATTERN.format(index=index)
    writer = array_record_module.ArrayRecordWriter(os.path.join(directory, name), 'group_size:1')
    for document in part:
      writer.write(records.encode_document(document, 'uint16'))
    writer.close()
    entries.append({'file': name, 'documents': len(part)})
  records.write_metadata(directory, records.Metadata(
      format_version=records.FORMAT_VERSION, vocab_sha256='0' * 64, vocab_file='vocab.txt',
      vocab_size=65536, lowercase=True, token_dtype='uint16', shards=entries,
      num_documents=len(documents)))
  return str(directory)


def stream_settings(**overrides):
  values = dict(special=SPECIAL, vocab_size=65536, max_seq_length=48, max_predictions=8,
                batch_size=8, nsp=True, pair_kind='order', short_seq_prob=0.2, mask_rate=0.0,
                mask_token_fraction=0.8, random_token_fraction=0.1)
  values.update(overrides)
  return streaming.StreamSettings(**values)


def batches(directory, count, **overrides):
  store = streaming.DocumentStore(directory)
  order = streaming.document_order(len(store), 0)
  iterator = iter(streaming.PretrainingBatches(order.to_iter_dataset(streaming.read_options()),
                                               store, stream_settings(**overrides), 0))
  return [next(iterator) for _ in range(count)]


@pytest.mark.parametrize('packing', [False, True])
def test_streamed_sop_pairs_are_consecutive_segments_of_one_document(tmp_path, packing):
  directory = write_documents(tmp_path / 'prepared', numbered_documents(num_documents=40))
  options = dict(packing=packing, max_pairs_per_row=3 if packing else 1)
  labels = []
  for batch in batches(directory, 12, **options):
    pair_ids = batch['pair_ids'] if packing else batch['input_mask']
    row_labels = batch['next_sentence_labels'].reshape(len(pair_ids), -1)
    for r in range(len(pair_ids)):
      for j in range(int(pair_ids[r].max())):
        span = np.flatnonzero(pair_ids[r] == j + 1)
        ids, segments = batch['input_ids'][r, span], batch['segment_ids'][r, span]
        text = ~np.isin(ids, [SPECIAL.cls, SPECIAL.sep])
        check_sop_pair(ids[text & (segments == 0)], ids[text & (segments == 1)],
                       row_labels[r, j], truncated_at=48 - 3)
        labels.append(row_labels[r, j])
  assert 0 < np.mean(labels) < 1


@pytest.mark.slow
@pytest.mark.parametrize('path', ['in_memory', 'prepared', 'prepared_packed'])
def test_albert_recipe_trains_a_few_steps(tmp_path, path):
  """'mlm,sop' with n-gram masking on the ALBERT encoder, in memory and streamed."""
  import conftest  # pylint: disable=g-import-not-at-top
  import test_streaming  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  recipe = {'objectives': 'mlm,sop', 'masking.max_ngram': 3, 'model.name': 'albert',
            'model.embedding_size': 16, 'train.num_steps': 4, 'train.warmup_steps': 2,
            'train.log_every': 2, 'train.eval_every': 4, 'train.checkpoint_every': 4}
  if path == 'in_memory':
    config = conftest.micro_config(tmp_path, **recipe)
  else:
    prepared = test_streaming.write_prepared_with_vocab(tmp_path / 'prepared', 60)
    config = test_streaming.tiny_config(prepared, **{k: v for k, v in recipe.items()
                                                     if k != 'objectives'})
    config.objectives = 'mlm,sop'
    config.data.packing = path == 'prepared_packed'
  last_eval = pretrain.train_and_evaluate(config, str(tmp_path / 'run'))
  assert np.isfinite(last_eval['mlm_loss']) and np.isfinite(last_eval['sop_loss'])
  assert 0 <= last_eval['sop_accuracy'] <= 1 and 'nsp_loss' not in last_eval

"""The streaming pipeline: exact resume, the paper's masking rules, packing that changes no
per-example output, static masking, and the held-out split."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from array_record.python import array_record_module

from bert_jax.data import batching
from bert_jax.data import pretraining
from bert_jax.data import records
from bert_jax.data import streaming
from bert_jax.models import bert as model_lib
from bert_jax.models.encoder import EncoderConfig
from bert_jax.objectives import pretraining as pretraining_model

SPECIAL = pretraining.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 997


def write_prepared(directory, num_documents=120, seed=0, shards=3, sentences=12, length=40):
  """A prepared corpus of random documents (1 to sentences-1 sentences of 3 to length-1 ids)."""
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  entries = []
  for index in range(shards):
    name = records.SHARD_PATTERN.format(index=index)
    writer = array_record_module.ArrayRecordWriter(os.path.join(directory, name), 'group_size:1')
    count = num_documents // shards
    for _ in range(count):
      document = [rng.integers(5, VOCAB, rng.integers(3, length)).astype(np.int32)
                  for _ in range(rng.integers(1, sentences))]
      writer.write(records.encode_document(document, 'uint16'))
    writer.close()
    entries.append({'file': name, 'documents': count})
  records.write_metadata(directory, records.Metadata(
      format_version=records.FORMAT_VERSION, vocab_sha256='0' * 64, vocab_file='vocab.txt',
      vocab_size=VOCAB, lowercase=True, token_dtype='uint16', shards=entries,
      num_documents=num_documents))
  return str(directory)


def settings(**overrides):
  fields = dict(special=SPECIAL, vocab_size=VOCAB, max_seq_length=64, max_predictions=10,
                batch_size=8, nsp=True, short_seq_prob=0.1, mask_rate=0.15,
                mask_token_fraction=0.8, random_token_fraction=0.1)
  fields.update(overrides)
  return streaming.StreamSettings(**fields)


def stream(directory, seed=0, process_index=0, process_count=1, **overrides):
  store = streaming.DocumentStore(directory)
  order = streaming.document_order(len(store), seed, process_index, process_count)
  return streaming.PretrainingBatches(order.to_iter_dataset(streaming.read_options()), store,
                                      settings(**overrides), seed)


def equal_batches(a, b):
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize('packing', [False, True])
def test_resumed_stream_continues_with_the_same_batches(tmp_path, packing):
  directory = write_prepared(tmp_path / 'prepared')
  options = dict(packing=packing, max_pairs_per_row=3 if packing else 1)
  iterator = iter(stream(directory, **options))
  for stop_after in (1, 7, 30):  # 30 batches pass the end of the first epoch.
    while iterator.get_state()['batches'] < stop_after:
      next(iterator)
    state = iterator.get_state()
    expected = [next(iterator) for _ in range(4)]
    resumed = iter(stream(directory, **options))
    resumed.set_state(state)
    assert all(equal_batches(a, b) for a, b in zip(expected, [next(resumed) for _ in range(4)]))


def test_processes_read_disjoint_documents(tmp_path):
  directory = write_prepared(tmp_path / 'prepared')
  order = [[doc for _, doc in streaming.document_order(120, 0, p, 2)[:120]] for p in range(2)]
  assert not set(order[0][:60]) & set(order[1][:60])
  assert sorted(order[0][:60] + order[1][:60]) == list(range(120))
  # Each epoch is a fresh order.
  epoch0, epoch1 = streaming.document_order(120, 0)[:120], streaming.document_order(120, 0)[120:240]
  assert [d for _, d in epoch0] != [d for _, d in epoch1]
  assert {e for e, _ in epoch1} == {1}
  assert directory


def test_masking_follows_the_paper(tmp_path):
  directory = write_prepared(tmp_path / 'prepared', num_documents=300)
  iterator = iter(stream(directory, batch_size=64, max_predictions=20))
  batches = [next(iterator) for _ in range(20)]
  original, replaced, total_real = [], [], 0
  for batch in batches:
    weights = batch['masked_lm_weights'] > 0
    lengths = batch['input_mask'].sum(1)
    # Each row: min(max_predictions, max(1, round(length * rate))) predictions.
    expected = np.minimum(20, np.maximum(1, np.round(lengths * 0.15)))
    np.testing.assert_array_equal(weights.sum(1), expected)
    labels = batch['masked_lm_ids'][weights]
    assert not np.isin(labels, [SPECIAL.cls, SPECIAL.sep, SPECIAL.pad]).any()
    rows = np.repeat(np.arange(len(weights)), weights.sum(1))
    replaced.append(batch['input_ids'][rows, batch['masked_lm_positions'][weights]])
    original.append(labels)
    total_real += lengths.sum()
    for row_positions, row_weights in zip(batch['masked_lm_positions'], weights):
      assert (np.diff(row_positions[row_weights]) > 0).all()  # Sorted, distinct.
  original, replaced = np.concatenate(original), np.concatenate(replaced)
  n = len(original)
  mask_share = np.mean(replaced == SPECIAL.mask)
  kept_share = np.mean(replaced == original)
  assert abs(mask_share - 0.8) < 4 * np.sqrt(0.16 / n)
  # Kept: the 10% left alone plus random draws that hit the label.
  assert abs(kept_share - 0.1) < 4 * np.sqrt(0.09 / n) + 0.002
  assert 0.14 < n / total_real < 0.16


def test_packed_rows_fit_and_keep_each_pair_apart(tmp_path):
  directory = write_prepared(tmp_path / 'prepared')
  iterator = iter(stream(directory, packing=True, max_pairs_per_row=4, short_seq_prob=0.5))
  for batch in (next(iterator) for _ in range(10)):
    pairs = batch['pair_ids']
    for row in range(len(pairs)):
      count = int(batch['nsp_weights'][row].sum())
      assert set(np.unique(pairs[row])) - {0} == set(range(1, count + 1))
      for j in range(count):
        span = np.flatnonzero(pairs[row] == j + 1)
        assert np.array_equal(batch['position_ids'][row, span], np.arange(len(span)))
        assert batch['nsp_positions'][row, j] == span[0]
        assert batch['input_ids'][row, span[0]] == SPECIAL.cls
        assert batch['input_ids'][row, span[-1]] == SPECIAL.sep


def test_packing_raises_real_tokens_per_row(tmp_path):
  """Short documents (1-3 sentences of 3-9 ids) leave most of an unpacked row as padding."""
  directory = write_prepared(tmp_path / 'prepared', sentences=4, length=10)
  real = {}
  for packing in (False, True):
    iterator = iter(stream(directory, packing=packing, max_pairs_per_row=4))
    real[packing] = np.mean([next(iterator)['input_mask'].sum() for _ in range(20)])
  assert real[True] > 2.0 * real[False]


def test_static_masking_repeats_each_pass(tmp_path):
  """dupe_factor=1: every epoch has the same pairs and masks (only the order differs)."""
  directory = write_prepared(tmp_path / 'prepared', num_documents=30, shards=1)
  store = streaming.DocumentStore(directory)
  per_epoch = 0
  for doc_id in range(len(store)):
    rng = np.random.default_rng([0, streaming._DOC_STREAM, 0, doc_id])  # pylint: disable=protected-access
    per_epoch += len(pretraining.create_instances_from_document(
        store, doc_id, rng, max_seq_length=64, short_seq_prob=0.1, nsp=True))
  iterator = iter(stream(directory, batch_size=1, dupe_factor=1))
  rows = [next(iterator)['input_ids'][0].tobytes() for _ in range(2 * per_epoch)]
  assert sorted(rows[:per_epoch]) == sorted(rows[per_epoch:])
  dynamic = iter(stream(directory, batch_size=1))
  rows = [next(dynamic)['input_ids'][0].tobytes() for _ in range(2 * per_epoch)]
  assert sorted(rows[:per_epoch]) != sorted(rows[per_epoch:])


def test_held_out_documents_never_train():
  train, held_out = streaming.split_ids(100, 0.1, seed=3)
  assert len(held_out) == 10 and not set(train) & set(held_out)
  assert sorted(np.concatenate([train, held_out])) == list(range(100))


@pytest.mark.slow
def test_packed_and_unpacked_rows_give_the_same_per_example_outputs():
  cfg = EncoderConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                      intermediate_size=64, max_position_embeddings=64,
                      hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  model = pretraining_model.PretrainingModel(cfg)
  encoder = model_lib.BertModel(cfg)
  rng = np.random.default_rng(0)
  instances = [pretraining.Instance(rng.integers(5, VOCAB, n).astype(np.int32),
                                    rng.integers(5, VOCAB, m).astype(np.int32), bool(n % 2))
               for n, m in ((5, 7), (9, 3), (4, 4))]
  s = settings(max_seq_length=48, max_predictions=6, batch_size=3)
  unpacked = batching.make_batch([[(i, (0, 0), 0)] for i in instances], rng, s)
  packed = batching.make_batch([[(i, (0, 0), 0) for i in instances]],
                                rng, settings(max_seq_length=48, max_predictions=18,
                                              batch_size=1, packing=True, max_pairs_per_row=3))
  # Predict every real position of every pair, with the unmasked ids in both layouts.
  ids = [pretraining.assemble(i, SPECIAL)[0] for i in instances]
  variables = model.init(jax.random.PRNGKey(0), jax.tree.map(jnp.asarray, unpacked))
  encoder_variables = {'params': variables['params']['bert']}
  starts = np.cumsum([0] + [len(x) for x in ids])
  packed_ids = np.zeros((1, 48), np.int32)
  packed_ids[0, :starts[-1]] = np.concatenate(ids)
  unpacked_ids = np.zeros((3, 48), np.int32)
  for r, x in enumerate(ids):
    unpacked_ids[r, :len(x)] = x
  sequence_unpacked, pooled_unpacked = encoder.apply(
      encoder_variables, unpacked_ids, unpacked['segment_ids'], unpacked['input_mask'])
  sequence_packed, pooled_packed = encoder.apply(
      encoder_variables, packed_ids, packed['segment_ids'], packed['input_mask'], True,
      jnp.asarray(packed['position_ids']), jnp.asarray(packed['pair_ids']),
      jnp.asarray(packed['nsp_positions']))
  for r, x in enumerate(ids):
    np.testing.assert_allclose(sequence_packed[0, starts[r]:starts[r + 1]],
                               sequence_unpacked[r, :len(x)], atol=2e-5)
    np.testing.assert_allclose(pooled_packed[0, r], pooled_unpacked[r], atol=2e-5)
  # And the losses: NSP per pair, MLM at the same tokens.
  outputs = model.apply(variables, {**packed, 'input_ids': packed_ids})
  assert outputs['nsp_logits'].shape == (1, 3, 2)
  reference = model.apply(variables, {**unpacked, 'input_ids': unpacked_ids})
  np.testing.assert_allclose(outputs['nsp_logits'][0], reference['nsp_logits'], atol=2e-5)


def write_vocab(directory):
  """vocab.txt matching SPECIAL and VOCAB, and its sha256."""
  import hashlib  # pylint: disable=g-import-not-at-top
  path = os.path.join(directory, 'vocab.txt')
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
                      + [f'w{i}' for i in range(5, VOCAB)]) + '\n')
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def write_prepared_with_vocab(directory, num_documents=90):
  """write_prepared's short documents (6 sentences of 20 tokens) with their vocab.txt, its
  sha256 recorded in the metadata as prepare_data records it."""
  directory = write_prepared(directory, num_documents=num_documents, sentences=6, length=20)
  metadata = records.read_metadata(directory)
  metadata.vocab_sha256 = write_vocab(directory)
  records.write_metadata(directory, metadata)
  return directory


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  return write_prepared_with_vocab(tmp_path_factory.mktemp('prepared'))


def tiny_config(prepared_dir, **overrides):
  from configs import tiny  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  values = {
      'model.vocab_size': 1024, 'model.hidden_size': 32, 'model.num_layers': 2,
      'model.num_heads': 2, 'model.intermediate_size': 64, 'model.max_position_embeddings': 64,
      'data.max_seq_length': 64, 'data.max_predictions_per_seq': 10, 'data.eval_fraction': 0.1,
      'data.corpus': '', 'data.prepared': prepared_dir, 'train.batch_size': 8,
      'train.learning_rate': 1e-3, 'train.warmup_steps': 2, 'train.eval_batches': 2,
      'train.keep_checkpoints': 3, 'train.peak_flops': 1e11, 'train.num_steps': 12,
      'train.log_every': 2, 'train.eval_every': 6, 'train.checkpoint_every': 4, **overrides}
  for key, value in values.items():
    section, name = key.split('.')
    config[section][name] = value
  return config


def final_params(workdir, step):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  return ocp.StandardCheckpointer().restore(
      os.path.join(workdir, 'checkpoints', str(step), 'state'))['params']


@pytest.mark.slow
def test_training_on_a_prepared_corpus_resumes_exactly(prepared, tmp_path, packing=True):
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = tiny_config(prepared, **{'data.packing': packing})
  reference = str(tmp_path / 'reference')
  last_eval = pretrain.train_and_evaluate(config, reference)
  assert np.isfinite(last_eval['mlm_loss']) and 'nsp_accuracy' in last_eval
  restarted = str(tmp_path / 'restarted')
  pretrain.train_and_evaluate(tiny_config(prepared, **{'data.packing': packing}), restarted)
  shutil.rmtree(os.path.join(restarted, 'checkpoints', '12'))  # As if it died after step 8.
  pretrain.train_and_evaluate(tiny_config(prepared, **{'data.packing': packing}), restarted)
  for a, b in zip(jax.tree.leaves(final_params(reference, 12)),
                  jax.tree.leaves(final_params(restarted, 12))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_prepared_corpus_of_another_vocab_is_refused(prepared, tmp_path):
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  other = tmp_path / 'vocab.txt'
  other.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'x']) + '\n')
  config = tiny_config(prepared, **{'data.vocab_file': str(other)})
  with pytest.raises(config_lib.ConfigError, match='was tokenised with the vocab of sha256'):
    pretrain.train_and_evaluate(config, str(tmp_path / 'run'))
  config = tiny_config(prepared, **{'data.lowercase': False})
  with pytest.raises(config_lib.ConfigError, match='lowercase=True'):
    pretrain.train_and_evaluate(config, str(tmp_path / 'run2'))
  config = tiny_config('', **{'data.corpus': 'builtin', 'data.packing': True})
  with pytest.raises(config_lib.ConfigError, match='needs a prepared corpus'):
    pretrain.train_and_evaluate(config, str(tmp_path / 'run3'))
  # A phase-2 batch the input shards cannot split is found at start-up, not at the phase.
  phase2 = {'train.phase2_fraction': 0.5, 'data.phase2_max_seq_length': 64,
            'data.phase2_max_predictions_per_seq': 10}
  config = tiny_config(prepared, **phase2, **{'data.input_shards': 2,
                                               'train.phase2_batch_size': 3})
  with pytest.raises(config_lib.ConfigError, match='3 rows of a batch per process'):
    pretrain.train_and_evaluate(config, str(tmp_path / 'run4'))
  config = tiny_config(prepared, **{**phase2, 'data.phase2_max_seq_length': 512})
  with pytest.raises(config_lib.ConfigError, match='phase2_max_seq_length=512 exceeds'):
    pretrain.train_and_evaluate(config, str(tmp_path / 'run5'))


@pytest.mark.slow
def test_two_phases_switch_shapes_and_resume_in_either(prepared, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  two_phases = {'data.max_seq_length': 32, 'data.max_predictions_per_seq': 5,
                'train.phase2_fraction': 0.25, 'data.phase2_max_seq_length': 64,
                'data.phase2_max_predictions_per_seq': 10, 'train.phase2_batch_size': 4,
                'train.keep_checkpoints': 5}
  reference = str(tmp_path / 'reference')
  pretrain.train_and_evaluate(tiny_config(prepared, **two_phases), reference)
  # Steps 1-9 at seq 32 (batch 8), 10-12 at seq 64 (batch 4); the boundary step 9 is saved.
  assert sorted(int(s) for s in os.listdir(os.path.join(reference, 'checkpoints'))) == [4, 8, 9,
                                                                                         12]
  for removed in (['12'], ['12', '9']):  # Resume inside phase 2, then inside phase 1.
    restarted = str(tmp_path / f'restarted{len(removed)}')
    shutil.copytree(reference, restarted)
    for step in removed:
      shutil.rmtree(os.path.join(restarted, 'checkpoints', step))
    pretrain.train_and_evaluate(tiny_config(prepared, **two_phases), restarted)
    for a, b in zip(jax.tree.leaves(final_params(reference, 12)),
                    jax.tree.leaves(final_params(restarted, 12))):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# A micro modern encoder (rotary positions, local windows) in two phases: 9 steps at seq 32,
# then 3 at 64.
MODERN = {'model.name': 'modernbert', 'model.positions': 'rotary', 'model.rope_theta': 10000.0,
          'model.local_rope_theta': 10000.0, 'model.local_window': 8, 'model.global_every': 2,
          'model.scan_layers': False, 'model.use_bias': False, 'model.feed_forward': 'geglu',
          'model.type_vocab_size': 1, 'data.max_seq_length': 32,
          'data.max_predictions_per_seq': 5, 'train.phase2_fraction': 0.25,
          'data.phase2_max_seq_length': 64, 'data.phase2_max_predictions_per_seq': 10,
          'train.phase2_batch_size': 4, 'train.keep_checkpoints': 5}


@pytest.mark.slow
def test_a_context_extension_phase_changes_the_model_of_phase_2_only(prepared, tmp_path,
                                                                     caplog):
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top

  def modern(phase2_model=''):
    config = tiny_config(prepared, **MODERN, **{'train.phase2_model': phase2_model})
    config.objectives = 'mlm'
    return config
  runs = {}
  for name, change in (('plain', ''), ('same', 'rope_theta=10000'),
                       ('extended', 'rope_theta=160000,local_window=16')):
    runs[name] = str(tmp_path / name)
    with caplog.at_level('INFO'):
      pretrain.train_and_evaluate(modern(change), runs[name])
  assert ('Phase 2 from step 10: seq 64, 10 predictions, batch 4, model.rope_theta=160000.0, '
          'model.local_window=16.') in caplog.text
  same = lambda a, b, step: all(  # noqa: E731
      np.array_equal(np.asarray(x), np.asarray(y))
      for x, y in zip(jax.tree.leaves(final_params(runs[a], step)),
                      jax.tree.leaves(final_params(runs[b], step)), strict=True))
  # Phase 1 is the same run; phase 2 trains with the new theta and window (phase 1's own values
  # given again change nothing).
  assert same('plain', 'extended', 9) and not same('plain', 'extended', 12)
  assert same('plain', 'same', 12)
  # Stopped inside phase 2 and rerun: the extended model again, to the same end.
  runs['resumed'] = str(tmp_path / 'resumed')
  shutil.copytree(runs['extended'], runs['resumed'])
  shutil.rmtree(os.path.join(runs['resumed'], 'checkpoints', '12'))
  pretrain.train_and_evaluate(modern('rope_theta=160000,local_window=16'), runs['resumed'])
  assert same('resumed', 'extended', 12)


def test_a_truncated_or_missing_shard_is_an_error_naming_it(tmp_path):
  directory = write_prepared(tmp_path / 'prepared')
  shard = os.path.join(directory, records.SHARD_PATTERN.format(index=1))
  with open(shard, 'rb') as f:
    data = f.read()
  with open(shard, 'wb') as f:
    f.write(data[:len(data) // 2])
  with pytest.raises(ValueError, match=r'documents-00001\.array_record .*truncated or corrupt'):
    streaming.DocumentStore(directory)
  os.remove(shard)
  with pytest.raises(ValueError, match=r'documents-00001\.array_record is missing'):
    streaming.DocumentStore(directory)

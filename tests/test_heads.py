"""The fine-tuning heads: output shapes, the encoder's names, all-layer outputs, frozen features,
a BiLSTM between the fine-tuned encoder and the head."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import bert as model_lib
from bert_jax.models import heads
from bert_jax.models.encoder import EncoderConfig
from bert_jax.objectives import pretraining
from bert_jax.train import finetune

BATCH, SEQ = 3, 7


def small_config(**overrides):
  cfg = EncoderConfig(vocab_size=99, hidden_size=24, num_layers=3, num_heads=4,
                      intermediate_size=37, max_position_embeddings=16)
  return dataclasses.replace(cfg, **overrides)


def inputs(seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 99, (BATCH, SEQ)).astype(np.int32)
  mask = np.ones((BATCH, SEQ), np.int32)
  mask[0, 4:] = 0
  return ids, np.zeros_like(ids), mask


def init(module):
  ids, segments, mask = inputs()
  return nn.meta.unbox(module.init(jax.random.PRNGKey(0), ids, segments, mask)['params'])


@pytest.mark.parametrize('head,num_outputs,keys,shape', [
    ('classification', 3, ('logits',), (BATCH, 3)),
    ('regression', 1, ('logits',), (BATCH, 1)),
    ('token', 9, ('logits',), (BATCH, SEQ, 9)),
    ('span', 2, ('start_logits', 'end_logits'), (BATCH, SEQ)),
])
@pytest.mark.slow
def test_each_head_returns_its_outputs_in_float32(head, num_outputs, keys, shape):
  module = heads.BertForFineTuning(small_config(dtype=jnp.bfloat16), head, num_outputs)
  params = init(module)
  outputs = module.apply({'params': params}, *inputs())
  assert tuple(outputs) == keys
  for value in outputs.values():
    assert value.shape == shape and value.dtype == jnp.float32


@pytest.mark.slow
def test_encoder_lives_under_bert_like_the_pretraining_model():
  fine = init(heads.BertForFineTuning(small_config(), 'classification', 2))
  ids = jnp.zeros((1, SEQ), jnp.int32)
  pre = nn.meta.unbox(pretraining.PretrainingModel(small_config()).init(
      jax.random.PRNGKey(0), {'input_ids': ids, 'segment_ids': ids, 'input_mask': ids,
                              'masked_lm_positions': jnp.zeros((1, 2), jnp.int32)})['params'])
  shapes = lambda tree: jax.tree.map(np.shape, tree)  # noqa: E731
  assert shapes(fine['bert']) == shapes(pre['bert'])
  assert set(fine) == {'bert', 'classifier'}


@pytest.mark.slow
@pytest.mark.parametrize('scan', [True, False])
def test_all_layers_end_with_the_sequence_output(scan):
  cfg = small_config(scan_layers=scan)
  module = model_lib.BertModel(cfg)
  ids, segments, mask = inputs()
  variables = module.init(jax.random.PRNGKey(0), ids, segments, mask)
  sequence, pooled = module.apply(variables, ids, segments, mask)
  all_layers, pooled_all = model_lib.BertModel(cfg, return_all_layers=True).apply(
      variables, ids, segments, mask)
  assert all_layers.shape == (cfg.num_layers, BATCH, SEQ, cfg.hidden_size)
  np.testing.assert_allclose(all_layers[-1], sequence, rtol=1e-6)
  np.testing.assert_allclose(pooled_all, pooled, rtol=1e-6)
  # The layers differ from each other (not one output repeated).
  assert not np.allclose(all_layers[0], all_layers[-1])


@pytest.mark.slow
def test_feature_based_mode_passes_no_gradient_to_the_encoder():
  module = heads.BertForFineTuning(small_config(), 'token', 9, feature_layers=2,
                                   feature_lstm_units=8, feature_lstm_layers=2)
  params = init(module)
  assert {'bert', 'bilstm_0', 'bilstm_1', 'classifier'} == set(params)
  ids, segments, mask = inputs()
  batch = {'input_ids': ids, 'segment_ids': segments, 'input_mask': mask,
           'labels': np.ones((BATCH, SEQ), np.int32), 'label_weights': mask.astype(np.float32)}

  def loss(p):
    return finetune.task_loss('token', finetune._apply(module, p, batch, True), batch)
  grads = jax.grad(loss)(params)
  encoder_norm = sum(float(jnp.sum(g ** 2)) for g in jax.tree.leaves(grads['bert']))
  head_norm = sum(float(jnp.sum(g ** 2)) for g in jax.tree.leaves(grads['classifier']))
  assert encoder_norm == 0.0 and head_norm > 0.0


@pytest.mark.slow
def test_feature_based_optimizer_never_moves_the_encoder():
  module = heads.BertForFineTuning(small_config(), 'token', 9, feature_layers=2,
                                   feature_lstm_units=8)
  params = init(module)
  from ml_collections import ConfigDict  # pylint: disable=g-import-not-at-top
  train = ConfigDict(dict(learning_rate=1e-2, warmup_proportion=0.0, max_grad_norm=1.0,
                          adam_b1=0.9, adam_b2=0.999, adam_eps=1e-6, weight_decay=0.01))
  tx, _ = finetune.create_optimizer(train, 10, frozen_encoder=True)
  grads = jax.tree.map(jnp.ones_like, params)  # Even a nonzero gradient must not move it.
  updates, _ = tx.update(grads, tx.init(params), params)
  assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates['bert']))
  assert float(jnp.abs(updates['classifier']['kernel']).max()) > 0.0


def test_feature_based_mode_rejects_other_heads():
  module = heads.BertForFineTuning(small_config(), 'classification', 2, feature_layers=2)
  with pytest.raises(ValueError, match='feature-based'):
    init(module)



def padded(extra):
  """inputs() with `extra` more padding positions (mask 0, arbitrary ids) at the end of each row."""
  ids, segments, mask = inputs()
  grow = lambda x, value: np.pad(x, ((0, 0), (0, extra)), constant_values=value)  # noqa: E731
  return grow(ids, 7), grow(segments, 0), grow(mask, 0)


@pytest.mark.parametrize('head,num_outputs', [('classification', 3)] + [
    pytest.param(head, n, marks=pytest.mark.slow) for head, n in (('regression', 1), ('token', 9),
                                                                   ('span', 2))])
def test_bilstm_outputs_ignore_trailing_padding(head, num_outputs):
  module = heads.BertForFineTuning(small_config(num_layers=1), head, num_outputs, lstm_layers=2,
                                   lstm_units=6)
  params = init(module)
  short = module.apply({'params': params}, *inputs())
  long = module.apply({'params': params}, *padded(5))
  mask = inputs()[2].astype(bool)  # [batch, length]: real tokens; row 0 is padded from 4 on.
  for key, value in short.items():
    if head in ('token', 'span'):  # Per-token outputs: compared at the real tokens.
      np.testing.assert_allclose(long[key][:, :SEQ][mask], value[mask], atol=1e-5)
    else:
      np.testing.assert_allclose(long[key], value, atol=1e-5)


def test_bilstm_summary_reads_forward_at_the_last_real_token_and_backward_at_the_first():
  units, lengths = 2, np.array([2, 3])
  outputs = np.arange(2 * 3 * 2 * units, dtype=np.float32).reshape(2, 3, 2 * units)
  summary = heads.bilstm_summary(outputs, lengths)  # [batch, 2 * units]
  np.testing.assert_array_equal(summary, [np.r_[outputs[0, 1, :units], outputs[0, 0, units:]],
                                          np.r_[outputs[1, 2, :units], outputs[1, 0, units:]]])


@pytest.mark.slow
def test_bilstm_is_fresh_between_the_trained_encoder_and_the_head():
  cfg = small_config(num_layers=1)
  module = heads.BertForFineTuning(cfg, 'classification', 2, lstm_layers=1, lstm_units=6)
  params = init(module)
  assert set(params) == {'bert', 'bilstm_0', 'classifier'}
  plain = init(heads.BertForFineTuning(cfg, 'classification', 2))
  shapes = lambda tree: jax.tree.map(np.shape, tree)  # noqa: E731
  assert shapes(params['bert']) == shapes(plain['bert'])  # init_from loads it as before.
  assert params['classifier']['kernel'].shape == (12, 2)  # Forward and backward, 6 each.
  ids, segments, mask = inputs()
  batch = {'input_ids': ids, 'segment_ids': segments, 'input_mask': mask,
           'label': np.array([0, 1, 1], np.int32)}
  grads = jax.grad(lambda p: finetune.task_loss(
      'classification', finetune._apply(module, p, batch, True), batch))(params)
  lstm = jax.tree_util.tree_leaves_with_path(grads['bilstm_0'])
  # One cell per direction (the forward's, then the backward's), each with a gradient throughout.
  assert {jax.tree_util.keystr(path[:1]) for path, _ in lstm} == {
      "['OptimizedLSTMCell_0']", "['OptimizedLSTMCell_1']"}
  assert all(float(jnp.abs(g).max()) > 0.0 for _, g in lstm)
  assert sum(float(jnp.sum(g ** 2)) for g in jax.tree.leaves(grads['bert']['encoder'])) > 0.0

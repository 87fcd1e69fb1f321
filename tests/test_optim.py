"""Optimizers: the schedule, the decay mask, LAMB's layer-wise trust ratio, and ELECTRA's
layer-wise learning-rate decay."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax.train import optim
from configs import large_lamb


def train_config(optimizer, lr=1e-2, weight_decay=0.01):
  return ml_collections.ConfigDict(dict(
      optimizer=optimizer, learning_rate=lr, warmup_steps=0, num_steps=100,
      weight_decay=weight_decay, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-6, max_grad_norm=1e9))


def params_and_grads():
  rng = np.random.default_rng(0)
  params = {'dense': {'kernel': jnp.asarray(rng.normal(size=(8, 4)) * 3, jnp.float32),
                      'bias': jnp.asarray(rng.normal(size=(4,)), jnp.float32)},
            'LayerNorm': {'scale': jnp.ones((4,), jnp.float32)}}
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 1e-3, jnp.float32),
                       params)
  return params, grads


def test_schedule_warms_up_then_decays_to_zero():
  schedule = optim.learning_rate_schedule(1.0, 10, 110)
  np.testing.assert_allclose([schedule(s) for s in (0, 5, 10, 60, 110)],
                             [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)


def test_lamb_scales_each_decayed_update_to_lr_times_weight_norm():
  params, grads = params_and_grads()
  lr = 1e-2
  # The schedule is lr * (1 - step / num_steps): the first step sees the peak.
  tx = optim.create_optimizer(train_config('lamb', lr))
  updates, _ = tx.update(grads, tx.init(params), params)
  kernel = params['dense']['kernel']
  np.testing.assert_allclose(jnp.linalg.norm(updates['dense']['kernel']),
                             lr * jnp.linalg.norm(kernel), rtol=1e-5)
  # Biases and LayerNorm: neither decayed nor adapted, so plain Adam (first step: ~lr * sign(g)).
  adam = optax.adam(lr, b1=0.9, b2=0.999, eps=1e-6)
  expected, _ = adam.update(grads, adam.init(params))
  for path in (('dense', 'bias'), ('LayerNorm', 'scale')):
    np.testing.assert_allclose(updates[path[0]][path[1]], expected[path[0]][path[1]], rtol=1e-5)


def test_adamw_update_is_not_layer_adapted():
  params, grads = params_and_grads()
  tx = optim.create_optimizer(train_config('adamw', 1e-2))
  updates, _ = tx.update(grads, tx.init(params), params)
  ratio = jnp.linalg.norm(updates['dense']['kernel']) / jnp.linalg.norm(params['dense']['kernel'])
  assert abs(float(ratio) - 1e-2) > 1e-3  # Adam's step is ~lr per element, not lr * ||w||.


def test_lamb_recipe_config_phases():
  one, two = large_lamb.get_config(), large_lamb.get_config('phase=2,steps=10')
  assert (one.train.batch_size, one.data.max_seq_length, one.train.optimizer) == (65536, 128, 'lamb')
  assert (two.train.batch_size, two.data.max_seq_length, two.train.num_steps) == (32768, 512, 10)
  with pytest.raises(ValueError, match='phase=3'):
    large_lamb.get_config('phase=3')


@pytest.mark.parametrize('optimizer', ['adamw', 'lamb'])
def test_bfloat16_first_moment_stores_mu_only_in_bfloat16(optimizer):
  params, grads = params_and_grads()
  config = train_config(optimizer)
  config.adam_mu_dtype = 'bfloat16'
  tx = optim.create_optimizer(config)
  state = tx.init(params)
  is_adam = lambda s: isinstance(s, optax.ScaleByAdamState)  # noqa: E731
  adam = [s for s in jax.tree.leaves(state, is_leaf=is_adam) if is_adam(s)]
  assert len(adam) == 1
  assert {leaf.dtype for leaf in jax.tree.leaves(adam[0].mu)} == {jnp.dtype(jnp.bfloat16)}
  assert {leaf.dtype for leaf in jax.tree.leaves(adam[0].nu)} == {jnp.dtype(jnp.float32)}
  # The update still follows the float32 one to bfloat16 precision of the first moment.
  updates, _ = tx.update(grads, state, params)
  reference, _ = optim.create_optimizer(train_config(optimizer)).update(
      grads, optim.create_optimizer(train_config(optimizer)).init(params), params)
  for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(reference)):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(a, b, rtol=2e-2, atol=1e-7)


def encoder_tree(num_layers=3, scanned=True):
  """Parameters laid out as a fine-tuning model's: the encoder under 'bert', a task head."""
  rng = np.random.default_rng(1)
  leaf = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  layers = ({'layer': {'dense': {'kernel': leaf(num_layers, 4, 4), 'bias': leaf(num_layers, 4)}}}
            if scanned else {f'layer_{i}': {'dense': {'kernel': leaf(4, 4), 'bias': leaf(4)}}
                             for i in range(num_layers)})
  return {'bert': {'embeddings': {'word_embeddings': leaf(10, 2)},
                   'embeddings_project': {'kernel': leaf(2, 4)},
                   'encoder': layers, 'pooler': {'dense': {'kernel': leaf(4, 4)}}},
          'classifier': {'kernel': leaf(4, 2)}}


def test_layer_depth_places_each_parameter_as_electras_reference():
  depth = lambda *path: optim.layer_depth(path, 12)  # noqa: E731
  assert depth('bert', 'embeddings', 'word_embeddings') == 0
  assert depth('bert', 'embeddings_project', 'kernel') == 0
  assert depth('bert', 'encoder', 'layer_0', 'dense', 'kernel') == 1
  assert depth('bert', 'encoder', 'layer_11', 'dense', 'kernel') == 12
  np.testing.assert_array_equal(depth('bert', 'encoder', 'layer', 'dense', 'kernel'),
                                np.arange(1, 13))
  assert depth('bert', 'encoder', 'rel_embeddings', 'embedding') == 0  # Read by every layer.
  assert depth('bert', 'encoder', 'final_norm', 'scale') == 13  # After the last layer.
  assert depth('bert', 'pooler', 'dense', 'kernel') == 14
  assert depth('classifier', 'kernel') == 14
  with pytest.raises(ValueError, match="ALBERT's layers share one set"):
    depth('bert', 'encoder', 'shared_layer', 'dense', 'kernel')


@pytest.mark.parametrize('scanned', [True, False])
def test_layerwise_decay_scales_each_update_by_decay_to_its_distance_from_the_head(scanned):
  params = encoder_tree(scanned=scanned)
  grads = jax.tree.map(lambda p: p * 1e-3, params)
  config = train_config('adamw', 1e-2)
  plain = optim.create_optimizer(config)
  config.layerwise_lr_decay = 0.5
  decayed = optim.create_optimizer(config, num_layers=3)
  expected, _ = plain.update(grads, plain.init(params), params)
  updates, _ = decayed.update(grads, decayed.init(params), params)
  ratio = lambda *path: np.asarray(_get(updates, path)) / np.asarray(_get(expected, path))  # noqa: E731
  np.testing.assert_allclose(ratio('classifier', 'kernel'), 1.0)
  np.testing.assert_allclose(ratio('bert', 'pooler', 'dense', 'kernel'), 1.0)
  np.testing.assert_allclose(ratio('bert', 'embeddings', 'word_embeddings'), 0.5 ** 5)
  np.testing.assert_allclose(ratio('bert', 'embeddings_project', 'kernel'), 0.5 ** 5)
  for i in range(3):  # Layer i sits at depth i + 1, the head at 3 + 2.
    path = (('bert', 'encoder', 'layer', 'dense', 'kernel') if scanned
            else ('bert', 'encoder', f'layer_{i}', 'dense', 'kernel'))
    r = ratio(*path)
    np.testing.assert_allclose(r[i] if scanned else r, 0.5 ** (4 - i), rtol=1e-6)


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_layerwise_decay_with_a_frozen_encoder_moves_only_the_head():
  params = encoder_tree()
  grads = jax.tree.map(lambda p: p * 1e-3, params)
  config = train_config('adamw', 1e-2)
  config.layerwise_lr_decay = 0.8
  tx = optim.create_optimizer(config, frozen=('bert',), num_layers=3)
  updates, _ = tx.update(grads, tx.init(params), params)
  assert all(not np.any(u) for u in jax.tree.leaves(updates['bert']))
  plain = optim.create_optimizer(train_config('adamw', 1e-2), frozen=('bert',))
  expected, _ = plain.update(grads, plain.init(params), params)
  np.testing.assert_allclose(updates['classifier']['kernel'], expected['classifier']['kernel'])

"""Optimizers: the schedule, the decay mask, LAMB's layer-wise trust ratio, StableAdamW's update
clipping, and ELECTRA's layer-wise learning-rate decay."""

import flax
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


@pytest.mark.parametrize('shape', ['linear', 'cosine', '1-sqrt'])
def test_warmup_stable_decay_is_its_formula_at_every_step(shape):
  peak, warmup, decay, num_steps = 0.5, 10, 40, 100
  decayed = {'linear': lambda x: 1 - x, 'cosine': lambda x: 0.5 * (1 + np.cos(np.pi * x)),
             '1-sqrt': lambda x: 1 - np.sqrt(x)}[shape]

  def reference(step):  # Written from the definition, not from optax's parts.
    if step < warmup:
      return peak * step / warmup
    if step < num_steps - decay:
      return peak
    return peak * decayed(min(step - (num_steps - decay), decay) / decay)
  schedule = optim.learning_rate_schedule(peak, warmup, num_steps, 'wsd', decay, shape)
  steps = np.arange(num_steps + 5)
  np.testing.assert_allclose([float(schedule(s)) for s in steps],
                             [reference(s) for s in steps], atol=1e-7)
  # Up to its decay, a WSD schedule is that of any longer run: the point of branching a decay.
  longer = optim.learning_rate_schedule(peak, warmup, 3 * num_steps, 'wsd', decay, shape)
  assert [float(longer(s)) for s in range(num_steps - decay + 1)] == [
      float(schedule(s)) for s in range(num_steps - decay + 1)]


def test_warmup_stable_without_a_decay_holds_the_peak_to_the_end():
  # decay_steps=0: ModernBERT's phase 1 (its release's t_decay: 0tok), decays branched later.
  schedule = optim.learning_rate_schedule(0.5, 10, 100, 'wsd', 0)
  assert [float(schedule(s)) for s in (0, 5, 10, 50, 99, 100)] == [0.0, 0.25, 0.5, 0.5, 0.5, 0.5]


def test_the_config_selects_the_schedule():
  train = train_config('adamw', 1.0)
  train.update(num_steps=100, warmup_steps=10)
  linear = optim.schedule_of(train)
  train.update(schedule='wsd', decay_steps=20, decay_shape='cosine')
  wsd = optim.schedule_of(train)
  assert float(linear(55)) == pytest.approx(0.5) and float(wsd(55)) == 1.0
  assert float(wsd(90)) == pytest.approx(0.5 * (1 + np.cos(np.pi / 2)))


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


def stable_adamw_reference(params, grads_per_step, lr, b1=0.9, b2=0.999, eps=1e-6, decay=0.01,
                           num_steps=100):
  """StableAdamW by hand (Wortsman et al. 2023, Algorithm 2; its debiased betas are Adam's bias
  correction), in float64: per tensor, the step (m_hat / (sqrt(v_hat) + eps) + decay * w) at
  learning rate lr_t / max(1, sqrt(mean(g^2 / max(v_hat, eps^2))))."""
  flat = {k: np.asarray(v, np.float64) for k, v in flax.traverse_util.flatten_dict(params).items()}
  m = {k: np.zeros_like(v) for k, v in flat.items()}
  v = {k: np.zeros_like(w) for k, w in flat.items()}
  clipped = []
  for t, grads in enumerate(grads_per_step, start=1):
    grads = {k: np.asarray(g, np.float64)
             for k, g in flax.traverse_util.flatten_dict(grads).items()}
    rate = lr * (1 - (t - 1) / num_steps)  # Linear decay from the peak, no warmup.
    for k, g in grads.items():
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      m_hat, v_hat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
      rms = np.sqrt(np.mean(g * g / np.maximum(v_hat, eps * eps)))
      clipped.append(rms > 1)
      step = m_hat / (np.sqrt(v_hat) + eps)
      if k[-1] not in optim.NO_DECAY_LEAVES:
        step = step + decay * flat[k]
      flat[k] = flat[k] - rate / max(1.0, rms) * step
  return flax.traverse_util.unflatten_dict(flat), any(clipped)


def spiky_grads(params, steps=6, spike=4):
  """Small gradients, then one 300x larger at step `spike`: its RMS against v_hat exceeds 1."""
  rng = np.random.default_rng(2)
  return [jax.tree.map(lambda p, s=step: jnp.asarray(
      rng.normal(size=p.shape) * (0.3 if s == spike else 1e-3), jnp.float32), params)
      for step in range(1, steps + 1)]


def test_stable_adamw_equals_its_definition_and_clips_the_spike():
  params, _ = params_and_grads()
  grads = spiky_grads(params)
  tx = optim.create_optimizer(train_config('stableadamw', 1e-2))
  state, ours = tx.init(params), params
  for g in grads:
    updates, state = tx.update(g, state, ours)
    ours = optax.apply_updates(ours, updates)
  reference, clipped = stable_adamw_reference(params, grads, 1e-2)
  assert clipped  # The spike's step was clipped: the test sees the clipping, not plain AdamW.
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(reference)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  # Plain AdamW takes the spike's full step: the two differ.
  adamw = optim.create_optimizer(train_config('adamw', 1e-2))
  plain, adam_state = params, adamw.init(params)
  for g in grads:
    updates, adam_state = adamw.update(g, adam_state, plain)
    plain = optax.apply_updates(plain, updates)
  assert not np.allclose(plain['dense']['kernel'], ours['dense']['kernel'], rtol=1e-4)


def test_stable_adamw_resumes_exactly_from_its_saved_state():
  """Its state is AdamW's (count, mu, nu and the decay's): serialised and restored mid-run, the
  run goes on as if never stopped."""
  params, _ = params_and_grads()
  grads = spiky_grads(params)
  tx = optim.create_optimizer(train_config('stableadamw', 1e-2))

  def run(p, state, steps):
    for g in steps:
      updates, state = tx.update(g, state, p)
      p = optax.apply_updates(p, updates)
    return p, state

  whole, _ = run(params, tx.init(params), grads)
  half, state = run(params, tx.init(params), grads[:3])
  saved = flax.serialization.to_bytes((half, state))
  half, state = flax.serialization.from_bytes((params, tx.init(params)), saved)
  resumed, _ = run(half, state, grads[3:])
  for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed)):
    np.testing.assert_array_equal(a, b)


def test_stable_adamw_leaves_a_frozen_scope_alone():
  """A distillation teacher (a frozen scope) gets no step and no state under StableAdamW too."""
  params, grads = params_and_grads()
  params, grads = {'teacher': params, 'student': params}, {'teacher': grads, 'student': grads}
  tx = optim.create_optimizer(train_config('stableadamw', 1e-2), frozen=('teacher',))
  updates, _ = tx.update(grads, tx.init(params), params)
  assert all(not np.any(u) for u in jax.tree.leaves(updates['teacher']))
  assert all(np.any(u) for u in jax.tree.leaves(updates['student']))


def test_lamb_recipe_config_phases():
  one, two = large_lamb.get_config(), large_lamb.get_config('phase=2,steps=10')
  assert (one.train.batch_size, one.data.max_seq_length, one.train.optimizer) == (65536, 128, 'lamb')
  assert (two.train.batch_size, two.data.max_seq_length, two.train.num_steps) == (32768, 512, 10)
  with pytest.raises(ValueError, match='phase=3'):
    large_lamb.get_config('phase=3')


@pytest.mark.parametrize('optimizer', ['adamw', 'lamb', 'stableadamw'])
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

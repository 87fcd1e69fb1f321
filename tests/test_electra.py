"""ELECTRA: the discriminator encoder, the 'rtd' objective (generator, sampling, labels, loss,
AUC, FLOPs), its configs and their validation, and a tiny pretraining run on CPU."""

import json
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_refused, micro_config, micro_run, run_records
from benchmarks import electra_reference
from configs import base
from configs import electra as electra_configs
from bert_jax import config_lib
from bert_jax import objectives
from bert_jax.interop import init_from
from bert_jax.models import electra
from bert_jax.models import sharing
from bert_jax.objectives import rtd
from bert_jax.train import metrics as metrics_lib
from bert_jax.train import pretrain
from bert_jax.train import step as steps

# Odd sizes: vocab 103, E 24, H 40 (5 heads), generator 10 wide.
BATCH, SEQ, PREDICTIONS = 3, 11, 4


def tiny_config(**model):
  config = base.get_config()
  config.objectives = 'rtd'
  config.model.update(name='electra', vocab_size=103, hidden_size=40, embedding_size=24,
                      num_layers=2, num_heads=5, intermediate_size=72,
                      max_position_embeddings=16, hidden_dropout_rate=0.0,
                      attention_dropout_rate=0.0, **model)
  config.data.update(max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS)
  return config


def make_batch(seed=0):
  """Rows of 9, 11 and 6 real tokens; predictions at distinct positions, the last row's last
  prediction padding (position 0, weight 0)."""
  rng = np.random.default_rng(seed)
  lengths = [9, 11, 6]
  input_mask = np.array([[1] * n + [0] * (SEQ - n) for n in lengths], np.int32)
  original = rng.integers(5, 103, (BATCH, SEQ)).astype(np.int32) * input_mask
  positions = np.array([[1, 3, 4, 7], [2, 5, 9, 10], [1, 2, 4, 0]], np.int32)
  weights = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]], np.float32)
  masked_ids = np.take_along_axis(original, positions, axis=1) * (weights > 0)
  input_ids = original.copy()
  for row in range(BATCH):
    for p, w in zip(positions[row], weights[row]):
      if w:
        input_ids[row, p] = 4  # [MASK]
  return {'input_ids': input_ids, 'input_mask': input_mask,
          'segment_ids': np.zeros_like(input_ids), 'masked_lm_positions': positions,
          'masked_lm_ids': masked_ids.astype(np.int32), 'masked_lm_weights': weights}, original


@pytest.fixture(scope='module')
def built():
  config = tiny_config()
  model = steps.build_model(config)
  batch, original = make_batch()
  params = flax.linen.meta.unbox(model.init(jax.random.PRNGKey(0), batch)['params'])
  return config, model, params, batch, original


def flat_paths(params):
  return {'/'.join(str(k.key) for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


def test_generator_and_discriminator_share_one_embedding_table(built):
  _, _, params, _, _ = built
  paths = flat_paths(params)
  tables = [p for p in paths if 'word_embeddings' in p]
  assert tables == ['bert/embeddings/word_embeddings']
  assert not [p for p in paths if p.startswith('generator/embeddings/')]
  # The generator has its own E -> H_g projection and layers of its width; its head maps to E.
  assert paths['generator/embeddings_project/kernel'].shape == (24, 10)
  assert paths['bert/embeddings_project/kernel'].shape == (24, 40)
  assert paths['generator/encoder/layer/intermediate/dense/kernel'].shape == (2, 10, 40)
  assert paths['generator_predictions/transform_dense/kernel'].shape == (10, 24)


def test_fill_mask_reads_the_generator_as_a_masked_lm_of_its_own(built):
  from bert_jax.tools import predict  # pylint: disable=g-import-not-at-top
  config, model, params, batch, _ = built
  gen_config, gen_params = predict.masked_lm_of(config, params)
  assert gen_config.objectives == 'mlm' and gen_config.model.hidden_size == 10
  assert set(gen_params) == {'bert', 'predictions'}
  ours = steps.build_model(gen_config).apply({'params': gen_params}, batch)['mlm_logits']
  inside = model.apply({'params': params}, batch)['rtd_gen_logits']
  np.testing.assert_allclose(ours, inside, rtol=1e-5, atol=1e-5)
  assert np.std(inside) > 1e-3


def test_generator_shape_scales_width_heads_and_feed_forward_as_the_reference():
  for size, (hidden, heads, ffn, depth) in {'small': (64, 1, 256, 12), 'base': (256, 4, 1024, 12),
                                            'large': (256, 4, 1024, 24)}.items():
    model = electra_configs.get_config(f'size={size}').model
    assert electra.generator_shape(model) == {'hidden_size': hidden, 'num_heads': heads,
                                              'intermediate_size': ffn, 'num_layers': depth}
  # The reference's generator_layers: a fraction of the discriminator's depth, at least one.
  model = electra_configs.get_config('size=large').model
  model.generator_layer_fraction = 0.5
  assert electra.generator_shape(model)['num_layers'] == 12
  model.generator_layer_fraction = 0.01
  assert electra.generator_shape(model)['num_layers'] == 1


def test_rtd_labels_mark_exactly_the_replaced_positions(built):
  config, model, params, batch, original = built
  # A generator whose softmax puts all its mass on token 50: every masked position samples 50.
  params = jax.tree.map(lambda x: x, params)
  bias = np.full((103,), -1e4, np.float32)
  bias[50] = 1e4
  params['generator_predictions']['output_bias'] = jnp.asarray(bias)
  batch = dict(batch)
  # Two real predictions whose original token is 50: sampling it is no replacement.
  original = original.copy()
  for row, slot in ((0, 1), (1, 3)):
    position = batch['masked_lm_positions'][row, slot]
    original[row, position] = 50
  batch['masked_lm_ids'] = np.take_along_axis(original, batch['masked_lm_positions'], 1) * (
      batch['masked_lm_weights'] > 0)
  for train in (False, True):
    outputs = model.apply({'params': params}, batch, deterministic=not train,
                          rngs={'dropout': jax.random.PRNGKey(3)} if train else None)
    expected = np.zeros((BATCH, SEQ), np.float32)
    for row in range(BATCH):
      for p, w in zip(batch['masked_lm_positions'][row], batch['masked_lm_weights'][row]):
        if w and original[row, p] != 50:
          expected[row, p] = 1
    np.testing.assert_array_equal(np.asarray(outputs['rtd_labels']), expected)
    assert expected.sum() == 9  # 11 real predictions, 2 of them sampled as they were.


def test_sampling_draws_from_the_softmax_not_the_argmax(built):
  config, model, params, batch, _ = built
  # A flat generator (zero transform, zero bias): every token equally likely.
  params = jax.tree.map(lambda x: x, params)
  params['generator_predictions']['transform_dense'] = jax.tree.map(
      jnp.zeros_like, params['generator_predictions']['transform_dense'])
  seen = set()
  for seed in range(4):
    outputs = model.apply({'params': params}, batch, deterministic=False,
                          rngs={'dropout': jax.random.PRNGKey(seed)})
    seen.add(np.asarray(outputs['rtd_labels']).tobytes())
  assert len(seen) > 1  # Different draws replace different sets of tokens.


def test_the_rtd_term_sends_no_gradient_to_the_generator(built):
  config, model, params, batch, _ = built

  def disc_term(p):
    outputs = model.apply({'params': p}, batch, deterministic=False,
                          rngs={'dropout': jax.random.PRNGKey(1)})
    stats = rtd.losses(outputs, batch)
    return stats['rtd_disc_weighted_sum'] / stats['rtd_disc_count']

  grads = flat_paths(jax.grad(disc_term)(params))
  generator = [p for p in grads if p.startswith(('generator/', 'generator_predictions/'))]
  assert generator and all(not np.any(grads[p]) for p in generator)
  assert np.any(grads['bert/embeddings/word_embeddings'])
  assert np.any(grads['discriminator_predictions/dense/kernel'])
  assert np.any(grads['bert/encoder/layer/intermediate/dense/kernel'])


def test_loss_is_the_generator_mlm_loss_plus_50_times_the_rtd_loss(built):
  config, model, params, batch, _ = built
  loss_fn = steps.pretraining_loss_fn(model)
  rngs = {'dropout': jax.random.PRNGKey(2)}
  loss, stats = loss_fn(params, batch, rngs)
  outputs = model.apply({'params': params}, batch, deterministic=False, rngs=rngs)
  logits = np.asarray(outputs['rtd_gen_logits'], np.float64)
  top = logits.max(-1, keepdims=True)
  log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
  ce = -np.take_along_axis(log_probs, batch['masked_lm_ids'][..., None], -1)[..., 0]
  w = batch['masked_lm_weights']
  gen = (ce * w).sum() / w.sum()
  z = np.asarray(outputs['rtd_disc_logits'], np.float64)
  y = np.asarray(outputs['rtd_labels'], np.float64)
  bce = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
  real = batch['input_mask']
  disc = (bce * real).sum() / real.sum()
  np.testing.assert_allclose(float(loss), gen + 50 * disc, rtol=1e-5)
  fields = objectives.summarize([rtd.OBJECTIVE], jax.device_get(stats))
  np.testing.assert_allclose(fields['rtd_loss'], gen + 50 * disc, rtol=1e-5)
  np.testing.assert_allclose(fields['rtd_disc_loss'], disc, rtol=1e-5)
  np.testing.assert_allclose(fields['rtd_gen_loss'], gen, rtol=1e-5)
  assert fields['loss'] == fields['rtd_loss']
  np.testing.assert_allclose(fields['rtd_replaced_fraction'], y.sum() / real.sum(), rtol=1e-6)


def test_disc_weight_scales_the_rtd_term(built):
  _, _, params, batch, _ = built
  model = steps.build_model(tiny_config(disc_weight=7.0))
  rngs = {'dropout': jax.random.PRNGKey(2)}
  outputs = model.apply({'params': params}, batch, deterministic=False, rngs=rngs)
  stats = jax.device_get(rtd.losses(outputs, batch))
  np.testing.assert_allclose(stats['rtd_disc_weighted_sum'], 7 * stats['rtd_disc_loss_sum'],
                             rtol=1e-6)


def rtd_stats(logits, labels, mask):
  """rtd.losses' stats of discriminator logits and labels [batch, length] (a dummy generator)."""
  batch_size = logits.shape[0]
  outputs = {'rtd_gen_logits': jnp.zeros((batch_size, 1, 5)), 'rtd_labels': jnp.asarray(labels),
             'rtd_disc_logits': jnp.asarray(logits), 'rtd_disc_weight': jnp.float32(50)}
  batch = {'masked_lm_ids': np.zeros((batch_size, 1), np.int32),
           'masked_lm_weights': np.ones((batch_size, 1), np.float32), 'input_mask': mask}
  return jax.device_get(rtd.losses(outputs, batch))


def test_auc_from_histograms_is_the_pairwise_auc_of_the_binned_scores_pooled_over_batches():
  rng = np.random.default_rng(0)
  stats = []
  scores = {'replaced': [], 'original': []}
  for _ in range(2):
    labels = (rng.random((4, 9)) < 0.3).astype(np.float32)
    logits = (rng.normal(size=(4, 9)) * 3 + 2 * labels).astype(np.float32)
    mask = (rng.random((4, 9)) < 0.8).astype(np.int32)
    stats.append(rtd_stats(logits, labels, mask))
    scores['replaced'] += list(logits[(labels > 0) & (mask > 0)])
    scores['original'] += list(logits[(labels == 0) & (mask > 0)])
  pooled = jax.tree.map(np.add, *stats)
  binned = {k: np.asarray(rtd.auc_bins(np.asarray(v))) for k, v in scores.items()}
  pairs = binned['replaced'][:, None] - binned['original'][None, :]
  exact = ((pairs > 0).sum() + 0.5 * (pairs == 0).sum()) / pairs.size
  # Two histogram leaves (not a stat a bin), read by the train loop's summary.
  assert pooled['rtd_auc_replaced'].shape == (rtd.AUC_BINS,)
  auc = objectives.summarize([rtd.OBJECTIVE], pooled)['rtd_disc_auc']
  np.testing.assert_allclose(auc, exact, rtol=1e-6)
  assert 0.6 < auc < 1.0


def test_auc_bins_are_monotone_and_open_at_both_ends():
  logits = np.array([-1e4, -64.5, -3.0, -1e-3, 0.0, 1e-3, 0.1, 3.0, 64.5, 1e4], np.float32)
  bins = np.asarray(rtd.auc_bins(logits))
  assert (np.diff(bins) >= 0).all()
  assert bins[0] == bins[1] == 0 and bins[-1] == bins[-2] == rtd.AUC_BINS - 1
  assert len(set(bins[2:8])) == 6  # 1e-3 apart near 0 still lands in distinct bins.


@pytest.mark.parametrize('center,spread,shift', [
    (-1.8, 0.05, 0.3),   # A weak discriminator near the prior's log-odds (13% replaced).
    (-1.8, 0.05, 1.0),
    (0.0, 0.05, 0.6),
    (3.0, 0.05, 0.3),
    (-1.0, 0.5, 1.0),
    (0.0, 5.0, 1.5),     # A strong one, logits far apart.
])
def test_auc_reads_the_exact_auc_of_weakly_spread_logits(center, spread, shift):
  # The case: logits that spread 0.05 read near 0.5 from 0.2-wide bins.
  rng = np.random.default_rng(7)
  labels = (rng.random((16, 2048)) < 0.15).astype(np.float32)
  logits = (center + spread * (rng.normal(size=labels.shape) + shift * labels)).astype(np.float32)
  mask = (rng.random(labels.shape) < 0.9).astype(np.int32)
  auc = objectives.summarize([rtd.OBJECTIVE], rtd_stats(logits, labels, mask))['rtd_disc_auc']
  real = mask > 0
  exact = electra_reference.exact_auc(logits[real].astype(np.float64), labels[real])
  assert 0.55 < exact < 0.99
  assert abs(auc - exact) < 1e-3, (auc, exact)


def test_a_constant_discriminator_reads_an_auc_of_one_half():
  labels = (np.random.default_rng(0).random((4, 64)) < 0.15).astype(np.float32)
  logits = np.full(labels.shape, -1.87, np.float32)
  stats = rtd_stats(logits, labels, np.ones(labels.shape, np.int32))
  assert objectives.summarize([rtd.OBJECTIVE], stats)['rtd_disc_auc'] == 0.5


def test_rtd_flops_count_the_generator_its_head_and_the_discriminator_head():
  config = electra_configs.get_config('size=small')
  m = config.model
  s, p, v, e, h, layers_ = 128, 19, m.vocab_size, 128, 256, 12
  g, gf = 64, 256
  generator = layers_ * (s * (8 * g * g + 4 * g * gf) + 4 * s * s * g) + s * 2 * e * g
  head = p * (2 * g * e + 2 * e * v)
  disc_head = s * (2 * h * h + 2 * h)
  encoder = layers_ * (s * (8 * h * h + 4 * h * 4 * h) + 4 * s * s * h) + s * 2 * e * h
  assert (config.data.max_seq_length, config.data.max_predictions_per_seq) == (s, p)
  assert metrics_lib.model_flops_per_sequence(config) == 3.0 * (
      encoder + generator + head + disc_head)


def test_electra_configs_hold_the_papers_recipe():
  for size, want in {
      'small': (12, 256, 4, 128, 128, 128, 5e-4, 1_000_000, 0.15, 19),
      'base': (12, 768, 12, 0, 512, 256, 2e-4, 766_000, 0.15, 79),
      'large': (24, 1024, 16, 0, 512, 2048, 2e-4, 400_000, 0.25, 130)}.items():
    c = electra_configs.get_config(f'size={size}')
    got = (c.model.num_layers, c.model.hidden_size, c.model.num_heads, c.model.embedding_size,
           c.data.max_seq_length, c.train.batch_size, c.train.learning_rate, c.train.num_steps,
           c.masking.rate, c.data.max_predictions_per_seq)
    assert got == want, size
    assert (c.objectives, c.model.name, c.model.disc_weight) == ('rtd', 'electra', 50.0)
    assert (c.train.warmup_steps, c.train.weight_decay, c.train.adam_eps) == (10_000, 0.01, 1e-6)
    assert (c.masking.mask_token_fraction, c.masking.random_token_fraction,
            c.masking.keep_fraction) == (0.85, 0.0, 0.15)
    c.data.corpus = 'builtin'
    config_lib.validate(c)


@pytest.fixture(scope='module')
def built_gdes(built):
  """The `built` model under gradient-disentangled sharing, its parameters `built`'s plus zero
  deltas and a discriminator LayerNorm equal to the shared one: where 'gdes' starts."""
  _, _, shared, batch, original = built
  config = tiny_config(embedding_sharing='gdes')
  model = steps.build_model(config)
  fresh = flax.linen.meta.unbox(model.init(jax.random.PRNGKey(0), batch)['params'])
  flat = flax.traverse_util.flatten_dict(shared, sep='/')
  for path, value in flax.traverse_util.flatten_dict(fresh, sep='/').items():
    if path.endswith(sharing.DELTA_SUFFIX):
      flat[path] = np.zeros_like(value)
    elif sharing.DISCRIMINATOR_LAYER_NORM in path:
      flat[path] = flat[path.replace(sharing.DISCRIMINATOR_LAYER_NORM, 'LayerNorm')]
  assert set(flat) == set(flax.traverse_util.flatten_dict(fresh, sep='/'))
  return config, model, flax.traverse_util.unflatten_dict(flat, sep='/'), batch, original


def test_gdes_with_zero_deltas_computes_what_shared_embeddings_do(built, built_gdes):
  _, shared_model, shared_params, batch, _ = built
  _, model, params, _, _ = built_gdes
  rngs = {'dropout': jax.random.PRNGKey(3)}
  ours = model.apply({'params': params}, batch, deterministic=False, rngs=rngs)
  shared = shared_model.apply({'params': shared_params}, batch, deterministic=False, rngs=rngs)
  for key in ('rtd_gen_logits', 'rtd_labels', 'rtd_disc_logits'):
    np.testing.assert_array_equal(ours[key], shared[key])


def loss_term_grads(model, params, batch, which, seed):
  """{path: gradient} of the generator's loss term alone (which='generator') or the
  discriminator's, dropout on with PRNGKey(seed)."""
  def loss(p):
    outputs = model.apply({'params': p}, batch, deterministic=False,
                          rngs={'dropout': jax.random.PRNGKey(seed)})
    stats = rtd.losses(outputs, batch)
    if which == 'generator':
      return stats['rtd_gen_loss_sum'] / stats['rtd_gen_weight']
    return stats['rtd_disc_weighted_sum'] / stats['rtd_disc_count']
  return flat_paths(jax.grad(loss)(params))


def test_gdes_keeps_each_loss_off_the_other_models_embeddings(built_gdes):
  _, model, params, batch, _ = built_gdes
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(4)
  params = jax.tree.unflatten(tree, [x + rng.normal(size=x.shape).astype(np.float32) * 0.05
                                     for x in leaves])
  generator, discriminator = (loss_term_grads(model, params, batch, which, 5)
                              for which in ('generator', 'discriminator'))
  prefix = 'bert/embeddings/'
  shared = [prefix + t for t in ('word_embeddings', 'position_embeddings',
                                 'token_type_embeddings', 'LayerNorm/scale', 'LayerNorm/bias')]
  own = [prefix + t + sharing.DELTA_SUFFIX
         for t in ('word_embeddings', 'position_embeddings', 'token_type_embeddings')]
  own += [prefix + sharing.DISCRIMINATOR_LAYER_NORM + '/' + t for t in ('scale', 'bias')]
  # The discriminator's loss moves its deltas and LayerNorm, never the generator's tables.
  assert all(not np.any(discriminator[p]) for p in shared)
  assert all(np.any(discriminator[p]) for p in own)
  # The generator's MLM loss moves the tables and never reads the discriminator's own.
  assert all(np.any(generator[p]) for p in shared)
  assert all(not np.any(generator[p]) for p in own)


def test_discriminator_params_materialise_the_gdes_tables(built_gdes):
  _, _, params, _, _ = built_gdes
  flat = flax.traverse_util.flatten_dict(params, sep='/')
  rng = np.random.default_rng(6)
  flat = {k: v + rng.normal(size=v.shape).astype(np.float32) for k, v in flat.items()}
  disc = sharing.discriminator_params(flat)
  prefix = 'bert/embeddings/'
  for table in ('word_embeddings', 'position_embeddings', 'token_type_embeddings'):
    np.testing.assert_array_equal(disc[prefix + table],
                                  flat[prefix + table] + flat[prefix + table + '_delta'])
  np.testing.assert_array_equal(disc[prefix + 'LayerNorm/scale'],
                                flat[prefix + 'discriminator_LayerNorm/scale'])
  assert not [k for k in disc if sharing.is_discriminator_embedding(k)]
  tree = sharing.discriminator_tree(flax.traverse_util.unflatten_dict(flat, sep='/'))
  assert flax.traverse_util.flatten_dict(tree, sep='/').keys() == disc.keys()
  # The generator alone keeps the tables it trained, not the discriminator's.
  gen = electra.generator_params(flat)
  np.testing.assert_array_equal(gen[prefix + 'word_embeddings'], flat[prefix + 'word_embeddings'])
  np.testing.assert_array_equal(gen[prefix + 'LayerNorm/scale'], flat[prefix + 'LayerNorm/scale'])
  assert not [k for k in gen if sharing.is_discriminator_embedding(k)]
  # A 'shared' run's parameters have nothing to materialise.
  shared = {k: v for k, v in flat.items() if not sharing.is_discriminator_embedding(k)}
  assert sharing.discriminator_params(shared) == shared


@pytest.mark.parametrize('overrides, match', [
    ({'model.name': 'bert'}, r"config.model.name='bert'.*set config.model.name='electra'"),
    ({'objectives': 'mlm,rtd'}, r"drop 'mlm'"),
    ({'model.generator_fraction': 1.5}, r'generator_fraction=1.5.*\(0, 1\]'),
    ({'model.generator_fraction': 0.0}, r'generator_fraction=0.0: must be a finite number > 0'),
    ({'model.generator_fraction': 0.001}, r'generator_fraction=0.001 .* no unit'),
    ({'model.disc_weight': -1.0}, r'disc_weight=-1.0: must be a finite number >= 0'),
    ({'model.embedding_sharing': 'es'}, r"embedding_sharing='es'.*'shared', 'gdes'"),
    ({'model.embedding_sharing': 'gdes', 'objectives': 'mlm', 'model.name': 'bert'},
     r"embedding_sharing='gdes' with config.objectives='mlm'.*leave it 'shared'"),
    # 135 of the small model's 256 units: 2 heads of 64, which do not divide 135.
    ({'model.generator_fraction': 135 / 256}, r'generator 135 wide with 2 heads'),
])
def test_bad_electra_settings_are_refused_before_compiling(overrides, match):
  config = electra_configs.get_config('size=small')
  config.data.corpus = 'builtin'
  for key, value in overrides.items():
    *parents, leaf = key.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  assert_refused(config, match)


@pytest.fixture(scope='module')
def rtd_workdir(tmp_path_factory):
  return micro_run(tmp_path_factory.mktemp('rtd'), objectives='rtd', **{
      'model.name': 'electra', 'model.embedding_size': 16, 'model.generator_fraction': 0.5,
      'masking.mask_token_fraction': 0.85, 'masking.random_token_fraction': 0.0,
      'masking.keep_fraction': 0.15,
      'train.num_steps': 30, 'train.log_every': 10, 'train.eval_every': 30,
      'train.checkpoint_every': 30})


@pytest.mark.slow
def test_rtd_pretraining_logs_falling_losses_and_the_auc(rtd_workdir):
  records = run_records(rtd_workdir)
  evals, train = records['eval'], records['train']
  assert [r['step'] for r in evals] == [0, 30] and len(train) == 3
  fields = {'rtd_loss', 'rtd_gen_loss', 'rtd_gen_accuracy', 'rtd_disc_loss',
            'rtd_disc_accuracy', 'rtd_disc_auc', 'rtd_replaced_fraction'}
  for r in evals + train:
    assert fields <= set(r) and 'mlm_loss' not in r
    assert all(np.isfinite(r[k]) for k in fields)
    assert r['loss'] == pytest.approx(r['rtd_loss'])
  assert evals[-1]['rtd_loss'] < evals[0]['rtd_loss']
  assert evals[-1]['rtd_gen_loss'] < evals[0]['rtd_gen_loss']
  assert train[-1]['rtd_loss'] < train[0]['rtd_loss']
  assert 0 < evals[-1]['rtd_replaced_fraction'] < 0.2
  assert all(r['mfu'] > 0 for r in train)
  assert set(init_from.workdir_params(rtd_workdir)) == {
      'bert', 'generator', 'generator_predictions', 'discriminator_predictions'}


@pytest.mark.slow
def test_an_rtd_run_ends_with_a_done_line_against_chance_and_the_prior(rtd_workdir, caplog):
  with open(os.path.join(rtd_workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    evals = [r for r in map(json.loads, f) if r['split'] == 'eval']
  caplog.set_level('INFO')
  pretrain.log_summary(rtd_workdir, evals[-1])
  done = [r.getMessage() for r in caplog.records if r.getMessage().startswith('Done.')]
  first, last = evals[0], evals[-1]
  assert done == [
      f'Done. Discriminator AUC {first["rtd_disc_auc"]:.3f} -> {last["rtd_disc_auc"]:.3f} (0.5: '
      f'chance), its loss {last["rtd_disc_loss"]:.3f} vs {last["rtd_disc_prior_loss"]:.3f} for '
      f'the prior; generator MLM loss {first["rtd_gen_loss"]:.3f} -> {last["rtd_gen_loss"]:.3f} '
      f'(unigram {last["unigram_loss"]:.3f}).']


@pytest.mark.slow
def test_an_rtd_workdir_fine_tunes_from_its_discriminator_and_exports_both(rtd_workdir,
                                                                          tmp_path):
  from bert_jax.tools import convert  # pylint: disable=g-import-not-at-top
  from bert_jax.train import finetune  # pylint: disable=g-import-not-at-top
  from configs import glue as glue_config  # pylint: disable=g-import-not-at-top
  config = glue_config.get_config(f'task=mrpc,init={rtd_workdir}')
  config.data.max_seq_length = 32
  config_lib.validate_and_adopt_source(config, config_lib.validate_finetune)
  assert config.model.name == 'electra' and config.model.embedding_size == 16
  task = type('Task', (), {'head': 'classification', 'num_outputs': 2})()
  encoder, _ = finetune.load_source_params(config, finetune.build_model(config, task))
  source = init_from.workdir_params(rtd_workdir)['bert']
  np.testing.assert_array_equal(encoder['embeddings_project']['kernel'],
                                source['embeddings_project']['kernel'])
  out = str(tmp_path / 'export')
  convert.export_workdir(rtd_workdir, out)
  for name in ('discriminator', 'generator'):
    assert {'config.json', 'model.safetensors', 'vocab.txt'} <= set(
        os.listdir(os.path.join(out, name)))


@pytest.mark.slow
def test_predict_fills_masks_of_an_rtd_workdir_with_its_generator(rtd_workdir):
  from bert_jax.tools import predict  # pylint: disable=g-import-not-at-top
  predictor = predict.load(rtd_workdir)
  assert predictor.config.objectives == 'mlm'
  top = predictor.fill_mask('the man went to the [MASK] .', top_k=3)
  assert len(top) == 1 and len(top[0]) == 3
  assert sum(p for _, p in top[0]) <= 1.0 and top[0][0][1] >= top[0][1][1]


@pytest.mark.slow
def test_a_gdes_run_trains_and_fine_tunes_from_its_materialised_tables(tmp_path):
  from bert_jax.train import finetune  # pylint: disable=g-import-not-at-top
  from configs import glue as glue_config  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  config = micro_config(tmp_path, objectives='rtd', **{
      'model.name': 'electra', 'model.embedding_size': 16, 'model.generator_fraction': 0.5,
      'model.embedding_sharing': 'gdes', 'train.num_steps': 6, 'train.log_every': 3,
      'train.eval_every': 6, 'train.checkpoint_every': 6})
  pretrain.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  assert all(np.isfinite(r['rtd_loss']) for r in records)
  source = init_from.workdir_params(workdir)['bert']['embeddings']
  assert np.any(source['word_embeddings_delta'])  # The discriminator trained its deltas.
  config = glue_config.get_config(f'task=mrpc,init={workdir}')
  config.data.max_seq_length = 32
  config_lib.validate_and_adopt_source(config, config_lib.validate_finetune)
  task = type('Task', (), {'head': 'classification', 'num_outputs': 2})()
  encoder, _ = finetune.load_source_params(config, finetune.build_model(config, task))
  np.testing.assert_array_equal(encoder['embeddings']['word_embeddings'],
                                source['word_embeddings'] + source['word_embeddings_delta'])
  np.testing.assert_array_equal(encoder['embeddings']['LayerNorm']['scale'],
                                source['discriminator_LayerNorm']['scale'])

"""The model: parameter counts of the paper's configs, shapes, masking, scan/remat equivalence."""

import functools
import math

import flax
import flax.linen as nn
import jax
from jax.ad_checkpoint import print_saved_residuals
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import bert as model_lib
from bert_jax.models import layers
from bert_jax.models.encoder import EncoderConfig
from bert_jax.objectives import pretraining
from bert_jax.ops import attention as attention_ops
from bert_jax.ops import ffn as ffn_ops
from bert_jax.ops import per_device
from bert_jax.train import optim
from bert_jax.train import step as steps
from configs import base, large, tiny

# transformers' BertModel (no heads) for bert-base-uncased / bert-large-uncased.
HF_BERT_MODEL_PARAMS = {'base': 109_482_240, 'large': 335_141_888}


def count_formula(v, h, layers, f, positions=512, types=2, nsp=True):
  """Closed-form parameter count of BertForPreTraining."""
  embeddings = v * h + positions * h + types * h + 2 * h
  layer = 4 * (h * h + h) + 2 * h + (h * f + f) + (f * h + h) + 2 * h
  pooler = h * h + h
  mlm_head = h * h + h + 2 * h + v
  nsp_head = 2 * h + 2 if nsp else 0
  return embeddings + layers * layer + pooler, mlm_head + nsp_head


def abstract_params(config):
  model = steps.build_model(config)
  s, p = 8, 2
  batch = steps.dummy_batch(1, s, p, objectives=model.objectives)
  variables = jax.eval_shape(functools.partial(model.init, deterministic=True),
                             {'params': jax.random.key(0)}, batch)
  return nn.meta.unbox(variables['params'])


def num_params(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize('name,get_config,paper_millions', [
    ('base', base.get_config, 110), ('large', large.get_config, 340)])
def test_paper_configs_have_paper_parameter_counts(name, get_config, paper_millions):
  config = get_config()
  params = abstract_params(config)
  m = config.model
  encoder, heads = count_formula(m.vocab_size, m.hidden_size, m.num_layers, m.intermediate_size)
  assert num_params(params['bert']) == encoder == HF_BERT_MODEL_PARAMS[name]
  assert num_params(params) == encoder + heads
  assert abs(num_params(params) / 1e6 - paper_millions) / paper_millions < 0.02


def test_nsp_off_drops_the_nsp_head_only():
  config = base.get_config('layers=2,nsp=False')
  params = abstract_params(config)
  assert 'seq_relationship' not in params
  m = config.model
  encoder, heads = count_formula(m.vocab_size, m.hidden_size, 2, m.intermediate_size, nsp=False)
  assert num_params(params) == encoder + heads


def test_every_parameter_has_logical_axis_names():
  config = base.get_config('layers=2')
  model = steps.build_model(config)
  variables = jax.eval_shape(functools.partial(model.init, deterministic=True),
                             {'params': jax.random.key(0)},
                             steps.dummy_batch(1, 8, 2, objectives=model.objectives))
  flat = flax.traverse_util.flatten_dict(variables['params'])
  for path, leaf in flat.items():
    assert isinstance(leaf, nn.LogicallyPartitioned), path
    assert len(leaf.names) == len(leaf.value.shape), path
    if 'encoder' in path:
      assert leaf.names[0] == 'layers', path


def small_config(**overrides):
  cfg = EncoderConfig(vocab_size=99, hidden_size=24, num_layers=3, num_heads=4,
                      intermediate_size=37, max_position_embeddings=16)
  return EncoderConfig(**{**cfg.__dict__, **overrides})


def inputs(batch=3, length=7, predictions=2, seed=0):
  rng = np.random.default_rng(seed)
  ids = jnp.asarray(rng.integers(5, 99, (batch, length)), jnp.int32)
  mask = jnp.asarray(np.arange(length)[None] < rng.integers(3, length + 1, (batch, 1)),
                     jnp.int32)
  segments = jnp.asarray(np.arange(length)[None] >= 3, jnp.int32) * mask
  positions = jnp.asarray(rng.integers(1, 3, (batch, predictions)), jnp.int32)
  return ids, segments, mask, positions


def as_batch(ids, segments, mask, positions):
  """The pretraining model's batch (the labels' values do not matter to its outputs)."""
  return {'input_ids': ids, 'segment_ids': segments, 'input_mask': mask,
          'masked_lm_positions': positions}


@pytest.mark.slow
def test_padding_does_not_change_real_positions():
  model = pretraining.PretrainingModel(small_config())
  ids, segments, mask, positions = inputs()
  params = model.init(jax.random.key(0), as_batch(ids, segments, mask, positions))['params']
  garbage = jnp.where(mask > 0, ids, 7)  # Different ids at padded positions only.
  a = model.apply({'params': params}, as_batch(ids, segments, mask, positions))
  b = model.apply({'params': params}, as_batch(garbage, segments, mask, positions))
  np.testing.assert_allclose(a['mlm_logits'], b['mlm_logits'], atol=1e-5)
  np.testing.assert_allclose(a['nsp_logits'], b['nsp_logits'], atol=1e-5)


def unrolled_params(scanned):
  """Scanned params (leading layers axis) -> layer_0 ... layer_{L-1}."""
  encoder = scanned['bert']['encoder']['layer']
  num_layers = jax.tree.leaves(encoder)[0].shape[0]
  out = jax.tree.map(lambda x: x, scanned)
  out['bert']['encoder'] = {f'layer_{i}': jax.tree.map(lambda x, i=i: x[i], encoder)
                            for i in range(num_layers)}
  return out


@pytest.mark.slow
@pytest.mark.parametrize('remat_policy', ['none', 'full', 'dots'])
def test_scan_and_remat_match_unrolled_layers(remat_policy):
  ids, segments, mask, positions = inputs()
  scanned = pretraining.PretrainingModel(small_config(remat_policy=remat_policy))
  unrolled = pretraining.PretrainingModel(small_config(scan_layers=False))
  params = nn.meta.unbox(scanned.init(jax.random.key(0),
                                      as_batch(ids, segments, mask, positions))['params'])

  def loss(model, p):
    out = model.apply({'params': p}, as_batch(ids, segments, mask, positions))
    return out['mlm_logits'].sum() + out['nsp_logits'].sum()

  value_a, grads_a = jax.value_and_grad(functools.partial(loss, scanned))(params)
  value_b, grads_b = jax.value_and_grad(functools.partial(loss, unrolled))(
      unrolled_params(params))
  np.testing.assert_allclose(value_a, value_b, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(unrolled_params(grads_a)), jax.tree.leaves(grads_b)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_dropout_is_active_only_in_training():
  model = pretraining.PretrainingModel(small_config())
  ids, segments, mask, positions = inputs()
  params = model.init(jax.random.key(0), as_batch(ids, segments, mask, positions))['params']
  run = lambda seed: model.apply({'params': params}, as_batch(ids, segments, mask, positions),  # noqa
                                 deterministic=False, rngs={'dropout': jax.random.key(seed)})
  assert not np.allclose(run(1)['mlm_logits'], run(2)['mlm_logits'])
  eval_a = model.apply({'params': params}, as_batch(ids, segments, mask, positions))
  eval_b = model.apply({'params': params}, as_batch(ids, segments, mask, positions))
  np.testing.assert_array_equal(eval_a['mlm_logits'], eval_b['mlm_logits'])


@pytest.mark.parametrize('run_seed', [0, 5])
def test_cudnn_attention_gets_a_distinct_dropout_seed_per_layer(monkeypatch, run_seed):
  # cuDNN runs on GPUs only: stand in for it with the einsum attention and record what each
  # layer asks the kernel for (rate, static seed).
  calls = []

  def fake_cudnn(query, key, value, bias, dropout_rate=0.0, seed=0):
    calls.append((dropout_rate, seed))
    return attention_ops.dot_product_attention(query, key, value, bias, None, 0.0, True,
                                               query.dtype)

  monkeypatch.setattr(attention_ops, 'cudnn_attention', fake_cudnn)
  model = pretraining.PretrainingModel(
      small_config(attention_impl='cudnn', scan_layers=False, seed=run_seed))
  ids, segments, mask, positions = inputs()
  params = model.init(jax.random.key(0), as_batch(ids, segments, mask, positions))['params']
  calls.clear()
  model.apply({'params': params}, as_batch(ids, segments, mask, positions), deterministic=False,
              rngs={'dropout': jax.random.key(1)})
  assert [rate for rate, _ in calls] == [0.1, 0.1, 0.1]
  seeds = [seed for _, seed in calls]
  assert len(set(seeds)) == 3
  assert seeds == [attention_ops.cudnn_dropout_seed(run_seed, i) for i in range(3)]
  calls.clear()
  model.apply({'params': params}, as_batch(ids, segments, mask, positions))  # Evaluation: no dropout.
  assert [rate for rate, _ in calls] == [0.0, 0.0, 0.0]


@pytest.mark.slow
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_gather_positions_equals_take_along_axis_with_its_gradient(dtype):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 9, 5)), dtype)
  positions = jnp.asarray([[0, 8, 8], [4, 1, 2], [7, 0, 3]], jnp.int32)
  weights = jnp.asarray(rng.normal(size=(3, 3, 5)), dtype)
  ours = lambda x: layers.gather_positions(x, positions)  # noqa: E731
  reference = lambda x: jnp.take_along_axis(x, positions[..., None], axis=1)  # noqa: E731
  np.testing.assert_array_equal(ours(x), reference(x))  # Exact, not close.
  grad = lambda f: jax.grad(lambda x: jnp.sum(f(x).astype(jnp.float32) * weights))(x)  # noqa
  np.testing.assert_array_equal(grad(ours), grad(reference))  # Repeated picks accumulate.


@pytest.mark.slow
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_gelu_tanh_is_jax_tanh_gelu_and_saves_only_its_input(dtype, capsys):
  x = jnp.linspace(-6, 6, 4001).astype(dtype)
  np.testing.assert_array_equal(layers.gelu_tanh(x), jax.nn.gelu(x, approximate=True))
  total = lambda f: lambda v: jnp.sum(f(v).astype(jnp.float32))  # noqa: E731
  grad = jax.grad(total(layers.gelu_tanh))(x)
  want = jax.grad(total(lambda v: jax.nn.gelu(v, approximate=True)))(x.astype(jnp.float32))
  assert grad.dtype == dtype
  # float32: the same derivative; bfloat16: computed in float32, so within one bf16 rounding.
  tolerance = 1e-5 if dtype == jnp.float32 else 2 ** -8
  np.testing.assert_allclose(grad.astype(jnp.float32), want, rtol=tolerance, atol=tolerance)
  # Only x is kept for the backward (JAX's own autodiff keeps the tanh and more: XLA cannot
  # then fold the GELU into the matmul's epilogue).
  capsys.readouterr()
  print_saved_residuals(total(layers.gelu_tanh), x)
  saved = [line for line in capsys.readouterr().out.splitlines() if '[]' not in line]
  assert saved == [f'{"bf16" if dtype == jnp.bfloat16 else "f32"}[4001] from the argument v']
  np.testing.assert_array_equal(layers.gelu(x, 'tanh'), layers.gelu_tanh(x))
  np.testing.assert_array_equal(layers.gelu(x, 'erf'), jax.nn.gelu(x, approximate=False))


@pytest.mark.slow
def test_mlm_logits_use_the_tied_word_embeddings():
  model = pretraining.PretrainingModel(small_config())
  ids, segments, mask, positions = inputs()
  ids = jnp.where(ids == 50, 51, ids)  # Row 50 is then reached only through the output layer.
  params = nn.meta.unbox(model.init(jax.random.key(0), as_batch(ids, segments, mask, positions))['params'])
  grads = jax.grad(lambda p: model.apply({'params': p}, as_batch(ids, segments, mask, positions))[
      'mlm_logits'][..., 50].sum())(params)
  assert float(jnp.abs(grads['bert']['embeddings']['word_embeddings'][50]).sum()) > 0


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_params_and_logits():
  model = pretraining.PretrainingModel(small_config(dtype=jnp.bfloat16))
  ids, segments, mask, positions = inputs()
  variables = model.init(jax.random.key(0), as_batch(ids, segments, mask, positions))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nn.meta.unbox(variables)))
  out = model.apply(variables, as_batch(ids, segments, mask, positions))
  assert out['mlm_logits'].dtype == jnp.float32


@pytest.mark.slow
def test_initialisers_follow_bert():
  params = nn.meta.unbox(pretraining.PretrainingModel(small_config(hidden_size=64,
                                                                   num_heads=4)).init(
      jax.random.key(0), as_batch(*inputs()))['params'])
  table = np.asarray(params['bert']['embeddings']['word_embeddings'])
  assert np.abs(table).max() <= 2 * 0.02 + 1e-7  # Truncated at two stddevs.
  assert 0.015 < table.std() < 0.02
  ln = params['bert']['encoder']['layer']['output']['LayerNorm']
  np.testing.assert_array_equal(ln['scale'], 1.0)
  np.testing.assert_array_equal(ln['bias'], 0.0)
  np.testing.assert_array_equal(params['predictions']['output_bias'], 0.0)


@pytest.mark.slow
def test_weight_decay_skips_layer_norm_and_biases():
  params = nn.meta.unbox(pretraining.PretrainingModel(small_config()).init(
      jax.random.key(0), as_batch(*inputs()))['params'])
  mask = flax.traverse_util.flatten_dict(optim.weight_decay_mask(params))
  for path, decayed in mask.items():
    no_decay = path[-1] in ('bias', 'output_bias') or 'LayerNorm' in path[-2]
    assert decayed == (not no_decay), path


@pytest.mark.slow
@pytest.mark.parametrize('get_config', [base.get_config, large.get_config])
def test_paper_configs_train_step_compiles(get_config):
  config = get_config()
  config.train.batch_size = 2
  model = steps.build_model(config)
  tx = optim.create_optimizer(config.train)
  s, p = config.data.max_seq_length, config.data.max_predictions_per_seq
  abstract_state = nn.meta.unbox(steps.abstract_train_state(config, model, tx))
  step = jax.jit(functools.partial(steps.train_step, loss_fn=steps.pretraining_loss_fn(model),
                                   tx=tx), donate_argnums=0)
  compiled = step.lower(abstract_state, steps.dummy_batch(2, s, p)).compile()
  assert compiled.cost_analysis() is not None


@pytest.mark.slow
def test_scan_unroll_computes_the_same_function():
  ids, segments, mask, positions = inputs()
  rngs = {'dropout': jax.random.key(3)}
  outputs = []
  for unroll in (1, 3):
    model = pretraining.PretrainingModel(small_config(scan_unroll=unroll))
    params = model.init(jax.random.key(0), as_batch(ids, segments, mask, positions))['params']
    outputs.append(model.apply({'params': params}, as_batch(ids, segments, mask, positions),
                               deterministic=False, rngs=rngs)['mlm_logits'])
  np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('layer_norm_impl', ['xla', 'pallas'])
def test_flat_matmuls_compute_the_same_function_and_gradients(layer_norm_impl):
  ids, segments, mask, positions = inputs()
  args = (as_batch(ids, segments, mask, positions),)
  results = []
  for flat in (False, True):
    model = pretraining.PretrainingModel(small_config(
        flat_matmuls=flat, layer_norm_impl=layer_norm_impl, scan_layers=False))
    params = nn.meta.unbox(model.init(jax.random.key(0), *args)['params'])

    def loss(p, model=model):
      out = model.apply({'params': p}, *args, deterministic=False,
                        rngs={'dropout': jax.random.key(3)})
      return out['mlm_logits'].sum() + out['nsp_logits'].sum()

    results.append((jax.tree.map(jnp.shape, params),) + jax.value_and_grad(loss)(params))
  (shapes_a, value_a, grads_a), (shapes_b, value_b, grads_b) = results
  assert shapes_a == shapes_b  # Checkpoints are the same either way.
  np.testing.assert_allclose(value_a, value_b, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_tanh_gelu_and_its_derivative_from_one_tanh():
  """layers.gelu_tanh_and_grad (fused_ffn's kernels; gelu_tanh's backward) against the formula
  of the original BERT code and its derivative by autodiff."""
  c = math.sqrt(2 / math.pi)
  formula = lambda v: 0.5 * v * (1 + jnp.tanh(c * (v + 0.044715 * v ** 3)))  # noqa: E731
  x = jnp.linspace(-6.0, 6.0, 1001)
  h, g = layers.gelu_tanh_and_grad(x)
  # Tails: 1 + t and 1 - t * t cancel in float32.
  np.testing.assert_allclose(h, formula(x), rtol=1e-6, atol=1e-5)
  np.testing.assert_allclose(g, jax.vmap(jax.grad(formula))(x), rtol=1e-6, atol=1e-5)
  np.testing.assert_array_equal(layers.gelu_tanh_grad(x), g)
  np.testing.assert_allclose(layers.gelu_tanh(x), formula(x), rtol=1e-6, atol=1e-5)


def test_flatten_needs_trailing_contracted_axes():
  dense = layers.DenseGeneral(5, ('heads', 'embed'), axis=1, flatten=True)
  with pytest.raises(ValueError, match='trailing'):
    dense.init(jax.random.key(0), jnp.ones((2, 3, 4)))


@pytest.mark.slow
def test_rbg_dropout_masks_are_deterministic_and_differ_by_step():
  config = tiny.get_config()
  config.model.update(hidden_size=32, intermediate_size=64, vocab_size=128, num_layers=1,
                      dropout_rng_impl='rbg')
  config.data.update(max_seq_length=16, max_predictions_per_seq=3)
  model = steps.build_model(config)
  tx = optim.create_optimizer(config.train)
  state = nn.meta.unbox(steps.state_initializer(config, model, tx)(jax.random.PRNGKey(0)))
  batch = {k: np.ones(v.shape, v.dtype) for k, v in steps.dummy_batch(2, 16, 3).items()}
  step = jax.jit(functools.partial(steps.train_step, loss_fn=steps.pretraining_loss_fn(model),
                                   tx=tx, dropout_rng_impl='rbg'))
  loss = lambda s: float(step(s, batch)[1]['loss'])  # noqa: E731
  assert loss(state) == loss(state)
  assert loss(state) != loss(state.replace(step=state.step + 1))


def test_kernels_on_a_mesh_that_splits_what_they_need_whole_are_refused(monkeypatch):
  """per_device.on_each_device: where the mesh splits the activations, an axis the kernels need
  whole (here the feed-forward width, by the rules) is named before anything is traced."""
  monkeypatch.setattr(per_device, 'splitting_mesh', lambda x, spec: 'a mesh of 8 devices')
  args = jnp.zeros((2, 4, 4)), jnp.zeros((4, 8)), jnp.zeros((8,)), jnp.zeros((8, 4))
  with nn.logical_axis_rules([('batch', 'data'), ('mlp', 'tensor')]):
    with pytest.raises(ValueError, match=r"ffn_impl='pallas' needs whole feed-forward rows; the "
                                         r"mesh rules split them over 'tensor'\."):
      ffn_ops.fused_ffn(*args)
  # One device: the kernel runs on the whole arrays.
  monkeypatch.setattr(per_device, 'splitting_mesh', lambda x, spec: None)
  with nn.logical_axis_rules([('batch', 'data'), ('mlp', 'tensor')]):
    assert ffn_ops.fused_ffn(*args).shape == (2, 4, 4)

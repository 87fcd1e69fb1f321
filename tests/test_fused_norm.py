"""The fused bias + dropout + residual + LayerNorm: the Pallas kernels (run by the interpreter on
CPU) against the jnp reference, the reference against flax's Dropout + LayerNorm, and the model
with `layer_norm_impl='pallas'` against the XLA path."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.kernels.gpu import fused_norm
from bert_jax.models import bert as model_lib
from bert_jax.models.encoder import EncoderConfig
from bert_jax.objectives import pretraining
from configs import tiny


def operands(rows, embed, dtype, seed=0):
  keys = jax.random.split(jax.random.key(seed), 7)
  y = jax.random.normal(keys[0], (rows, embed)).astype(dtype)
  residual = jax.random.normal(keys[1], (rows, embed)).astype(dtype)
  bias = 0.1 * jax.random.normal(keys[2], (embed,))
  scale = 1.0 + 0.1 * jax.random.normal(keys[3], (embed,))
  offset = 0.1 * jax.random.normal(keys[4], (embed,))
  row_keys = fused_norm.row_keys(keys[5], rows)
  cotangent = jax.random.normal(keys[6], (rows, embed)).astype(dtype)
  return y, bias, residual, row_keys, scale, offset, cotangent


def value_and_grads(impl, y, bias, residual, row_keys, scale, offset, cotangent, rate=0.1):
  def loss(y, bias, residual, scale, offset):
    out = fused_norm.dropout_add_layer_norm(y, bias, residual, row_keys, scale, offset, rate=rate,
                                            eps=1e-12, impl=impl, interpret=True)
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32)), out
  (_, out), grads = jax.value_and_grad(loss, argnums=range(5), has_aux=True)(
      y, bias, residual, scale, offset)
  return out, grads


@pytest.mark.slow
@pytest.mark.parametrize('dtype,embed,with_dropout', [
    (jnp.float32, 128, True), (jnp.float32, 96, False), (jnp.float32, 96, True),
    (jnp.bfloat16, 128, True)])
@pytest.mark.parametrize('launches', ['default', '2:32:4 both', '4:8:4 forward, 2:16:4 backward'])
def test_pallas_kernels_match_the_reference(dtype, embed, with_dropout, launches, monkeypatch):
  shapes = {'default': (fused_norm.FORWARD, fused_norm.BACKWARD),
            '2:32:4 both': (fused_norm.Launch(2, 32, 4),) * 2,
            '4:8:4 forward, 2:16:4 backward': (fused_norm.Launch(4, 8, 4),
                                               fused_norm.Launch(2, 16, 4))}[launches]
  monkeypatch.setattr(fused_norm, 'FORWARD', shapes[0])
  monkeypatch.setattr(fused_norm, 'BACKWARD', shapes[1])
  y, bias, residual, row_keys, scale, offset, cotangent = operands(64, embed, dtype)
  row_keys = row_keys if with_dropout else None
  out_ref, grads_ref = value_and_grads('xla', y, bias, residual, row_keys, scale, offset,
                                       cotangent)
  out, grads = value_and_grads('pallas', y, bias, residual, row_keys, scale, offset, cotangent)
  assert out.dtype == dtype and out.shape == y.shape
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.float32(out), np.float32(out_ref), atol=tol, rtol=tol)
  for name, a, b in zip(('y', 'bias', 'residual', 'scale', 'offset'), grads, grads_ref):
    assert a.dtype == b.dtype, name
    # bias sums bf16-rounded dy in the reference, float32 dy in the kernel.
    scale_of = float(jnp.max(jnp.abs(b.astype(jnp.float32))))
    np.testing.assert_allclose(np.float32(a), np.float32(b), atol=tol * max(1.0, scale_of),
                               rtol=tol, err_msg=name)


def test_dropout_zeroes_dropped_values_before_the_residual():
  """The kernels drop exactly keep_mask's values: with y + bias zero where kept, what is left is
  the residual; with y + bias zero where dropped, the same as the reference."""
  y, bias, residual, row_keys, scale, offset, _ = operands(32, 128, jnp.float32)
  keep = fused_norm.keep_mask(row_keys, 128, fused_norm.dropout_threshold(0.1))
  assert 0.05 < 1 - float(jnp.mean(keep)) < 0.15
  run = lambda y, impl: fused_norm.dropout_add_layer_norm(  # noqa: E731
      y, jnp.zeros_like(bias), residual, row_keys, scale, offset, rate=0.1, eps=1e-12, impl=impl,
      interpret=True)
  only_residual = fused_norm.reference(jnp.zeros_like(y), jnp.zeros_like(bias), residual, None,
                                       scale, offset, rate=0.0, eps=1e-12)
  np.testing.assert_allclose(run(jnp.where(keep, 0.0, y), 'pallas'), only_residual, atol=1e-5)
  np.testing.assert_allclose(run(jnp.where(keep, y, 0.0), 'pallas'),
                             run(jnp.where(keep, y, 0.0), 'xla'), atol=1e-5)


@pytest.mark.slow
def test_reference_is_flax_dropout_then_layer_norm():
  y, bias, residual, row_keys, scale, offset, _ = operands(16, 64, jnp.float32)
  rate = 0.1
  keep = fused_norm.keep_mask(row_keys, 64, fused_norm.dropout_threshold(rate))
  kept_rate = 1.0 - fused_norm.dropout_threshold(rate) / 65536  # 0.899994
  dropped = jnp.where(keep, (y + bias) / kept_rate, 0.0)
  layer_norm = nn.LayerNorm(epsilon=1e-12)
  expected = layer_norm.apply({'params': {'scale': scale, 'bias': offset}}, dropped + residual)
  got = fused_norm.reference(y, bias, residual, row_keys, scale, offset, rate=rate, eps=1e-12)
  np.testing.assert_allclose(got, expected, atol=2e-5)


def test_dropout_draws_drop_at_the_rate_independently_per_column_and_key():
  rows, embed, rate = 512, 768, 0.1
  threshold = fused_norm.dropout_threshold(rate)
  assert threshold == 6554 and fused_norm.keep_scale(threshold) == 65536 / (65536 - 6554)
  keep = np.asarray(fused_norm.keep_mask(fused_norm.row_keys(jax.random.key(0), rows), embed,
                                         threshold))
  assert keep.shape == (rows, embed)
  p = threshold / 65536
  sigma = np.sqrt(p * (1 - p) / keep.size)
  assert abs((1 - keep.mean()) - p) < 5 * sigma
  # Per row (the row's key must not bias it) and per column (nor the pair index).
  assert np.all(np.abs((1 - keep.mean(axis=1)) - p) < 6 * np.sqrt(p * (1 - p) / embed))
  assert np.all(np.abs((1 - keep.mean(axis=0)) - p) < 6 * np.sqrt(p * (1 - p) / rows))
  # The two halves of one hash (even and odd columns), and neighbouring pairs: uncorrelated.
  dropped = 1.0 - keep
  for a, b in ((dropped[:, 0::2], dropped[:, 1::2]), (dropped[:, 1:-1:2], dropped[:, 2::2]),
               (dropped[1:], dropped[:-1])):
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 5 / np.sqrt(a.size)
  # Deterministic per key, different across keys; rbg keys draw the row keys as well.
  again = fused_norm.row_keys(jax.random.key(0), rows)
  other = fused_norm.row_keys(jax.random.key(1), rows)
  np.testing.assert_array_equal(keep, fused_norm.keep_mask(again, embed, threshold))
  assert 0.15 < np.mean(keep != np.asarray(fused_norm.keep_mask(other, embed, threshold))) < 0.21
  rbg = fused_norm.keep_mask(fused_norm.row_keys(jax.random.key(0, impl='rbg'), rows), embed,
                             threshold)
  assert abs((1 - float(jnp.mean(rbg))) - p) < 5 * sigma


def test_split_pairs_orders_the_draws_as_value_draws():
  """split_pairs (what the kernels run: a join then a reshape; here in jnp, in the kernels under
  the interpret-mode kernel tests) gives value c the draw value_draws (the oracle) gives it."""
  keys = fused_norm.row_keys(jax.random.key(3), 6).reshape(2, 3, 1)
  hashed = fused_norm.pair_draws(keys, jnp.arange(8, dtype=jnp.uint32))
  split = fused_norm.split_pairs(hashed)
  assert split.shape == (2, 3, 16)
  np.testing.assert_array_equal(
      split, fused_norm.value_draws(keys, jnp.arange(16, dtype=jnp.uint32)))
  assert int(jnp.max(split)) < 65536 and len(np.unique(np.asarray(split))) > 80


def test_rows_whose_keys_differ_in_few_bits_draw_unrelated_values():
  """The pair index enters multiplied by an odd constant: keys that differ by a small XOR hash
  other values, not the same ones permuted (as key ^ pair would: pair c of one key is pair c ^ d
  of the other)."""
  pairs = jnp.arange(512, dtype=jnp.uint32)
  def draws(key):
    return set(np.asarray(fused_norm.pair_draws(jnp.uint32(key), pairs)).tolist())

  first = draws(12345)
  assert len(first) == 512
  for difference in (1, 6, 255, 511):
    assert len(first & draws(12345 ^ difference)) <= 1


def test_rate_one_drops_everything_and_bad_keys_are_refused():
  y, bias, residual, row_keys, scale, offset, _ = operands(16, 96, jnp.float32)
  assert fused_norm.keep_scale(fused_norm.dropout_threshold(1.0)) == 0.0
  out = fused_norm.dropout_add_layer_norm(y, bias, residual, row_keys, scale, offset, rate=1.0,
                                          eps=1e-12, impl='pallas', interpret=True)
  only_residual = fused_norm.reference(jnp.zeros_like(y), jnp.zeros_like(bias), residual, None,
                                       scale, offset, rate=0.0, eps=1e-12)
  np.testing.assert_allclose(out, only_residual, atol=1e-5)
  with pytest.raises(ValueError, match=r'keys must be row_keys\(rng, 16\): uint32 \(16,\); '
                     r'got uint32 \(1,\)'):
    fused_norm.dropout_add_layer_norm(y, bias, residual, row_keys[:1], scale, offset, rate=0.1,
                                      eps=1e-12)
  with pytest.raises(ValueError, match=r'got int32 \(16,\)'):
    fused_norm.dropout_add_layer_norm(y, bias, residual, row_keys.astype(jnp.int32), scale,
                                      offset, rate=0.1, eps=1e-12)


def test_fused_layer_norm_module_draws_from_its_dropout_rng():
  cfg = small_config(layer_norm_impl='pallas', hidden_dropout_rate=0.1)
  module = model_lib.FusedLayerNorm(cfg)
  rng = np.random.default_rng(0)
  y, residual = (jnp.asarray(rng.normal(size=(2, 8, 32)), jnp.float32) for _ in range(2))
  bias = jnp.asarray(rng.normal(size=(32,)), jnp.float32)
  params = module.init(jax.random.key(0), y, bias, residual, True)
  run = lambda seed: module.apply(params, y, bias, residual, False,  # noqa: E731
                                  rngs={'dropout': jax.random.key(seed)})
  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))
  evaluation = module.apply(params, y, bias, residual, True)
  assert not np.allclose(run(1), evaluation)
  no_dropout = model_lib.FusedLayerNorm(small_config(layer_norm_impl='pallas',
                                                     hidden_dropout_rate=0.0))
  np.testing.assert_allclose(no_dropout.apply(params, y, bias, residual, False,
                                              rngs={'dropout': jax.random.key(1)}),
                             evaluation, atol=1e-6)


def test_block_rows_divide_the_rows():
  assert fused_norm.block_rows(16384, 16) == 16
  assert fused_norm.block_rows(16384, 32) == 32
  assert fused_norm.block_rows(24, 16) == 8
  assert fused_norm.block_rows(7, 16) == 1
  with pytest.raises(ValueError, match="impl='triton'"):
    fused_norm.dropout_add_layer_norm(*operands(8, 8, jnp.float32)[:6], rate=0.0, eps=1e-6,
                                      impl='triton')


def small_config(**overrides):
  fields = dict(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                max_position_embeddings=16, scan_layers=False)
  return EncoderConfig(**{**fields, **overrides})


def model_inputs(batch=2, length=8):
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, 99, (batch, length)), jnp.int32)
  mask = jnp.asarray(np.arange(length)[None] < np.array([[8], [5]]), jnp.int32)
  segments = jnp.asarray(np.arange(length)[None] >= 3, jnp.int32) * mask
  positions = jnp.asarray(rng.integers(1, 4, (batch, 2)), jnp.int32)
  return ids, segments, mask, positions


def model_batch(batch=2, length=8, **packed):
  """(the pretraining model's batch,) of model_inputs, with any packing keys."""
  ids, segments, mask, positions = model_inputs(batch, length)
  return ({'input_ids': ids, 'segment_ids': segments, 'input_mask': mask,
           'masked_lm_positions': positions, **packed},)


@pytest.mark.slow
@pytest.mark.parametrize('layers', [dict(scan_layers=False),
                                    dict(scan_layers=True, remat_policy='full')])
def test_model_with_the_fused_layer_norm_computes_the_same_function(layers):
  xla = pretraining.PretrainingModel(small_config(**layers))
  fused = pretraining.PretrainingModel(small_config(layer_norm_impl='pallas', **layers))
  args = model_batch()
  params = nn.meta.unbox(xla.init(jax.random.key(0), *args)['params'])
  fused_params = nn.meta.unbox(fused.init(jax.random.key(0), *args)['params'])
  # Same parameter tree: checkpoints move between the two implementations.
  assert (jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, fused_params))

  assert_same_function(xla, fused, params, args)


def assert_same_function(model_a, model_b, params, args):
  """The two models' logits sums and their gradients agree (to float32 rounding)."""
  def loss(model, p):
    out = model.apply({'params': p}, *args)
    return out['mlm_logits'].sum() + out['nsp_logits'].sum()

  value_a, grads_a = jax.value_and_grad(functools.partial(loss, model_a))(params)
  value_b, grads_b = jax.value_and_grad(functools.partial(loss, model_b))(params)
  np.testing.assert_allclose(value_a, value_b, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_fused_layer_norm_drops_in_training_only():
  model = pretraining.PretrainingModel(small_config(layer_norm_impl='pallas'))
  args = model_batch()
  params = model.init(jax.random.key(0), *args)['params']
  run = lambda seed: model.apply({'params': params}, *args, deterministic=False,  # noqa: E731
                                 rngs={'dropout': jax.random.key(seed)})['mlm_logits']
  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))
  eval_logits = model.apply({'params': params}, *args)['mlm_logits']
  no_dropout = pretraining.PretrainingModel(
      small_config(layer_norm_impl='pallas', hidden_dropout_rate=0.0,
                   attention_dropout_rate=0.0))
  np.testing.assert_allclose(
      no_dropout.apply({'params': params}, *args, deterministic=False,
                       rngs={'dropout': jax.random.key(1)})['mlm_logits'], eval_logits,
      atol=1e-5)


def test_pallas_layer_norm_is_refused_off_gpus():
  config = tiny.get_config()
  config.model.layer_norm_impl = 'pallas'
  config_lib.validate(config)  # A valid choice...
  with pytest.raises(config_lib.ConfigError,
                     match="layer_norm_impl='pallas' runs Triton kernels on NVIDIA GPUs; "
                           "this run has 1 cpu device"):
    config_lib.validate_runtime(config, tokenizer_vocab_size=100, batch_divisor=1)


def test_lowered_once_traces_a_launcher_once_per_setting_and_lowers_it_once():
  """fused_norm.lowered_once: calls with the same shapes and settings share one trace, and a jit
  calling the launcher three times lowers its body once (three calls of one function); a new
  static setting or a new shape traces again."""
  traces = []

  def launcher(x, *, scale):
    traces.append((x.shape, scale))
    return x * scale
  launch = fused_norm.lowered_once(static_argnames=('scale',))(launcher)
  x = jnp.arange(4.0)
  np.testing.assert_array_equal(launch(x, scale=2.0), 2 * x)
  launch(x + 1, scale=2.0)
  assert len(traces) == 1
  launch(x, scale=3.0)
  np.testing.assert_array_equal(launch(jnp.arange(2.0), scale=2.0), [0.0, 2.0])
  assert traces == [((4,), 2.0), ((4,), 3.0), ((2,), 2.0)]
  text = jax.jit(lambda x: launch(x, scale=5.0) + launch(2 * x, scale=5.0) + launch(
      3 * x, scale=5.0)).lower(x).as_text()
  assert text.count('call @launcher(') == 3 and text.count('func.func private @launcher(') == 1
  assert text.count('5.000000e+00') == 1  # The body, once.


def test_each_kernel_launches_as_its_launch_shape_says(monkeypatch):
  """FORWARD launches the forward kernel and BACKWARD the backward (the grid: rows over the block
  rows; the backward's partial sums, one row a block), the backward in one pipelining stage at a
  width that is not a power of two; num_warps, when given, replaces both's warps; a new shape
  lowers a new kernel."""
  rows = 64

  def lowered(forward, backward, embed=32, **kwargs):
    args = (jax.ShapeDtypeStruct((rows, embed), jnp.bfloat16),
            *[jax.ShapeDtypeStruct((embed,), jnp.float32)] * 3)
    monkeypatch.setattr(fused_norm, 'FORWARD', forward)
    monkeypatch.setattr(fused_norm, 'BACKWARD', backward)
    def loss(y, bias, scale, offset):
      return jnp.sum(fused_norm.dropout_add_layer_norm(
          y, bias, y, None, scale, offset, rate=0.0, eps=1e-12, impl='pallas',
          **kwargs).astype(jnp.float32))
    text = jax.jit(jax.grad(loss)).trace(*args).lower(lowering_platforms=('cuda',)).as_text()
    warps = [int(n) for n in re.findall(r'num_warps = (\d+) : i32', text)]
    stages = [int(n) for n in re.findall(r'num_stages = (\d+) : i32', text)]
    grids = [int(n) for n in re.findall(r'grid_x = (\d+) : i32', text)]
    partial_rows = {rows // b for b in (2, 4, 8, 16, 32)
                    if f'tensor<{rows // b}x{embed}xf32>' in text}
    return warps, stages, grids, partial_rows

  Launch = fused_norm.Launch  # pylint: disable=invalid-name
  assert lowered(Launch(1, 16, 2), Launch(2, 4, 8)) == ([2, 8], [1, 1], [4, 16], {16})
  assert lowered(Launch(1, 16, 2), Launch(2, 32, 8, 3)) == ([2, 8], [1, 3], [4, 2], {2})
  assert lowered(Launch(1, 8, 2, 2), Launch(2, 32, 8), num_warps=4) == (
      [4, 4], [2, 1], [8, 2], {2})
  # A width that is not a power of two (masked tiles): the backward pipelines in one stage.
  assert lowered(Launch(1, 16, 2, 2), Launch(2, 32, 8, 3), embed=96) == (
      [2, 8], [2, 1], [4, 2], {2})


def test_the_layer_norm_kernels_of_a_model_lower_once():
  """Every layer of a model calls the fused LayerNorm kernels with the same shapes: the step's
  CUDA lowering holds each kernel a fixed number of times, however many layers call it (the
  first layer's forward is traced apart from the rest's, its outputs used differently)."""
  rows, embed = 256, 128

  def lowered(layers: int) -> str:
    def loss(y, bias, scale, offset, keys):
      for _ in range(layers):
        y = fused_norm.dropout_add_layer_norm(y, bias, y, keys, scale, offset, rate=0.1,
                                              eps=1e-12, impl='pallas')
      return jnp.sum(y.astype(jnp.float32))
    args = (jax.ShapeDtypeStruct((rows, embed), jnp.bfloat16),
            *[jax.ShapeDtypeStruct((embed,), jnp.float32)] * 3,
            jax.ShapeDtypeStruct((rows,), jnp.uint32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(*args).lower(
        lowering_platforms=('cuda',)).as_text()
  three, six = lowered(3), lowered(6)
  for kernel in ('dropout_add_layer_norm_fwd', 'dropout_add_layer_norm_bwd'):
    assert six.count(kernel) == three.count(kernel) > 0, kernel
  assert len(six) < 1.2 * len(three)

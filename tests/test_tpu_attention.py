"""attention_impl='tpu': the Pallas TPU kernels (interpreted on CPU) against the XLA attention and
their jnp reference, their dropout draws, their declared costs, the model and config wiring, a
mesh, and (slow tier) AOT compiles of the train step with them for TPU topologies."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_refused

from bert_jax import config_lib
from bert_jax.kernels.tpu import fused_attention
from bert_jax.models import layers
from bert_jax.objectives import pretraining
from bert_jax.ops import attention as attention_ops
from bert_jax.ops import checks
from bert_jax.tools import kernel_costs
from configs import tiny
import test_fused_norm  # pylint: disable=g-bad-import-order  (tests/, on pytest's path)
from test_aot import require_libtpu  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parent.parent
BATCH, LENGTH, HEADS, HEAD_DIM = 2, 16, 2, 8
# Rows of each case: segment ids (the kernels' input) and the XLA path's additive bias.
PADDED = [[1] * 11 + [0] * 5, [1] * 6 + [0] * 10]  # Rows of 11 and 6 real tokens.
PACKED = [[1] * 5 + [2] * 7 + [0] * 4, [1] * 3 + [2] * 4 + [3] * 6 + [0] * 3]  # 2 and 3 pairs.


def operands(dtype, seed=0, length=LENGTH):
  keys = jax.random.split(jax.random.key(seed), 5)
  q, k, v, cotangent = (jax.random.normal(key, (BATCH, length, HEADS, HEAD_DIM)).astype(dtype)
                        for key in keys[:4])
  return q, k, v, cotangent, fused_attention.tile_keys(keys[4], BATCH, HEADS)


def xla_bias(case, segment_ids, dtype):
  """The bias BertModel makes for these rows in dtype (its most negative value, finite)."""
  mask = (segment_ids > 0).astype(jnp.int32)
  if case == 'packed':
    return layers.pair_attention_bias(segment_ids, dtype)
  if case == 'causal':
    return layers.causal_attention_bias(mask, dtype)
  return layers.attention_bias(mask, dtype)


def value_and_grads(attend, q, k, v, cotangent):
  def loss(q, k, v):
    out = attend(q, k, v)
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32)), out
  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out, grads


def max_diffs(a, b):
  return [float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32))))
          for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]


@pytest.mark.parametrize('dtype, tolerance', [(jnp.float32, 5e-6), (jnp.bfloat16, 4e-2)])
@pytest.mark.parametrize('case', ['padded', 'packed', 'causal'])
def test_kernels_equal_the_xla_attention(case, dtype, tolerance):
  """Forward and q, k, v gradients against ops.attention's einsum path (its bias made from the
  same rows), on every real query; padding queries get no cotangent (nothing reads them)."""
  q, k, v, cotangent, _ = operands(dtype)
  segment_ids = jnp.asarray(PACKED if case == 'packed' else PADDED, jnp.int32)
  real = segment_ids > 0
  cotangent = jnp.where(real[:, :, None, None], cotangent, 0)
  causal = case == 'causal'
  kernel = value_and_grads(lambda q, k, v: fused_attention.attention(
      q, k, v, segment_ids, None, rate=0.0, causal=causal, interpret=True), q, k, v, cotangent)
  bias = xla_bias(case, segment_ids, dtype)
  xla = value_and_grads(lambda q, k, v: attention_ops.dot_product_attention(
      q, k, v, bias, None, 0.0, True, dtype), q, k, v, cotangent)
  out_diff = float(jnp.max(jnp.abs(jnp.where(real[:, :, None, None],
                                             kernel[0].astype(jnp.float32)
                                             - xla[0].astype(jnp.float32), 0))))
  diffs = [out_diff] + max_diffs(kernel[1], xla[1])
  assert np.all(np.asarray(diffs) < tolerance), diffs  # NaN fails too.
  assert float(jnp.max(jnp.abs(kernel[1][1].astype(jnp.float32)))) > 0.1  # A real gradient.


@pytest.mark.parametrize('causal', [False, True])
def test_kernels_with_dropout_equal_the_reference(causal):
  """Dropout in the kernels: forward and gradients equal the jnp reference with the same keys."""
  q, k, v, cotangent, keys = operands(jnp.float32)
  segment_ids = jnp.asarray(PACKED, jnp.int32)
  kernel, reference = (value_and_grads(lambda q, k, v, f=f: f(
      q, k, v, segment_ids, keys, rate=0.25, causal=causal, **extra), q, k, v, cotangent)
                       for f, extra in ((fused_attention.attention, {'interpret': True}),
                                        (fused_attention.reference, {})))
  diffs = max_diffs(kernel, reference)
  assert np.all(np.asarray(diffs) < 2e-5), diffs
  no_dropout = fused_attention.reference(q, k, v, segment_ids, None, rate=0.0, causal=causal)
  assert not np.allclose(kernel[0], no_dropout, atol=1e-3)  # Something was dropped.


def test_dropout_draws_are_the_gpu_kernels_and_keep_the_rate():
  """The draws are the GPU kernels' (the same keys drop the same probabilities on both), keep
  1 - rate of the probabilities, and are a function of the key."""
  from bert_jax.kernels.gpu import fused_attention as gpu  # pylint: disable=g-import-not-at-top
  rate, length = 0.1, 128
  threshold = fused_attention.dropout_threshold(rate)
  assert threshold == gpu.dropout_threshold(rate)
  keys = fused_attention.tile_keys(jax.random.key(0), 4, 8)
  np.testing.assert_array_equal(keys, gpu.tile_keys(jax.random.key(0), 4, 8))
  keep = np.asarray(fused_attention.keep_mask(keys, length, threshold))  # [4, 8, 128, 128]
  np.testing.assert_array_equal(keep, gpu.keep_mask(keys, length, threshold))
  assert abs((1 - keep.mean()) - rate) < 5 * np.sqrt(rate * (1 - rate) / keep.size)
  other = fused_attention.keep_mask(fused_attention.tile_keys(jax.random.key(1), 4, 8), length,
                                    threshold)
  assert 0.15 < np.mean(keep != np.asarray(other)) < 0.21  # 2 * 0.1 * 0.9 if independent.


def test_kernel_dropout_is_deterministic_per_key_and_scales_what_it_keeps():
  q, k, v, _, keys = operands(jnp.float32, length=64)
  segment_ids = jnp.ones((BATCH, 64), jnp.int32)
  attend = lambda q, v, keys: fused_attention.attention(  # noqa: E731
      q, k, v, segment_ids, keys, rate=0.5, interpret=True)
  np.testing.assert_array_equal(attend(q, v, keys), attend(q, v, keys))
  assert not np.allclose(attend(q, v, keys), attend(q, v, keys ^ jnp.uint32(1)))
  # Uniform probabilities (q = 0), v = 1: o = the kept share of 64 keys times 1 / P(keep) = 2,
  # 1 on average (256 queries: standard error about 0.008).
  ones = attend(jnp.zeros_like(q), jnp.ones_like(v), keys)
  assert abs(float(ones.mean()) - 1.0) < 0.04


def pallas_costs(length=LENGTH, rate=0.0):
  """{kernel name: its pallas_call's declared CostEstimate} in the forward and backward."""
  q, k, v, cotangent, keys = operands(jnp.float32, length=length)
  segment_ids = jnp.ones((BATCH, length), jnp.int32)
  jaxpr = jax.make_jaxpr(lambda q, k, v: value_and_grads(lambda q, k, v: fused_attention.attention(
      q, k, v, segment_ids, keys, rate=rate), q, k, v, cotangent))(q, k, v)
  found = {}

  def visit(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'pallas_call':
        name = eqn.params['name']
        found[getattr(name, 'name', name)] = eqn.params['cost_estimate']
      for sub in jax_core.jaxprs_in_params(eqn.params):
        visit(sub)
  visit(jaxpr.jaxpr)
  return found


@pytest.mark.parametrize('rate', [0.0, 0.1])
def test_kernels_declare_the_attention_flops(rate):
  """4 b h s^2 d forward (q k^T, p v), 10 b h s^2 d backward (q k^T again, dO v^T, p^T dO,
  ds k, ds^T q); an exponential per score each way; bytes at least q, k, v and o once."""
  length = 32
  costs = pallas_costs(length, rate)
  assert set(costs) == {'tpu_attention_forward', 'tpu_attention_backward'}
  work = BATCH * HEADS * length * length * HEAD_DIM
  assert costs['tpu_attention_forward'].flops == 4 * work
  assert costs['tpu_attention_backward'].flops == 10 * work
  for cost in costs.values():
    assert cost.transcendentals == BATCH * HEADS * length * length
    assert cost.bytes_accessed >= 4 * BATCH * length * HEADS * HEAD_DIM * 4


def mosaic_call(name, cost):
  """One line of a compiled TPU program: a Mosaic kernel's custom call, as libtpu prints it."""
  config = '"body":"TUxJUg=="' + (f',"cost_estimate":{cost}' if cost else '')
  return (f'  %{name} = bf16[8,2,64,64]{{3,2,1,0}} custom-call(%q, %k), '
          'custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/pallas_call"}, '
          'backend_config={"flag_configs":[],"custom_call_config":{' + config
          + ',"needs_layout_passes":true},"retry_config":{"retry_count":"0"}}')


def test_aot_sums_the_costs_the_compiled_kernels_declare():
  """bert_jax.aot reads each Mosaic call's declared cost from the compiled program; other custom
  calls and a kernel that declares nothing add no FLOPs or bytes."""
  text = '\n'.join([
      'ENTRY %main {',
      mosaic_call('fwd', '{"flops":"1000","transcendentals":"7","bytes_accessed":"64",'
                  '"remote_bytes_transferred":"0"}'),
      mosaic_call('bwd', '{"flops":"2500","transcendentals":"7","bytes_accessed":"96",'
                  '"remote_bytes_transferred":"0"}'),
      mosaic_call('plain', None),
      '  %s = f32[8] custom-call(%x), custom_call_target="Sharding", '
      'backend_config={"cost_estimate":{"flops":"9"}}',
      '  %d = f32[8,8] dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}',
      '}'])
  assert kernel_costs.kernel_cost(text) == {'kernel_flops': 3500.0, 'kernel_bytes': 160.0,
                                   'kernel_calls': 3}
  assert kernel_costs.kernel_cost('ENTRY %main {\n}') == {'kernel_flops': 0.0, 'kernel_bytes': 0.0,
                                                 'kernel_calls': 0}


def small_config(**overrides):
  """test_fused_norm's micro model with 2 heads of 16."""
  return test_fused_norm.small_config(**{'num_heads': 2, **overrides})


@pytest.mark.slow
def test_model_with_the_tpu_attention_computes_the_same_function():
  """A whole pretraining model (dropout off): logits and every parameter's gradient equal the
  'xla' model's, on rows with padding; the parameter trees are the same."""
  args = test_fused_norm.model_batch(length=16)
  xla = pretraining.PretrainingModel(small_config())
  tpu = pretraining.PretrainingModel(small_config(attention_impl='tpu'))
  params = nn.meta.unbox(xla.init(jax.random.key(0), *args)['params'])
  tpu_params = nn.meta.unbox(tpu.init(jax.random.key(0), *args)['params'])
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, tpu_params)
  test_fused_norm.assert_same_function(xla, tpu, params, args)


@pytest.mark.slow
def test_model_with_the_tpu_attention_on_packed_rows_computes_the_same_function():
  ids, segments, _, positions = test_fused_norm.model_inputs(length=16)
  pair_ids = jnp.asarray([[1] * 7 + [2] * 9, [1] * 4 + [2] * 5 + [0] * 7], jnp.int32)
  mask = (pair_ids > 0).astype(jnp.int32)
  position_ids = jnp.asarray([list(range(7)) + list(range(9)),
                              list(range(4)) + list(range(5)) + [0] * 7], jnp.int32)
  args = ({'input_ids': ids * mask, 'segment_ids': segments * mask, 'input_mask': mask,
           'masked_lm_positions': positions, 'position_ids': position_ids, 'pair_ids': pair_ids,
           'nsp_positions': jnp.asarray([[0, 7], [0, 4]], jnp.int32)},)
  xla = pretraining.PretrainingModel(small_config())
  tpu = pretraining.PretrainingModel(small_config(attention_impl='tpu'))
  params = nn.meta.unbox(xla.init(jax.random.key(0), *args)['params'])
  test_fused_norm.assert_same_function(xla, tpu, params, args)


@pytest.mark.slow
def test_model_tpu_attention_drops_in_training_only_and_per_rng():
  model = pretraining.PretrainingModel(small_config(attention_impl='tpu',
                                                    hidden_dropout_rate=0.0))
  args = test_fused_norm.model_batch(length=16)
  params = model.init(jax.random.key(0), *args)['params']
  run = lambda seed: model.apply({'params': params}, *args, deterministic=False,  # noqa: E731
                                 rngs={'dropout': jax.random.key(seed)})['mlm_logits']
  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))  # Only attention dropout is on.
  np.testing.assert_allclose(
      model.apply({'params': params}, *args)['mlm_logits'],
      pretraining.PretrainingModel(small_config()).apply({'params': params}, *args)[
          'mlm_logits'], rtol=1e-5, atol=1e-5)


def test_rows_the_kernels_do_not_take_go_to_the_xla_attention():
  assert all(attention_ops.takes_segment_ids('tpu', n, 64) for n in (8, 64, 128, 512))
  assert not any(attention_ops.takes_segment_ids('tpu', n, 64) for n in (7, 100, 1024))
  assert not attention_ops.takes_segment_ids('tpu', 128, 12)
  assert attention_ops.takes_segment_ids('tpu', 128, 64, causal=True)
  assert not attention_ops.takes_segment_ids('xla', 128, 64)
  with pytest.raises(ValueError, match=r'rows of 8..512 tokens .* got rows of 1024, heads of 64'):
    q = jnp.zeros((1, 1024, 1, 64))
    fused_attention.attention(q, q, q, jnp.ones((1, 1024), jnp.int32), None, rate=0.0)


def test_config_takes_the_tpu_attention_with_dropout_scans_remat_and_causal():
  """Dropout keys come from the rng stream, so no unrolling or remat condition applies; the
  kernels apply the causal mask themselves."""
  config = tiny.get_config()
  config.model.update(attention_impl='tpu', scan_layers=True, remat_policy='full',
                      attention_dropout_rate=0.1)
  config_lib.validate(config)
  config_lib.validate_runtime(config, tokenizer_vocab_size=100, batch_divisor=1)  # CPU: interpreted
  config.model.causal = True
  checks.check_model(config.model, [64])


def test_config_refuses_bad_tpu_attention_settings_before_compiling(monkeypatch):
  config = tiny.get_config()
  config.model.attention_impl = 'tpus'
  assert_refused(config, r"attention_impl.*'tpus'.*'xla', 'cudnn', 'pallas', 'tpu'")
  config.model.update(attention_impl='pallas', causal=True, scan_layers=False)
  with pytest.raises(config_lib.ConfigError, match=r"causal=True needs config.model."
                     r"attention_impl='xla' \(got 'pallas'\), or 'tpu' on TPUs"):
    checks.check_model(config.model, [64])
  config.model.update(attention_impl='tpu', causal=False)
  monkeypatch.setattr(checks.jax, 'default_backend', lambda: 'gpu')
  with pytest.raises(config_lib.ConfigError,
                     match=r"attention_impl='tpu' runs Pallas TPU \(Mosaic\) kernels; this run "
                           r"has 1 gpu device\(s\). Use attention_impl 'pallas', 'cudnn' or "):
    config_lib.validate_runtime(config, tokenizer_vocab_size=100, batch_divisor=1)


def run_script(source: str, *env_items) -> dict:
  """Runs `source` in a fresh Python (its own devices) and returns the JSON it prints last."""
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [
      str(REPO), os.environ.get('PYTHONPATH')])), **dict(env_items)}
  result = subprocess.run([sys.executable, '-c', textwrap.dedent(source)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-4000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


# The check of a mesh script: its `loss` of q, k, v on one device and on 8, split as the train
# step splits them.
MESH_CHECK = """
  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
  one = step(q, k, v)
  # The train step's mesh (axes of the Auto type, as sharding.create_mesh makes them).
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 2, 2), sharding.MESH_AXES)
  with sharding.activation_rules(mesh, sharding.logical_axis_rules('fsdp_tensor')):
    many = step(q, k, v)
    shard_mapped = 'shard_map' in str(jax.make_jaxpr(loss)(q, k, v))
  diff = max(float(jnp.max(jnp.abs(a - b_))) for a, b_ in
             zip(jax.tree.leaves(one), jax.tree.leaves(many)))
  print(json.dumps({'diff': diff, 'shard_mapped': shard_mapped}))
"""
MESH_SCRIPT = """
  import json
  import jax, jax.numpy as jnp
  import numpy as np
  from bert_jax import sharding
  from bert_jax.ops import attention as attention_ops
  b, n, h, d = 8, 16, 4, 8
  q, k, v, cot = (jax.random.normal(jax.random.key(i), (b, n, h, d)) for i in range(4))
  seg = (jnp.arange(n)[None] < jnp.arange(6, 14)[:, None]).astype(jnp.int32)

  def loss(q, k, v):
    out = attention_ops.attention('tpu', q, k, v, seg, rate=0.1, deterministic=False,
                                  dropout_rng=jax.random.key(7), dtype=jnp.float32)
    return jnp.sum(out * cot), out
""" + MESH_CHECK


@pytest.mark.slow
def test_kernels_on_a_mesh_equal_one_device():
  """On 8 fake CPU devices (batch over data x fsdp, heads over tensor) each runs the kernels on
  its rows and heads under shard_map; dropout keys are drawn for the whole batch first, so the
  result (dropout on) equals one device's."""
  result = run_script(MESH_SCRIPT, ('JAX_PLATFORMS', 'cpu'), ('XLA_FLAGS', os.environ.get(
      'XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'))
  assert result['shard_mapped']
  assert result['diff'] < 1e-5, result


KERNEL_AOT_SCRIPT = """
  import json, os, sys
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  import jax, jax.numpy as jnp
  from bert_jax.tools import aot
  from bert_jax.ops import attention as attention_ops
  b, n, h, d = 4, 256, 4, 64
  out = {}
  for topology in ('v5e:2x2', 'v6e:2x2'):
    mesh = jax.sharding.Mesh(aot.topology_devices(topology)[:1], ('data',))
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    x = jax.ShapeDtypeStruct((b, n, h, d), jnp.bfloat16, sharding=whole)
    seg = jax.ShapeDtypeStruct((b, n), jnp.int32, sharding=whole)

    def loss(q, k, v, seg):
      return jnp.sum(attention_ops.attention(
          'tpu', q, k, v, seg, rate=0.1, deterministic=False, dropout_rng=jax.random.key(0),
          dtype=jnp.bfloat16).astype(jnp.float32))
    with jax.set_mesh(mesh):
      compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, seg).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    out[topology] = {'flops': cost['flops'], 'mosaic': 'tpu_custom_call' in compiled.as_text()}
  print(json.dumps(out))
"""


@pytest.mark.slow
def test_kernels_compile_for_tpus_with_their_declared_flops():
  """Compiled for v5e and v6e on this CPU host, the step runs the Mosaic kernels (not the
  interpreter) and libtpu's cost analysis counts their declared FLOPs: 4 + 10 b h s^2 d."""
  require_libtpu()
  result = run_script(KERNEL_AOT_SCRIPT)
  for topology in ('v5e:2x2', 'v6e:2x2'):
    assert result[topology]['mosaic'], result
    assert result[topology]['flops'] >= 14 * 4 * 4 * 256 * 256 * 64, result


@pytest.mark.slow
@pytest.mark.parametrize('topology', ['v6e:2x2'])  # v5e:2x2: the declared-costs test's step.
def test_train_step_with_the_tpu_attention_compiles_for_tpu_topologies(topology):
  """`python -m bert_jax.aot` of the tiny config (rows of 64, heads of 64) with
  attention_impl='tpu' and attention dropout on compiles and fits."""
  require_libtpu()
  result = subprocess.run(
      [sys.executable, '-m', 'bert_jax.aot', '--config=configs/tiny.py', f'--topology={topology}',
       '--layer_probes=false', '--config.model.attention_impl=tpu',
       '--config.model.attention_dropout_rate=0.1', '--config.model.dtype=bfloat16'],
      cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report['fits'] is True and report['flops_per_device'] > 0
  assert (report['batch'], report['seq']) == (32, 64)


def aot_report(*args: str) -> dict:
  """`python -m bert_jax.aot` of the tiny config (2 scanned layers of 2 heads of 64, rows of 64,
  batch 32) in bfloat16 for v5e:2x2 (4 devices, 8 rows each) with attention dropout on."""
  result = subprocess.run(
      [sys.executable, '-m', 'bert_jax.aot', '--config=configs/tiny.py', '--topology=v5e:2x2',
       '--config.model.attention_dropout_rate=0.1', '--config.model.dtype=bfloat16', *args],
      cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_aot_reports_the_kernels_declared_costs_beside_the_estimate():
  """With attention_impl='tpu' the report splits libtpu's FLOPs and bytes into the kernels'
  declarations (a forward and a backward call per layer: 4 + 10 b h s^2 d FLOPs on each
  device's 8 rows, the bytes of their operands) and the rest; the layer probes count both
  layers where the scanned step counts one. The 'xla' attention declares nothing, and its
  einsums, counted by XLA, exceed what the 'tpu' step leaves once the declarations are out."""
  require_libtpu()
  rows, layers, heads, length, head_dim = 8, 2, 2, 64, 64
  tpu = aot_report('--config.model.attention_impl=tpu')
  assert tpu['fits'] is True and (tpu['batch'], tpu['seq']) == (32, 64)  # Compiles for v5e.
  work = rows * heads * length * length * head_dim
  assert tpu['kernel_calls_per_device'] == 2 * layers
  assert tpu['kernel_flops_per_device'] == layers * 14 * work
  assert tpu['xla_kernel_flops_per_device'] == 14 * work  # The scanned layer, costed once.
  tile = rows * heads * length * head_dim * 2  # bfloat16
  inputs = rows * heads * 4 + rows * length * 128 * 4 + rows * 8 * length * 4  # keys, ids
  assert tpu['kernel_bytes_per_device'] == layers * (2 * inputs + (3 + 1) * tile + (5 + 3) * tile)
  assert (tpu['flops_without_kernels_per_device']
          == tpu['flops_per_device'] - tpu['kernel_flops_per_device'] > 0)
  assert (tpu['bytes_without_kernels_per_device']
          == tpu['bytes_per_device'] - tpu['kernel_bytes_per_device'] > 0)
  assert tpu['kernel_flops_share'] == pytest.approx(
      tpu['kernel_flops_per_device'] / tpu['flops_per_device'])
  assert 0 < tpu['roofline_without_kernels_s'] < tpu['roofline_s']
  assert 0 < tpu['kernel_roofline_s'] < tpu['roofline_s']

  xla = aot_report('--layer_probes=false')
  assert xla['kernel_calls_per_device'] == 0
  assert xla['kernel_flops_per_device'] == xla['kernel_bytes_per_device'] == 0
  assert xla['flops_without_kernels_per_device'] == xla['flops_per_device']
  assert xla['roofline_without_kernels_s'] == xla['roofline_s']
  # Unprobed, both count one layer: the XLA attention's q k^T, p v and their gradients
  # (12 b h s^2 d) are in its FLOPs, not in the 'tpu' step's without its declarations.
  tpu_without = tpu['xla_flops_per_device'] - tpu['xla_kernel_flops_per_device']
  assert xla['xla_flops_per_device'] - tpu_without >= 12 * work

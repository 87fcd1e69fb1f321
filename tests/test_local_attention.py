"""attention_impl='splash': JAX's splash attention kernels (interpreted on CPU) for the modern
encoder's local and global layers, against the XLA attention's masked scores; the model wired to
them, a mesh, the config's refusals, and (slow tier) what a TPU compile of ModernBERT's step
moves with them."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_refused

from bert_jax import config_lib
from bert_jax.kernels.tpu import local_attention
from bert_jax.ops import attention as attention_ops
from bert_jax.ops import positions
import test_tpu_attention  # pylint: disable=g-bad-import-order  (tests/, on pytest's path)

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 256, 3, 16
# Segment ids: a row with 56 padding tokens, and a packed row of three sequences and padding.
PADDED = [[1] * LENGTH, [1] * 200 + [0] * 56]
PACKED = [[1] * 100 + [2] * 156, [1] * 60 + [2] * 90 + [3] * 70 + [0] * 36]


def reference(q, k, v, segments, window):
  """The XLA attention with the modern encoder's additive mask: same segment, within window."""
  segments = np.asarray(segments)
  allowed = segments[:, :, None] == segments[:, None, :]
  if window:
    allowed &= np.asarray(positions.sliding_window_mask(LENGTH, window))[None]
  bias = np.where(allowed[:, None], 0.0, -1e30).astype(np.float32)
  return attention_ops.dot_product_attention(q, k, v, jnp.asarray(bias), None, 0.0, True,
                                             jnp.float32)


@pytest.mark.parametrize('rows', [PADDED, PACKED], ids=['padded', 'packed'])
@pytest.mark.parametrize('window', [20, *(pytest.param(w, marks=pytest.mark.slow)
                                         for w in (0, 1, 64))])
def test_kernels_equal_the_masked_xla_attention_and_its_gradients(rows, window):
  q, k, v, cotangent = (jax.random.normal(key, (BATCH, LENGTH, HEADS, HEAD_DIM))
                        for key in jax.random.split(jax.random.key(window), 4))
  segments = jnp.asarray(rows, jnp.int32)
  real = (segments > 0)[..., None, None]  # Padding's outputs are never read.

  def loss(attend, q, k, v):
    return jnp.sum(jnp.where(real, attend(q, k, v) * cotangent, 0.0))

  kernel = lambda q, k, v: local_attention.attention(  # noqa: E731
      q, k, v, segments, window=window, interpret=True)
  xla = lambda q, k, v: reference(q, k, v, rows, window)  # noqa: E731
  np.testing.assert_allclose(np.where(real, kernel(q, k, v), 0), np.where(real, xla(q, k, v), 0),
                             atol=2e-6)
  ours = jax.grad(lambda *a: loss(kernel, *a), argnums=(0, 1, 2))(q, k, v)
  theirs = jax.grad(lambda *a: loss(xla, *a), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(ours, theirs):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_window_changes_the_result():
  q, k, v = (jax.random.normal(key, (BATCH, LENGTH, HEADS, HEAD_DIM))
             for key in jax.random.split(jax.random.key(0), 3))
  segments = jnp.asarray(PADDED, jnp.int32)
  local = local_attention.attention(q, k, v, segments, window=8, interpret=True)
  whole = local_attention.attention(q, k, v, segments, window=0, interpret=True)
  assert float(jnp.max(jnp.abs(local - whole))) > 0.1


def modern_config(**model):
  """A small modern encoder (3 layers: global, local, local) on rows of 256."""
  from configs import base  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.objectives = 'mlm'
  config.data.update(corpus='builtin', max_seq_length=LENGTH, max_predictions_per_seq=40)
  config.model.update(
      name='modernbert', num_layers=3, hidden_size=48, num_heads=3, intermediate_size=64,
      vocab_size=97, type_vocab_size=1, norm='layer_norm', use_bias=False,
      feed_forward='geglu', positions='rotary', rope_theta=1000.0, local_rope_theta=50.0,
      local_window=16, global_every=3, attention_dropout_rate=0.0,
      **{'scan_layers': False, **model})
  return config


@pytest.mark.slow
def test_the_modern_encoder_computes_the_same_function_with_the_kernels():
  """Logits and every parameter's gradient of a pretraining model equal the XLA path's, on a
  padded row and on a packed one (positions restarting in each sequence), its layers unrolled
  and scanned (each scanned layer runs its own kind's kernels)."""
  from bert_jax.interop import param_tree  # pylint: disable=g-import-not-at-top
  from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  pair_ids = np.asarray(PACKED, np.int32)
  mask = (pair_ids > 0).astype(np.int32)
  position_ids = np.zeros_like(pair_ids)
  for row in range(BATCH):
    for pair in range(1, pair_ids[row].max() + 1):
      where = pair_ids[row] == pair
      position_ids[row, where] = np.arange(where.sum())
  batch = {'input_ids': rng.integers(3, 97, (BATCH, LENGTH)).astype(np.int32) * mask,
           'input_mask': mask, 'segment_ids': np.zeros_like(mask),
           'masked_lm_positions': rng.integers(0, 200, (BATCH, 40)).astype(np.int32)}
  packed = {**batch, 'position_ids': position_ids, 'pair_ids': pair_ids}
  xla_config, splash_config = modern_config(), modern_config(attention_impl='splash')
  scanned_config = modern_config(attention_impl='splash', scan_layers=True)
  for config in (splash_config, scanned_config):
    config_lib.validate(config)
  xla, splash, scanned = (steps.build_model(c)
                          for c in (xla_config, splash_config, scanned_config))
  params = nn.meta.unbox(xla.init(jax.random.key(1), batch)['params'])
  stacked = param_tree.unflatten(param_tree.stack_layers(param_tree.flatten(params), 3))
  for rows in (batch, packed):
    def loss(model, p, rows=rows):
      return model.apply({'params': p}, rows)['mlm_logits']
    theirs = param_tree.flatten(jax.grad(lambda p: loss(xla, p).sum())(params))
    np.testing.assert_allclose(loss(splash, params), loss(xla, params), atol=1e-5)
    np.testing.assert_allclose(loss(scanned, stacked), loss(xla, params), atol=1e-5)
    ours = param_tree.flatten(jax.grad(lambda p: loss(splash, p).sum())(params))
    ours_scanned = param_tree.unstack_layers(param_tree.flatten(
        jax.grad(lambda p: loss(scanned, p).sum())(stacked)))
    for key, grad in theirs.items():
      np.testing.assert_allclose(ours[key], grad, rtol=1e-4, atol=1e-5, err_msg=key)
      np.testing.assert_allclose(ours_scanned[key], grad, rtol=1e-4, atol=1e-5, err_msg=key)


@pytest.mark.parametrize('model, message', [
    ({'name': 'bert', 'local_window': 0, 'global_every': 1, 'positions': 'absolute',
      'use_bias': True, 'feed_forward': 'gelu', 'rope_theta': 10_000.0,
      'local_rope_theta': 10_000.0, 'type_vocab_size': 2},
     "attention_impl='splash' with config.model.name='bert'"),
    ({'attention_dropout_rate': 0.1}, "attention_impl='splash' with attention_dropout_rate=0.1"),
])
def test_config_refuses_what_the_kernels_cannot_do(model, message):
  config = modern_config(attention_impl='splash')
  config.model.update(model)
  assert_refused(config, message.replace('(', r'\('))


def test_deberta_refuses_the_kernels_naming_its_attention():
  from configs import deberta  # pylint: disable=g-import-not-at-top
  config = deberta.get_config()
  config.data.corpus = 'builtin'
  config.model.attention_impl = 'splash'
  with pytest.raises(config_lib.ConfigError, match="attention_impl='splash' with config.model"
                                                    ".name='deberta'"):
    config_lib.validate(config)


MESH_SCRIPT = """
  import json
  import jax, jax.numpy as jnp
  import numpy as np
  from bert_jax import sharding
  from bert_jax.ops import attention as attention_ops
  b, n, h, d = 8, 128, 4, 8
  q, k, v, cot = (jax.random.normal(jax.random.key(i), (b, n, h, d)) for i in range(4))
  seg = (jnp.arange(n)[None] < jnp.arange(60, 124, 8)[:, None]).astype(jnp.int32)

  def loss(q, k, v):
    out = attention_ops.attention('splash', q, k, v, seg, rate=0.0, deterministic=True,
                                  dropout_rng=None, dtype=jnp.float32, window=10)
    return jnp.sum(out * cot * seg[..., None, None]), out
""" + test_tpu_attention.MESH_CHECK


@pytest.mark.slow
def test_kernels_on_a_mesh_equal_one_device():
  """On 8 fake CPU devices (batch over data x fsdp, heads over tensor) each runs the kernels on
  its rows and heads under shard_map; the result equals one device's."""
  result = test_tpu_attention.run_script(
      MESH_SCRIPT, ('JAX_PLATFORMS', 'cpu'),
      ('XLA_FLAGS', os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'))
  assert result['shard_mapped']
  assert result['diff'] < 1e-5, result


AOT_SCRIPT = """
  import json, os
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  import jax, jax.numpy as jnp
  from bert_jax.tools import aot
  from bert_jax.ops import attention as attention_ops
  b, n, h, d = 4, 1024, 4, 64
  mesh = jax.sharding.Mesh(aot.topology_devices('v5e:2x2')[:1], ('data',))
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  x = jax.ShapeDtypeStruct((b, n, h, d), jnp.bfloat16, sharding=whole)
  seg = jax.ShapeDtypeStruct((b, n), jnp.int32, sharding=whole)
  out = {}
  for impl, window in (('splash', 64), ('splash', 0)):
    def loss(q, k, v, seg):
      return jnp.sum(attention_ops.attention(
          impl, q, k, v, seg, rate=0.0, deterministic=True, dropout_rng=None,
          dtype=jnp.bfloat16, window=window).astype(jnp.float32))
    with jax.set_mesh(mesh):
      compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, seg).compile()
    out[f'{impl}-{window}'] = 'tpu_custom_call' in compiled.as_text()
  print(json.dumps(out))
"""


@pytest.mark.slow
def test_kernels_compile_for_tpus():
  """The train step's attention and its gradient compile for a TPU (libtpu, on this CPU) into
  Mosaic kernels, local and global."""
  test_tpu_attention.require_libtpu()
  result = test_tpu_attention.run_script(AOT_SCRIPT)
  assert result == {'splash-64': True, 'splash-0': True}, result

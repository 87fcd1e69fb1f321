"""fused_ffn.gelu_dense: its custom backward against the model's way under JAX's autodiff (on
CPU the kernel's place is taken by dgelu_reference; the kernel itself needs a Hopper GPU, and is
traced here), its input checks, and the model with `ffn_impl='pallas'`."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import fused_ffn
from bert_jax import model as model_lib
from configs import tiny

TOKENS, MLP, EMBED = 128, 256, 64  # The smallest shapes the default tiling divides.


def operands(dtype, tokens=TOKENS):
  keys = jax.random.split(jax.random.key(0), 4)
  pre = (2 * jax.random.normal(keys[0], (tokens, MLP))).astype(dtype)  # GELU's curved part too.
  bias = 0.1 * jax.random.normal(keys[1], (MLP,))
  kernel = 0.05 * jax.random.normal(keys[2], (MLP, EMBED))
  cotangent = jax.random.normal(keys[3], (tokens, EMBED)).astype(dtype)
  return pre, bias, kernel, cotangent


def value_and_grads(impl, pre, bias, kernel, cotangent):
  def loss(pre, bias, kernel):
    out = fused_ffn.gelu_dense(pre, bias, kernel, impl=impl)
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32)), out
  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(pre, bias, kernel)
  return out, grads


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_custom_backward_equals_the_models_way(dtype):
  pre, bias, kernel, cotangent = operands(dtype)
  assert fused_ffn.fits(TOKENS, MLP, EMBED)
  out_ref, grads_ref = value_and_grads('xla', pre, bias, kernel, cotangent)
  out, grads = value_and_grads('pallas', pre, bias, kernel, cotangent)
  assert out.dtype == dtype and grads[0].dtype == dtype
  assert grads[1].dtype == grads[2].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(out_ref, np.float32))
  # float32: the same arithmetic. bf16: dY @ kernel^T is multiplied by gelu' before rounding
  # (the model's way rounds it to bf16 first), as in the kernel.
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  for name, a, b in zip(('pre', 'bias', 'kernel'), grads, grads_ref):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max(), err_msg=f'd{name}')


def test_the_kernel_traces_at_bert_base_shapes():
  """The kernel's body traced to a jaxpr (Mosaic GPU lowers it only on a Hopper GPU): its
  indexing, tiling and epilogue are consistent at BERT-Base 256 x 128 and at Large."""
  for tokens, mlp, embed in ((32768, 3072, 768), (16384, 4096, 1024)):
    dy = jax.ShapeDtypeStruct((tokens, embed), jnp.bfloat16)
    kernel = jax.ShapeDtypeStruct((mlp, embed), jnp.bfloat16)
    pre = jax.ShapeDtypeStruct((tokens, mlp), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(lambda a, b, c: fused_ffn.dgelu_matmul(a, b, c, sms=132))(
        dy, kernel, pre)
    assert 'wgmma' in str(jaxpr)  # The kernel's body, traced.
    assert jaxpr.out_avals[0].shape == (tokens, mlp)


@pytest.mark.parametrize('tiles, message', [
    (fused_ffn.Tiles(rows=96), r'tiles.rows=96: must be a multiple of 64 dividing tokens \(128\)'),
    (fused_ffn.Tiles(cols=256), r'tiles.cols=256: .* dividing mlp / 2 \(128\)'),
    (fused_ffn.Tiles(depth=32), r'tiles.depth=32: must be 64, dividing embed \(64\)'),
    (fused_ffn.Tiles(stages=0), r'tiles.stages=0: must be at least 1'),
    (fused_ffn.Tiles(stages=5), r'needs 311296 bytes of shared memory, more than a block')])
def test_bad_tilings_are_named_before_compiling(tiles, message):
  pre, bias, kernel, _ = operands(jnp.bfloat16)
  with pytest.raises(ValueError, match=message):
    fused_ffn.gelu_dense(pre, bias, kernel, tiles=tiles)
  # impl='xla' runs no kernel, so the tiling it is given is not its concern.
  np.testing.assert_array_equal(fused_ffn.gelu_dense(pre, bias, kernel, impl='xla', tiles=tiles),
                                fused_ffn.gelu_dense(pre, bias, kernel, impl='xla'))


def test_bad_shapes_and_impl_are_named():
  pre, bias, kernel, _ = operands(jnp.float32)
  with pytest.raises(ValueError, match=r'pre \[tokens, mlp\], bias \[mlp\], kernel \[mlp, embed\]'):
    fused_ffn.gelu_dense(pre, bias, kernel.T)
  with pytest.raises(ValueError, match=r"impl='cuda'; valid: \('xla', 'pallas'\)"):
    fused_ffn.gelu_dense(pre, bias, kernel, impl='cuda')


def test_shapes_the_tiling_does_not_divide_fall_back_to_xla():
  assert fused_ffn.fits(32768, 3072, 768)  # BERT-Base 256 x 128.
  assert not fused_ffn.fits(40, MLP, EMBED)
  assert not fused_ffn.on_hopper()  # This CPU: the backward runs dgelu_reference.
  pre, bias, kernel, _ = operands(jnp.float32, tokens=40)
  ref = jax.grad(lambda p: jnp.sum(fused_ffn.gelu_dense(p, bias, kernel, impl='xla')))(pre)
  got = jax.grad(lambda p: jnp.sum(fused_ffn.gelu_dense(p, bias, kernel)))(pre)
  np.testing.assert_array_equal(got, ref)


def test_model_with_the_fused_ffn_computes_the_same_function_and_gradients():
  batch, length, embed, mlp = 16, 8, 64, 256
  assert fused_ffn.fits(batch * length, mlp, embed)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, 99, (batch, length)), jnp.int32)
  mask = jnp.asarray(np.arange(length)[None] < rng.integers(3, length + 1, (batch, 1)), jnp.int32)
  args = (ids, jnp.zeros_like(ids), mask, jnp.asarray(rng.integers(1, 3, (batch, 2)), jnp.int32))
  results = []
  for impl in ('xla', 'pallas'):
    model = model_lib.BertForPreTraining(model_lib.BertConfig(
        vocab_size=99, hidden_size=embed, num_layers=2, num_heads=2, intermediate_size=mlp,
        max_position_embeddings=length, gelu='tanh', ffn_impl=impl))
    params = nn.meta.unbox(model.init(jax.random.key(0), *args)['params'])

    def loss(p, model=model):
      out = model.apply({'params': p}, *args, deterministic=False,
                        rngs={'dropout': jax.random.key(3)})
      return out['mlm_logits'].sum() + out['nsp_logits'].sum()

    results.append((params,) + jax.value_and_grad(loss)(params))
  (params_a, value_a, grads_a), (params_b, value_b, grads_b) = results
  # The same parameters (names, shapes, initial values): checkpoints are the same either way.
  jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
  np.testing.assert_allclose(value_a, value_b, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               grads_a, grads_b)


def test_fused_ffn_needs_the_tanh_gelu_and_a_gpu():
  config = tiny.get_config()
  config.model.update(ffn_impl='pallas', gelu='erf')
  with pytest.raises(config_lib.ConfigError,
                     match=r"ffn_impl='pallas' computes the tanh GELU .* got "
                           r"config.model.gelu='erf'. Set gelu='tanh'"):
    config_lib.validate(config)
  config.model.gelu = 'tanh'
  config_lib.validate(config)
  with pytest.raises(config_lib.ConfigError,
                     match="ffn_impl='pallas' runs a Mosaic GPU kernel on NVIDIA Hopper GPUs; "
                           r"this run has 1 cpu device\(s\). Use ffn_impl='xla'"):
    config_lib.validate_runtime(config, tokenizer_vocab_size=100, batch_divisor=1)


def test_fused_ffn_on_a_gpu_before_hopper_is_refused(monkeypatch):
  config = tiny.get_config()
  config.model.update(ffn_impl='pallas', gelu='tanh')
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  monkeypatch.setattr(fused_ffn, 'on_hopper', lambda: False)
  with pytest.raises(config_lib.ConfigError,
                     match=r"ffn_impl='pallas' runs a Mosaic GPU kernel \(wgmma, TMA\) on NVIDIA "
                           r"Hopper GPUs \(compute capability 9.x\); this run has .* Use "
                           r"ffn_impl='xla'"):
    config_lib.check_gpu_kernels(config)
  config.model.ffn_impl = 'xla'  # The Triton kernels need no Hopper.
  config.model.layer_norm_impl = 'pallas'
  config_lib.check_gpu_kernels(config)

"""fused_ffn.gelu_dense: the Pallas backward (run by the interpreter on CPU) against the model's
way under JAX's autodiff, its input checks, and the model with `ffn_impl='pallas'`."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import fused_ffn
from bert_jax import model as model_lib
from configs import tiny

TOKENS, MLP = 64, 128


def operands(dtype, embed):
  keys = jax.random.split(jax.random.key(0), 4)
  pre = (2 * jax.random.normal(keys[0], (TOKENS, MLP))).astype(dtype)  # GELU's curved part too.
  bias = 0.1 * jax.random.normal(keys[1], (MLP,))
  kernel = 0.05 * jax.random.normal(keys[2], (MLP, embed))
  cotangent = jax.random.normal(keys[3], (TOKENS, embed)).astype(dtype)
  return pre, bias, kernel, cotangent


def value_and_grads(impl, pre, bias, kernel, cotangent, blocks=None):
  def loss(pre, bias, kernel):
    out = fused_ffn.gelu_dense(pre, bias, kernel, impl=impl, interpret=True, blocks=blocks)
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32)), out
  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(pre, bias, kernel)
  return out, grads


@pytest.mark.parametrize('dtype, embed, blocks', [
    # An embed that is no power of two (as BERT-Base's 768 = 12 x 64), steps of 16.
    (jnp.float32, 48, fused_ffn.Blocks(rows=32, cols=64, depth=16)),
    (jnp.bfloat16, 64, fused_ffn.Blocks(rows=16, cols=32, depth=32))])
def test_kernel_backward_equals_the_models_way(dtype, embed, blocks):
  pre, bias, kernel, cotangent = operands(dtype, embed)
  out_ref, grads_ref = value_and_grads('xla', pre, bias, kernel, cotangent)
  out, grads = value_and_grads('pallas', pre, bias, kernel, cotangent, blocks)
  assert out.dtype == dtype and grads[0].dtype == dtype
  assert grads[1].dtype == grads[2].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(out_ref, np.float32))
  # float32: the same arithmetic. bf16: the kernel multiplies dY @ kernel^T by gelu' before
  # rounding (the model's way rounds it to bf16 first) and sums the bias gradient in float32.
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  for name, a, b in zip(('pre', 'bias', 'kernel'), grads, grads_ref):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max(), err_msg=f'd{name}')


@pytest.mark.parametrize('blocks, message', [
    (fused_ffn.Blocks(rows=48), r'blocks.rows=48: must be a power of two from 16 dividing tokens'),
    (fused_ffn.Blocks(rows=32, cols=256), r'blocks.cols=256: .* dividing mlp \(128\)'),
    (fused_ffn.Blocks(rows=32, cols=32, depth=32), r'blocks.depth=32: .* dividing embed \(48\)'),
    (fused_ffn.Blocks(rows=32, cols=32, depth=16, warps=6), r'blocks.warps=6'),
    (fused_ffn.Blocks(rows=32, cols=32, depth=16, stages=0), r'blocks.stages=0')])
def test_bad_tilings_are_named_before_compiling(blocks, message):
  pre, bias, kernel, _ = operands(jnp.float32, 48)
  with pytest.raises(ValueError, match=message):
    fused_ffn.gelu_dense(pre, bias, kernel, blocks=blocks)


def test_bad_shapes_and_impl_are_named():
  pre, bias, kernel, _ = operands(jnp.float32, 48)
  with pytest.raises(ValueError, match=r'pre \[tokens, mlp\], bias \[mlp\], kernel \[mlp, embed\]'):
    fused_ffn.gelu_dense(pre, bias, kernel.T)
  with pytest.raises(ValueError, match=r"impl='cuda'; valid: \('xla', 'pallas'\)"):
    fused_ffn.gelu_dense(pre, bias, kernel, impl='cuda')


def test_default_tiling_fits_the_shapes_or_falls_back_to_xla():
  assert fused_ffn.fit_blocks(32768, 3072, 768) == fused_ffn.BLOCKS  # BERT-Base 256 x 128.
  assert fused_ffn.fit_blocks(48, 64, 32) == fused_ffn.BLOCKS._replace(rows=16, cols=64, depth=32)
  assert fused_ffn.fit_blocks(40, 64, 32) is None  # 40 tokens: no power of two from 16 divides.
  pre, bias, kernel, cotangent = operands(jnp.float32, 48)
  pre = pre[:40]  # Falls back to the same function the XLA way.
  ref = jax.grad(lambda p: jnp.sum(fused_ffn.gelu_dense(p, bias, kernel, impl='xla')))(pre)
  got = jax.grad(lambda p: jnp.sum(fused_ffn.gelu_dense(p, bias, kernel, interpret=True)))(pre)
  np.testing.assert_array_equal(got, ref)


def test_model_with_the_fused_ffn_computes_the_same_function_and_gradients():
  batch, length, embed, mlp = 4, 8, 32, 64
  assert fused_ffn.fit_blocks(batch * length, mlp, embed) is not None  # The kernel runs.
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
                     match="ffn_impl='pallas' runs Triton kernels on NVIDIA GPUs; "
                           r"this run has 1 cpu device\(s\). Use ffn_impl='xla'"):
    config_lib.validate_runtime(config, tokenizer_vocab_size=100, batch_divisor=1)

"""fused_ffn.ffn: its custom VJP against the model's way under JAX's autodiff (on CPU the
kernels' places are taken by gelu_reference and dgelu_reference; the kernels need a Hopper GPU,
and are lowered to Mosaic GPU here), its input checks, and the model with `ffn_impl='pallas'`."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_refused

from bert_jax import config_lib
from bert_jax.kernels.gpu import fused_ffn
from bert_jax.models.encoder import EncoderConfig
from bert_jax.objectives import pretraining
from bert_jax.ops import checks
from configs import tiny

TOKENS, MLP, EMBED = 128, 128, 64  # The smallest shapes the default tiling divides.


def operands(dtype, tokens=TOKENS):
  keys = jax.random.split(jax.random.key(0), 5)
  x = jax.random.normal(keys[0], (tokens, EMBED)).astype(dtype)
  w1 = 0.2 * jax.random.normal(keys[1], (EMBED, MLP))  # Pre-activations of about 1.6: the
  b1 = 0.1 * jax.random.normal(keys[2], (MLP,))  # GELU's curved part too.
  w2 = 0.05 * jax.random.normal(keys[3], (MLP, EMBED))
  cotangent = jax.random.normal(keys[4], (tokens, EMBED)).astype(dtype)
  return x, w1, b1, w2, cotangent


def value_and_grads(impl, x, w1, b1, w2, cotangent):
  def loss(*args):
    out = fused_ffn.ffn(*args, impl=impl)
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32)), out
  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(x, w1, b1, w2)
  return out, grads


@pytest.mark.slow
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_custom_vjp_equals_the_models_way(dtype):
  x, w1, b1, w2, cotangent = operands(dtype)
  assert fused_ffn.fits(TOKENS, MLP, EMBED)
  out_ref, grads_ref = value_and_grads('xla', x, w1, b1, w2, cotangent)
  out, grads = value_and_grads('pallas', x, w1, b1, w2, cotangent)
  assert out.dtype == dtype and grads[0].dtype == dtype
  assert all(g.dtype == jnp.float32 for g in grads[1:])
  # float32: the same function, the GELU's arithmetic in another order. bf16: the kernels keep
  # x @ w1 + b1 and dY @ w2^T in float32 where the model's way rounds them to bf16, and save
  # gelu' in bf16.
  tol = 1e-5 if dtype == jnp.float32 else 3e-2
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(out_ref, np.float32),
                             rtol=tol, atol=tol * np.abs(np.asarray(out_ref, np.float32)).max())
  for name, a, b in zip(('x', 'w1', 'b1', 'w2'), grads, grads_ref):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * np.abs(b).max(), err_msg=f'd{name}')


@pytest.mark.slow
@pytest.mark.parametrize('tokens, mlp, embed', [(32768, 3072, 768), (16384, 4096, 1024)])
def test_the_kernels_lower_to_mosaic_gpu_at_bert_shapes(tokens, mlp, embed, mosaic_semantics):
  """Both kernels lowered for a CUDA device (Mosaic GPU's layout inference and lowering run on
  this CPU; compiling them needs a Hopper GPU) at BERT-Base 256 x 128 and Large 128 x 128, under
  each lowering semantics: the forward's h and g; the backward's dPre and its column sums per 64
  rows [tokens // 64, mlp], whose buffer leaves the default tiling within a block's shared
  memory."""
  del mosaic_semantics
  bf16 = jnp.bfloat16
  x, dy = (jax.ShapeDtypeStruct((tokens, embed), bf16),) * 2
  w1 = jax.ShapeDtypeStruct((embed, mlp), bf16)
  w2 = jax.ShapeDtypeStruct((mlp, embed), bf16)
  b1 = jax.ShapeDtypeStruct((mlp,), jnp.float32)
  g = jax.ShapeDtypeStruct((tokens, mlp), bf16)
  assert fused_ffn.fits(tokens, mlp, embed)
  for fn, args, shapes in (
      (fused_ffn.gelu_matmul, (x, w1, b1), [(tokens, mlp)] * 2),
      (fused_ffn.dgelu_matmul, (dy, w2, g), [(tokens, mlp), (tokens // 64, mlp)])):
    lowered = jax.jit(functools.partial(fn, sms=132)).trace(*args).lower(
        lowering_platforms=('cuda',))
    text = lowered.as_text()
    assert 'mosaic_gpu' in text  # The kernel, as a Mosaic GPU custom call.
    assert [o.shape for o in jax.tree.leaves(lowered.out_info)] == shapes


def _kernels_as_on_an_h100(monkeypatch):
  """ffn runs its kernels (not the references), launched on an H100's 132 SMs (the CPU device
  has no count)."""
  monkeypatch.setattr(fused_ffn, 'on_hopper', lambda: True)
  for name in ('gelu_matmul', 'dgelu_matmul'):
    monkeypatch.setattr(fused_ffn, name, functools.partial(getattr(fused_ffn, name), sms=132))


@pytest.mark.parametrize('tokens, mlp, embed', [(32768, 3072, 768), (16384, 4096, 1024)])
def test_the_bias_gradient_comes_from_the_backward_kernels_column_sums(tokens, mlp, embed,
                                                                      monkeypatch):
  """The block's gradient, with the kernels as on a Hopper GPU, at BERT-Base and Large: the bias
  gradient is the sum of dgelu_matmul's column sums per 64 rows (no second read of dPre)."""
  _kernels_as_on_an_h100(monkeypatch)
  x = jax.ShapeDtypeStruct((tokens, embed), jnp.bfloat16)
  params = [jax.ShapeDtypeStruct(shape, jnp.float32)
            for shape in ((embed, mlp), (mlp,), (mlp, embed))]
  loss = lambda x, *p: jnp.sum(fused_ffn.ffn(x, *p).astype(jnp.float32))  # noqa: E731
  traced = jax.jit(jax.grad(loss, argnums=(1, 2, 3))).trace(x, *params)
  sums_in = [e for e in _kernel_eqns(traced.jaxpr.jaxpr)
             if e.primitive.name == 'reduce_sum' and e.invars[0].aval.shape == (tokens // 64, mlp)]
  assert len(sums_in) == 1
  assert [o.shape for o in traced.lower(lowering_platforms=('cuda',)).out_info] == [
      p.shape for p in params]


def test_the_kernels_of_every_block_lower_once(monkeypatch):
  """The blocks of a model share one trace and one CUDA lowering of each FFN kernel
  (fused_norm.lowered_once): the lowered gradient of six blocks holds as many Mosaic GPU
  modules as that of three (one each for the forward and the backward kernel)."""
  _kernels_as_on_an_h100(monkeypatch)
  tokens, embed, mlp = 1024, 256, 1024
  args = (jax.ShapeDtypeStruct((tokens, embed), jnp.bfloat16),
          *[jax.ShapeDtypeStruct(shape, jnp.float32)
            for shape in ((embed, mlp), (mlp,), (mlp, embed))])

  def lowered(blocks: int) -> str:
    def loss(x, *params):
      return sum(jnp.sum(fused_ffn.ffn(x * (i + 1), *params).astype(jnp.float32))
                 for i in range(blocks))
    return jax.jit(jax.grad(loss, argnums=(1, 2, 3))).trace(*args).lower(
        lowering_platforms=('cuda',)).as_text()
  three, six = lowered(3), lowered(6)
  assert six.count('stable_mosaic_gpu.version') == three.count('stable_mosaic_gpu.version') == 2


def _kernel_eqns(jaxpr):
  """The equations of a traced function's jaxpr and of every jaxpr nested in their params."""
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (tuple, list)) else (value,)):
        sub = getattr(sub, 'jaxpr', sub)  # ClosedJaxpr -> Jaxpr
        if hasattr(sub, 'eqns'):
          yield from _kernel_eqns(sub)


def test_traced_kernels_ask_the_profiler_for_their_regions(tmp_path):
  """With trace_dir each kernel asks Mosaic GPU's profiler for trace_ranges ranges per
  warpgroup, written to trace_dir, and its prologue and epilogue are named regions; without, no
  profiler. (The traced kernel's lowering needs a GPU backend for
  the profiler's callback, so this checks the traced function.) At Base's shapes a warpgroup
  takes at most 24 of the 6,144 tiles of 132 blocks, two ranges each; the profiler's 'Init'
  range and header take two ranges' room."""
  tokens, mlp, embed = 32768, 3072, 768
  tiles = fused_ffn.TILES
  assert fused_ffn.trace_ranges(tokens, mlp, tiles, 132) == 2 * 24 + 2
  bf16 = jnp.bfloat16
  args = {fused_ffn.gelu_matmul: (jax.ShapeDtypeStruct((tokens, embed), bf16),
                                  jax.ShapeDtypeStruct((embed, mlp), bf16),
                                  jax.ShapeDtypeStruct((mlp,), jnp.float32)),
          fused_ffn.dgelu_matmul: (jax.ShapeDtypeStruct((tokens, embed), bf16),
                                   jax.ShapeDtypeStruct((mlp, embed), bf16),
                                   jax.ShapeDtypeStruct((tokens, mlp), bf16))}
  for fn, fn_args in args.items():
    for trace_dir in ('', str(tmp_path)):
      traced = jax.jit(functools.partial(fn, tiles=tiles, sms=132, trace_dir=trace_dir)).trace(
          *fn_args)
      eqns = list(_kernel_eqns(traced.jaxpr.jaxpr))
      (params,) = [e.params['compiler_params'] for e in eqns if 'compiler_params' in e.params]
      assert (params.profile_space, params.profile_dir) == (
          (50, trace_dir) if trace_dir else (0, ''))
      names = {scope.name for e in eqns for scope in e.source_info.name_stack.stack}
      assert {'prologue', 'epilogue'} <= names


@pytest.mark.parametrize('tiles, message', [
    (fused_ffn.Tiles(rows=96), r'tiles.rows=96: must be 64 or 128, dividing tokens \(128\)'),
    (fused_ffn.Tiles(cols=256), r'tiles.cols=256: must be 64 or 128, dividing mlp \(128\)'),
    (fused_ffn.Tiles(forward_stages=0), r'tiles.forward_stages=0: must be at least 1'),
    (fused_ffn.Tiles(forward_stages=6),
     r'needs 263168 bytes of shared memory in the forward kernel, more than a block'),
    (fused_ffn.Tiles(backward_stages=6),
     r'needs 294912 bytes of shared memory in the backward kernel, more than a block')])
def test_bad_tilings_are_named_before_compiling(tiles, message):
  x, w1, b1, w2, _ = operands(jnp.bfloat16)
  with pytest.raises(ValueError, match=message):
    fused_ffn.ffn(x, w1, b1, w2, tiles=tiles)
  # impl='xla' runs no kernel, so the tiling it is given is not its concern.
  np.testing.assert_array_equal(fused_ffn.ffn(x, w1, b1, w2, impl='xla', tiles=tiles),
                                fused_ffn.ffn(x, w1, b1, w2, impl='xla'))


def test_bad_shapes_and_impl_are_named():
  x, w1, b1, w2, _ = operands(jnp.float32)
  with pytest.raises(ValueError, match=r'x \[tokens, embed\], w1 \[embed, mlp\], b1 \[mlp\], '
                                       r'w2 \[mlp, embed\]; got \(128, 64\), \(128, 64\)'):
    fused_ffn.ffn(x, w1.T, b1, w2)
  with pytest.raises(ValueError, match=r"impl='cuda'; valid: \('xla', 'pallas'\)"):
    fused_ffn.ffn(x, w1, b1, w2, impl='cuda')
  with pytest.raises(ValueError, match=r'embed=96: the kernels need a multiple of 64'):
    fused_ffn.check_tiles(fused_ffn.TILES, 128, 128, 96)


def test_shapes_the_tiling_does_not_divide_run_the_same_vjp_on_xla():
  assert fused_ffn.fits(32768, 3072, 768)  # BERT-Base 256 x 128.
  assert not fused_ffn.fits(40, MLP, EMBED)
  assert not fused_ffn.on_hopper()  # This CPU: gelu_reference and dgelu_reference.
  x, w1, b1, w2, _ = operands(jnp.float32, tokens=40)
  ref = jax.grad(lambda x: jnp.sum(fused_ffn.ffn(x, w1, b1, w2, impl='xla')))(x)
  got = jax.grad(lambda x: jnp.sum(fused_ffn.ffn(x, w1, b1, w2)))(x)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_model_with_the_fused_ffn_computes_the_same_function_and_gradients():
  batch, length, embed, mlp = 16, 8, 64, 256
  assert fused_ffn.fits(batch * length, mlp, embed)
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, 99, (batch, length)), jnp.int32)
  mask = jnp.asarray(np.arange(length)[None] < rng.integers(3, length + 1, (batch, 1)), jnp.int32)
  args = ({'input_ids': ids, 'segment_ids': jnp.zeros_like(ids), 'input_mask': mask,
           'masked_lm_positions': jnp.asarray(rng.integers(1, 3, (batch, 2)), jnp.int32)},)
  results = []
  for impl in ('xla', 'pallas'):
    model = pretraining.PretrainingModel(EncoderConfig(
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
  assert_refused(config, r"ffn_impl='pallas' computes the tanh GELU .* got "
                         r"config.model.gelu='erf'. Set gelu='tanh'")
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
    checks.check_gpu_kernels(config)
  config.model.ffn_impl = 'xla'  # The Triton kernels need no Hopper.
  config.model.layer_norm_impl = 'pallas'
  checks.check_gpu_kernels(config)
  for key in ('long_attention_backward', 'short_attention_backward'):
    config.model[key] = 'mosaic'
    with pytest.raises(config_lib.ConfigError,
                       match=rf"{key}='mosaic' runs a Mosaic GPU kernel .* Use {key}='triton'"):
      checks.check_gpu_kernels(config)
    config.model[key] = 'triton'

"""Attention with in-kernel dropout: the Pallas kernels, short rows and long (run by the
interpreter on CPU), against the jnp reference, the reference against the model's XLA attention,
the dropout draws, and the model with `attention_impl='pallas'` against `'xla'`."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.experimental.pallas as pl
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_refused

from bert_jax import config_lib
from bert_jax.train import xla
from bert_jax.kernels.gpu import flash_backward
from bert_jax.kernels.gpu import fused_attention
from bert_jax.kernels.gpu import fused_norm
from bert_jax.models import layers
from bert_jax.objectives import pretraining
from bert_jax.ops import attention as attention_ops
from configs import tiny
import test_fused_norm  # pylint: disable=g-bad-import-order  (tests/, on pytest's path)

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 32, 3, 16


def operands(dtype, seed=0, length=LENGTH, head_dim=HEAD_DIM, heads=HEADS):
  keys = jax.random.split(jax.random.key(seed), 5)
  q, k, v, cotangent = (jax.random.normal(key, (BATCH, length, heads, head_dim)).astype(dtype)
                        for key in keys[:4])
  # Row 0: 5/8 real tokens then padding; row 1: two packed segments, then padding.
  a, b = length * 5 // 8, length * 5 // 16
  segment_ids = jnp.asarray([[1] * a + [0] * (length - a),
                             [1] * b + [2] * (a - b + 4) + [0] * (length - a - 4)], jnp.int32)
  return q, k, v, segment_ids, fused_attention.tile_keys(keys[4], BATCH, heads), cotangent


def value_and_grads(impl, q, k, v, segment_ids, tile_keys, cotangent, rate, long_blocks=None,
                    short_backward='triton'):
  def loss(q, k, v):
    out = fused_attention.attention(q, k, v, segment_ids, tile_keys, rate=rate, impl=impl,
                                    interpret=True, long_blocks=long_blocks,
                                    short_backward=short_backward)
    return jnp.sum(out.astype(jnp.float32) * cotangent.astype(jnp.float32)), out
  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out, grads


KERNEL_CASES = [
    (jnp.float32, LENGTH, HEAD_DIM, None, 'triton'),
    (jnp.bfloat16, LENGTH, HEAD_DIM, None, 'triton'),
    (jnp.bfloat16, 128, 64, None, 'triton'),  # BERT's phase-1 shape.
    # Its backward by the Mosaic GPU kernel (flash_backward.row_backward: one block per row and
    # head), rows of 128 and 64.
    (jnp.bfloat16, 128, 64, None, 'mosaic'), (jnp.bfloat16, 64, 64, None, 'mosaic'),
    # The flash kernels: their default tiling, and one whose backward steps (32) are not its
    # blocks (64) and whose forward blocks are both smaller.
    (jnp.float32, 256, HEAD_DIM, None, 'triton'),
    (jnp.float32, 256, HEAD_DIM, fused_attention.LongBlocks(64, 32, 64, 32), 'triton'),
    (jnp.bfloat16, 256, 64, None, 'triton'), (jnp.float32, 512, HEAD_DIM, None, 'triton')]
# The Mosaic GPU backward (bert_jax.kernels.gpu.flash_backward) on its interpreter, two
# warpgroups: the slowest case, run with dropout only (the other cases take both rates).
MOSAIC_LONG = (jnp.bfloat16, 256, 64, fused_attention.MOSAIC_LONG_BLOCKS, 'triton')


@pytest.mark.parametrize('dtype, length, head_dim, long_blocks, short_backward, rate',
                         [(*case, rate) for case in KERNEL_CASES for rate in (0.0, 0.1)]
                         + [(*MOSAIC_LONG, 0.1)])
@pytest.mark.slow
def test_kernels_equal_the_reference(dtype, length, head_dim, long_blocks, short_backward, rate):
  # Mosaic GPU's interpreter runs each (row, head) program thread by thread, the slowest of
  # these: two heads still index more than one.
  heads = 2 if long_blocks == fused_attention.MOSAIC_LONG_BLOCKS else HEADS
  q, k, v, segment_ids, tile_keys, cotangent = operands(dtype, length=length, head_dim=head_dim,
                                                        heads=heads)
  out_ref, grads_ref = value_and_grads('xla', q, k, v, segment_ids, tile_keys, cotangent, rate)
  out, grads = value_and_grads('pallas', q, k, v, segment_ids, tile_keys, cotangent, rate,
                               long_blocks, short_backward)
  assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
  # float32: the same arithmetic; bfloat16: probabilities rounded before or after normalising.
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  as32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
  np.testing.assert_allclose(as32(out), as32(out_ref), rtol=tol, atol=tol)
  for name, a, b in zip('qkv', grads, grads_ref):
    np.testing.assert_allclose(as32(a), as32(b), rtol=tol, atol=tol * 4, err_msg=f'd{name}')


def _races_found(run, monkeypatch) -> bool:
  """Whether Mosaic GPU's interpreter, with its happens-before race detector on, finds a race
  on shared memory between threads while run() runs the kernels of
  bert_jax.kernels.gpu.flash_backward."""
  from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call  # pylint: disable=g-import-not-at-top
  from jax._src.pallas.mosaic_gpu.interpret import params  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(flash_backward, '_interpret_params',
                      lambda: params.InterpretGPUParams(detect_races=True))
  # The launchers' cached traces (fused_norm.lowered_once) hold the interpreter parameters they
  # were traced with: trace again with the race detector on, and again after without it.
  jax.clear_caches()
  jax.block_until_ready(run())
  jax.clear_caches()
  return interpret_pallas_call.get_races().races_found


@pytest.mark.slow
def test_the_race_detector_finds_a_race(monkeypatch):
  """The control for the test below: a warpgroup reads what the other wrote, with no barrier."""
  def kernel(out_ref, smem):
    wg = jax.lax.axis_index('wg')

    @pl.when(wg == 0)
    def _():
      smem[...] = jnp.ones(smem.shape, jnp.float32)

    @pl.when(wg == 1)
    def _():
      out_ref[...] = smem[...]

  def racy():
    ops = flash_backward.kernel_ops(True)  # After _races_found's patch.
    return ops.plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64,), jnp.float32),
                            scratch_types=[ops.plgpu.SMEM((64,), jnp.float32)], num_threads=2,
                            thread_name='wg', interpret=ops.interpret)()
  assert _races_found(racy, monkeypatch)


@pytest.mark.slow
def test_row_backward_has_no_shared_memory_races(monkeypatch):
  """Its barriers order each warpgroup's probabilities and dS before the other reads them."""
  q, k, v, segment_ids, keys, do = operands(jnp.bfloat16, length=128, head_dim=64)
  qkv = jnp.stack([q, k, v], axis=2)
  threshold = fused_attention.dropout_threshold(0.1)
  o, lse = fused_attention._pallas_forward(qkv, segment_ids, keys, threshold, True, 4)  # pylint: disable=protected-access
  run = lambda: flash_backward.row_backward(  # noqa: E731
      qkv, segment_ids, keys, lse, o, do, threshold=threshold, interpret=True)
  assert not _races_found(run, monkeypatch)


@pytest.mark.slow
def test_mosaic_backward_with_one_warpgroup_and_steps_unlike_its_blocks():
  """flash_backward with one compute warpgroup of 128 keys, stepping 64 at a time (its pipeline
  indices and the dropout draws' offsets), rows of 512, on Mosaic GPU's interpreter, through the
  model's path (attention_qkv with the projection's bias): dqkv, and the bias gradient from the
  kernel's column sums, which are those of dqkv as stored."""
  q, k, v, segment_ids, tile_keys, cotangent = operands(jnp.bfloat16, length=512, head_dim=64)
  q, k, v, segment_ids, tile_keys, cotangent = (  # One row (two segments, padding), one head.
      x[1:, :, :1] if x.ndim == 4 else x[1:] if x.ndim == 2 else x[1:, :1]
      for x in (q, k, v, segment_ids, tile_keys, cotangent))
  qkv = jnp.stack([q, k, v], axis=2)
  bias = jax.random.normal(jax.random.key(7), (3, 1, 64))
  blocks = fused_attention.MOSAIC_LONG_BLOCKS._replace(backward_block=128, backward_warps=4)

  def grads(impl):
    loss = lambda qkv, bias: jnp.sum(fused_attention.attention_qkv(  # noqa: E731
        qkv, bias, segment_ids, tile_keys, rate=0.1, impl=impl, interpret=True,
        long_blocks=blocks).astype(jnp.float32) * cotangent.astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1))(qkv, bias)

  (dqkv, dbias), (dqkv_ref, _) = grads('pallas'), grads('xla')
  as32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
  np.testing.assert_allclose(as32(dqkv), as32(dqkv_ref), rtol=2e-2, atol=8e-2)
  np.testing.assert_allclose(dbias, jnp.sum(as32(dqkv), axis=(0, 1)), rtol=1e-5, atol=1e-4)
  # Against the reference's dqkv summed in float32 (its own bias gradient sums in bf16); the
  # key bias's is 0 in exact arithmetic (softmax ignores a per-query constant), rounding in both.
  np.testing.assert_allclose(dbias[::2], jnp.sum(as32(dqkv_ref), axis=(0, 1))[::2], rtol=2e-2,
                             atol=5e-2)
  assert float(jnp.max(jnp.abs(dbias))) > 1.0  # Not a zero gradient matching a zero one.


@pytest.mark.slow
@pytest.mark.parametrize('length, short_backward', [(128, 'mosaic'), (64, 'mosaic'),
                                                    (512, 'triton')])
def test_mosaic_kernels_lower_for_a_cuda_device_at_berts_shapes(length, short_backward,
                                                               mosaic_semantics, monkeypatch):
  """The gradient with a Mosaic GPU backward lowers for CUDA here, under each lowering
  semantics: its kernel, after the Triton forward, at Large's heads, rows of 128 and 64
  (short_backward: row_backward with two warpgroups and one) and 512 (long_blocks); drawing
  the dropout through flash_backward.paired_draws in each tile orientation the kernel draws in
  (the dQ pass's [queries, keys] tiles; the long backward's dK/dV pass's [keys, queries])."""
  del mosaic_semantics
  orientations = []
  draws = flash_backward.paired_draws

  def recorded(index, key, *, rows_are_keys):
    orientations.append(rows_are_keys)
    return draws(index, key, rows_are_keys=rows_are_keys)
  monkeypatch.setattr(flash_backward, 'paired_draws', recorded)
  qkv = jax.ShapeDtypeStruct((2, length, 3, 16, 64), jnp.bfloat16)
  args = (qkv, jax.ShapeDtypeStruct((3, 16, 64), jnp.float32),
          jax.ShapeDtypeStruct((2, length), jnp.int32),
          jax.ShapeDtypeStruct((2, 16, 1), jnp.uint32))

  def loss(qkv, bias, segment_ids, keys):
    out = fused_attention.attention_qkv(qkv, bias, segment_ids, keys, rate=0.1,
                                        long_blocks=fused_attention.MOSAIC_LONG_BLOCKS,
                                        short_backward=short_backward)
    return jnp.sum(out.astype(jnp.float32))
  lowered = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(*args).lower(
      lowering_platforms=('cuda',))
  text = lowered.as_text()
  assert ('row_attention_bwd_mgpu' in text) == (short_backward == 'mosaic')
  assert ('long_attention_bwd_mgpu' in text) == (short_backward != 'mosaic')
  assert [o.shape for o in lowered.out_info] == [qkv.shape, (3, 16, 64)]
  assert orientations == ([False] if short_backward == 'mosaic' else [True, False])


@pytest.mark.slow
@pytest.mark.parametrize('length, short_backward', [(128, 'mosaic'), (512, 'triton')])
def test_the_mosaic_backward_of_every_layer_lowers_once(length, short_backward):
  """The layers of a model share one trace and one CUDA lowering of the Mosaic GPU attention
  backward (fused_norm.lowered_once): the lowered gradient of six layers holds the kernel as
  often as that of three (row_backward at 128, the long backward at 512)."""
  qkv = jax.ShapeDtypeStruct((2, length, 3, 16, 64), jnp.bfloat16)
  args = (qkv, jax.ShapeDtypeStruct((3, 16, 64), jnp.float32),
          jax.ShapeDtypeStruct((2, length), jnp.int32),
          jax.ShapeDtypeStruct((2, 16, 1), jnp.uint32))

  def lowered(layers: int) -> str:
    def loss(qkv, bias, segment_ids, keys):
      outs = [fused_attention.attention_qkv(qkv * (i + 1), bias, segment_ids, keys, rate=0.1,
                                            long_blocks=fused_attention.MOSAIC_LONG_BLOCKS,
                                            short_backward=short_backward)
              for i in range(layers)]
      return sum(jnp.sum(out.astype(jnp.float32)) for out in outs)
    return jax.jit(jax.grad(loss, argnums=(0, 1))).trace(*args).lower(
        lowering_platforms=('cuda',)).as_text()
  kernel = 'row_attention_bwd_mgpu' if short_backward == 'mosaic' else 'long_attention_bwd_mgpu'
  three, six = lowered(3), lowered(6)
  assert six.count(kernel) == three.count(kernel) > 0


def test_paired_draws_pairing_on_the_wgmma_layout_gives_the_kernels_draws():
  """flash_backward.paired_draws' register algorithm, run here lane by lane over the WGMMA layout
  it assumes (checked against jax's: lane l holds rows l // 4 and l // 4 + 8 of its warp's 16,
  each two-value register columns 2 (l % 4) + 8 j and the next), gives every value of a tile the
  draw fused_attention.keep_mask draws, in both orientations. (The kernels' registers themselves
  run only on a GPU; the interpreter draws by flash_backward._draws instead.)"""
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  layout = plgpu.Layout.WGMMA.to_mgpu()
  assert layout.tiling.tiles == ((64, 8), (16, 8), (8, 8), (2,))
  assert (layout.warp_dims, layout.lane_dims, layout.vector_dim) == ((-7,), (-3, -2), -1)
  length, key = 256, np.uint32(0x1234ABCD)
  first_row, first_col = 64, 128  # Tile offsets, multiples of 64 as the kernels' are.
  warp, lane, half, group, v = np.meshgrid(np.arange(4), np.arange(32), np.arange(2),
                                           np.arange(8), np.arange(2), indexing='ij')
  rows = 16 * warp + lane // 4 + 8 * half  # [warp, lane, half, group, value]
  cols = 8 * group + 2 * (lane % 4) + v
  draws_of = lambda q, k: np.asarray(fused_norm.value_draws(  # noqa: E731
      jnp.uint32(key), jnp.asarray(q * length + k, jnp.uint32)))
  pair_hash = lambda index: np.asarray(fused_norm.pair_draws(  # noqa: E731
      jnp.uint32(key), jnp.asarray(index >> 1, jnp.uint32)))
  low = lambda x: x & np.uint32(0xFFFF)  # noqa: E731
  for rows_are_keys in (False, True):
    queries, keys = ((cols + first_col, rows + first_row) if rows_are_keys
                     else (rows + first_row, cols + first_col))
    index = (queries * length + keys).astype(np.uint32)
    first, second = index[..., 0], index[..., 1]
    if not rows_are_keys:
      hashed = pair_hash(first)
      got = np.stack([low(hashed), hashed >> 16], axis=-1)
    else:
      odd = (first & 1).astype(bool)
      mine = pair_hash(np.where(odd, second, first))
      theirs = mine[:, np.arange(32) ^ 4]  # The butterfly shuffle at distance 4.
      shift = np.where(odd, 16, 0).astype(np.uint32)
      got = np.stack([low(np.where(odd, theirs, mine) >> shift),
                      low(np.where(odd, mine, theirs) >> shift)], axis=-1)
    np.testing.assert_array_equal(got, draws_of(queries, keys))


@pytest.mark.slow
def test_flash_kernels_take_rows_whose_real_tokens_come_last():
  """Queries whose first key blocks are all of another segment (the running softmax starts on
  masked blocks), a padding-only row, and segments of one token at the end of a row."""
  q, k, v, _, tile_keys, cotangent = operands(jnp.float32, length=256)
  segment_ids = jnp.asarray([[0] * 200 + [1] * 56, [0] * 254 + [1, 2]], jnp.int32)
  for rate in (0.0, 0.1):
    for padding_only in (False, True):
      segments = jnp.zeros_like(segment_ids) if padding_only else segment_ids
      out_ref, grads_ref = value_and_grads('xla', q, k, v, segments, tile_keys, cotangent, rate)
      out, grads = value_and_grads('pallas', q, k, v, segments, tile_keys, cotangent, rate,
                                   fused_attention.LongBlocks(64, 16, 32, 16))
      np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-5)
      for name, a, b in zip('qkv', grads, grads_ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=4e-5, err_msg=f'd{name}')


@pytest.mark.slow
@pytest.mark.parametrize('rate', [0.0, 0.1])
@pytest.mark.parametrize('length', [LENGTH, 256])
def test_packed_projection_gives_the_bias_gradient_from_the_kernels(length, rate):
  """attention_qkv (the model's path): the kernels' dqkv layout and their per-tile sums (per
  block of tokens, for long rows), which make the bias gradient, against the reference's
  autodiff."""
  q, k, v, segment_ids, tile_keys, cotangent = operands(jnp.float32, length=length)
  qkv = jnp.stack([q, k, v], axis=2)
  bias = jax.random.normal(jax.random.key(7), (3, HEADS, HEAD_DIM))

  def value_and_grads_qkv(impl):
    loss = lambda qkv, bias: jnp.sum(fused_attention.attention_qkv(  # noqa: E731
        qkv, bias, segment_ids, tile_keys, rate=rate, impl=impl, interpret=True) * cotangent)
    return jax.value_and_grad(loss, argnums=(0, 1))(qkv, bias)

  (value, (dqkv, dbias)), (value_ref, (dqkv_ref, dbias_ref)) = map(value_and_grads_qkv,
                                                                   ('pallas', 'xla'))
  np.testing.assert_allclose(value, value_ref, rtol=1e-5)
  np.testing.assert_allclose(dqkv, dqkv_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dbias, dbias_ref, rtol=1e-5, atol=1e-4)
  assert float(jnp.max(jnp.abs(dbias))) > 0.1  # Not a zero gradient matching a zero one.
  # The bias gradient is the sum of dqkv over every token.
  np.testing.assert_allclose(dbias, jnp.sum(dqkv, axis=(0, 1)), rtol=1e-5, atol=1e-4)


def test_reference_is_the_models_attention_on_real_tokens():
  """Without dropout, on plain rows (segment ids = input mask), the reference equals
  ops.attention.dot_product_attention (the model's XLA path) wherever a real token queries."""
  q, k, v, _, _, _ = operands(jnp.float32)
  input_mask = jnp.asarray([[1] * 20 + [0] * 12, [1] * 32], jnp.int32)
  ours = fused_attention.reference(q, k, v, input_mask, None, rate=0.0)
  xla = attention_ops.dot_product_attention(q, k, v,
                                            layers.attention_bias(input_mask, jnp.float32),
                                     None, 0.0, True, jnp.float32)
  real = np.asarray(input_mask, bool)
  np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(xla)[real], rtol=1e-5, atol=1e-5)


def test_packed_segments_do_not_see_each_other():
  """Row 1 holds two segments: changing segment 2's keys and values leaves segment 1's outputs."""
  q, k, v, segment_ids, tile_keys, _ = operands(jnp.float32)
  attend = lambda k, v: fused_attention.attention(  # noqa: E731
      q, k, v, segment_ids, tile_keys, rate=0.1, interpret=True)
  k2, v2 = k.at[1, 10:24].add(3.0), v.at[1, 10:24].add(3.0)
  np.testing.assert_array_equal(attend(k, v)[1, :10], attend(k2, v2)[1, :10])
  assert not np.allclose(attend(k, v)[1, 10:24], attend(k2, v2)[1, 10:24])


def test_dropout_draws_keep_the_rate_and_are_independent():
  rate, length = 0.1, 128
  threshold = fused_attention.dropout_threshold(rate)
  assert abs(threshold / 2 ** 16 - rate) < 2 ** -16
  tile_keys = fused_attention.tile_keys(jax.random.key(0), 8, 16)
  keep = np.asarray(fused_attention.keep_mask(tile_keys, length, threshold))  # [8, 16, 128, 128]
  n = keep.size
  sigma = np.sqrt(rate * (1 - rate) / n)
  assert abs((1 - keep.mean()) - rate) < 5 * sigma, keep.mean()
  # Per tile (the per-(row, head) key must not bias a tile) and per position (the counter must
  # not bias a query or key index).
  per_tile = 1 - keep.mean(axis=(2, 3))
  assert np.all(np.abs(per_tile - rate) < 6 * np.sqrt(rate * (1 - rate) / length ** 2))
  per_position = 1 - keep.mean(axis=(0, 1))
  assert np.all(np.abs(per_position - rate) < 6 * np.sqrt(rate * (1 - rate) / 128))
  # Neighbours along keys, along queries, and the same position in the next head: uncorrelated.
  centred = keep.astype(np.float64) - keep.mean()
  for a, b in ((centred[..., 1:], centred[..., :-1]), (centred[:, :, 1:], centred[:, :, :-1]),
               (centred[:, 1:], centred[:, :-1])):
    correlation = np.mean(a * b) / centred.var()
    assert abs(correlation) < 5 / np.sqrt(a.size), correlation
  # Deterministic per key; another key, another mask.
  again = fused_attention.keep_mask(tile_keys, length, threshold)
  np.testing.assert_array_equal(keep, again)
  other = fused_attention.keep_mask(fused_attention.tile_keys(jax.random.key(1), 8, 16), length,
                                    threshold)
  assert 0.15 < np.mean(keep != np.asarray(other)) < 0.21  # 2 * 0.1 * 0.9 = 0.18 if independent.


def test_dropout_scales_kept_probabilities_and_rate_one_drops_all():
  q, k, v, segment_ids, tile_keys, _ = operands(jnp.float32, length=128)
  # Uniform probabilities (q = 0) and v = 1: o = the kept share of a query's keys, scaled by
  # 1/P(keep), so 1 on average (768 queries of 40-80 keys: standard error about 0.004).
  out = fused_attention.attention(jnp.zeros_like(q), k, jnp.ones_like(v), segment_ids, tile_keys,
                                  rate=0.5, interpret=True)
  assert abs(float(out.mean()) - 1.0) < 0.02
  q, k, v, segment_ids, tile_keys, _ = operands(jnp.float32)
  for impl in fused_attention.IMPLS:
    np.testing.assert_array_equal(
        fused_attention.attention(q, k, v, segment_ids, tile_keys, rate=1.0, impl=impl,
                                  interpret=True), jnp.zeros_like(q))
  # No keys: no dropout, whatever the rate.
  np.testing.assert_array_equal(
      fused_attention.attention(q, k, v, segment_ids, None, rate=1.0, interpret=True),
      fused_attention.attention(q, k, v, segment_ids, None, rate=0.0, interpret=True))


def test_bad_shapes_are_named():
  q, k, v, segment_ids, tile_keys, _ = operands(jnp.float32)
  with pytest.raises(ValueError, match=r'lengths 16..512.*got length 24'):
    fused_attention.attention(q[:, :24], k[:, :24], v[:, :24], segment_ids[:, :24], tile_keys,
                              rate=0.1)
  with pytest.raises(ValueError,
                     match=r'keys must be tile_keys\(rng, 2, 3\).*got uint32 \(2, 3\)'):
    fused_attention.attention(q, k, v, segment_ids, tile_keys[..., 0], rate=0.1)
  with pytest.raises(ValueError, match=r'uint32 \(2, 3, 1\); got int32'):
    fused_attention.attention(q, k, v, segment_ids, tile_keys.astype(jnp.int32), rate=0.1)
  with pytest.raises(ValueError, match=r'q, k, v must be \[batch, length, heads, head_dim\] alike; '
                     r'got \(2, 32, 3, 16\), \(2, 32, 3, 8\)'):
    fused_attention.attention(q, k[..., :8], v, segment_ids, tile_keys, rate=0.1)
  qkv = jnp.stack([q, k, v], axis=2)
  with pytest.raises(ValueError, match=r'qkv must be \[batch, length, 3, heads, head_dim\]; '
                     r'got shape \(2, 32, 3, 16\)'):
    fused_attention.attention_qkv(q, None, segment_ids, tile_keys, rate=0.1)
  with pytest.raises(ValueError, match=r'bias must be \[3, heads, head_dim\] = \(3, 3, 16\); '
                     r'got \(3, 48\)'):
    fused_attention.attention_qkv(qkv, jnp.zeros((3, 48)), segment_ids, tile_keys, rate=0.1)
  # A tiling of the flash kernels that would leave queries or keys out, or not lower.
  q, k, v, segment_ids, tile_keys, _ = operands(jnp.float32, length=256)
  for blocks, message in (
      (fused_attention.LongBlocks(forward_queries=512), r'forward_queries=512: .* to the row '
       r'length 256'),
      (fused_attention.LongBlocks(backward_block=96), r'backward_block=96: must be a power of two'),
      (fused_attention.LongBlocks(backward_step=8), r'backward_step=8: must be a power of two '
       r'from 16'),
      (fused_attention.LongBlocks(forward_warps=6), r'forward_warps=6: must be a power of two'),
      (fused_attention.LongBlocks(stages=0), r'stages=0: must be at least 1'),
      (fused_attention.LongBlocks(backward='cuda'), r"backward='cuda'; valid: \('triton', "
       r"'mosaic'\)"),
      (fused_attention.MOSAIC_LONG_BLOCKS._replace(backward_warps=16),
       r"backward_warps=16: backward='mosaic' takes 4 or 8"),
      (fused_attention.MOSAIC_LONG_BLOCKS._replace(backward_block=32),
       r'tiles.block=32: must be 64 or 128'),
      (fused_attention.MOSAIC_LONG_BLOCKS, r'head_dim=16: the Mosaic GPU kernels take 64 or '
       r'128')):
    with pytest.raises(ValueError, match=message):
      fused_attention.attention(q, k, v, segment_ids, tile_keys, rate=0.1, long_blocks=blocks)
  assert all(fused_attention.supported(n, 64) for n in (16, 128, 256, 512))
  assert not any(fused_attention.supported(n, 64) for n in (8, 384, 1024))


def small_config(**overrides):
  """test_fused_norm's micro model with 2 heads of 16 (the kernels' smallest head size)."""
  return test_fused_norm.small_config(**{'num_heads': 2, **overrides})


def model_inputs():
  return test_fused_norm.model_inputs(length=16)  # The kernels' shortest row.


def model_batch():
  return test_fused_norm.model_batch(length=16)


@pytest.mark.slow
def test_model_with_the_fused_attention_computes_the_same_function():
  xla = pretraining.PretrainingModel(small_config())
  fused = pretraining.PretrainingModel(small_config(attention_impl='pallas'))
  args = model_batch()
  params = nn.meta.unbox(xla.init(jax.random.key(0), *args)['params'])
  test_fused_norm.assert_same_function(xla, fused, params, args)


@pytest.mark.slow
def test_model_with_the_fused_attention_on_long_rows_computes_the_same_function(monkeypatch):
  """Rows of 256 (phase 2's kind) go to the flash kernels, not to cuDNN's attention."""
  monkeypatch.setattr(attention_ops, 'cudnn_attention', None)  # Calling it would fail.
  xla = pretraining.PretrainingModel(small_config(max_position_embeddings=256))
  fused = pretraining.PretrainingModel(small_config(max_position_embeddings=256,
                                                    attention_impl='pallas'))
  args = test_fused_norm.model_batch(length=256)
  params = nn.meta.unbox(xla.init(jax.random.key(0), *args)['params'])
  test_fused_norm.assert_same_function(xla, fused, params, args)


def test_model_with_the_fused_attention_on_packed_rows_computes_the_same_function():
  """Packed rows hand their pair ids to the kernels as segments (no cuDNN fallback needed)."""
  ids, segments, mask, positions = model_inputs()
  pair_ids = jnp.asarray([[1] * 7 + [2] * 9, [1] * 4 + [2] * 5 + [0] * 7], jnp.int32)
  mask = (pair_ids > 0).astype(jnp.int32)
  position_ids = jnp.asarray([list(range(7)) + list(range(9)),
                              list(range(4)) + list(range(5)) + [0] * 7], jnp.int32)
  nsp_positions = jnp.asarray([[0, 7], [0, 4]], jnp.int32)
  args = ({'input_ids': ids * mask, 'segment_ids': segments * mask, 'input_mask': mask,
           'masked_lm_positions': positions, 'position_ids': position_ids, 'pair_ids': pair_ids,
           'nsp_positions': nsp_positions},)
  packed = {}
  xla = pretraining.PretrainingModel(small_config())
  fused = pretraining.PretrainingModel(small_config(attention_impl='pallas'))
  params = nn.meta.unbox(xla.init(jax.random.key(0), *args, **packed)['params'])
  outputs = [model.apply({'params': params}, *args, **packed) for model in (xla, fused)]
  for name in ('mlm_logits', 'nsp_logits'):
    np.testing.assert_allclose(outputs[0][name], outputs[1][name], rtol=1e-5, atol=1e-5)


def test_model_hands_its_kernel_choices_to_the_attention(monkeypatch):
  """short_ and long_attention_backward reach fused_attention.attention_qkv."""
  calls = []  # The keyword arguments of each call (the kernels themselves are not run).
  monkeypatch.setattr(fused_attention, 'attention_qkv', lambda qkv, *a, **kw: calls.append(
      kw) or jnp.zeros(qkv.shape[:2] + qkv.shape[3:], qkv.dtype))
  model = pretraining.PretrainingModel(small_config(
      attention_impl='pallas', short_attention_backward='mosaic', long_attention_backward='mosaic'))
  model.init(jax.random.key(0), *model_batch())
  assert calls and all(c['short_backward'] == c['long_blocks'].backward == 'mosaic'
                       for c in calls)


def test_model_layers_draw_their_own_tile_keys(monkeypatch):
  drawn = []
  tile_keys = fused_attention.tile_keys
  monkeypatch.setattr(fused_attention, 'tile_keys',
                      lambda *a: drawn.append(tile_keys(*a)) or drawn[-1])
  model = pretraining.PretrainingModel(small_config(attention_impl='pallas'))
  args = model_batch()
  params = model.init(jax.random.key(0), *args)['params']
  model.apply({'params': params}, *args, deterministic=False, rngs={'dropout': jax.random.key(1)})
  assert len(drawn) == 2  # One draw per layer (2 layers).
  assert not np.array_equal(drawn[0], drawn[1])


@pytest.mark.slow
def test_model_fused_attention_drops_in_training_only():
  model = pretraining.PretrainingModel(small_config(attention_impl='pallas',
                                                    hidden_dropout_rate=0.0))
  args = model_batch()
  params = model.init(jax.random.key(0), *args)['params']
  run = lambda seed: model.apply({'params': params}, *args, deterministic=False,  # noqa: E731
                                 rngs={'dropout': jax.random.key(seed)})['mlm_logits']
  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))  # Only attention dropout is on.
  no_dropout = pretraining.PretrainingModel(small_config(
      attention_impl='pallas', hidden_dropout_rate=0.0, attention_dropout_rate=0.0))
  np.testing.assert_allclose(
      no_dropout.apply({'params': params}, *args, deterministic=False,
                       rngs={'dropout': jax.random.key(1)})['mlm_logits'],
      model.apply({'params': params}, *args)['mlm_logits'], atol=1e-5)


def test_pallas_attention_is_refused_off_gpus():
  config = tiny.get_config()
  config.model.update(attention_impl='pallas', scan_layers=False)
  config_lib.validate(config)
  with pytest.raises(config_lib.ConfigError,
                     match="attention_impl='pallas' runs Triton kernels on NVIDIA GPUs; "
                           r"this run has 1 cpu device\(s\). Use attention_impl='xla'"):
    config_lib.validate_runtime(config, tokenizer_vocab_size=100, batch_divisor=1)


def test_mosaic_long_backward_is_checked_before_compiling():
  config = tiny.get_config()  # Heads of 64, rows of 64: the Mosaic backward is never used.
  config.model.update(attention_impl='pallas', scan_layers=False,
                      long_attention_backward='mosaic')
  config_lib.validate(config)
  config.data.max_seq_length = config.model.max_position_embeddings = 256
  with pytest.raises(config_lib.ConfigError, match="long_attention_backward='mosaic' takes 16-bit "
                     r"compute .* got config.model.dtype='float32', head size 64"):
    config_lib.validate(config)
  config.model.update(dtype='bfloat16', hidden_size=96, num_heads=3, intermediate_size=384)
  assert_refused(config, r"got config.model.dtype='bfloat16', head "
                         r'size 32 \(hidden_size 96 / num_heads 3\)')
  config.model.update(long_attention_backward='cute')
  assert_refused(config, 'long_attention_backward')
  q, k, v, segment_ids, tile_keys, _ = operands(jnp.float32, length=256, head_dim=64)
  with pytest.raises(ValueError, match=r"long_blocks.backward='mosaic' takes 16-bit q, k, v "
                     r'\(wgmma\); got float32'):
    fused_attention.attention(q, k, v, segment_ids, tile_keys, rate=0.1,
                              long_blocks=fused_attention.MOSAIC_LONG_BLOCKS)


def test_mosaic_short_backward_is_checked_before_compiling():
  key = 'short_attention_backward'
  config = tiny.get_config()  # Rows of 64, heads of 64, float32 compute.
  config.model.update({'attention_impl': 'pallas', 'scan_layers': False, key: 'mosaic'})
  assert_refused(config, f"{key}='mosaic' takes 16-bit compute .* got "
                         "config.model.dtype='float32', head size 64")
  config.model.dtype = 'bfloat16'
  config_lib.validate(config)
  config.data.max_seq_length = 32
  assert_refused(config, rf"{key}='mosaic' takes rows of 64 tokens or "
                         r'more .* this run has rows of \[32\]')
  config.data.max_seq_length = 256  # No row of 128 or fewer: the short backward is never used.
  config.model.max_position_embeddings, config.data.max_predictions_per_seq = 256, 40
  config_lib.validate(config)
  attend = functools.partial(fused_attention.attention, rate=0.1)
  q, k, v, segment_ids, tile_keys, _ = operands(jnp.float32, length=128, head_dim=64)
  with pytest.raises(ValueError, match=r"short_backward='mosaic' takes 16-bit q, k, v"):
    attend(q, k, v, segment_ids, tile_keys, short_backward='mosaic')
  q, k, v, segment_ids, tile_keys, _ = operands(jnp.bfloat16, length=32, head_dim=64)
  with pytest.raises(ValueError, match=r"short_backward='mosaic' takes rows of 64 tokens or more "
                     '.* got length 32'):
    attend(q, k, v, segment_ids, tile_keys, short_backward='mosaic')
  with pytest.raises(ValueError, match=r"short_backward='cute'; valid: \('triton', 'mosaic'\)"):
    attend(q, k, v, segment_ids, tile_keys, short_backward='cute')
  q, k, v, segment_ids, tile_keys, _ = operands(jnp.bfloat16, length=128, head_dim=32)
  with pytest.raises(ValueError, match='head_dim=32: the Mosaic GPU kernels take 64 or 128'):
    attend(q, k, v, segment_ids, tile_keys, short_backward='mosaic')


def test_pallas_attention_keeps_cudnns_conditions_only_for_rows_cudnn_gets():
  config = tiny.get_config()  # Rows of 64 tokens, heads of 64: the kernels take every row.
  config.model.update(attention_impl='pallas', scan_layers=True, remat_policy='full')
  config_lib.validate(config)
  assert not xla.needs_cudnn_outside_command_buffers(config)
  config.model.max_position_embeddings = 512
  config.data.update(max_seq_length=256, max_predictions_per_seq=40)  # The flash kernels'.
  config_lib.validate(config)
  assert not xla.needs_cudnn_outside_command_buffers(config)
  config.data.update(max_seq_length=384, max_predictions_per_seq=60)  # Rows of 384 go to cuDNN.
  assert xla.needs_cudnn_outside_command_buffers(config)
  with pytest.raises(config_lib.ConfigError,
                     match=r"attention_impl='pallas' with attention dropout.*scan_layers=False"):
    config_lib.validate(config)


@pytest.mark.slow
def test_scanned_rematerialised_layers_draw_the_same_masks_again():
  """Under nn.scan + nn.remat the recomputed attention draws its forward's masks (the keys come
  from the rng stream), so the gradients equal those without remat."""
  args = model_batch()
  rngs = {'dropout': jax.random.key(1)}
  grads = []
  for remat in ('none', 'full'):
    model = pretraining.PretrainingModel(small_config(
        attention_impl='pallas', scan_layers=True, remat_policy=remat, hidden_dropout_rate=0.0))
    params = nn.meta.unbox(model.init(jax.random.key(0), *args)['params'])
    loss = lambda p: model.apply({'params': p}, *args, deterministic=False,  # noqa: E731
                                 rngs=rngs)['mlm_logits'].sum()
    grads.append(jax.grad(loss)(params))
  for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  no_dropout = small_config(scan_layers=True, remat_policy='full', hidden_dropout_rate=0.0,
                            attention_dropout_rate=0.0)
  xla, fused = (pretraining.PretrainingModel(dataclasses.replace(no_dropout, attention_impl=impl))
                for impl in ('xla', 'pallas'))
  test_fused_norm.assert_same_function(
      xla, fused, nn.meta.unbox(xla.init(jax.random.key(0), *args)['params']), args)

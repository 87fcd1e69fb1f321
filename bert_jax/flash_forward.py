"""The forward of the attention kernels as one Pallas Mosaic GPU kernel (`fused_attention`'s
`forward='mosaic'`): Hopper's wgmma from shared memory fed by TMA, a memory warpgroup streaming
keys and values ahead of the compute warpgroups, for rows of 64 to 512 tokens.

Its function is the Triton forwards' (`fused_attention._forward_kernel` for rows up to 128,
`_long_forward_kernel` for longer ones): the same segment masks, the same dropout draws
(`flash_backward.tile_kept`, which are `fused_attention.keep_mask`'s), the output and the base-2
log-sum-exp that every backward takes. Each block of the grid (head, tile, row) has
`warpgroups` compute warpgroups of `block` queries each; a warpgroup holds its queries' q in
shared memory and steps over every key of the row, `step` at a time:

  S = Q K^T (base 2)    the running max m and sum l of exp2(S - m) (before dropout)
  acc = acc * exp2(m_old - m) + dropped(P) V     (P from registers, V from shared memory)

then O = acc * (1 / P(keep)) / l and lse = m + log2(l). A query's first key steps may all be of
another segment: their masked scores then share the running max, and the first step with a key
of its own segment scales what they added by exp2(-1e30 - m) = 0 (as the Triton kernels do).

Needs an NVIDIA Hopper GPU and 16-bit q, k, v; heads of 64 or 128. Not yet timed on a GPU.
"""

import math

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.numpy as jnp

from bert_jax import flash_backward
from bert_jax import fused_norm

Tiles = flash_backward.Tiles
# Two compute warpgroups of 64 queries, steps of 128 keys, two steps in flight.
TILES = Tiles(block=64, step=128, warpgroups=2, stages=2)


def tiles_for(length: int, tiles: Tiles | None = None) -> Tiles:
  """tiles (default TILES) fitted to a row of `length` tokens (flash_backward.fit_tiles)."""
  return flash_backward.fit_tiles(tiles or TILES, length)


def forward(qkv, segment_ids, keys, *, threshold: int, tiles: Tiles = TILES,
            interpret: bool = False):
  """(o [batch, length, heads, head_dim] in qkv's dtype, lse [batch, heads, length] float32: the
  base-2 log-sum-exp of each query's masked scores, before dropout).

  qkv: the packed projection [batch, length, 3, heads, head_dim] (bias added); segment_ids
  [batch, length] int32 (a query sees the keys of its own segment); keys: [batch, heads, 1]
  uint32 (ignored when threshold is 0); threshold: fused_norm.dropout_threshold of the rate.
  tiles: as flash_backward's, `block` queries a warpgroup. interpret: run on Mosaic GPU's
  interpreter (any device; slow, for tests)."""
  ops = flash_backward.kernel_ops(interpret)
  plgpu = ops.plgpu
  batch, length, _, heads, head_dim = qkv.shape
  flash_backward.check_tiles(tiles, length, head_dim)
  block, step, wgs = tiles.block, tiles.step, tiles.warpgroups
  dtype = qkv.dtype
  log2_scale = math.log2(math.e) / head_dim ** 0.5
  keep_scale = fused_norm.keep_scale(threshold) if threshold else 1.0

  def kernel(qkv_ref, seg_ref, keys_ref, o_ref, lse_ref, q_smem, seg_smem, lse_smem, fetched):
    b, h, wg = lax.axis_index('batch'), lax.axis_index('heads'), lax.axis_index('wg')
    first = lax.axis_index('tile') * (wgs * block) + wg * block  # This warpgroup's queries.
    mine = pl.ds(first, block)
    key = keys_ref[b, h, 0] if threshold else None

    def rows(x, shape):
      return lax.broadcast_in_dim(x, shape, [0])

    def query_pass(run):
      plgpu.copy_gmem_to_smem(qkv_ref.at[b, mine, 0, h, :], q_smem.at[wg], fetched.at[wg])
      plgpu.copy_gmem_to_smem(seg_ref.at[b, mine], seg_smem.at[wg], fetched.at[wg])
      plgpu.barrier_wait(fetched.at[wg])
      acc = ops.wgmma_layout(jnp.zeros((block, head_dim), jnp.float32))
      seg_q = ops.load(seg_smem.at[wg], ops.wgmma_rows)
      m, l = ops.vector(block, flash_backward.MASKED), ops.vector(block, 0.0)
      acc, m, l, _ = run((acc, m, l, seg_q))
      o = acc * rows(keep_scale / l, acc.shape)
      q_smem[wg] = o.astype(dtype)  # q's buffer: every wgmma that read it has finished.
      lse_smem[wg] = m + jnp.log(l) * math.log2(math.e)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(q_smem.at[wg], o_ref.at[b, mine, h, :])
      plgpu.copy_smem_to_gmem(lse_smem.at[wg], lse_ref.at[b, h, mine])
      plgpu.wait_smem_to_gmem(0)

    def key_step(indices, k_smem, v_smem, seg_k_smem, carry):
      acc, m, l, seg_q = carry
      # [my queries, these keys], base 2, masked outside each query's segment.
      s = ops.matmul(q_smem.at[wg], k_smem, block, transpose_b=True) * log2_scale
      seg_k = ops.load(seg_k_smem, ops.wgmma_cols)
      s = jnp.where(rows(seg_q, s.shape) == lax.broadcast_in_dim(seg_k, s.shape, [1]), s,
                    flash_backward.MASKED)
      m_next = jnp.maximum(m, jnp.max(s, axis=1))
      rescale = jnp.exp2(m - m_next)
      p = jnp.exp2(s - rows(m_next, s.shape))
      l = l * rescale + jnp.sum(p, axis=1)
      if threshold:
        keep = flash_backward.tile_kept(ops.iota, key, s.shape, first, indices[0] * step,
                                        False, length, threshold)
        p = jnp.where(keep, p, 0.0)
      acc = ops.matmul(p.astype(dtype), v_smem, block, acc=acc * rows(rescale, acc.shape))
      return acc, m_next, l, seg_q

    part = lambda j: qkv_ref.at[b, :, j, h, :]  # noqa: E731  [length, head_dim] views
    plgpu.emit_pipeline_warp_specialized(
        key_step, grid=(length // step,), memory_registers=40,
        max_concurrent_steps=tiles.stages, num_compute_wgs=wgs, wg_axis='wg',
        compute_context=query_pass,
        in_specs=[plgpu.BlockSpec((step, head_dim), lambda i: (i, 0), transforms=ops.swizzled),
                  plgpu.BlockSpec((step, head_dim), lambda i: (i, 0), transforms=ops.swizzled),
                  plgpu.BlockSpec((step,), lambda i: (i,))],
    )(part(1), part(2), seg_ref.at[b])

  scratch = [
      plgpu.SMEM((wgs, block, head_dim), dtype, transforms=ops.swizzled),  # q, then o
      plgpu.SMEM((wgs, block), jnp.int32),  # segment ids of my queries
      plgpu.SMEM((wgs, block), jnp.float32),  # their log-sum-exps
      plgpu.Barrier(num_arrivals=2, num_barriers=wgs),  # q and segment ids arrived
  ]
  keys = keys if threshold else jnp.zeros((batch, heads, 1), jnp.uint32)
  return plgpu.kernel(
      kernel, scratch_types=scratch,
      out_type=(jax.ShapeDtypeStruct((batch, length, heads, head_dim), dtype),
                jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)),
      compiler_params=plgpu.CompilerParams(approx_math=True),
      grid=(heads, length // (wgs * block), batch), grid_names=('heads', 'tile', 'batch'),
      num_threads=wgs + 1, thread_name='wg', kernel_name='attention_fwd_mgpu',
      interpret=ops.interpret,
  )(qkv, segment_ids, keys)

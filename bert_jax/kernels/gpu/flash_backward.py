"""The backward of the flash attention kernels (rows over 128 tokens) as one Pallas Mosaic GPU
kernel: Hopper's wgmma from shared memory fed by TMA, a memory warpgroup running ahead of the
compute warpgroups (`fused_attention.LongBlocks(backward='mosaic')`). Rows of 64 or 128 take
`row_backward` below instead (`short_backward='mosaic'`): one block per row and head, nothing
recomputed.

Its function is `fused_attention._long_backward`'s (the Triton kernel's): the same masks, the same
dropout draws, the same gradients, from the forward's saved log-sum-exp (base 2). Each block of
the grid (head, tile, row) has `warpgroups` compute warpgroups of `block` keys and queries each:

  dK, dV  each warpgroup holds its keys' k and v in shared memory and steps over every query of
          the row, `step` at a time: the scores transposed [keys, queries] (so that dV = P^T dO
          and dK = dS^T Q take the probabilities from registers), dP^T = V dO^T
  dQ      then holds its queries' q and dO and steps over every key: S = Q K^T, dP = dO V^T,
          dQ = dS K

rowsum(dO * O) comes computed once per query (`delta`, an XLA fusion) instead of once per
program. The probabilities of the dQ pass are recomputed, as in the Triton kernel: two matmuls
of seven, and no float32 dQ accumulated across programs (cuDNN adds dQ with atomics).
Each stored dq, dk, dv tile is also summed over its tokens, by a wgmma of ones over the stored
tile, for the bias gradient (the Triton kernel's per-block sums). Needs an NVIDIA Hopper GPU and
16-bit q, k, v; the layout is `fused_attention`'s packed [batch, length, 3, heads, head_dim].

The dropout's draws hash each pair of keys once, as the Triton kernels do, through the registers
(`paired_draws`, a warp shuffle in the transposed tiles). Mosaic GPU's interpreter has no
registers to reach, so there each value hashes alone (`_draws`): the same draws, twice the
hashing.

With the paper's dropout at BERT-Large 32 x 512 it is faster than both the Triton backward and
cuDNN's attention with its own dropout (docs/performance.md).
"""

import functools
import math
from typing import Any, Callable, NamedTuple

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.numpy as jnp
import numpy as np

from bert_jax.kernels.gpu import fused_norm

_MASKED = -1e30  # A masked score, as fused_attention's: exp2 of it underflows to 0.
_SUM_ROWS = 64  # Rows of the wgmma that sums a gradient tile's columns (wgmma's least).


class Tiles(NamedTuple):
  """Each of `warpgroups` compute warpgroups takes `block` keys (dK, dV) and `block` queries
  (dQ); the memory warpgroup streams `step` queries or keys at a time, `stages` steps ahead."""
  block: int = 64
  step: int = 64
  warpgroups: int = 2
  stages: int = 3  # 0.705 ms against 0.727 with 2, 0.719 with 4 (H100, Large 512).


TILES = Tiles()


def row_tiles(length: int) -> Tiles:
  """row_backward's warpgroups as Tiles: one of 64 tokens per 64 of the row."""
  return Tiles(block=64, step=64, warpgroups=length // 64)


def check_tiles(tiles: Tiles, length: int, head_dim: int) -> None:
  """Tilings the kernel computes at `length` and `head_dim`: block and step 64 (a warpgroup's
  wgmma rows; 128 for block) dividing the row, warpgroups 1 or 2 with block * warpgroups
  dividing it, stages at least 2, head_dim 64 or 128 (one or two 128-byte swizzled rows)."""
  if tiles.block not in (64, 128) or length % (tiles.block * tiles.warpgroups):
    raise ValueError(f'tiles.block={tiles.block}: must be 64 or 128, with block * warpgroups '
                     f'({tiles.block * tiles.warpgroups}) dividing the row length {length}.')
  if tiles.step not in (64, 128) or length % tiles.step:
    raise ValueError(f'tiles.step={tiles.step}: must be 64 or 128, dividing the row length '
                     f'{length}.')
  if tiles.warpgroups not in (1, 2):
    raise ValueError(f'tiles.warpgroups={tiles.warpgroups}: must be 1 or 2.')
  if tiles.stages < 2:
    raise ValueError(f'tiles.stages={tiles.stages}: must be at least 2.')
  if head_dim not in (64, 128):
    raise ValueError(f'head_dim={head_dim}: the Mosaic GPU kernels take 64 or 128.')


def _plgpu():
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  return plgpu


def _interpret_params():
  # Not yet exported by jax.experimental.pallas.mosaic_gpu (jax 0.10).
  from jax._src.pallas.mosaic_gpu.interpret import params  # pylint: disable=g-import-not-at-top
  return params.InterpretGPUParams()


def _draws(key, index):
  """fused_attention.keep_mask's 16-bit draws at draw indices `index` (uint32, query * length +
  key): the low (even key) or high (odd key) half of fused_norm.pair_draws(key, index // 2), one
  hash per value."""
  hashed = fused_norm.pair_draws(key, index >> 1)
  return jnp.where((index & 1) == 1, hashed >> 16, hashed & jnp.uint32(fused_norm.DRAW_RANGE - 1))


def paired_draws(index, key, *, rows_are_keys: bool):
  """The 16-bit draws of a [rows, cols] uint32 tile `index` of draw indices (query * length +
  key, `length` even) in the WGMMA layout, hashing each pair of keys once: _draws's draws in half
  its hashing. key: the (row, head)'s uint32 key. Mosaic GPU only (plgpu.inline_mgpu reaches
  the registers; the interpreter has none).

  A thread holds rows r and r + 8 of its warp's 16 (r = lane // 4) and, in each two-value
  register, columns 2c and 2c + 1 (c = lane % 4, then steps of 8 columns).
  - Columns are keys ([queries, keys] tiles): a register holds both keys of one query's pair, so
    one hash gives both (low half, high half).
  - Rows are keys ([keys, queries] tiles): keys 2m and 2m + 1 sit in lanes l and l ^ 4, each
    holding queries 2c and 2c + 1. Each lane hashes one of the two pairs (the even key's lane
    query 2c's, the odd key's 2c + 1's) and the two swap hashes by a warp shuffle; the even key
    takes the low halves, the odd key the high halves."""
  plgpu = _plgpu()
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir.dialects import arith, vector  # pylint: disable=g-import-not-at-top
  from jax.experimental import mosaic  # pylint: disable=g-import-not-at-top
  mgpu = mosaic.gpu
  layout = plgpu.Layout.WGMMA

  @plgpu.inline_mgpu(arg_types=(layout, plgpu.Layout.WG_SPLAT(())),
                     return_type=plgpu.ShapeDtypeStruct(index.shape, jnp.uint32, layout=layout))
  def draws(_, index_array, key_array):
    i32 = ir.IntegerType.get_signless(32)
    const = lambda v: mgpu.utils.c(v - (1 << 32) if v >= 1 << 31 else v, i32)  # noqa: E731
    at = lambda i: ir.DenseI64ArrayAttr.get([i])  # noqa: E731
    [key_value] = key_array.registers.flat
    low_half = lambda x: arith.andi(x, const(fused_norm.DRAW_RANGE - 1))  # noqa: E731

    def pair_hash(index):  # fused_norm.pair_draws(key, index // 2) in 32-bit registers.
      x = arith.xori(key_value, arith.muli(arith.shrui(index, const(1)),
                                           const(fused_norm.SPREAD)))
      for shift, factor in fused_norm.MIX_STEPS:
        x = arith.xori(x, arith.shrui(x, const(shift)))
        x = x if factor is None else arith.muli(x, const(factor))
      return x

    def register_draws(register):  # [draw of value 0, draw of value 1]
      first, second = (vector.extract(register, dynamic_position=[], static_position=at(i))
                       for i in range(2))
      if not rows_are_keys:  # Keys 2c, 2c + 1 of one query: one pair.
        hashed = pair_hash(first)
        return low_half(hashed), arith.shrui(hashed, const(fused_norm.DRAW_BITS))
      odd = arith.andi(first, const(1))  # This lane's key is odd.
      is_odd = arith.cmpi(arith.CmpIPredicate.ne, odd, const(0))
      mine = pair_hash(arith.select(is_odd, second, first))  # Query 2c + odd's pair.
      theirs = mgpu.utils.shfl_bfly(mine, 4)  # The other key's lane: the other query's pair.
      shift = arith.muli(odd, const(fused_norm.DRAW_BITS))
      hashes = (arith.select(is_odd, theirs, mine), arith.select(is_odd, mine, theirs))
      return tuple(low_half(arith.shrui(h, shift)) for h in hashes)

    registers = np.empty_like(index_array.registers)
    for position, register in np.ndenumerate(index_array.registers):
      for i, draw in enumerate(register_draws(register)):
        register = vector.insert(draw, register, dynamic_position=[], static_position=at(i))
      registers[position] = register
    return mgpu.FragmentedArray(_registers=registers, _layout=index_array.layout,
                                _is_signed=False)

  return draws(index, key)


def tile_probs(ops, s, seg_rows, seg_cols, lse, *, key, first_row, first_col,
               rows_are_keys: bool, length: int, threshold: int):
  """The probabilities of a [rows, cols] tile of base-2 scores s whose rows are tokens
  first_row.. (keys if rows_are_keys, else queries) and columns tokens first_col.., masked
  outside each query's segment (seg_rows, seg_cols: their segment ids); lse: the queries'
  base-2 log-sum-exps. With the tile's keep mask (None without dropout): on the GPU hashed a
  pair of keys at a time (paired_draws), on the interpreter a value at a time (_draws)."""
  rows = lambda x: lax.broadcast_in_dim(x, s.shape, [0])  # noqa: E731
  cols = lambda x: lax.broadcast_in_dim(x, s.shape, [1])  # noqa: E731
  p = jnp.exp2(jnp.where(rows(seg_rows) == cols(seg_cols), s, _MASKED)
               - (cols(lse) if rows_are_keys else rows(lse)))
  if not threshold:
    return p, None
  row_tokens = ops.iota(s.shape, 0) + first_row.astype(jnp.uint32)
  col_tokens = ops.iota(s.shape, 1) + first_col.astype(jnp.uint32)
  queries, keys = (col_tokens, row_tokens) if rows_are_keys else (row_tokens, col_tokens)
  index = queries * jnp.uint32(length) + keys
  if ops.interpret is None:  # On the GPU (paired_draws reaches the registers).
    draws = paired_draws(index, key.astype(jnp.uint32), rows_are_keys=rows_are_keys)
  else:
    draws = _draws(key, index)
  return p, draws >= jnp.uint32(threshold)


def dropped(x, keep, threshold: int):
  """x where kept, scaled by 1 / P(keep), 0 elsewhere (x itself when keep is None)."""
  return x if keep is None else jnp.where(keep, x * fused_norm.keep_scale(threshold), 0.0)


class KernelOps(NamedTuple):
  """What a Mosaic GPU attention kernel does with tiles, the same on the GPU and on Mosaic GPU's
  interpreter (which has no plgpu.load, layouts, wgmma, transposed refs or run_state).

  load(ref, layout): a [n] vector in a WGMMA tile's row or column layout; wgmma_layout(x): x in the
  WGMMA layout; iota(shape, dim): uint32 indices in it; matmul(a, b, rows, transpose_b=False,
  acc=None, transpose_a=False): a @ b (b^T with transpose_b, a^T with transpose_a; b a shared-memory
  ref, a one or a register tile) by wgmma in float32, a new [rows, ...] product or added to acc;
  swizzled: the shared-memory transforms of a [rows, head_dim] 16-bit tile; wgmma_rows,
  wgmma_cols: the vector layouts; plgpu: the Mosaic GPU module; interpret: plgpu.kernel's
  argument of that name."""
  load: Callable
  wgmma_layout: Callable
  iota: Callable
  matmul: Callable
  swizzled: tuple
  wgmma_rows: Any
  wgmma_cols: Any
  plgpu: Any
  interpret: Any


def kernel_ops(interpret: bool) -> KernelOps:
  """The KernelOps of the GPU, or of the interpreter."""
  plgpu = _plgpu()

  def load(ref, layout):
    return ref[...] if interpret else plgpu.load(ref, (), layout=layout)

  def wgmma_layout(x):
    return x if interpret else plgpu.layout_cast(x, plgpu.Layout.WGMMA)

  def iota(shape, dim):
    return wgmma_layout(lax.broadcasted_iota(jnp.uint32, shape, dim))

  def matmul(a, b_, rows, transpose_b=False, acc=None, transpose_a=False):
    if interpret:
      a = a if isinstance(a, jax.Array) else a[...].T if transpose_a else a[...]
      b_ = b_[...].T if transpose_b else b_[...]
      product = lax.dot(a, b_, preferred_element_type=jnp.float32)
      return product if acc is None else acc + product
    b_ = plgpu.transpose_ref(b_, (1, 0)) if transpose_b else b_
    a = plgpu.transpose_ref(a, (1, 0)) if transpose_a else a

    def new(acc_ref):
      plgpu.wgmma(acc_ref, a, b_)
      return acc_ref[...]

    def accumulate(acc_ref):
      plgpu.wgmma(acc_ref, a, b_)

    if acc is None:
      return pl.run_scoped(new, plgpu.ACC((rows, b_.shape[1]), jnp.float32))
    return pl.run_state(accumulate)(plgpu.ACC.init(acc))

  return KernelOps(load, wgmma_layout, iota, matmul,
                   (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)),
                   plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0), plgpu,
                   _interpret_params() if interpret else None)


def store_grad(ops: KernelOps, tile, staging, sums_smem, dst, sums_dst) -> None:
  """tile ([rows, head_dim], 16-bit) -> dst (a gmem view) through staging (a shared-memory tile
  like it); and its column sums as stored to sums_dst (a [1, head_dim] gmem view) through
  sums_smem ([_SUM_ROWS, head_dim] float32), by a wgmma of ones over staging: every row of
  ones @ tile is the sum (the bias gradient's share of these tokens)."""
  plgpu = ops.plgpu
  staging[...] = tile
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(staging, dst)
  ones = ops.wgmma_layout(jnp.ones((_SUM_ROWS, tile.shape[0]), tile.dtype))
  sums_smem[...] = ops.matmul(ones, staging, _SUM_ROWS)
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(sums_smem.at[pl.ds(0, 1)], sums_dst)
  plgpu.wait_smem_to_gmem(0)


@fused_norm.lowered_once(static_argnames=('threshold', 'tiles', 'interpret'))
def backward(qkv, segment_ids, keys, lse, delta, do, *, threshold: int, tiles: Tiles = TILES,
             interpret: bool = False):
  """(dqkv [batch, length, 3, heads, head_dim] in qkv's dtype, the column sums of its blocks
  [batch, heads, length // tiles.block, 3, head_dim] float32: the bias gradient's shares).

  qkv: the forward's packed projection (bias added); segment_ids [batch, length] int32; keys:
  [batch, heads, 1] uint32 (ignored when threshold is 0); lse: the forward's base-2 log-sum-exp
  [batch, heads, length] float32; delta: rowsum(dO * O) [batch, heads, length] float32; do:
  [batch, length, heads, head_dim]. interpret: run on Mosaic GPU's interpreter (any device; slow,
  for tests)."""
  ops = kernel_ops(interpret)
  plgpu = ops.plgpu
  batch, length, _, heads, head_dim = qkv.shape
  check_tiles(tiles, length, head_dim)
  block, step, wgs = tiles.block, tiles.step, tiles.warpgroups
  dtype = qkv.dtype
  scale = 1.0 / head_dim ** 0.5
  log2_scale = scale * math.log2(math.e)
  load, wgmma_layout, swizzled = ops.load, ops.wgmma_layout, ops.swizzled
  wgmma_rows, wgmma_cols = ops.wgmma_rows, ops.wgmma_cols

  def matmul(a, b_, transpose_b=False, acc=None, rows=block):
    return ops.matmul(a, b_, rows, transpose_b, acc)

  def kernel(qkv_ref, seg_ref, keys_ref, lse_ref, delta_ref, do_ref, dqkv_ref, sums_ref,
             tiles_smem, seg_smem, stats_smem, sums_smem, fetched_kv, fetched_q):
    b, h, wg = lax.axis_index('batch'), lax.axis_index('heads'), lax.axis_index('wg')
    first = lax.axis_index('tile') * (wgs * block) + wg * block  # This warpgroup's tokens.
    mine = pl.ds(first, block)
    key = keys_ref[b, h, 0] if threshold else None
    part = lambda j: qkv_ref.at[b, :, j, h, :]  # noqa: E731  [length, head_dim] views
    d_out = do_ref.at[b, :, h, :]
    lse_row, delta_row, seg_row = lse_ref.at[b, h, :], delta_ref.at[b, h, :], seg_ref.at[b]

    def fetch(pairs, barrier):
      """Copy this warpgroup's rows of each (gmem view, smem buffer) and wait for them (the
      barrier expects one arrival per copy)."""
      for src, dst in pairs:
        plgpu.copy_gmem_to_smem(src.at[mine], dst, barrier.at[wg])
      plgpu.barrier_wait(barrier.at[wg])

    def store(tile, j):  # Rows `mine` of part j of dqkv, through k's buffer.
      store_grad(ops, tile.astype(dtype), tiles_smem.at[wg, 0], sums_smem.at[wg],
                 dqkv_ref.at[b, mine, j, h, :],
                 sums_ref.at[b, h, lax.div(first, block), pl.ds(j, 1)])

    # A [block, step] tile's probabilities and keep mask, its rows my tokens.
    probs = functools.partial(tile_probs, ops, key=key, first_row=first, length=length,
                              threshold=threshold)
    drop = functools.partial(dropped, threshold=threshold)

    # dK and dV of my keys: [keys, queries] tiles, stepping over the queries.
    def key_pass(run):
      fetch(((part(1), tiles_smem.at[wg, 0]), (part(2), tiles_smem.at[wg, 1]),
             (seg_row, seg_smem.at[wg])), fetched_kv)
      zeros = wgmma_layout(jnp.zeros((block, head_dim), jnp.float32))
      seg_k = load(seg_smem.at[wg], wgmma_rows)
      dk, dv = run((zeros, zeros, seg_k))[:2]
      store(dv, 2)
      store(dk * scale, 1)

    def query_step(indices, q_smem, do_smem, lse_smem, delta_smem, seg_smem, carry):
      dk, dv, seg_k = carry
      k_smem, v_smem = tiles_smem.at[wg, 0], tiles_smem.at[wg, 1]
      # [my keys, these queries]: the scores transposed, in base 2.
      s_t = matmul(k_smem, q_smem, transpose_b=True) * log2_scale
      p_t, keep = probs(s_t, seg_k, load(seg_smem, wgmma_cols), load(lse_smem, wgmma_cols),
                        first_col=indices[0] * step, rows_are_keys=True)
      dp_t = drop(matmul(v_smem, do_smem, transpose_b=True), keep)
      dv = matmul(drop(p_t, keep).astype(dtype), do_smem, acc=dv)
      delta = load(delta_smem, wgmma_cols)
      ds_t = (p_t * (dp_t - lax.broadcast_in_dim(delta, s_t.shape, [1]))).astype(dtype)
      dk = matmul(ds_t, q_smem, acc=dk)
      return dk, dv, seg_k

    def tile():  # A step's [step, head_dim] tile of q, dO, k or v.
      return plgpu.BlockSpec((step, head_dim), lambda i: (i, 0), transforms=swizzled)

    def vec():  # A step's [step] lse, delta or segment ids.
      return plgpu.BlockSpec((step,), lambda i: (i,))

    plgpu.emit_pipeline_warp_specialized(
        query_step, grid=(length // step,), memory_registers=40,
        max_concurrent_steps=tiles.stages, num_compute_wgs=wgs, wg_axis='wg',
        compute_context=key_pass,
        in_specs=[tile(), tile(), vec(), vec(), vec()],
    )(part(0), d_out, lse_row, delta_row, seg_row)

    # dQ of my queries: [queries, keys] tiles, stepping over the keys.
    def query_pass(run):
      fetch(((part(0), tiles_smem.at[wg, 0]), (d_out, tiles_smem.at[wg, 1]),
             (seg_row, seg_smem.at[wg]), (lse_row, stats_smem.at[wg, 0]),
             (delta_row, stats_smem.at[wg, 1])), fetched_q)
      zeros = wgmma_layout(jnp.zeros((block, head_dim), jnp.float32))
      vecs = (load(seg_smem.at[wg], wgmma_rows),
              *(load(stats_smem.at[wg, i], wgmma_rows) for i in range(2)))
      dq = run((zeros, *vecs))[0]
      store(dq * scale, 0)

    def key_step(indices, k_smem, v_smem, seg_smem, carry):
      dq, seg_q, lse, delta = carry
      q_smem, do_smem = tiles_smem.at[wg, 0], tiles_smem.at[wg, 1]
      s = matmul(q_smem, k_smem, transpose_b=True) * log2_scale  # [my queries, these keys]
      p, keep = probs(s, seg_q, load(seg_smem, wgmma_cols), lse, first_col=indices[0] * step,
                      rows_are_keys=False)
      dp = drop(matmul(do_smem, v_smem, transpose_b=True), keep)
      ds = p * (dp - lax.broadcast_in_dim(delta, s.shape, [0]))
      dq = matmul(ds.astype(dtype), k_smem, acc=dq)
      return dq, seg_q, lse, delta

    plgpu.emit_pipeline_warp_specialized(
        key_step, grid=(length // step,), memory_registers=40,
        max_concurrent_steps=tiles.stages, num_compute_wgs=wgs, wg_axis='wg',
        compute_context=query_pass,
        in_specs=[tile(), tile(), vec()],
    )(part(1), part(2), seg_row)

  scratch = [
      plgpu.SMEM((wgs, 2, block, head_dim), dtype, transforms=swizzled),  # k, v; then q, dO
      plgpu.SMEM((wgs, block), jnp.int32),  # segment ids of my keys, then of my queries
      plgpu.SMEM((wgs, 2, block), jnp.float32),  # lse, delta of my queries
      plgpu.SMEM((wgs, _SUM_ROWS, head_dim), jnp.float32),  # column sums (rows alike)
      plgpu.Barrier(num_arrivals=3, num_barriers=wgs),  # k, v, segment ids arrived
      plgpu.Barrier(num_arrivals=5, num_barriers=wgs),  # q, dO, segment ids, lse, delta
  ]
  keys = keys if threshold else jnp.zeros((batch, heads, 1), jnp.uint32)
  return plgpu.kernel(
      kernel, scratch_types=scratch,
      out_type=(jax.ShapeDtypeStruct(qkv.shape, dtype),
                jax.ShapeDtypeStruct((batch, heads, length // block, 3, head_dim), jnp.float32)),
      compiler_params=plgpu.CompilerParams(approx_math=True),
      grid=(heads, length // (wgs * block), batch), grid_names=('heads', 'tile', 'batch'),
      num_threads=wgs + 1, thread_name='wg', kernel_name='long_attention_bwd_mgpu',
      interpret=ops.interpret,
  )(qkv, segment_ids, keys, lse, delta, do)


ROW_LENGTHS = (64, 128)  # Rows row_backward takes: one warpgroup per 64 tokens, in one block.


@fused_norm.lowered_once(static_argnames=('threshold', 'interpret'))
def row_backward(qkv, segment_ids, keys, lse, o, do, *, threshold: int,
                 interpret: bool = False):
  """backward's function for rows of ROW_LENGTHS tokens, one block of the grid per (row, head)
  holding the whole row, so nothing is recomputed (five matmuls, the draws once). It takes the
  forward's output o [batch, length, heads, head_dim] where backward takes delta: rowsum(dO * O)
  comes from the tiles it loads anyway. Returns dqkv and the column sums [batch, heads,
  length // 64, 3, head_dim] as backward does.

  Warpgroup w (one per 64 tokens) takes queries 64w.. against every key block j: S = Q K_j^T,
  dP = dO V_j^T, dS; dQ += dS K_j; it leaves the dropped probabilities and dS of each block in
  shared memory. After all warpgroups have, it takes keys 64w.. over every query block i:
  dV += P_iw^T dO_i and dK += dS_iw^T Q_i (wgmma's transposed shared-memory operand)."""
  ops = kernel_ops(interpret)
  plgpu = ops.plgpu
  batch, length, _, heads, head_dim = qkv.shape
  if length not in ROW_LENGTHS:
    raise ValueError(f'length={length}: row_backward takes rows of {ROW_LENGTHS} tokens.')
  check_tiles(row_tiles(length), length, head_dim)
  blocks, block = length // 64, 64
  dtype = qkv.dtype
  scale = 1.0 / head_dim ** 0.5
  log2_scale = scale * math.log2(math.e)

  def kernel(qkv_ref, seg_ref, keys_ref, lse_ref, o_ref, do_ref, dqkv_ref, sums_ref,
             q_smem, k_smem, v_smem, do_smem, seg_smem, lse_smem, probs_smem, grads_smem,
             staging_smem, sums_smem, fetched, written):
    b, h, wg = lax.axis_index('batch'), lax.axis_index('heads'), lax.axis_index('wg')
    mine = pl.ds(wg * block, block)
    key = keys_ref[b, h, 0] if threshold else None
    # This warpgroup's 64 tokens of q, k, v, dO and their segment ids and lse: each buffer
    # [blocks, 64, ...] holds the whole row once all arrive; and its o, in the buffer of its
    # stores.
    sources = [qkv_ref.at[b, mine, j, h, :] for j in range(3)] + [do_ref.at[b, mine, h, :]]
    for src, dst in zip(sources, (q_smem, k_smem, v_smem, do_smem)):
      plgpu.copy_gmem_to_smem(src, dst.at[wg], fetched)
    plgpu.copy_gmem_to_smem(seg_ref.at[b, mine], seg_smem.at[wg], fetched)
    plgpu.copy_gmem_to_smem(lse_ref.at[b, h, mine], lse_smem.at[wg], fetched)
    plgpu.copy_gmem_to_smem(o_ref.at[b, mine, h, :], staging_smem.at[wg], fetched)
    plgpu.barrier_wait(fetched)

    drop = functools.partial(dropped, threshold=threshold)

    def store(tile, j):  # Rows `mine` of part j of dqkv.
      store_grad(ops, tile.astype(dtype), staging_smem.at[wg], sums_smem.at[wg],
                 dqkv_ref.at[b, mine, j, h, :], sums_ref.at[b, h, wg, pl.ds(j, 1)])

    seg_q = ops.load(seg_smem.at[wg], ops.wgmma_rows)
    lse_q = ops.load(lse_smem.at[wg], ops.wgmma_rows)
    delta_q = jnp.sum(staging_smem[wg].astype(jnp.float32)  # rowsum(dO * O) [64]
                      * do_smem[wg].astype(jnp.float32), axis=1)

    # The blocks are stepped by fori_loop, not a Python loop: a shared-memory view taken at a
    # constant index and read by an accumulating wgmma (a run_state) fails to lower under jax
    # 0.11's Warpgroup semantics ("Shaped arrays must be represented by ir.Values").
    def query_step(j, dq):  # My queries against block j of keys.
      s = ops.matmul(q_smem.at[wg], k_smem.at[j], block, transpose_b=True) * log2_scale
      p, keep = tile_probs(ops, s, seg_q, ops.load(seg_smem.at[j], ops.wgmma_cols), lse_q,
                           key=key, first_row=wg * block, first_col=j * block,
                           rows_are_keys=False, length=length, threshold=threshold)
      dp = drop(ops.matmul(do_smem.at[wg], v_smem.at[j], block, transpose_b=True), keep)
      ds = (p * (dp - lax.broadcast_in_dim(delta_q, s.shape, [0]))).astype(dtype)
      probs_smem[wg, j] = drop(p, keep).astype(dtype)
      grads_smem[wg, j] = ds
      return ops.matmul(ds, k_smem.at[j], block, acc=dq)

    zeros = ops.wgmma_layout(jnp.zeros((block, head_dim), jnp.float32))
    store(lax.fori_loop(0, blocks, query_step, zeros) * scale, 0)
    plgpu.commit_smem()  # Every warpgroup's probabilities and dS, before the others read them.
    plgpu.barrier_arrive(written)
    plgpu.barrier_wait(written)

    def key_step(i, carry):  # My keys over block i of queries.
      dk, dv = carry
      dv = ops.matmul(probs_smem.at[i, wg], do_smem.at[i], block, acc=dv, transpose_a=True)
      dk = ops.matmul(grads_smem.at[i, wg], q_smem.at[i], block, acc=dk, transpose_a=True)
      return dk, dv

    dk, dv = lax.fori_loop(0, blocks, key_step, (zeros, zeros))
    store(dv, 2)
    store(dk * scale, 1)

  tile = plgpu.SMEM((blocks, block, head_dim), dtype, transforms=ops.swizzled)
  scratch = [
      tile, tile, tile, tile,  # q, k, v, dO
      plgpu.SMEM((blocks, block), jnp.int32),  # segment ids
      plgpu.SMEM((blocks, block), jnp.float32),  # lse
      # The dropped probabilities and dS, [query block, key block, 64, 64].
      plgpu.SMEM((blocks, blocks, block, block), dtype, transforms=ops.swizzled),
      plgpu.SMEM((blocks, blocks, block, block), dtype, transforms=ops.swizzled),
      tile,  # o, then stores
      plgpu.SMEM((blocks, _SUM_ROWS, head_dim), jnp.float32),  # column sums (rows alike)
      plgpu.Barrier(num_arrivals=7 * blocks),  # every warpgroup's seven copies arrived
      plgpu.Barrier(num_arrivals=blocks),  # every warpgroup wrote its probabilities and dS
  ]
  keys = keys if threshold else jnp.zeros((batch, heads, 1), jnp.uint32)
  return plgpu.kernel(
      kernel, scratch_types=scratch,
      out_type=(jax.ShapeDtypeStruct(qkv.shape, dtype),
                jax.ShapeDtypeStruct((batch, heads, blocks, 3, head_dim), jnp.float32)),
      compiler_params=plgpu.CompilerParams(approx_math=True),
      grid=(heads, batch), grid_names=('heads', 'batch'),
      num_threads=blocks, thread_name='wg', kernel_name='row_attention_bwd_mgpu',
      interpret=ops.interpret,
  )(qkv, segment_ids, keys, lse, o, do)

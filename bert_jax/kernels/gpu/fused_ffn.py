"""The feed-forward block gelu_tanh(x @ W1 + b1) @ W2 with Pallas Mosaic GPU kernels (Hopper's
wgmma and TMA) on both sides of its GELU. The model uses it with `model.ffn_impl='pallas'`.

`ffn(x, w1, b1, w2)` over rows: x [tokens, embed], w1 [embed, mlp], b1 [mlp], w2 [mlp, embed].

  forward   kernel: h = gelu_tanh(x @ W1 + b1) and g = gelu'(x @ W1 + b1), from one tanh
            XLA:    y = h @ W2
  backward  kernel: dPre = (dY @ W2^T) * g, and the column sums of every 64 rows of dPre
            XLA:    dW2 = h^T @ dY; dW1 = x^T @ dPre; db1 = the sum of those column sums (no
                    second read of dPre); dx = dPre @ W1^T

The forward saves h and g (the model's way saves h and the pre-activation, the same memory), so
the backward's kernel multiplies where XLA's way writes dH, reads it back with the
pre-activation and recomputes the tanh. Both kernels are one skeleton (`_pingpong_matmul`): a
persistent grid of one block per SM stepping over [rows, cols] output tiles in a snake; a memory
warpgroup streams the operands through shared memory `stages` steps ahead; two compute
warpgroups take the block's tiles in turn, each with its own accumulator, so one's epilogue
(bias, GELU, stores) runs while the other's matmul has the tensor cores (the ping-pong schedule of
CUTLASS and FlashAttention-3). They need an NVIDIA Hopper GPU (compute capability 9.x) and
16-bit activations; elsewhere (CPUs, older GPUs, float32, shapes the tiling does not divide) the
same custom backward runs on XLA's reference functions.

The block alone, forward and backward, is faster this way than XLA's (cuBLASLt's GELU_AUX
epilogue, then cuBLAS and one fusion for dPre) at BERT-Base and Large (docs/performance.md).
"""

import functools
from typing import NamedTuple

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.numpy as jnp

from bert_jax.kernels import activations
from bert_jax.kernels.gpu import fused_norm

IMPLS = ('xla', 'pallas')
_SMEM_BYTES = 227 * 1024  # Shared memory of one Hopper block.
_DEPTH = 64  # Contraction step: one 128-byte swizzled row of bf16.
_PIECE = 64  # Epilogues work on [64, 64] pieces of a warpgroup's accumulator (fewer registers).


class Tiles(NamedTuple):
  """Tiling of both kernels: each compute warpgroup computes [rows, cols] output tiles, stepping
  over the contracted axis 64 at a time with `forward_stages` / `backward_stages` steps of
  operands in flight; blocks take their tiles in a snake `snake` tiles wide."""
  rows: int = 128
  cols: int = 128
  forward_stages: int = 4
  backward_stages: int = 4
  snake: int = 8


TILES = Tiles()


def smem_bytes(tiles: Tiles) -> dict[str, int]:
  """Shared memory each kernel allocates: its operand stages and each compute warpgroup's output
  buffers (forward: two slots of a [64, 64] piece of h and g, and the bias; backward: the g tile,
  overwritten by dPre, and a [64, 64] float32 product of ones and a piece, its column sums)."""
  stage = (tiles.rows * _DEPTH + _DEPTH * tiles.cols) * 2
  sums = 2 * _PIECE * _PIECE * 4
  return {'forward': tiles.forward_stages * stage + 2 * (2 * 2 * _PIECE * _PIECE * 2
                                                         + 4 * tiles.cols),
          'backward': tiles.backward_stages * stage + 2 * tiles.rows * tiles.cols * 2 + sums}


def check_tiles(tiles: Tiles, tokens: int, mlp: int, embed: int) -> None:
  """Tilings the kernels compute for x @ W1 and dY @ W2^T (both [tokens, embed] @ [embed, mlp]):
  rows and cols 64 or 128 (a warpgroup's float32 accumulator in registers) dividing tokens and
  mlp; embed a multiple of 64; stages and snake at least 1; the buffers within a block's shared
  memory."""
  for field, size, axis in (('rows', tokens, 'tokens'), ('cols', mlp, 'mlp')):
    n = getattr(tiles, field)
    if n not in (64, 128) or size % n:
      raise ValueError(f'tiles.{field}={n}: must be 64 or 128, dividing {axis} ({size}).')
  if embed % _DEPTH:
    raise ValueError(f'embed={embed}: the kernels need a multiple of {_DEPTH}.')
  for field in ('forward_stages', 'backward_stages', 'snake'):
    if getattr(tiles, field) < 1:
      raise ValueError(f'tiles.{field}={getattr(tiles, field)}: must be at least 1.')
  for kernel, size in smem_bytes(tiles).items():
    if size > _SMEM_BYTES:
      raise ValueError(f'{tiles} needs {size} bytes of shared memory in the {kernel} kernel, '
                       f"more than a block's {_SMEM_BYTES}; use fewer stages or smaller tiles.")


def fits(tokens: int, mlp: int, embed: int, tiles: Tiles = TILES) -> bool:
  """Whether `tiles` divides the shapes (the model's vary: tiny configs, fine-tuning batches)."""
  try:
    check_tiles(tiles, tokens, mlp, embed)
  except ValueError:
    return False
  return True


def on_hopper() -> bool:
  """Whether this process's devices are NVIDIA Hopper GPUs (wgmma, TMA)."""
  device = jax.devices()[0]
  return device.platform == 'gpu' and str(getattr(device, 'compute_capability', '')).startswith(
      '9')


def _plgpu():
  # Imported where a kernel is built: the rest of the model (CPU, TPU) never needs Mosaic GPU.
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  return plgpu


def _swizzled():
  plgpu = _plgpu()
  return (plgpu.TilingTransform((8, _DEPTH)), plgpu.SwizzleTransform(2 * _DEPTH))


def _pieces(rows, cols):
  """[64, 64] pieces of a [rows, cols] tile, row by row: epilogues work on one at a time."""
  for r in range(0, rows, _PIECE):
    for c in range(0, cols, _PIECE):
      yield (slice(r, r + _PIECE), slice(c, c + _PIECE))


def _pingpong_matmul(a_gmem, b_gmem, *, rows, cols, stages, snake, sms, scratch, prologue,
                     epilogue):
  """The kernels' skeleton, inside plgpu.kernel(grid=(sms,), num_threads=3): a [m, k] @ b [k, n]
  in [rows, cols] output tiles. Block `sm` takes tiles sm, sm + sms, ... (a snake over the
  tiles); its compute warpgroup w takes the odd or even ones of those, calling
  prologue(rows_slice, cols_slice, w, scratch) before a tile's matmul (to fetch what the epilogue
  reads) and epilogue(acc, rows_slice, cols_slice, w, scratch) with the [rows, cols] float32
  product. scratch: the kernel's own shared memory (a pytree of plgpu.SMEM / Barrier)."""
  plgpu = _plgpu()
  k_steps = a_gmem.shape[1] // _DEPTH
  row_tiles, col_tiles = a_gmem.shape[0] // rows, b_gmem.shape[1] // cols

  @functools.partial(
      pl.run_scoped,
      a_smem=plgpu.SMEM((stages, rows, _DEPTH), a_gmem.dtype, transforms=_swizzled()),
      b_smem=plgpu.SMEM((stages, _DEPTH, cols), b_gmem.dtype, transforms=_swizzled()),
      # A stage's operands arrived, one barrier per (compute warpgroup, stage): each barrier's
      # phases are then waited by one warpgroup only, as Pallas tracks phases per thread.
      arrived=plgpu.Barrier(num_arrivals=2, num_barriers=2 * stages),
      consumed=plgpu.Barrier(num_barriers=stages),
      scratch=scratch, collective_axes='wg')
  def _scope(a_smem, b_smem, arrived, consumed, scratch):
    wg, sm = lax.axis_index('wg'), lax.axis_index('sm')
    block_tiles = lax.div(row_tiles * col_tiles - sm + sms - 1, sms)

    def tile(j):  # The block's j-th tile: (rows slice, cols slice).
      i, c = plgpu.planar_snake(sm + j * sms, (row_tiles, col_tiles), 0, snake)
      return pl.ds(i * rows, rows), pl.ds(c * cols, cols)

    @pl.when(wg == 2)
    def _memory():
      plgpu.set_max_registers(40, action='decrease')

      def fetch(step, carry):  # The block's steps in order: tile j's k-th operands.
        j, k, stage = lax.div(step, k_steps), lax.rem(step, k_steps), lax.rem(step, stages)
        r, c = tile(j)

        @pl.when(step >= stages)
        def _():
          plgpu.barrier_wait(consumed.at[stage])

        barrier = arrived.at[lax.rem(j, 2) * stages + stage]
        depth = pl.ds(k * _DEPTH, _DEPTH)
        plgpu.copy_gmem_to_smem(a_gmem.at[r, depth], a_smem.at[stage], barrier)
        plgpu.copy_gmem_to_smem(b_gmem.at[depth, c], b_smem.at[stage], barrier)
        return carry

      lax.fori_loop(0, block_tiles * k_steps, fetch, None)

    @pl.when(wg < 2)
    def _compute():
      plgpu.set_max_registers(232, action='increase')

      def one_tile(t, carry):
        j = 2 * t + wg
        r, c = tile(j)
        # The named scopes are the regions of the kernel's trace (see _launch's trace_dir);
        # without a trace they emit nothing. The matmul is the time between them: a scope
        # around it would name its loop's body too, a range per step.
        with jax.named_scope('prologue'):
          prologue(r, c, wg, scratch)

        def matmul(acc_ref):
          def step(k, acc_ref):
            stage = lax.rem(j * k_steps + k, stages)
            plgpu.barrier_wait(arrived.at[wg * stages + stage])
            plgpu.wgmma(acc_ref, a_smem.at[stage], b_smem.at[stage])
            plgpu.wgmma_wait(1)  # The previous step's wgmma is done with its stage.

            @pl.when(k > 0)
            def _():
              plgpu.barrier_arrive(consumed.at[lax.rem(stage + stages - 1, stages)])
            return acc_ref

          acc_ref = lax.fori_loop(0, k_steps, step, acc_ref)
          plgpu.wgmma_wait(0)
          plgpu.barrier_arrive(consumed.at[lax.rem(j * k_steps + k_steps - 1, stages)])
          return acc_ref[...]

        acc = pl.run_scoped(matmul, plgpu.ACC((rows, cols), jnp.float32))
        with jax.named_scope('epilogue'):
          epilogue(acc, r, c, wg, scratch)
        return carry

      lax.fori_loop(0, lax.div(block_tiles - wg + 1, 2), one_tile, None)

  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def trace_ranges(tokens: int, mlp: int, tiles: Tiles, sms: int) -> int:
  """Room for the ranges a compute warpgroup records in a trace of either kernel: two (prologue,
  epilogue) per tile it takes, for the block with the most tiles, and two more: the profiler's
  own 'Init' range and its three header entries (a range takes four)."""
  block_tiles = -(-(tokens // tiles.rows) * (mlp // tiles.cols) // sms)
  return 2 * -(-block_tiles // 2) + 2


def _launch(body, out_type, sms, tiles, trace_dir=''):
  """The kernel over a persistent grid of `sms` blocks; out_type's first output is [tokens, mlp]
  (both kernels'). With trace_dir, Mosaic GPU's on-device profiler records each compute
  warpgroup's prologue and epilogue of every tile, its matmul lying between them (the SM's clock
  at their ends: trace_ranges(...) ranges per warpgroup, 48 bytes of shared memory per range and
  block), and writes a Chrome trace there per call."""
  plgpu = _plgpu()
  traced = {}
  if trace_dir:
    tokens, mlp = jax.tree.leaves(out_type)[0].shape
    traced = dict(profile_space=trace_ranges(tokens, mlp, tiles, sms), profile_dir=trace_dir)
  return plgpu.kernel(
      body, out_type=out_type, grid=(sms,), grid_names=('sm',), num_threads=3, thread_name='wg',
      # approx_math: tanh as one tanh.approx.f32 (relative error 2^-11, below bf16's rounding).
      compiler_params=plgpu.CompilerParams(
          approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Warpgroup, **traced))


@fused_norm.lowered_once(static_argnames=('tiles', 'sms', 'trace_dir'))
def gelu_matmul(x, w1, b1, *, tiles: Tiles = TILES, sms: int | None = None, trace_dir: str = ''):
  """(h, g) = (gelu_tanh(pre), gelu'(pre)) in x's dtype, pre = x @ w1 + b1 in float32, by the
  forward kernel (Hopper GPUs). x: [tokens, embed]; w1: [embed, mlp] in x's 16-bit dtype; b1:
  [mlp] float32. sms: blocks of the persistent grid (default: the device's SMs); trace_dir: see
  _launch."""
  plgpu = _plgpu()
  check_tiles(tiles, x.shape[0], w1.shape[1], x.shape[1])
  sms = sms or jax.devices()[0].core_count
  rows, cols = tiles.rows, tiles.cols

  def body(x_gmem, w1_gmem, b1_gmem, h_gmem, g_gmem):
    pieces = list(_pieces(rows, cols))
    # Stores in flight while the next piece is written: the last piece's two, in the other slot
    # (a [64, 64] tiling, one piece a tile, has one slot in use and waits for it).
    in_flight = 2 if len(pieces) % 2 == 0 else 0

    def prologue(r, c, wg, scratch):
      _, b1_smem, fetched = scratch
      plgpu.copy_gmem_to_smem(b1_gmem.at[c], b1_smem.at[wg], fetched.at[wg])

    def epilogue(acc, r, c, wg, scratch):
      # h and g leave a [64, 64] piece at a time through two slots, so the stores run under the
      # next piece's arithmetic and the buffers leave room for a fourth operand stage (whole
      # [128, 128] tiles and three stages: 0.37 -> 0.29 ms at Base, H100).
      out_smem, b1_smem, fetched = scratch
      plgpu.barrier_wait(fetched.at[wg])
      for i, (rows_slice, cols_slice) in enumerate(pieces):
        slot = i % 2
        plgpu.wait_smem_to_gmem(in_flight, wait_read_only=True)  # This slot's last stores left.
        bias = lax.broadcast_in_dim(b1_smem[wg, cols_slice], (_PIECE, _PIECE), (1,))
        h, g = activations.gelu_tanh_and_grad(acc[rows_slice, cols_slice] + bias)
        out_smem[wg, slot, 0] = h.astype(out_smem.dtype)
        out_smem[wg, slot, 1] = g.astype(out_smem.dtype)
        plgpu.commit_smem()
        at = (pl.ds(r.start + rows_slice.start, _PIECE), pl.ds(c.start + cols_slice.start, _PIECE))
        plgpu.copy_smem_to_gmem(out_smem.at[wg, slot, 0], h_gmem.at[at])
        plgpu.copy_smem_to_gmem(out_smem.at[wg, slot, 1], g_gmem.at[at])

    _pingpong_matmul(
        x_gmem, w1_gmem, rows=rows, cols=cols, stages=tiles.forward_stages, snake=tiles.snake,
        sms=sms, prologue=prologue, epilogue=epilogue,
        scratch=(plgpu.SMEM((2, 2, 2, _PIECE, _PIECE), x.dtype, transforms=_swizzled()),
                 plgpu.SMEM((2, cols), jnp.float32), plgpu.Barrier(num_barriers=2)))

  out = jax.ShapeDtypeStruct((x.shape[0], w1.shape[1]), x.dtype)
  return _launch(body, (out, out), sms, tiles, trace_dir)(x, w1, b1)


@fused_norm.lowered_once(static_argnames=('tiles', 'sms', 'trace_dir'))
def dgelu_matmul(dy, w2, g, *, tiles: Tiles = TILES, sms: int | None = None, trace_dir: str = ''):
  """(dPre, its column sums per 64 rows) by the backward kernel (Hopper GPUs): dPre = (dy @ w2^T)
  * g in g's dtype, the product in float32; the column sums of each 64 rows of dPre as stored,
  [tokens // 64, mlp] float32, whose sum is the bias gradient (each [64, 64] piece summed by a
  wgmma of ones over it in shared memory: every row of ones @ piece is its column sums, so the
  bias gradient needs no second read of dPre). dy: [tokens, embed]; w2: [mlp, embed] in dy's
  16-bit dtype; g: [tokens, mlp] (gelu'(pre)); sms, trace_dir: as gelu_matmul's."""
  plgpu = _plgpu()
  check_tiles(tiles, g.shape[0], g.shape[1], dy.shape[1])
  sms = sms or jax.devices()[0].core_count
  rows, cols = tiles.rows, tiles.cols

  def body(dy_gmem, w2t_gmem, g_gmem, dpre_gmem, sums_gmem):
    def prologue(r, c, wg, scratch):
      g_smem, fetched, *_ = scratch
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # Its last tile's dPre has left g_smem.
      plgpu.copy_gmem_to_smem(g_gmem.at[r, c], g_smem.at[wg], fetched.at[wg])

    def store_sums(g_smem, sums_smem, wg, rows_slice, cols_slice, at):
      ones = plgpu.layout_cast(jnp.ones((_PIECE, _PIECE), g.dtype), plgpu.Layout.WGMMA)

      def product(acc_ref):
        plgpu.wgmma(acc_ref, ones, g_smem.at[wg, rows_slice, cols_slice])
        return acc_ref[...]

      total = pl.run_scoped(product, plgpu.ACC((_PIECE, _PIECE), jnp.float32))
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # The last piece's sums have left.
      sums_smem[wg] = total
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(sums_smem.at[wg, pl.ds(0, 1)], sums_gmem.at[at])

    def epilogue(acc, r, c, wg, scratch):
      # dPre leaves 64 rows at a time, each part's store running under the next's arithmetic.
      g_smem, fetched, sums_smem = scratch
      plgpu.barrier_wait(fetched.at[wg])
      for rows_slice, cols_slice in _pieces(rows, cols):
        piece = (wg, rows_slice, cols_slice)
        grad = g_smem[piece].astype(jnp.float32)
        g_smem[piece] = (acc[rows_slice, cols_slice] * grad).astype(g_smem.dtype)
        if cols_slice.stop == cols:  # The part's last piece: its 64 rows leave.
          first_row = r.start + rows_slice.start
          plgpu.commit_smem()
          plgpu.copy_smem_to_gmem(g_smem.at[wg, rows_slice],
                                  dpre_gmem.at[pl.ds(first_row, _PIECE), c])
          # Then its column sums, a [64, 64] piece at a time.
          for _, part_cols in _pieces(_PIECE, cols):
            at = (pl.ds(lax.div(first_row, _PIECE), 1),
                  pl.ds(c.start + part_cols.start, _PIECE))
            store_sums(g_smem, sums_smem, wg, rows_slice, part_cols, at)

    _pingpong_matmul(
        dy_gmem, w2t_gmem, rows=rows, cols=cols, stages=tiles.backward_stages,
        snake=tiles.snake, sms=sms, prologue=prologue, epilogue=epilogue,
        scratch=(plgpu.SMEM((2, rows, cols), g.dtype, transforms=_swizzled()),
                 plgpu.Barrier(num_barriers=2), plgpu.SMEM((2, _PIECE, _PIECE), jnp.float32)))

  out_type = (jax.ShapeDtypeStruct(g.shape, g.dtype),
              jax.ShapeDtypeStruct((g.shape[0] // _PIECE, g.shape[1]), jnp.float32))
  return _launch(body, out_type, sms, tiles, trace_dir)(dy, w2.T, g)


def gelu_reference(x, w1, b1):
  """gelu_matmul's function the XLA way."""
  pre = jnp.dot(x, w1, preferred_element_type=jnp.float32) + b1.astype(jnp.float32)
  return tuple(v.astype(x.dtype) for v in activations.gelu_tanh_and_grad(pre))


def dgelu_reference(dy, w2, g):
  """dgelu_matmul's function the XLA way."""
  dh = jnp.dot(dy, w2.T, preferred_element_type=jnp.float32)
  return (dh * g.astype(jnp.float32)).astype(g.dtype)


def _model_way(x, w1, b1, w2):
  pre = x @ w1.astype(x.dtype) + b1.astype(x.dtype)
  return activations.gelu_tanh(pre) @ w2.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fused(x, w1, b1, w2, tiles, use_kernel):
  return _fused_fwd(x, w1, b1, w2, tiles, use_kernel)[0]


def _fused_fwd(x, w1, b1, w2, tiles, use_kernel):
  w1_16, b1_32 = w1.astype(x.dtype), b1.astype(jnp.float32)
  if use_kernel:
    h, g = gelu_matmul(x, w1_16, b1_32, tiles=tiles)
  else:
    h, g = gelu_reference(x, w1_16, b1_32)
  return h @ w2.astype(x.dtype), (x, h, g, w1, b1, w2)


def _fused_bwd(tiles, use_kernel, saved, dy):
  x, h, g, w1, b1, w2 = saved
  w2_16 = w2.astype(dy.dtype)
  f32 = jnp.float32
  if use_kernel:
    dpre, sums = dgelu_matmul(dy, w2_16, g, tiles=tiles)
    db1 = jnp.sum(sums, axis=0)
  else:
    dpre = dgelu_reference(dy, w2_16, g)
    db1 = jnp.sum(dpre, axis=0, dtype=f32)
  tokens = (((0,), (0,)), ((), ()))  # Contract the rows: x^T @ dPre, h^T @ dY.
  dx = dpre @ w1.astype(dpre.dtype).T
  dw1 = lax.dot_general(x, dpre, tokens, preferred_element_type=f32)
  dw2 = lax.dot_general(h, dy, tokens, preferred_element_type=f32)
  return dx, dw1.astype(w1.dtype), db1.astype(b1.dtype), dw2.astype(w2.dtype)


_fused.defvjp(_fused_fwd, _fused_bwd)


def ffn(x, w1, b1, w2, *, impl: str = 'pallas', tiles: Tiles | None = None):
  """gelu_tanh(x @ w1 + b1) @ w2 in x's dtype (the down-projection's bias is the caller's).

  x: [tokens, embed]; w1: [embed, mlp]; b1: [mlp]; w2: [mlp, embed] (parameters in their dtype,
  cast to x's; their gradients in theirs). tiles: the kernels' tiling, checked against the
  shapes with impl='pallas' (default TILES). impl='pallas' runs the kernels where they can (a
  Hopper GPU, 16-bit x, shapes the tiling divides) and otherwise the same custom VJP with
  gelu_reference and dgelu_reference in their place; impl='xla' is the model's way under JAX's
  autodiff.
  """
  if impl not in IMPLS:
    raise ValueError(f'impl={impl!r}; valid: {IMPLS}')
  if (x.ndim != 2 or w1.ndim != 2 or w1.shape[0] != x.shape[1] or b1.shape != w1.shape[1:]
      or w2.shape != w1.shape[::-1]):
    raise ValueError(f'ffn takes x [tokens, embed], w1 [embed, mlp], b1 [mlp], w2 [mlp, embed]; '
                     f'got {x.shape}, {w1.shape}, {b1.shape}, {w2.shape}.')
  if impl == 'xla':  # No kernel: a tiling given is not used, so not checked.
    return _model_way(x, w1, b1, w2)
  shape = (x.shape[0], w1.shape[1], x.shape[1])  # tokens, mlp, embed
  if tiles is None:
    tiles, fitted = TILES, fits(*shape)
  else:
    tiles, fitted = Tiles(*tiles), True
    check_tiles(tiles, *shape)
  use_kernel = fitted and jnp.dtype(x.dtype).itemsize == 2 and on_hopper()
  return _fused(x, w1, b1, w2, tiles, use_kernel)

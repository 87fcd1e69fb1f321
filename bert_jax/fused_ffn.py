"""The feed-forward block's GELU and down-projection with a fused backward (Pallas Mosaic GPU:
Hopper's wgmma and TMA). The model uses it with `model.ffn_impl='pallas'`.

`gelu_dense(pre, bias, kernel)` = gelu_tanh(pre + bias) @ kernel over rows [tokens, mlp] @ [mlp,
embed]. Its forward is the model's: XLA folds the bias and the GELU into the up-projection's
cuBLASLt epilogue (BIAS_GELU_AUX writes the activation and its input in one pass). Its backward is
where the model's way spends memory passes: cuBLAS writes dH = dY @ kernel^T [tokens, mlp] in bf16,
then one XLA fusion reads dH and the pre-activation again and writes dPre = dH * gelu'(pre). Here
one kernel computes each tile of dY @ kernel^T in float32 on the tensor cores, multiplies it by
gelu'(pre) (the pre tile fetched by TMA while the matmul runs) and writes dPre once: dH is never
written or read. The bias gradient is dPre's column sums, by XLA.

  forward   XLA: h = gelu_tanh(pre + bias); y = h @ kernel; saves pre + bias and h
  backward  kernel: dPre = (dY @ kernel^T) * gelu'(pre + bias)
            XLA: dBias = column sums of dPre; dKernel = h^T @ dY

The kernel follows jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu: a persistent grid of one
block per SM stepping over output tiles in a snake; in each block a memory warpgroup streams the
operands through shared memory `stages` steps ahead and two compute warpgroups each multiply one
[rows, cols] tile (neighbouring columns). It needs an NVIDIA Hopper GPU (compute capability 9.x)
and 16-bit operands; elsewhere (CPUs, older GPUs, float32, shapes the tiling does not divide) the
backward computes the same function the XLA way. On an H100 at BERT-Base 256 x 128, 0.34 ms a
layer against cuBLAS's 0.20 for the matmul alone (0.67 for cuBLAS's matmul and XLA's fusion
timed alone); in the train step Base 256 x 128 1.6-3.2% faster, Large 128 x 128 0.5% faster,
Large 32 x 512 2.6-6.4% slower, in two calls (experiments/perf_notes.md): off by default.
"""

import functools
from typing import NamedTuple

import jax
from jax import lax
import jax.experimental.pallas as pl
import jax.numpy as jnp

from bert_jax import layers

IMPLS = ('xla', 'pallas')
_SMEM_BYTES = 227 * 1024  # Shared memory of one Hopper block.


class Tiles(NamedTuple):
  """Tiling of the backward kernel: each compute warpgroup computes [rows, cols] of dPre (a block
  [rows, 2 cols]), stepping over the embed axis `depth` at a time with `stages` steps of operands
  in flight; blocks take their tiles in a snake `snake` tiles wide."""
  rows: int = 128
  cols: int = 128
  depth: int = 64
  stages: int = 3
  snake: int = 8


TILES = Tiles()


def smem_bytes(tiles: Tiles) -> int:
  """Shared memory the kernel allocates: the operand stages and the two pre / dPre tiles."""
  stage = (tiles.rows * tiles.depth + tiles.depth * 2 * tiles.cols) * 2
  return tiles.stages * stage + 2 * tiles.rows * tiles.cols * 2


def check_tiles(tiles: Tiles, tokens: int, mlp: int, embed: int) -> None:
  """Tilings the kernel computes at [tokens, mlp] @ [mlp, embed]: rows and cols multiples of 64
  dividing tokens and mlp / 2; depth 64 (one 128-byte swizzle of bf16) dividing embed; stages
  and snake at least 1; the buffers within a block's shared memory."""
  for field, size, axis in (('rows', tokens, 'tokens'), ('cols', mlp // 2, 'mlp / 2')):
    n = getattr(tiles, field)
    if not (n >= 64 and n % 64 == 0 and size % n == 0):
      raise ValueError(f'tiles.{field}={n}: must be a multiple of 64 dividing {axis} ({size}).')
  if tiles.depth != 64 or embed % 64:
    raise ValueError(f'tiles.depth={tiles.depth}: must be 64, dividing embed ({embed}).')
  for field in ('stages', 'snake'):
    if getattr(tiles, field) < 1:
      raise ValueError(f'tiles.{field}={getattr(tiles, field)}: must be at least 1.')
  if smem_bytes(tiles) > _SMEM_BYTES:
    raise ValueError(f'{tiles} needs {smem_bytes(tiles)} bytes of shared memory, more than a '
                     f"block's {_SMEM_BYTES}; use fewer stages or smaller tiles.")


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


def _dgelu_kernel(dy_gmem, kernel_t_gmem, pre_gmem, dpre_gmem, *, tiles: Tiles):
  """One block: tiles of dPre [rows, 2 cols] in a snake, each compute warpgroup one half."""
  # Imported where a kernel is built: the rest of the model (CPU, TPU) never needs Mosaic GPU.
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  tokens, embed = dy_gmem.shape
  mlp = kernel_t_gmem.shape[1]
  block_rows, block_cols = tiles.rows, 2 * tiles.cols
  row_blocks, col_blocks = tokens // block_rows, mlp // block_cols
  swizzle = 128  # Bytes: a row of 64 bf16 values.
  transforms = (plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle))

  def pipeline(body, context):
    return plgpu.emit_pipeline_warp_specialized(
        body, grid=(embed // tiles.depth,), memory_registers=40,
        in_specs=[plgpu.BlockSpec((block_rows, tiles.depth), lambda k: (0, k),
                                  transforms=transforms, memory_space=plgpu.SMEM),
                  plgpu.BlockSpec((tiles.depth, block_cols), lambda k: (k, 0),
                                  transforms=transforms, memory_space=plgpu.SMEM)],
        wg_axis='wg', num_compute_wgs=2, max_concurrent_steps=tiles.stages,
        compute_context=context)

  ignore = lambda *_, **__: None

  @functools.partial(
      pl.run_scoped,
      operands=pipeline(ignore, ignore).get_allocations(dy_gmem, kernel_t_gmem),
      # Each compute warpgroup's tile of pre, fetched while its matmul runs; dPre overwrites it.
      pre_smem=plgpu.SMEM((2, tiles.rows, tiles.cols), pre_gmem.dtype, transforms=transforms),
      fetched=plgpu.Barrier(num_barriers=2),
      collective_axes='wg')
  def _scope(operands, pre_smem, fetched):
    wg = lax.axis_index('wg')

    @plgpu.nd_loop((row_blocks * col_blocks,), collective_axes='sm')
    def _tiles(info):
      (index,) = info.index
      i, j = plgpu.planar_snake(index, (row_blocks, col_blocks), 0, tiles.snake)
      rows, cols = pl.ds(i * block_rows, block_rows), pl.ds(j * block_cols, block_cols)
      half = pl.ds(wg * tiles.cols, tiles.cols)  # This warpgroup's columns of the block.

      def context(run_pipeline):
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # The last tile's dPre left pre_smem.
        plgpu.copy_gmem_to_smem(pre_gmem.at[rows, cols].at[:, half], pre_smem.at[wg],
                                fetched.at[wg])

        @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tiles.rows, tiles.cols),
                                                              jnp.float32))
        def _accumulate(acc_ref):
          run_pipeline(acc_ref)
          dh = acc_ref[...]  # [rows, cols] float32
          plgpu.barrier_wait(fetched.at[wg])
          for r in range(0, tiles.rows, 64):  # In [64, 64] pieces: fewer live registers.
            for c in range(0, tiles.cols, 64):
              piece = (slice(r, r + 64), slice(c, c + 64))
              grad = layers.gelu_tanh_grad(pre_smem[(wg,) + piece])
              pre_smem[(wg,) + piece] = (dh[piece] * grad).astype(pre_smem.dtype)
          plgpu.commit_smem()
          plgpu.copy_smem_to_gmem(pre_smem.at[wg], dpre_gmem.at[rows, cols].at[:, half])

      def multiply(step, dy_smem, kernel_t_smem, acc_ref):
        del step
        plgpu.wgmma(acc_ref, dy_smem, kernel_t_smem.at[:, half])
        plgpu.wgmma_wait(0)
        return acc_ref

      pipeline(multiply, context)(dy_gmem.at[rows, :], kernel_t_gmem.at[:, cols],
                                  allocations=operands)

  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def dgelu_matmul(dy, kernel, pre, *, tiles: Tiles = TILES, sms: int | None = None):
  """(dy @ kernel^T) * gelu'(pre) in pre's dtype, by the Mosaic GPU kernel (Hopper GPUs).

  dy: [tokens, embed]; kernel: [mlp, embed] (the down-projection's, in dy's 16-bit dtype); pre:
  [tokens, mlp], the GELU's input, in dy's dtype. Returns dPre [tokens, mlp]. sms: blocks of the
  persistent grid (default: the device's SMs).
  """
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  check_tiles(tiles, pre.shape[0], pre.shape[1], dy.shape[1])
  sms = sms or jax.devices()[0].core_count
  return plgpu.kernel(
      functools.partial(_dgelu_kernel, tiles=tiles),
      out_type=jax.ShapeDtypeStruct(pre.shape, pre.dtype),
      grid=(sms,), grid_names=('sm',), num_threads=3, thread_name='wg',
      # approx_math: tanh as one tanh.approx.f32 (relative error 2^-11, below bf16's rounding).
      compiler_params=plgpu.CompilerParams(
          approx_math=True, lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
  )(dy, kernel.T, pre)


def dgelu_reference(dy, kernel, pre):
  """dgelu_matmul's function the XLA way: dH in float32, times gelu'(pre), in pre's dtype."""
  dh = jnp.dot(dy, kernel.T, preferred_element_type=jnp.float32)
  return (dh * layers.gelu_tanh_grad(pre)).astype(pre.dtype)


def _reference(pre, bias, kernel):
  return layers.gelu_tanh(pre + bias.astype(pre.dtype)) @ kernel.astype(pre.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _fused(pre, bias, kernel, tiles, use_kernel):
  return _fused_fwd(pre, bias, kernel, tiles, use_kernel)[0]


def _fused_fwd(pre, bias, kernel, tiles, use_kernel):
  del tiles, use_kernel
  pre = pre + bias.astype(pre.dtype)
  h = layers.gelu_tanh(pre)
  return h @ kernel.astype(pre.dtype), (pre, h, bias, kernel)


def _fused_bwd(tiles, use_kernel, saved, dy):
  pre, h, bias, kernel = saved
  kernel16 = kernel.astype(dy.dtype)
  if use_kernel:
    dpre = dgelu_matmul(dy, kernel16, pre, tiles=tiles)
  else:
    dpre = dgelu_reference(dy, kernel16, pre)
  dbias = jnp.sum(dpre, axis=0, dtype=jnp.float32)
  dkernel = jax.lax.dot_general(h, dy, (((0,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)
  return dpre, dbias.astype(bias.dtype), dkernel.astype(kernel.dtype)


_fused.defvjp(_fused_fwd, _fused_bwd)


def gelu_dense(pre, bias, kernel, *, impl: str = 'pallas', tiles: Tiles | None = None):
  """gelu_tanh(pre + bias) @ kernel in pre's dtype.

  pre: [tokens, mlp], the up-projection's matmul output before its bias; bias: [mlp]; kernel:
  [mlp, embed] (parameters in their dtype, cast to pre's). The gradients: of pre in its dtype, of
  bias and kernel in theirs. tiles: the kernel's tiling, checked against the shapes with
  impl='pallas' (default TILES). impl='pallas' runs the kernel where it can (a Hopper GPU, 16-bit pre, shapes the tiling
  divides) and otherwise the same custom backward with dgelu_reference in the kernel's place;
  impl='xla' is the model's way under JAX's autodiff.
  """
  if impl not in IMPLS:
    raise ValueError(f'impl={impl!r}; valid: {IMPLS}')
  if pre.ndim != 2 or bias.shape != pre.shape[1:] or kernel.ndim != 2 or (
      kernel.shape[0] != pre.shape[1]):
    raise ValueError(f'gelu_dense takes pre [tokens, mlp], bias [mlp], kernel [mlp, embed]; '
                     f'got {pre.shape}, {bias.shape}, {kernel.shape}.')
  if impl == 'xla':  # No kernel: a tiling given is not used, so not checked.
    return _reference(pre, bias, kernel)
  shape = (pre.shape[0], pre.shape[1], kernel.shape[1])  # tokens, mlp, embed
  if tiles is None:
    tiles, fitted = TILES, fits(*shape)
  else:
    tiles, fitted = Tiles(*tiles), True
    check_tiles(tiles, *shape)
  use_kernel = fitted and jnp.dtype(pre.dtype).itemsize == 2 and on_hopper()
  return _fused(pre, bias, kernel, tiles, use_kernel)

"""The feed-forward block's GELU and down-projection with a fused backward (Pallas Triton; NVIDIA
GPUs). The model uses it with `model.ffn_impl='pallas'` (off by default: not yet timed on a GPU;
`experiments/epilogue_probe.py --gelu=fused` times the block alone against the model's way).

`gelu_dense(pre, bias, kernel)` = gelu_tanh(pre + bias) @ kernel over rows [tokens, mlp] @ [mlp,
embed]. Its forward is the model's: XLA folds the bias and the GELU into the up-projection's
cuBLASLt epilogue (BIAS_GELU_AUX writes the activation and its input in one pass). Its backward
is where the model's way spends memory passes: cuBLAS writes dH = dY @ kernel^T [tokens, mlp] in
bf16, then one XLA fusion reads dH and the pre-activation again, writes dPre = dH * gelu'(pre)
and sums it over the rows for the bias gradient (at BERT-Base 256 x 128 on an H100, 0.25 ms a
layer for that fusion, about 0.2 for the matmul; experiments/results/h100_base128_profile*.jsonl).
Here one kernel computes each [block_rows, block_cols] tile of dY @ kernel^T in float32, multiplies
it by gelu'(pre) there and writes dPre once, with the tile's column sums (the bias gradient before
the sum over row blocks). dH is never written, the pre-activation is read once, and dPre is not
read back for the bias.

  forward   XLA: h = gelu_tanh(pre + bias); y = h @ kernel; saves pre + bias and h
  backward  kernel: dPre = (dY @ kernel^T) * gelu'(pre + bias), its column sums per row block;
            XLA: dKernel = h^T @ dY

`impl='xla'` is the model's way (layers.gelu_tanh under JAX's autodiff; the test oracle);
`impl='pallas'` the kernel (`interpret=True` runs it anywhere, for tests).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from bert_jax import fused_norm
from bert_jax import layers

IMPLS = ('xla', 'pallas')


class Blocks(NamedTuple):
  """Tiling of the backward kernel: each program computes [rows, cols] of dPre, stepping over
  the embed axis `depth` at a time; Triton's warps and pipeline stages."""
  rows: int = 128
  cols: int = 128
  depth: int = 64
  warps: int = 8
  stages: int = 3


BLOCKS = Blocks()


def check_blocks(blocks: Blocks, tokens: int, mlp: int, embed: int) -> None:
  """Tilings the kernel computes at [tokens, mlp] @ [mlp, embed]: powers of two from 16 that
  divide their axis; warps a power of two up to 32; stages at least 1."""
  for field, size, axis in (('rows', tokens, 'tokens'), ('cols', mlp, 'mlp'),
                            ('depth', embed, 'embed')):
    n = getattr(blocks, field)
    if not (fused_norm.power_of_two(n) and n >= 16 and size % n == 0):
      raise ValueError(f'blocks.{field}={n}: must be a power of two from 16 dividing {axis} '
                       f'({size}).')
  fused_norm.check_launch('blocks', blocks.stages, warps=blocks.warps)


def _dgelu_kernel(dy_ref, kernel_ref, pre_ref, dpre_ref, sums_ref, *, blocks: Blocks):
  """Program (j, i): columns j * blocks.cols.. and rows i * blocks.rows.. of dPre."""
  cols = pl.ds(pl.program_id(0) * blocks.cols, blocks.cols)
  rows = pl.ds(pl.program_id(1) * blocks.rows, blocks.rows)

  def step(k, acc):  # Embed columns k * depth.. of dY and of the kernel's rows.
    depth = pl.ds(k * blocks.depth, blocks.depth)
    return acc + jax.lax.dot_general(dy_ref[rows, depth], kernel_ref[cols, depth],
                                     (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)

  dh = jax.lax.fori_loop(0, dy_ref.shape[1] // blocks.depth, step,
                         jnp.zeros((blocks.rows, blocks.cols), jnp.float32))
  dpre = dh * layers.gelu_tanh_grad(pre_ref[...])  # [rows, cols] float32
  dpre_ref[...] = dpre.astype(dpre_ref.dtype)
  sums_ref[...] = jnp.sum(dpre, axis=0)


def dgelu_matmul(dy, kernel, pre, *, blocks: Blocks = BLOCKS, interpret: bool = False):
  """(dy @ kernel^T) * gelu'(pre) in pre's dtype, and its column sums per block of rows.

  dy: [tokens, embed]; kernel: [mlp, embed] (the down-projection's, in dy's dtype); pre: [tokens,
  mlp], the GELU's input. Returns dPre [tokens, mlp] and float32 sums [tokens / rows, mlp].
  """
  tokens, embed = dy.shape
  mlp = kernel.shape[0]
  tile = pl.BlockSpec((blocks.rows, blocks.cols), lambda j, i: (i, j))
  return pl.pallas_call(
      functools.partial(_dgelu_kernel, blocks=blocks),
      # Grid axis 0 is CUDA's fastest: the programs running together share a block of dY's rows
      # (read once from memory) and step over the columns (the kernel, 4.7 MB at Base, stays in
      # L2). Rows fastest would read all of dY (50 MB at Base) once per block of columns.
      grid=(mlp // blocks.cols, tokens // blocks.rows),
      # dY and the kernel whole: each program reads its rows / columns `depth` at a time (embed
      # need not be a power of two: 768 = 12 x 64).
      in_specs=[pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec(memory_space=pl.ANY), tile],
      out_specs=[tile, pl.BlockSpec((None, blocks.cols), lambda j, i: (i, j))],
      out_shape=[jax.ShapeDtypeStruct((tokens, mlp), pre.dtype),
                 jax.ShapeDtypeStruct((tokens // blocks.rows, mlp), jnp.float32)],
      compiler_params=fused_norm.compiler_params(interpret, blocks.warps, blocks.stages),
      interpret=interpret, name='dgelu_matmul',
  )(dy, kernel, pre)


def fit_blocks(tokens: int, mlp: int, embed: int, blocks: Blocks = BLOCKS) -> Blocks | None:
  """blocks with rows, cols and depth halved until each divides its axis (the model's shapes
  vary: tiny configs, fine-tuning batches); None when an axis has no power-of-two divisor from
  16 (then gelu_dense computes the same function the XLA way)."""
  fitted = {}
  for field, size in (('rows', tokens), ('cols', mlp), ('depth', embed)):
    n = getattr(blocks, field)
    while n >= 16 and size % n:
      n //= 2
    if n < 16:
      return None
    fitted[field] = n
  return blocks._replace(**fitted)


def _reference(pre, bias, kernel):
  return layers.gelu_tanh(pre + bias.astype(pre.dtype)) @ kernel.astype(pre.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _pallas(pre, bias, kernel, blocks, interpret):
  return _pallas_fwd(pre, bias, kernel, blocks, interpret)[0]


def _pallas_fwd(pre, bias, kernel, blocks, interpret):
  pre = pre + bias.astype(pre.dtype)
  h = layers.gelu_tanh(pre)
  return h @ kernel.astype(pre.dtype), (pre, h, bias, kernel)


def _pallas_bwd(blocks, interpret, saved, dy):
  pre, h, bias, kernel = saved
  dpre, sums = dgelu_matmul(dy, kernel.astype(dy.dtype), pre, blocks=blocks,
                            interpret=interpret)
  dkernel = jax.lax.dot_general(h, dy, (((0,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)
  return dpre, jnp.sum(sums, axis=0).astype(bias.dtype), dkernel.astype(kernel.dtype)


_pallas.defvjp(_pallas_fwd, _pallas_bwd)


def gelu_dense(pre, bias, kernel, *, impl: str = 'pallas', interpret: bool = False,
               blocks: Blocks | None = None):
  """gelu_tanh(pre + bias) @ kernel in pre's dtype.

  pre: [tokens, mlp], the up-projection's matmul output before its bias; bias: [mlp]; kernel:
  [mlp, embed] (parameters in their dtype, cast to pre's). The gradients: of pre in its dtype,
  of bias and kernel in theirs. blocks: the kernel's tiling, checked against the shapes; by
  default BLOCKS fitted to them (`fit_blocks`), or the XLA way where none fits.
  """
  if impl not in IMPLS:
    raise ValueError(f'impl={impl!r}; valid: {IMPLS}')
  if pre.ndim != 2 or bias.shape != pre.shape[1:] or kernel.ndim != 2 or (
      kernel.shape[0] != pre.shape[1]):
    raise ValueError(f'gelu_dense takes pre [tokens, mlp], bias [mlp], kernel [mlp, embed]; '
                     f'got {pre.shape}, {bias.shape}, {kernel.shape}.')
  shape = (pre.shape[0], pre.shape[1], kernel.shape[1])  # tokens, mlp, embed
  if blocks is None:  # BLOCKS, fitted to the shapes.
    blocks = fit_blocks(*shape)
    if blocks is None:
      impl = 'xla'
  else:
    blocks = Blocks(*blocks)
    check_blocks(blocks, *shape)
  if impl == 'xla':
    return _reference(pre, bias, kernel)
  return _pallas(pre, bias, kernel, blocks, bool(interpret))

"""Bias + dropout + residual add + LayerNorm in one pass each way (Pallas/Triton, GPUs).

The post-LN sublayer output of BERT is `LayerNorm(dropout(y + bias) + residual)`, y the dense
layer's matmul output. XLA computes it, and its gradient, in several passes over the [tokens,
embed] activations (the sums, then the normalisation; the backward's row sums, then the input
gradient, then the column sums for the LayerNorm and dense biases, then again the input gradient
for the residual). `dropout_add_layer_norm` reads and writes each activation once per direction:

  forward   reads y, residual, the dropout bits; writes the output and z (the LayerNorm input)
  backward  reads the output gradient, z, the dropout bits; writes the gradients of the residual
            and of y, and per-block partial sums of the scale, offset and bias gradients

Dropout draws 16 bits per value: `dropout_bits` hashes each (row, group of four values) once with
threefry2x32, whose two 32-bit outputs give the group's four 16-bit draws (a quarter of the hashing
of `jax.random.bernoulli`, which hashes once per value). A value is dropped when its draw is below
`dropout_threshold(rate)` = round(rate * 65536), so the rate is a multiple of 1/65536 (0.1 becomes
0.100006) and the kept values are scaled by 65536 / (65536 - threshold), which keeps the
expectation exact.

Numerics follow the XLA path of flax's LayerNorm in bf16: z is rounded to the activation dtype
before its statistics are taken (so forward and backward see the same z), statistics and
gradients in float32.

An embed size that is not a power of two (BERT-Base's 768) is read into the next power of two
with masked loads and stores (`_Columns`).

`impl='xla'` computes the same function with jnp (the reference; any backend); `impl='pallas'`
runs the Triton kernels (NVIDIA GPUs; `interpret=True` runs them on any backend, for tests).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.extend import random as jax_random

IMPLS = ('xla', 'pallas')


def block_rows(rows: int) -> int:
  """Rows per kernel program: a power of two dividing rows, up to MAX_BLOCK_ROWS (the program
  walks them TILE_ROWS at a time and keeps the column sums of its rows in registers)."""
  block = 1
  while block * 2 <= MAX_BLOCK_ROWS and rows % (block * 2) == 0:
    block *= 2
  return block


def tile_rows(block: int) -> int:
  return min(block, TILE_ROWS)


# Launch shape of the kernels (experiments/fused_norm_bench.py measures the choices).
TILE_ROWS = 1
MAX_BLOCK_ROWS = 16
NUM_WARPS = 4
DRAW_BITS = 16
DRAW_RANGE = 1 << DRAW_BITS


def dropout_threshold(rate: float, bits: int = DRAW_BITS) -> int:
  """Draws (of `bits` bits) below this are dropped: rate * 2**bits, rounded."""
  return int(round(rate * (1 << bits)))


def keep_scale(threshold: int, bits: int = DRAW_BITS) -> float:
  """1 / P(keep) for a threshold: the scale of the kept values (0 when every value drops)."""
  draw_range = 1 << bits
  return 0.0 if threshold >= draw_range else draw_range / (draw_range - threshold)


def groups(embed: int) -> int:
  """Hashes per row: one per four values."""
  return math.ceil(embed / 4)


def dropout_bits(rng, rows: int, embed: int):
  """The dropout draws of a [rows, embed] activation: two uint32 [rows, groups(embed)] arrays.

  Value (r, c) draws the 16 bits at position (c // groups) of the 64 bits that threefry2x32 hashes
  from the counter (r, c % groups) under rng: bits0 holds the low 32, bits1 the high 32. A
  non-threefry key (rbg) draws the two arrays with jax.random.bits instead. The counters of row 0
  are those jax.random.split(rng, groups) hashes, so rng must serve these draws only (as a
  make_rng key does).
  """
  shape = (rows, groups(embed))
  typed = jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
  if typed and str(jax.random.key_impl(rng)) != 'threefry2x32':
    bits = jax.random.bits(rng, (2,) + shape, jnp.uint32)
    return bits[0], bits[1]
  if not typed and rng.shape != (2,):
    raise ValueError(f'a raw key must be a threefry uint32[2]; got shape {rng.shape}. Pass a '
                     'typed key (jax.random.key) for other PRNG implementations.')
  key = jax.random.key_data(rng) if typed else rng
  row = jax.lax.broadcasted_iota(jnp.uint32, shape, 0)
  group = jax.lax.broadcasted_iota(jnp.uint32, shape, 1)
  bits0, bits1 = jax_random.threefry2x32_p.bind(key[0], key[1], row, group)
  return bits0, bits1


def _draw_index(embed: int, columns):
  """For columns c of a row: (which of bits0/bits1 holds c's draw, its word index, shift)."""
  g = groups(embed)
  part = columns // g
  return part // 2, columns % g, 16 * (part % 2)


def _kept(words, shift, threshold: int):
  """Whether the 16-bit draw at `shift` of each uint32 word is at least the threshold."""
  return ((words >> shift.astype(jnp.uint32)) & jnp.uint32(DRAW_RANGE - 1)) >= threshold


def keep_from_bits(bits, embed: int, threshold: int):
  """bool [rows, embed]: True where the draw is at least the threshold (the value is kept)."""
  columns = jnp.arange(embed)
  which, word, shift = _draw_index(embed, columns)
  return _kept(jnp.where(which == 0, bits[0][:, word], bits[1][:, word]), shift, threshold)


def reference(y, bias, residual, bits, scale, offset, *, rate: float, eps: float):
  """The function, in jnp. y, residual: [rows, embed]; bits: dropout_bits' pair, or None."""
  z = y.astype(jnp.float32) + bias.astype(jnp.float32)
  if bits is not None:
    threshold = dropout_threshold(rate)
    z = jnp.where(keep_from_bits(bits, y.shape[-1], threshold), z * keep_scale(threshold), 0.0)
  z = (z + residual.astype(jnp.float32)).astype(y.dtype).astype(jnp.float32)
  mean = jnp.mean(z, axis=-1, keepdims=True)
  centered = z - mean
  rstd = jax.lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + eps)
  out = centered * rstd * scale.astype(jnp.float32) + offset.astype(jnp.float32)
  return out.astype(y.dtype)


class _Columns:
  """The embed axis inside a kernel: Triton blocks are powers of two, so an embed size that is
  not one (768) is read into the next power of two with masked loads and stores, zeros past it."""

  def __init__(self, embed: int):
    self.embed, self.width = embed, pl.next_power_of_2(embed)
    self.padded = self.width != embed

  def _index(self, first_row, tile):
    rows = (first_row + jnp.arange(tile))[:, None]
    cols = jnp.arange(self.width)[None, :]
    return (rows, cols), jnp.broadcast_to(cols < self.embed, (tile, self.width))

  def load_rows(self, ref, first_row, tile):  # -> [tile, width]
    if not self.padded:
      return ref[pl.ds(first_row, tile), :]
    index, mask = self._index(first_row, tile)
    return plgpu.load(ref.at[index], mask=mask, other=0)

  def store_rows(self, ref, first_row, value):
    if not self.padded:
      ref[pl.ds(first_row, value.shape[0]), :] = value
      return
    index, mask = self._index(first_row, value.shape[0])
    plgpu.store(ref.at[index], value, mask=mask)

  def load_keep(self, bits_refs, first_row, tile, threshold):  # -> bool [tile, width]
    """Whether each value of the rows is kept: its 16-bit draw (keep_from_bits) >= threshold."""
    rows = (first_row + jnp.arange(tile))[:, None]
    cols = jnp.arange(self.width)[None, :]
    which, word, shift = _draw_index(self.embed, cols)
    words = 0
    for half, ref in enumerate(bits_refs):  # Each value reads one of the two words.
      mask = jnp.broadcast_to((cols < self.embed) & (which == half), (tile, self.width))
      words = words | plgpu.load(ref.at[rows, word], mask=mask, other=0)
    return _kept(words, shift, threshold)

  def load_vector(self, ref):  # -> [1, width] float32
    if not self.padded:
      return ref[...].astype(jnp.float32)[None, :]
    cols = jnp.arange(self.width)
    return plgpu.load(ref.at[cols], mask=cols < self.embed, other=0).astype(jnp.float32)[None, :]

  def store_vector(self, ref, value):  # value: [width]
    if not self.padded:
      ref[...] = value
      return
    cols = jnp.arange(self.width)
    plgpu.store(ref.at[cols], value, mask=cols < self.embed)

  def zero_padding(self, x):  # x: [tile, width]
    if not self.padded:
      return x
    return jnp.where(jnp.arange(self.width)[None, :] < self.embed, x, 0.0)


def _forward_kernel(*refs, threshold: int, eps: float, has_bits: bool, tile: int):
  if has_bits:
    y_ref, bias_ref, res_ref, bits0_ref, bits1_ref, scale_ref, offset_ref = refs[:7]
  else:
    (y_ref, bias_ref, res_ref, scale_ref, offset_ref), bits0_ref, bits1_ref = refs[:5], None, None
  out_ref, z_ref, mean_ref, rstd_ref = refs[-4:]
  cols = _Columns(bias_ref.shape[0])
  bias, scale, offset = (cols.load_vector(r) for r in (bias_ref, scale_ref, offset_ref))

  def body(step, carry):
    first = step * tile
    z = cols.load_rows(y_ref, first, tile).astype(jnp.float32) + bias  # [tile, width]
    if has_bits:
      keep = cols.load_keep((bits0_ref, bits1_ref), first, tile, threshold)
      z = jnp.where(keep, z * keep_scale(threshold), 0.0)
    z = (z + cols.load_rows(res_ref, first, tile).astype(jnp.float32)).astype(z_ref.dtype)
    cols.store_rows(z_ref, first, z)
    z = z.astype(jnp.float32)  # Zero past embed: every load there gave 0.
    mean = jnp.sum(z, axis=1) / cols.embed
    centered = cols.zero_padding(z - mean[:, None])
    rstd = jax.lax.rsqrt(jnp.sum(centered * centered, axis=1) / cols.embed + eps)
    cols.store_rows(out_ref, first,
                    (centered * rstd[:, None] * scale + offset).astype(out_ref.dtype))
    mean_ref[pl.ds(first, tile)] = mean
    rstd_ref[pl.ds(first, tile)] = rstd
    return carry

  jax.lax.fori_loop(0, y_ref.shape[0] // tile, body, 0)


def _backward_kernel(*refs, threshold: int, has_bits: bool, tile: int):
  if has_bits:
    dout_ref, z_ref, bits0_ref, bits1_ref, mean_ref, rstd_ref, scale_ref = refs[:7]
  else:
    (dout_ref, z_ref, mean_ref, rstd_ref, scale_ref), bits0_ref, bits1_ref = refs[:5], None, None
  dres_ref, dy_ref, dscale_ref, doffset_ref, dbias_ref = refs[-5:]
  cols = _Columns(scale_ref.shape[0])
  scale = cols.load_vector(scale_ref)

  def body(step, sums):
    first = step * tile
    dout = cols.load_rows(dout_ref, first, tile).astype(jnp.float32)  # [tile, width]
    rstd = rstd_ref[pl.ds(first, tile)]
    z = cols.load_rows(z_ref, first, tile).astype(jnp.float32)
    xhat = cols.zero_padding((z - mean_ref[pl.ds(first, tile)][:, None]) * rstd[:, None])
    g = dout * scale
    mean_gx = jnp.sum(g * xhat, axis=1) / cols.embed
    mean_g = jnp.sum(g, axis=1) / cols.embed
    dz = cols.zero_padding((g - xhat * mean_gx[:, None] - mean_g[:, None]) * rstd[:, None])
    cols.store_rows(dres_ref, first, dz.astype(dres_ref.dtype))
    dy = dz
    if has_bits:
      keep = cols.load_keep((bits0_ref, bits1_ref), first, tile, threshold)
      dy = jnp.where(keep, dz * keep_scale(threshold), 0.0)
    cols.store_rows(dy_ref, first, dy.astype(dy_ref.dtype))
    dscale, doffset, dbias = sums
    return dscale + dout * xhat, doffset + dout, dbias + dy

  zeros = jnp.zeros((tile, cols.width), jnp.float32)
  dscale, doffset, dbias = jax.lax.fori_loop(0, dout_ref.shape[0] // tile, body,
                                             (zeros, zeros, zeros))
  cols.store_vector(dscale_ref, jnp.sum(dscale, axis=0))
  cols.store_vector(doffset_ref, jnp.sum(doffset, axis=0))
  cols.store_vector(dbias_ref, jnp.sum(dbias, axis=0))


def triton_params(num_warps: int):
  """Compiler params of this package's Pallas/Triton kernels (no loops to pipeline)."""
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=1)


def _block_specs(rows: int, embed: int):
  """Rows per program and the BlockSpecs of both kernels: row tiles, [embed] vectors, per-row
  values and the dropout bits' row tiles."""
  block = block_rows(rows)
  return (block, pl.BlockSpec((block, embed), lambda i: (i, 0)),
          pl.BlockSpec((embed,), lambda i: (0,)), pl.BlockSpec((block,), lambda i: (i,)),
          pl.BlockSpec((block, groups(embed)), lambda i: (i, 0)))


def _pallas_forward(y, bias, residual, bits, scale, offset, rate, eps, interpret, num_warps):
  rows, embed = y.shape
  block, tile, vector, per_row, bits_tile = _block_specs(rows, embed)
  bits = None if bits is None else tuple(bits)
  inputs = [y, bias, residual] + (list(bits) if bits else []) + [scale, offset]
  in_specs = [tile, vector, tile] + ([bits_tile] * 2 if bits else []) + [vector, vector]
  kernel = functools.partial(_forward_kernel, threshold=dropout_threshold(rate), eps=eps,
                             has_bits=bits is not None, tile=tile_rows(block))
  out, z, mean, rstd = pl.pallas_call(
      kernel, grid=(rows // block,), in_specs=in_specs,
      out_specs=[tile, tile, per_row, per_row],
      out_shape=[jax.ShapeDtypeStruct((rows, embed), y.dtype),
                 jax.ShapeDtypeStruct((rows, embed), y.dtype),
                 jax.ShapeDtypeStruct((rows,), jnp.float32),
                 jax.ShapeDtypeStruct((rows,), jnp.float32)],
      compiler_params=None if interpret else triton_params(num_warps),
      interpret=interpret, name='dropout_add_layer_norm_fwd')(*inputs)
  # residual's dtype travels as an empty array (residuals must be arrays).
  return out, (z, bits, mean, rstd, scale, bias, offset, jnp.zeros((0,), residual.dtype))


def _pallas_backward(rate, eps, interpret, num_warps, saved, dout):
  del eps
  z, bits, mean, rstd, scale, bias, offset, residual_like = saved
  rows, embed = z.shape
  block, tile, vector, per_row, bits_tile = _block_specs(rows, embed)
  blocks = rows // block
  partial = pl.BlockSpec((None, embed), lambda i: (i, 0))
  inputs = [dout, z] + (list(bits) if bits else []) + [mean, rstd, scale]
  in_specs = [tile, tile] + ([bits_tile] * 2 if bits else []) + [per_row, per_row, vector]
  kernel = functools.partial(_backward_kernel, threshold=dropout_threshold(rate),
                             has_bits=bits is not None, tile=tile_rows(block))
  partial_shape = jax.ShapeDtypeStruct((blocks, embed), jnp.float32)
  dres, dy, dscale, doffset, dbias = pl.pallas_call(
      kernel, grid=(blocks,), in_specs=in_specs,
      out_specs=[tile, tile, partial, partial, partial],
      out_shape=[jax.ShapeDtypeStruct((rows, embed), residual_like.dtype),
                 jax.ShapeDtypeStruct((rows, embed), z.dtype),
                 partial_shape, partial_shape, partial_shape],
      compiler_params=None if interpret else triton_params(num_warps),
      interpret=interpret, name='dropout_add_layer_norm_bwd')(*inputs)
  sums = lambda p, like: jnp.sum(p, axis=0).astype(like.dtype)  # noqa: E731
  return dy, sums(dbias, bias), dres, None, sums(dscale, scale), sums(doffset, offset)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def _pallas(y, bias, residual, bits, scale, offset, rate, eps, interpret, num_warps):
  return _pallas_forward(y, bias, residual, bits, scale, offset, rate, eps, interpret,
                         num_warps)[0]


def _pallas_fwd(y, bias, residual, bits, scale, offset, rate, eps, interpret, num_warps):
  return _pallas_forward(y, bias, residual, bits, scale, offset, rate, eps, interpret, num_warps)


_pallas.defvjp(_pallas_fwd, _pallas_backward)


def dropout_add_layer_norm(y, bias, residual, bits, scale, offset, *, rate: float, eps: float,
                           impl: str = 'xla', interpret: bool = False,
                           num_warps: int | None = None):
  """LayerNorm(dropout(y + bias) + residual) * scale + offset over the last axis.

  y, residual: [..., embed] (y the dense output before its bias); bias, scale, offset: [embed];
  bits: the dropout draws, dropout_bits(rng, rows, embed) with rows = y.size // embed, or None
  (no dropout); rate: the dropout rate (dropout_threshold says how it is quantised).
  Returns [..., embed] in y's dtype.
  """
  if impl not in IMPLS:
    raise ValueError(f'impl={impl!r}; valid: {IMPLS}')
  shape = y.shape
  if bits is not None:
    expected = (y.size // shape[-1], groups(shape[-1]))
    if len(bits) != 2 or any(b.shape != expected or b.dtype != jnp.uint32 for b in bits):
      raise ValueError(f'bits must be dropout_bits(rng, {expected[0]}, {shape[-1]}): two uint32 '
                       f'{expected} arrays; got {[(b.shape, str(b.dtype)) for b in bits]}.')
  flat = lambda a: a.reshape(-1, shape[-1])  # noqa: E731
  if impl == 'xla':
    out = reference(flat(y), bias, flat(residual), bits, scale, offset, rate=rate, eps=eps)
  else:
    out = _pallas(flat(y), bias, flat(residual), bits, scale, offset, float(rate), float(eps),
                  bool(interpret), int(num_warps or NUM_WARPS))
  return out.reshape(shape)

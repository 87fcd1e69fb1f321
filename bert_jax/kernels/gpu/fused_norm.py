"""Bias + dropout + residual add + LayerNorm in one pass each way (Pallas/Triton, GPUs).

The post-LN sublayer output of BERT is `LayerNorm(dropout(y + bias) + residual)`, y the dense
layer's matmul output. XLA computes it, and its gradient, in several passes over the [tokens,
embed] activations (the sums, then the normalisation; the backward's row sums, then the input
gradient, then the column sums for the LayerNorm and dense biases, then again the input gradient
for the residual). `dropout_add_layer_norm` reads and writes each activation once per direction:

  forward   reads y, residual, one dropout key per row; writes the output and z (the LayerNorm
            input)
  backward  reads the output gradient, z, the row keys; writes the gradients of the residual
            and of y, and per-block partial sums of the scale, offset and bias gradients

Dropout draws 16 bits per value inside the kernels: JAX draws one 32-bit key per row (`row_keys`),
and the kernels hash each pair of neighbouring values once, `mix(key ^ (c * 0x9E3779B9))` for
pair c (`mix`: a 32-bit integer finaliser), whose low and high 16 bits are the draws of values
2c and 2c + 1. No draws are written to or read from memory. A value is dropped when its draw is
below `dropout_threshold(rate)` = round(rate * 65536), so the rate is a multiple of 1/65536 (0.1
becomes 0.100006) and the kept values are scaled by 65536 / (65536 - threshold), which keeps the
expectation exact. `keep_mask` is the same decision in jnp. The pair index enters multiplied by an
odd constant, so two rows' draws coincide only at isolated pairs of values (for any two keys,
about 2^-14 such pairs expected in a row of 1024), not as a permuted row; two rows draw the same
mask only if their random keys are equal (for 16384 rows, a chance of about 3% per call that one
pair of rows does).

Numerics follow the XLA path of flax's LayerNorm in bf16: z is rounded to the activation dtype
before its statistics are taken (so forward and backward see the same z), statistics and
gradients in float32.

An embed size that is not a power of two (BERT-Base's 768) is read into the next power of two
with masked loads and stores (`_Columns`).

`impl='xla'` computes the same function with jnp (the reference; any backend); `impl='pallas'`
runs the Triton kernels (NVIDIA GPUs; `interpret=True` runs them on any backend, for tests).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

IMPLS = ('xla', 'pallas')


class Launch(NamedTuple):
  """A kernel's launch shape: each program takes up to max_block_rows rows (a power of two
  dividing the rows), walks them tile_rows at a time, and keeps the column sums of its rows in
  registers; num_warps warps a program; num_stages Triton's software-pipelining stages of the
  walk (1: none)."""
  tile_rows: int
  max_block_rows: int
  num_warps: int
  num_stages: int = 1


def block_rows(rows: int, max_block_rows: int) -> int:
  """Rows per kernel program: a power of two dividing rows, up to max_block_rows."""
  block = 1
  while block * 2 <= max_block_rows and rows % (block * 2) == 0:
    block *= 2
  return block


# Launch shapes of the kernels. The backward's 2 rows a step and 32 a program took 0.67-0.85 ms
# off BERT-Large's step at 512 on an H200, against 1:16:4; its 2 pipelining stages 0.16-0.23 ms
# more (docs/performance.md). Those stages apply to widths that are powers of two: at Base's 768
# columns, read as 1,024 under a mask, they were the slowest shape alone (backward_launch).
FORWARD = Launch(tile_rows=1, max_block_rows=16, num_warps=4)
BACKWARD = Launch(tile_rows=2, max_block_rows=32, num_warps=4, num_stages=2)
DRAW_BITS = 16
DRAW_RANGE = 1 << DRAW_BITS


def backward_launch(embed: int) -> Launch:
  """BACKWARD for rows of `embed` columns: one pipelining stage where embed is not a power of
  two (its tiles are masked), BACKWARD's own stages where it is."""
  masked = embed != pl.next_power_of_2(embed)
  return BACKWARD._replace(num_stages=1) if masked else BACKWARD


def dropout_threshold(rate: float) -> int:
  """16-bit draws below this are dropped: rate * 65536, rounded."""
  return int(round(rate * DRAW_RANGE))


def keep_scale(threshold: int) -> float:
  """1 / P(keep) for a threshold: the scale of the kept values (0 when every value drops)."""
  return 0.0 if threshold >= DRAW_RANGE else DRAW_RANGE / (DRAW_RANGE - threshold)


def row_keys(rng, rows: int) -> jax.Array:
  """One uint32 dropout key per row: [rows]."""
  return jax.random.bits(rng, (rows,), jnp.uint32)


# mix's steps: x ^= x >> shift, then x *= factor (none after the last shift).
MIX_STEPS = ((16, 0x7FEB352D), (15, 0x846CA68B), (16, None))


def mix(x):
  """A 32-bit integer finaliser (xor-shift-multiply; Wellons' lowbias32): uint32 -> uint32."""
  for shift, factor in MIX_STEPS:
    x = x ^ (x >> shift)
    x = x if factor is None else x * jnp.uint32(factor)
  return x


SPREAD = 0x9E3779B9  # Odd (2^32 / golden ratio): spreads the pair index over all 32 bits.


def pair_draws(keys, pairs):
  """mix(key ^ (pair * SPREAD)): the 16-bit draws of values 2 * pair (low half) and
  2 * pair + 1 (high half); keys and pairs broadcast (uint32). fused_attention draws the same
  way."""
  return mix(keys ^ (pairs * jnp.uint32(SPREAD)))


def value_draws(keys, index):
  """The 16-bit draw of value `index` (uint32; broadcasts with keys): the low or high half of
  pair_draws(key, index // 2). The jnp statement of what the kernels draw."""
  return (pair_draws(keys, index // 2) >> (16 * (index % 2))) & jnp.uint32(DRAW_RANGE - 1)


def split_pairs(hashed):
  """[..., n] pair hashes -> [..., 2n] draws in a kernel: value 2c gets the low half of hash c,
  2c + 1 the high half (value_draws' order; Triton concatenates only along a new minor axis)."""
  halves = (hashed & jnp.uint32(DRAW_RANGE - 1), hashed >> 16)
  joined = jnp.concatenate([h[..., None] for h in halves], axis=-1)
  return joined.reshape(hashed.shape[:-1] + (2 * hashed.shape[-1],))


def keep_mask(keys, embed: int, threshold: int):
  """bool [rows, embed]: True where a value's 16-bit draw is at least the threshold (kept);
  keys: row_keys(rng, rows). What the kernels decide."""
  columns = jnp.arange(embed, dtype=jnp.uint32)[None, :]
  return value_draws(keys[:, None], columns) >= threshold


def reference(y, bias, residual, keys, scale, offset, *, rate: float, eps: float):
  """The function, in jnp. y, residual: [rows, embed]; keys: row_keys(rng, rows), or None."""
  z = y.astype(jnp.float32) + bias.astype(jnp.float32)
  if keys is not None:
    threshold = dropout_threshold(rate)
    z = jnp.where(keep_mask(keys, y.shape[-1], threshold), z * keep_scale(threshold), 0.0)
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

  def keep(self, keys_ref, first_row, tile, threshold):  # -> bool [tile, width]
    """keep_mask of the rows: one hash per pair of values."""
    keys = keys_ref[pl.ds(first_row, tile)][:, None]
    pairs = jax.lax.broadcasted_iota(jnp.uint32, (tile, self.width // 2), 1)
    return split_pairs(pair_draws(keys, pairs)) >= jnp.uint32(threshold)

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


def _forward_kernel(*refs, threshold: int, eps: float, has_keys: bool, tile: int):
  if has_keys:
    y_ref, bias_ref, res_ref, keys_ref, scale_ref, offset_ref = refs[:6]
  else:
    (y_ref, bias_ref, res_ref, scale_ref, offset_ref), keys_ref = refs[:5], None
  out_ref, z_ref, mean_ref, rstd_ref = refs[-4:]
  cols = _Columns(bias_ref.shape[0])
  bias, scale, offset = (cols.load_vector(r) for r in (bias_ref, scale_ref, offset_ref))

  def body(step, carry):
    first = step * tile
    z = cols.load_rows(y_ref, first, tile).astype(jnp.float32) + bias  # [tile, width]
    if has_keys:
      keep = cols.keep(keys_ref, first, tile, threshold)
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


def _backward_kernel(*refs, threshold: int, has_keys: bool, tile: int):
  if has_keys:
    dout_ref, z_ref, keys_ref, mean_ref, rstd_ref, scale_ref = refs[:6]
  else:
    (dout_ref, z_ref, mean_ref, rstd_ref, scale_ref), keys_ref = refs[:5], None
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
    if has_keys:
      keep = cols.keep(keys_ref, first, tile, threshold)
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


def lowered_once(*, static_argnums: tuple[int, ...] = (), static_argnames: tuple[str, ...] = ()):
  """Decorator for a kernel's launcher: fn under jax.jit with its settings static, so that the
  layers of a model calling it with the same shapes and settings share one trace and one
  lowering of the kernel (each layer a call of it, which XLA inlines) instead of one each.
  BERT-Large's train step at 512 traces and lowers for CUDA in about 4 s instead of 30-36 on 2
  CPU cores, its module 4.0 MB instead of 28.6.

  The cache key is the arguments' shapes and dtypes and the static settings: a kernel's choices
  come from those, not from module globals. Whatever else a trace reads from outside its
  arguments is cached with it: a test that patches such a thing (a compiler parameter, an
  interpreter setting) first clears jax's caches (jax.clear_caches)."""
  def wrap(fn):
    def launch(*args, **kwargs):
      return fn(*args, **kwargs)
    launch.__name__ = launch.__qualname__ = getattr(fn, '__name__', 'kernel')
    jitted = jax.jit(launch, static_argnums=static_argnums, static_argnames=static_argnames)

    @functools.wraps(fn)
    def call(*args, **kwargs):
      return jitted(*args, **kwargs)
    return call
  return wrap


def power_of_two(n: int) -> bool:
  """Whether n is a power of two (Triton's block sizes are)."""
  return n > 0 and n & (n - 1) == 0


def compiler_params(interpret: bool, num_warps: int, num_stages: int = 1):
  """Compiler params of this package's Pallas/Triton kernels (num_stages 1: no loads to
  pipeline across loop steps); None when interpreted."""
  return None if interpret else plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _block_specs(rows: int, embed: int, launch: Launch):
  """Rows per program and the BlockSpecs of a kernel: row tiles, [embed] vectors, per-row
  values (statistics, dropout keys)."""
  block = block_rows(rows, launch.max_block_rows)
  return (block, pl.BlockSpec((block, embed), lambda i: (i, 0)),
          pl.BlockSpec((embed,), lambda i: (0,)), pl.BlockSpec((block,), lambda i: (i,)))


def _pallas_forward(y, bias, residual, keys, scale, offset, rate, eps, interpret, launches):
  rows, embed = y.shape
  launch = launches[0]
  block, tile, vector, per_row = _block_specs(rows, embed, launch)
  inputs = [y, bias, residual] + ([keys] if keys is not None else []) + [scale, offset]
  in_specs = [tile, vector, tile] + ([per_row] if keys is not None else []) + [vector, vector]
  kernel = functools.partial(_forward_kernel, threshold=dropout_threshold(rate), eps=eps,
                             has_keys=keys is not None, tile=min(block, launch.tile_rows))
  out, z, mean, rstd = pl.pallas_call(
      kernel, grid=(rows // block,), in_specs=in_specs,
      out_specs=[tile, tile, per_row, per_row],
      out_shape=[jax.ShapeDtypeStruct((rows, embed), y.dtype),
                 jax.ShapeDtypeStruct((rows, embed), y.dtype),
                 jax.ShapeDtypeStruct((rows,), jnp.float32),
                 jax.ShapeDtypeStruct((rows,), jnp.float32)],
      compiler_params=compiler_params(interpret, launch.num_warps, launch.num_stages),
      interpret=interpret, name='dropout_add_layer_norm_fwd')(*inputs)
  # residual's dtype travels as an empty array (residuals must be arrays).
  return out, (z, keys, mean, rstd, scale, bias, offset, jnp.zeros((0,), residual.dtype))


def _pallas_backward(rate, eps, interpret, launches, saved, dout):
  del eps
  z, keys, mean, rstd, scale, bias, offset, residual_like = saved
  rows, embed = z.shape
  launch = launches[1]
  block, tile, vector, per_row = _block_specs(rows, embed, launch)
  blocks = rows // block
  partial = pl.BlockSpec((None, embed), lambda i: (i, 0))
  inputs = [dout, z] + ([keys] if keys is not None else []) + [mean, rstd, scale]
  in_specs = [tile, tile] + ([per_row] if keys is not None else []) + [per_row, per_row, vector]
  kernel = functools.partial(_backward_kernel, threshold=dropout_threshold(rate),
                             has_keys=keys is not None, tile=min(block, launch.tile_rows))
  partial_shape = jax.ShapeDtypeStruct((blocks, embed), jnp.float32)
  dres, dy, dscale, doffset, dbias = pl.pallas_call(
      kernel, grid=(blocks,), in_specs=in_specs,
      out_specs=[tile, tile, partial, partial, partial],
      out_shape=[jax.ShapeDtypeStruct((rows, embed), residual_like.dtype),
                 jax.ShapeDtypeStruct((rows, embed), z.dtype),
                 partial_shape, partial_shape, partial_shape],
      compiler_params=compiler_params(interpret, launch.num_warps, launch.num_stages),
      interpret=interpret, name='dropout_add_layer_norm_bwd')(*inputs)
  sums = lambda p, like: jnp.sum(p, axis=0).astype(like.dtype)  # noqa: E731
  return dy, sums(dbias, bias), dres, None, sums(dscale, scale), sums(doffset, offset)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def _pallas_vjp(y, bias, residual, keys, scale, offset, rate, eps, interpret, launches):
  return _pallas_forward(y, bias, residual, keys, scale, offset, rate, eps, interpret,
                         launches)[0]


def _pallas_fwd(y, bias, residual, keys, scale, offset, rate, eps, interpret, launches):
  return _pallas_forward(y, bias, residual, keys, scale, offset, rate, eps, interpret, launches)


_pallas_vjp.defvjp(_pallas_fwd, _pallas_backward)
_pallas = lowered_once(static_argnums=(6, 7, 8, 9))(_pallas_vjp)


def dropout_add_layer_norm(y, bias, residual, keys, scale, offset, *, rate: float, eps: float,
                           impl: str = 'xla', interpret: bool = False,
                           num_warps: int | None = None):
  """LayerNorm(dropout(y + bias) + residual) * scale + offset over the last axis.

  y, residual: [..., embed] (y the dense output before its bias); bias, scale, offset: [embed];
  keys: the dropout keys, row_keys(rng, rows) with rows = y.size // embed, or None (no dropout);
  rate: the dropout rate (dropout_threshold says how it is quantised). The kernels launch as
  FORWARD and backward_launch(embed) say; num_warps, when given, replaces both's warps.
  Returns [..., embed] in y's dtype.
  """
  if impl not in IMPLS:
    raise ValueError(f'impl={impl!r}; valid: {IMPLS}')
  shape = y.shape
  rows = y.size // shape[-1]
  if keys is not None and (keys.shape != (rows,) or keys.dtype != jnp.uint32):
    raise ValueError(f'keys must be row_keys(rng, {rows}): uint32 {(rows,)}; got {keys.dtype} '
                     f'{keys.shape}.')
  flat = lambda a: a.reshape(-1, shape[-1])  # noqa: E731
  if impl == 'xla':
    out = reference(flat(y), bias, flat(residual), keys, scale, offset, rate=rate, eps=eps)
  else:
    launches = (FORWARD, backward_launch(shape[-1]))
    if num_warps:
      launches = tuple(launch._replace(num_warps=int(num_warps)) for launch in launches)
    out = _pallas(flat(y), bias, flat(residual), keys, scale, offset, float(rate), float(eps),
                  bool(interpret), tuple(Launch(*map(int, launch)) for launch in launches))
  return out.reshape(shape)

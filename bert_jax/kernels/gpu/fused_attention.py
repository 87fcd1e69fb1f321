"""Attention with dropout in the kernel, over rows of up to 512 tokens (Pallas Triton; NVIDIA
GPUs).

Rows of up to 128 tokens (MAX_LENGTH): one program per (row, head). Every query of a row sees all
its keys in one [128, 128] tile, so one program does the whole softmax, and the backward one
program per (row, head) as well: no running maxima, no dQ accumulator in float32, no separate
pass for rowsum(dO * O) (cuDNN's flash backward spends about a third of its time on those two at
this length).

  forward   reads q, k, v, the segment ids; writes o and the log-sum-exp of each query's scores
  backward  reads q, k, v, o, dO, the log-sum-exp; recomputes the probabilities and the dropout
            mask; writes dq, dk, dv and their sums over the tile's tokens

Longer rows (256 and 512, BERT's phase 2): flash attention (`LongBlocks`). The forward runs one
program per block of 128 queries, a running softmax over blocks of 64 keys; the backward one
program per block of 64 keys and as many queries: dK, dV of its keys stepping over every query,
then dQ of its queries stepping over every key (the probabilities recomputed in both, which costs
two matmuls of the seven, but needs no float32 dQ accumulator: Triton's atomic adds were slower).
`LongBlocks(backward='mosaic')` (`MOSAIC_LONG_BLOCKS`) runs that backward as
bert_jax.kernels.gpu.flash_backward's Mosaic GPU kernel instead (Hopper GPUs, 16-bit), and
`short_backward='mosaic'` (flash_backward.row_backward, one block per row and head holding the
whole row, nothing recomputed) the backward of rows of 64 or 128, with the same masks and draws;
both are faster than the Triton backwards on Hopper (docs/performance.md has the timings).

q, k and v come as one array [batch, length, 3, heads, head_dim], the output of one matmul
(`attention_qkv`, what the model uses): its bias is added in that matmul's epilogue, and the
backward writes the three gradients into one array of the same layout, for the matmuls of the
input and weight gradients to take whole, and the bias gradient from the kernel's sums (no add of
three input gradients, no concatenation, no reduction pass over them).

Masking: a query attends to the keys of its own segment (`segment_ids`: the input mask for plain
rows, 1 real / 0 padding; the pair ids for packed rows). Padding tokens attend among themselves;
nothing reads their outputs.

Dropout of the attention probabilities: JAX draws one 32-bit key per (row, head) (`tile_keys`);
the kernel hashes each pair of neighbouring keys once, as fused_norm hashes pairs of values
(`fused_norm.pair_draws` of pair index query * length / 2 + c), and the low and high 16 bits are
the draws of keys 2c and 2c + 1; a probability is kept when its draw is at least
`dropout_threshold(rate)` = round(rate * 2^16) (0.1 becomes 0.100006) and kept probabilities are
scaled by 1/P(keep). One hash serves two draws, half the hashing of a 32-bit draw each. The
backward recomputes the same draws. `reference` is the
same function in jnp (the test oracle).

`impl='xla'` runs `reference`; `impl='pallas'` the kernels (`interpret=True` runs them anywhere,
for tests).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from bert_jax.kernels.gpu import fused_norm

IMPLS = ('xla', 'pallas')
MAX_LENGTH = 128  # Longest row one program holds (its scores are a [length, length] f32 tile).
MAX_LONG_LENGTH = 512  # Longest row the flash kernels take (BERT's position table).
NUM_WARPS = 8  # Warps of the short backward (and of the forward when num_warps is given).
# Warps of the short forward by default: 0.115 -> 0.084 ms a Large layer with dropout against 8
# warps on an H100; the backward needs 8 (4: 0.93 ms fwd+bwd).
FORWARD_WARPS = 4
_MASKED = -1e30  # Score of a key outside the query's segment (exp underflows to 0).
# The kernels' softmax is in base 2 (exp2 is one instruction; Pallas lowers exp to libdevice's
# expf): scores times log2(e), and the saved log-sum-exp is log2 of the sum.
_LOG2E = 1.4426950408889634


def supported(length: int, head_dim: int) -> bool:
  """Row lengths and head sizes the kernels take: powers of two, length 16..MAX_LONG_LENGTH (the
  one-program kernels up to MAX_LENGTH, the flash kernels above), head 16..128."""
  return (fused_norm.power_of_two(length) and 16 <= length <= MAX_LONG_LENGTH
          and fused_norm.power_of_two(head_dim) and 16 <= head_dim <= 128)


# A probability is dropped when its 16-bit draw is below round(rate * 2^16); kept ones are scaled
# by 1 / P(keep) (0 when every one drops): fused_norm's quantisation and draw width.
dropout_threshold = fused_norm.dropout_threshold
keep_scale = fused_norm.keep_scale


def tile_keys(rng, batch: int, heads: int) -> jax.Array:
  """One uint32 dropout key per (row, head): [batch, heads, 1]."""
  return jax.random.bits(rng, (batch, heads, 1), jnp.uint32)


def keep_mask(keys, length: int, threshold: int):
  """[batch, heads, length, length] keep mask of all tiles (jnp; what the kernels draw): each
  probability's 16-bit draw is fused_norm.value_draws of its index query * length + key_index in
  the tile."""
  queries = jnp.arange(length, dtype=jnp.uint32)[:, None]
  key_index = jnp.arange(length, dtype=jnp.uint32)[None, :]
  draws = fused_norm.value_draws(keys[..., None], queries * length + key_index)
  return draws >= jnp.uint32(threshold)


def reference(q, k, v, segment_ids, keys, *, rate: float):
  """The function of the kernels in jnp. q, k, v: [batch, length, heads, head_dim];
  segment_ids: [batch, length] int32; keys: tile_keys(...) or None (no dropout)."""
  length, head_dim = q.shape[1], q.shape[3]
  scores = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
  scores = scores * (1.0 / head_dim ** 0.5)
  same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
  probs = jax.nn.softmax(jnp.where(same, scores, _MASKED), axis=-1)
  threshold = dropout_threshold(rate)
  if keys is not None and keep_scale(threshold) == 0:  # Everything dropped.
    probs = jnp.zeros_like(probs)
  elif keys is not None and threshold > 0:
    keep = keep_mask(keys, length, threshold)
    probs = jnp.where(keep, probs * keep_scale(threshold), 0.0)
  return jnp.einsum('bhqk,bkhd->bqhd', probs.astype(v.dtype), v,
                    preferred_element_type=jnp.float32).astype(q.dtype)


def _dot(a, b, trans_a: bool = False, trans_b: bool = False):
  """a @ b (optionally transposed operands) accumulated in float32, as the kernels' Triton dot."""
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _scores(q, k, seg, scale, seg_k=None):
  """Masked, scaled scores [queries, keys] in float32, times log2(e), for exp2 (seg_k: the keys'
  segment ids, when they are not the queries')."""
  s = _dot(q, k, trans_b=True) * (scale * _LOG2E)
  return jnp.where(seg[:, None] == (seg if seg_k is None else seg_k)[None, :], s, _MASKED)


def _tile_keep(keys_ref, length: int, threshold: int, first_query=0, first_key=0,
               shape=None):
  """keep_mask of queries first_query.. and keys first_key.. of this program's (row, head),
  [queries, keys] (shape; the whole [length, length] by default): one hash per pair of keys."""
  queries, keys = shape or (length, length)
  key = keys_ref[...].reshape(1, 1)
  pairs = (queries, keys // 2)
  query = jax.lax.broadcasted_iota(jnp.uint32, pairs, 0) + jnp.asarray(first_query, jnp.uint32)
  pair = jax.lax.broadcasted_iota(jnp.uint32, pairs, 1) + jnp.asarray(first_key // 2, jnp.uint32)
  hashed = fused_norm.pair_draws(key, query * (length // 2) + pair)
  return fused_norm.split_pairs(hashed) >= jnp.uint32(threshold)


def _delta(do, o):
  """rowsum(dP * P) = rowsum(dO * O) (O = dropped probabilities @ v), [queries] float32."""
  return jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=1)


def _tile_grads(p, dp, delta, keep, threshold: int, dtype):
  """ds (the gradient of the scores before their scale) and the dropped probabilities of a tile
  [queries, keys], both in dtype, from its probabilities p, dp = dO @ v^T (the gradient of the
  dropped probabilities) and delta; keep: the tile's keep mask (threshold > 0)."""
  if threshold:
    factor = keep_scale(threshold)
    dropped = jnp.where(keep, p * factor, 0.0)
    dp = jnp.where(keep, dp * factor, 0.0)
  else:
    dropped = p
  return (p * (dp - delta[:, None])).astype(dtype), dropped.astype(dtype)


def _forward_kernel(*refs, scale: float, threshold: int, length: int):
  if threshold:
    keys_ref, seg_ref, q_ref, k_ref, v_ref, o_ref, lse_ref = refs
  else:
    seg_ref, q_ref, k_ref, v_ref, o_ref, lse_ref = refs
  s = _scores(q_ref[...], k_ref[...], seg_ref[...], scale)  # [length, length]
  m = jnp.max(s, axis=1)
  p = jnp.exp2(s - m[:, None])
  l = jnp.sum(p, axis=1)
  norm = 1.0 / l
  if threshold:
    p = jnp.where(_tile_keep(keys_ref, length, threshold), p, 0.0)
    norm = norm * keep_scale(threshold)
  v = v_ref[...]
  o = _dot(p.astype(v.dtype), v) * norm[:, None]
  o_ref[...] = o.astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log2(l)


def _backward_kernel(*refs, scale: float, threshold: int, length: int):
  if threshold:
    keys_ref, *refs = refs
  seg_ref, q_ref, k_ref, v_ref, o_ref, do_ref, lse_ref, dqkv_ref, *sum_refs = refs
  row, head = pl.program_id(0), pl.program_id(1)

  def store(part, value):  # value: [length, head_dim] float32, the gradient of q, k or v
    dqkv_ref[row, :, part, head, :] = value.astype(dqkv_ref.dtype)
    sum_refs[part][...] = jnp.sum(value, axis=0)
  q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
  p = jnp.exp2(_scores(q, k, seg_ref[...], scale) - lse_ref[...][:, None])  # [length, length]
  keep = _tile_keep(keys_ref, length, threshold) if threshold else None
  ds, dropped = _tile_grads(p, _dot(do, v, trans_b=True), _delta(do, o_ref[...]), keep,
                            threshold, q.dtype)
  store(2, _dot(dropped, do, trans_a=True))
  store(0, _dot(ds, k) * scale)
  store(1, _dot(ds, q, trans_a=True) * scale)


def _specs(length: int, head_dim: int, has_keys: bool):
  """BlockSpecs of whole rows over grid (batch, heads, ...): keys, segment ids, the q / k / v
  tiles [length, head_dim] of one head in qkv [batch, length, 3, heads, head_dim], a head tile of
  [batch, length, heads, head_dim] (o, dO), the log-sum-exps, a per-(row, head) vector
  [head_dim]."""
  part = lambda j: pl.BlockSpec((None, length, None, None, head_dim),  # noqa: E731
                                lambda b, h, *_: (b, 0, j, h, 0))
  head = pl.BlockSpec((None, length, None, head_dim), lambda b, h, *_: (b, 0, h, 0))
  seg = pl.BlockSpec((None, length), lambda b, h, *_: (b, 0))
  keys = [pl.BlockSpec((None, None, 1), lambda b, h, *_: (b, h, 0))] if has_keys else []
  lse = pl.BlockSpec((None, None, length), lambda b, h, *_: (b, h, 0))
  vector = pl.BlockSpec((None, None, head_dim), lambda b, h: (b, h, 0))
  return keys, seg, [part(0), part(1), part(2)], head, lse, vector


def _pallas_forward(qkv, segment_ids, keys, threshold, interpret, num_warps):
  batch, length, _, heads, head_dim = qkv.shape
  key_specs, seg, parts, head, lse, _ = _specs(length, head_dim, bool(threshold))
  kernel = functools.partial(_forward_kernel, scale=1.0 / head_dim ** 0.5, threshold=threshold,
                             length=length)
  return pl.pallas_call(
      kernel, grid=(batch, heads), in_specs=[*key_specs, seg, *parts],
      out_specs=[head, lse],
      out_shape=[jax.ShapeDtypeStruct((batch, length, heads, head_dim), qkv.dtype),
                 jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
      compiler_params=fused_norm.compiler_params(interpret, num_warps),
      interpret=interpret, name='short_attention_fwd',
  )(*([keys] if threshold else []), segment_ids, qkv, qkv, qkv)


def _pallas_backward(qkv, segment_ids, keys, o, lse_value, do, threshold, interpret,
                     num_warps):
  """dqkv [batch, length, 3, heads, head_dim] and the column sums of dq, dk, dv per (row, head),
  three float32 [batch, heads, head_dim] (the bias gradients before the sum over rows)."""
  batch, length, _, heads, head_dim = qkv.shape
  key_specs, seg, parts, head, lse, vector = _specs(length, head_dim, bool(threshold))
  kernel = functools.partial(_backward_kernel, scale=1.0 / head_dim ** 0.5, threshold=threshold,
                             length=length)
  sums = jax.ShapeDtypeStruct((batch, heads, head_dim), jnp.float32)
  return pl.pallas_call(
      kernel, grid=(batch, heads), in_specs=[*key_specs, seg, *parts, head, head, lse],
      # dqkv is written whole-array: one program writes its head's three tiles.
      out_specs=[pl.BlockSpec(memory_space=pl.ANY), vector, vector, vector],
      out_shape=[jax.ShapeDtypeStruct(qkv.shape, qkv.dtype), sums, sums, sums],
      compiler_params=fused_norm.compiler_params(interpret, num_warps),
      interpret=interpret, name='short_attention_bwd',
  )(*([keys] if threshold else []), segment_ids, qkv, qkv, qkv, o, do, lse_value)


class LongBlocks(NamedTuple):
  """Tiling of the kernels for rows longer than MAX_LENGTH (flash attention: running softmax
  over key blocks). forward: programs of `forward_queries` queries, steps of `forward_keys` keys;
  backward: each program takes `backward_block` keys (their dK, dV, stepping over the queries)
  and as many queries (their dQ, stepping over the keys), `backward_step` at a time.
  `backward`: 'triton' (the Pallas Triton kernel below) or 'mosaic'
  (bert_jax.kernels.gpu.flash_backward: Hopper's wgmma; one warpgroup of `backward_block` keys
  per 4 of `backward_warps`, `stages` steps of operands in flight)."""
  forward_queries: int = 128
  forward_keys: int = 64
  backward_block: int = 64
  backward_step: int = 64
  forward_warps: int = 8
  backward_warps: int = 4
  stages: int = 3
  backward: str = 'triton'


LONG_BLOCKS = LongBlocks()
# The Mosaic GPU backward's tiling: two compute warpgroups of 64 keys, steps of 64.
MOSAIC_LONG_BLOCKS = LONG_BLOCKS._replace(backward_warps=8, backward='mosaic')
# The kernels of each backward (attention_qkv's short_backward, LongBlocks.backward): Pallas
# Triton, or Pallas Mosaic GPU (bert_jax.kernels.gpu.flash_backward: Hopper's wgmma;
# row_backward for rows up to MAX_LENGTH, backward for longer ones).
KERNELS = ('triton', 'mosaic')


def long_blocks(backward: str) -> LongBlocks:
  """The tiling of rows over MAX_LENGTH with this backward (KERNELS)."""
  if backward not in KERNELS:
    raise ValueError(f'backward={backward!r}; valid: {KERNELS}')
  return MOSAIC_LONG_BLOCKS if backward == 'mosaic' else LONG_BLOCKS


def _long_forward_kernel(*refs, scale: float, threshold: int, length: int, block_keys: int):
  if threshold:
    keys_ref, *refs = refs
  seg_q_ref, seg_ref, q_ref, k_ref, v_ref, o_ref, lse_ref = refs
  block_queries = q_ref.shape[0]
  first_query = pl.program_id(2) * block_queries
  q, seg_q = q_ref[...], seg_q_ref[...]

  def step(j, carry):  # Keys first_key.. of the row: the running max, sum and output.
    m, l, acc = carry
    first_key = j * block_keys
    keys = pl.ds(first_key, block_keys)
    s = _scores(q, k_ref[keys, :], seg_q, scale, seg_ref[keys])  # [queries, keys]
    m_next = jnp.maximum(m, jnp.max(s, axis=1))
    rescale = jnp.exp2(m - m_next)
    p = jnp.exp2(s - m_next[:, None])
    l = l * rescale + jnp.sum(p, axis=1)
    if threshold:
      keep = _tile_keep(keys_ref, length, threshold, first_query, first_key, p.shape)
      p = jnp.where(keep, p, 0.0)
    v = v_ref[keys, :]
    acc = acc * rescale[:, None] + _dot(p.astype(v.dtype), v)
    return m_next, l, acc

  rows = (block_queries,)
  m, l, acc = jax.lax.fori_loop(
      0, length // block_keys, step,
      (jnp.full(rows, _MASKED, jnp.float32), jnp.zeros(rows, jnp.float32),
       jnp.zeros(q.shape, jnp.float32)))
  norm = (keep_scale(threshold) if threshold else 1.0) / l
  o_ref[...] = (acc * norm[:, None]).astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log2(l)


def _long_backward_kernel(*refs, scale: float, threshold: int, length: int, block: int,
                          step_size: int):
  """Program j: dK, dV of keys j * block.. (stepping over all queries), then dQ of queries
  j * block.. (stepping over all keys); the probabilities recomputed in both."""
  if threshold:
    keys_ref, *refs = refs
  seg_ref, q_ref, k_ref, v_ref, o_ref, do_ref, lse_ref, dqkv_ref, *sum_refs = refs
  row, head, first = pl.program_id(0), pl.program_id(1), pl.program_id(2) * block
  mine = pl.ds(first, block)

  def store(part, value):  # value: [block, head_dim] float32, rows first.. of dq, dk or dv
    dqkv_ref[row, mine, part, head, :] = value.astype(dqkv_ref.dtype)
    sum_refs[part][...] = jnp.sum(value, axis=0)

  def tile_grads(q, k, v, do, queries, keys, lse, delta, first_query, first_key):
    """ds and the dropped probabilities of queries x keys (pl.ds each), [queries, keys]."""
    p = jnp.exp2(_scores(q, k, seg_ref[queries], scale, seg_ref[keys]) - lse[:, None])
    keep = None
    if threshold:
      keep = _tile_keep(keys_ref, length, threshold, first_query, first_key, p.shape)
    return _tile_grads(p, _dot(do, v, trans_b=True), delta, keep, threshold, q.dtype)

  # dK, dV of my keys.
  k, v = k_ref[mine, :], v_ref[mine, :]

  def key_step(i, carry):
    dk, dv = carry
    first_query = i * step_size
    queries = pl.ds(first_query, step_size)
    q, do = q_ref[queries, :], do_ref[queries, :]
    ds, dropped = tile_grads(q, k, v, do, queries, mine, lse_ref[queries],
                             _delta(do, o_ref[queries, :]), first_query, first)
    return dk + _dot(ds, q, trans_a=True), dv + _dot(dropped, do, trans_a=True)

  zeros = jnp.zeros((block, q_ref.shape[1]), jnp.float32)
  dk, dv = jax.lax.fori_loop(0, length // step_size, key_step, (zeros, zeros))
  store(1, dk * scale)
  store(2, dv)

  # dQ of my queries.
  q, do, lse = q_ref[mine, :], do_ref[mine, :], lse_ref[mine]
  delta = _delta(do, o_ref[mine, :])

  def query_step(i, dq):
    first_key = i * step_size
    keys = pl.ds(first_key, step_size)
    k = k_ref[keys, :]
    ds, _ = tile_grads(q, k, v_ref[keys, :], do, mine, keys, lse, delta, first, first_key)
    return dq + _dot(ds, k)

  store(0, jax.lax.fori_loop(0, length // step_size, query_step, zeros) * scale)


def _long_forward(qkv, segment_ids, keys, threshold, interpret, blocks: LongBlocks):
  """(o [batch, length, heads, head_dim], the base-2 log-sum-exp [batch, heads, length])."""
  batch, length, _, heads, head_dim = qkv.shape
  bq = blocks.forward_queries
  key_specs, seg, parts, _, _, _ = _specs(length, head_dim, bool(threshold))
  kernel = functools.partial(_long_forward_kernel, scale=1.0 / head_dim ** 0.5,
                             threshold=threshold, length=length, block_keys=blocks.forward_keys)
  return pl.pallas_call(
      kernel, grid=(batch, heads, length // bq),
      in_specs=[*key_specs, pl.BlockSpec((None, bq), lambda b, h, i: (b, i)), seg,
                pl.BlockSpec((None, bq, None, None, head_dim), lambda b, h, i: (b, i, 0, h, 0)),
                *parts[1:]],
      out_specs=[pl.BlockSpec((None, bq, None, head_dim), lambda b, h, i: (b, i, h, 0)),
                 pl.BlockSpec((None, None, bq), lambda b, h, i: (b, h, i))],
      out_shape=[jax.ShapeDtypeStruct((batch, length, heads, head_dim), qkv.dtype),
                 jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
      compiler_params=fused_norm.compiler_params(interpret, blocks.forward_warps, blocks.stages),
      interpret=interpret, name='long_attention_fwd',
  )(*([keys] if threshold else []), segment_ids, segment_ids, qkv, qkv, qkv)


def _mosaic_tiles(blocks: LongBlocks):
  from bert_jax.kernels.gpu import flash_backward  # pylint: disable=g-import-not-at-top
  return flash_backward.Tiles(block=blocks.backward_block, step=blocks.backward_step,
                              warpgroups=blocks.backward_warps // 4, stages=blocks.stages)


def _mosaic_backward(qkv, segment_ids, keys, o, lse_value, do, threshold, interpret, tiles):
  """As _long_backward by bert_jax.kernels.gpu.flash_backward's kernel (tiles: its Tiles),
  rowsum(dO * O) by XLA, once per query; or by its row_backward (tiles None), which computes
  that itself; the column sums [batch, heads, blocks, head_dim] of dq, dk, dv as stored
  (16-bit)."""
  from bert_jax.kernels.gpu import flash_backward  # pylint: disable=g-import-not-at-top
  if tiles is None:
    dqkv, sums = flash_backward.row_backward(qkv, segment_ids, keys, lse_value, o, do,
                                             threshold=threshold, interpret=interpret)
  else:
    delta = jnp.einsum('bqhd,bqhd->bhq', o.astype(jnp.float32), do.astype(jnp.float32))
    dqkv, sums = flash_backward.backward(qkv, segment_ids, keys, lse_value, delta, do,
                                         threshold=threshold, tiles=tiles, interpret=interpret)
  return (dqkv, *(sums[:, :, :, j] for j in range(3)))


def _long_backward(qkv, segment_ids, keys, o, lse_value, do, threshold, interpret,
                   blocks: LongBlocks):
  """As _pallas_backward; the column sums come per block of tokens [batch, heads, blocks,
  head_dim]."""
  if blocks.backward == 'mosaic':
    return _mosaic_backward(qkv, segment_ids, keys, o, lse_value, do, threshold, interpret,
                            _mosaic_tiles(blocks))
  batch, length, _, heads, head_dim = qkv.shape
  block = blocks.backward_block
  key_specs, seg, parts, head, lse, _ = _specs(length, head_dim, bool(threshold))
  vector = pl.BlockSpec((None, None, None, head_dim), lambda b, h, i: (b, h, i, 0))
  sums = jax.ShapeDtypeStruct((batch, heads, length // block, head_dim), jnp.float32)
  kernel = functools.partial(_long_backward_kernel, scale=1.0 / head_dim ** 0.5,
                             threshold=threshold, length=length, block=block,
                             step_size=blocks.backward_step)
  return pl.pallas_call(
      kernel, grid=(batch, heads, length // block),
      in_specs=[*key_specs, seg, *parts, head, head, lse],
      # dqkv is written whole-array: each program writes its block of three tiles.
      out_specs=[pl.BlockSpec(memory_space=pl.ANY), vector, vector, vector],
      out_shape=[jax.ShapeDtypeStruct(qkv.shape, qkv.dtype), sums, sums, sums],
      compiler_params=fused_norm.compiler_params(interpret, blocks.backward_warps, blocks.stages),
      interpret=interpret, name='long_attention_bwd',
  )(*([keys] if threshold else []), segment_ids, qkv, qkv, qkv, o, do, lse_value)


def _add_bias(qkv, bias):
  """qkv + bias as the 2-d add XLA folds into the projection's matmul epilogue."""
  if bias is None:
    return qkv
  flat = qkv.reshape(-1, bias.size) + bias.reshape(-1).astype(qkv.dtype)
  return flat.reshape(qkv.shape)


def _pallas_fwd(qkv, bias, segment_ids, keys, threshold, interpret, warps, blocks,
                short_backward):
  del short_backward
  qkv = _add_bias(qkv, bias)
  if qkv.shape[1] > MAX_LENGTH:
    o, lse_value = _long_forward(qkv, segment_ids, keys, threshold, interpret, blocks)
  else:
    o, lse_value = _pallas_forward(qkv, segment_ids, keys, threshold, interpret, warps[0])
  return o, (qkv, bias, segment_ids, keys, o, lse_value)


def _pallas_bwd(threshold, interpret, warps, blocks, short_backward, saved, do):
  qkv, bias, segment_ids, keys, o, lse_value = saved
  length = qkv.shape[1]
  if length > MAX_LENGTH:
    dqkv, *sums = _long_backward(qkv, segment_ids, keys, o, lse_value, do, threshold,
                                 interpret, blocks)
  elif short_backward == 'mosaic':
    dqkv, *sums = _mosaic_backward(qkv, segment_ids, keys, o, lse_value, do, threshold,
                                   interpret, None)
  else:
    dqkv, *sums = _pallas_backward(qkv, segment_ids, keys, o, lse_value, do, threshold,
                                   interpret, warps[1])
  dbias = None
  if bias is not None:  # [3, heads, head_dim]: the column sums over every row (and block).
    dbias = jnp.stack([jnp.sum(s, axis=(0,) + tuple(range(2, s.ndim - 1))) for s in sums])
    dbias = dbias.astype(bias.dtype)
  return dqkv, dbias, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _pallas(qkv, bias, segment_ids, keys, threshold, interpret, warps, blocks, short_backward):
  """keys: None when threshold is 0 (no dropout); warps: of the short forward and backward;
  short_backward: the KERNELS of the short backward."""
  return _pallas_fwd(qkv, bias, segment_ids, keys, threshold, interpret, warps, blocks,
                     short_backward)[0]


_pallas.defvjp(_pallas_fwd, _pallas_bwd)


def _check_long_blocks(blocks: LongBlocks, length: int, head_dim: int) -> None:
  """Tilings the flash kernels compute correctly at `length` (a power of two over MAX_LENGTH):
  blocks and steps powers of two from 16 (Triton's smallest dot) to the row; warps powers of
  two; stages at least 1; the backward one of KERNELS, 'mosaic' with 4 or 8 warps and
  what flash_backward.check_tiles allows."""
  for field in LongBlocks._fields[:4]:
    n = getattr(blocks, field)
    if not (fused_norm.power_of_two(n) and 16 <= n <= length):
      raise ValueError(f'long_blocks.{field}={n}: must be a power of two from 16 to the row '
                       f'length {length}.')
  for field in ('forward_warps', 'backward_warps'):
    n = getattr(blocks, field)
    if not (fused_norm.power_of_two(n) and n <= 32):
      raise ValueError(f'long_blocks.{field}={n}: must be a power of two up to 32.')
  if blocks.stages < 1:
    raise ValueError(f'long_blocks.stages={blocks.stages}: must be at least 1.')
  if blocks.backward not in KERNELS:
    raise ValueError(f'long_blocks.backward={blocks.backward!r}; valid: {KERNELS}')
  if blocks.backward == 'mosaic':
    if blocks.backward_warps not in (4, 8):
      raise ValueError(f"long_blocks.backward_warps={blocks.backward_warps}: backward='mosaic' "
                       'takes 4 or 8 (one or two compute warpgroups).')
    from bert_jax.kernels.gpu import flash_backward  # pylint: disable=g-import-not-at-top
    flash_backward.check_tiles(_mosaic_tiles(blocks), length, head_dim)


def _check_mosaic_kernels(short_backward: str, blocks: LongBlocks, dtype, length: int,
                          head_dim: int) -> None:
  """The backward of each length is one of KERNELS; a Mosaic GPU one serving rows of this length
  takes 16-bit operands (wgmma), rows of 64 tokens or more (a wgmma's 64 rows) and what
  flash_backward.check_tiles allows."""
  from bert_jax.kernels.gpu import flash_backward  # pylint: disable=g-import-not-at-top
  if short_backward not in KERNELS:
    raise ValueError(f'short_backward={short_backward!r}; valid: {KERNELS}')
  # The long backward's tiles are checked with the rest of its blocks.
  name, kind = (('long_blocks.backward', blocks.backward) if length > MAX_LENGTH
                else ('short_backward', short_backward))
  if kind != 'mosaic':
    return
  if jnp.dtype(dtype).itemsize != 2:
    raise ValueError(f"{name}='{kind}' takes 16-bit q, k, v (wgmma); got {dtype}. Use "
                     f"{name}='triton'.")
  if length % 64:
    raise ValueError(f"{name}='{kind}' takes rows of 64 tokens or more (a wgmma's 64 rows); "
                     f"got length {length}. Use {name}='triton'.")
  if length <= MAX_LENGTH:
    flash_backward.check_tiles(flash_backward.row_tiles(length), length, head_dim)


def attention_qkv(qkv, bias, segment_ids, keys, *, rate: float, impl: str = 'pallas',
                  interpret: bool = False, num_warps: int | None = None,
                  long_blocks: LongBlocks | None = None, short_backward: str = 'triton'):
  """Softmax attention within segments over one packed projection, dropout `rate` on the
  probabilities.

  qkv: [batch, length, 3, heads, head_dim], the query, key and value projections before their
  bias (one matmul's output); bias: [3, heads, head_dim] or None; segment_ids: [batch, length]
  int32 (a query sees the keys of its own segment); keys: tile_keys(rng, batch, heads), or None
  for no dropout. Returns [batch, length, heads, head_dim] in qkv's dtype. num_warps tiles the
  kernels of rows up to MAX_LENGTH (default: FORWARD_WARPS forward, NUM_WARPS backward), long_blocks
  (default LONG_BLOCKS) those of longer rows. short_backward: the backward of rows up to MAX_LENGTH,
  one of KERNELS: 'triton' (one program per row and head) or 'mosaic'
  (flash_backward.row_backward: Hopper, 16-bit q, k, v, heads of 64 or 128, rows of 64 or 128
  tokens).

  The backward writes the three gradients into one [batch, length, 3, heads, head_dim] array (the
  projection's matmul takes it whole) and sums each over its tile's tokens in the kernel, so the
  bias gradient costs no pass over them.
  """
  if impl not in IMPLS:
    raise ValueError(f'impl={impl!r}; valid: {IMPLS}')
  if qkv.ndim != 5 or qkv.shape[2] != 3:
    raise ValueError(f'qkv must be [batch, length, 3, heads, head_dim]; got shape {qkv.shape}.')
  batch, length, _, heads, head_dim = qkv.shape
  if bias is not None and bias.shape != (3, heads, head_dim):
    raise ValueError(f'bias must be [3, heads, head_dim] = {(3, heads, head_dim)}; got '
                     f'{bias.shape}.')
  if not supported(length, head_dim):
    raise ValueError(f'fused_attention takes lengths 16..{MAX_LONG_LENGTH} and head sizes '
                     f'16..128, powers of two; got length {length}, head_dim {head_dim}.')
  if keys is not None and (keys.shape != (batch, heads, 1) or keys.dtype != jnp.uint32):
    raise ValueError(f'keys must be tile_keys(rng, {batch}, {heads}): uint32 {(batch, heads, 1)}; '
                     f'got {keys.dtype} {keys.shape}.')
  blocks = LongBlocks(*(long_blocks or LONG_BLOCKS))
  if length > MAX_LENGTH:
    _check_long_blocks(blocks, length, head_dim)
  _check_mosaic_kernels(short_backward, blocks, qkv.dtype, length, head_dim)
  threshold = dropout_threshold(rate)
  keys = keys if threshold > 0 else None
  if keys is not None and keep_scale(threshold) == 0:  # Everything dropped.
    return jnp.zeros((batch, length, heads, head_dim), qkv.dtype)
  if impl == 'xla':
    q, k, v = (_add_bias(qkv, bias)[:, :, j] for j in range(3))
    return reference(q, k, v, segment_ids, keys, rate=rate)
  warps = (int(num_warps), int(num_warps)) if num_warps else (FORWARD_WARPS, NUM_WARPS)
  return _pallas(qkv, bias, segment_ids.astype(jnp.int32), keys,
                 threshold if keys is not None else 0, bool(interpret), warps, blocks,
                 short_backward)


def attention(q, k, v, segment_ids, keys, *, rate: float, impl: str = 'pallas',
              interpret: bool = False, num_warps: int | None = None,
              long_blocks: LongBlocks | None = None, short_backward: str = 'triton'):
  """attention_qkv over separate q, k, v [batch, length, heads, head_dim] (stacked first)."""
  if not q.shape == k.shape == v.shape or q.ndim != 4:
    raise ValueError(f'q, k, v must be [batch, length, heads, head_dim] alike; got {q.shape}, '
                     f'{k.shape}, {v.shape}.')
  return attention_qkv(jnp.stack([q, k, v], axis=2), None, segment_ids, keys, rate=rate,
                       impl=impl, interpret=interpret, num_warps=num_warps,
                       long_blocks=long_blocks, short_backward=short_backward)

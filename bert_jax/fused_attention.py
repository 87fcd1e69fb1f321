"""Attention over short rows (up to 128 tokens) in one Triton program per (row, head), dropout in
the kernel (Pallas; NVIDIA GPUs).

At BERT's phase-1 length every query of a row sees all its keys in one [128, 128] tile, so one
program does the whole softmax, and the backward one program per (row, head) as well: no running
maxima, no dQ accumulator in float32, no separate pass for rowsum(dO * O) (cuDNN's flash backward
spends about a third of its time on those two at this length; experiments/perf_notes.md).

  forward   reads q, k, v, the segment ids; writes o and the log-sum-exp of each query's scores
  backward  reads q, k, v, o, dO, the log-sum-exp; recomputes the probabilities and the dropout
            mask; writes dq, dk, dv

Masking: a query attends to the keys of its own segment (`segment_ids`: the input mask for plain
rows, 1 real / 0 padding; the pair ids for packed rows). Padding tokens attend among themselves;
nothing reads their outputs.

Dropout of the attention probabilities: JAX draws one 32-bit key per (row, head) (`tile_keys`);
the kernel derives each probability's 32-bit draw as `mix(key ^ (query * length + key_index))`
(`_mix`: a 32-bit integer finaliser, two multiplies) and keeps it when the draw is at least
`dropout_threshold(rate)` = round(rate * 2^32); kept probabilities are scaled by 1/P(keep). The
backward recomputes the same draws. `reference` is the same function in jnp (the test oracle).
The key enters by XOR, so two tiles whose keys differ by some d < length^2 draw the same values,
permuted (index c gets the draw of c ^ d): for random keys about 2^-18 of all pairs of tiles, each
pair a different (row, head); every mask keeps the rate.

`impl='xla'` runs `reference`; `impl='pallas'` the kernels (`interpret=True` runs them anywhere,
for tests).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from bert_jax import fused_norm

IMPLS = ('xla', 'pallas')
MAX_LENGTH = 128  # Longest row one program holds (its scores are a [length, length] f32 tile).
NUM_WARPS = 8
_MASKED = -1e30  # Score of a key outside the query's segment (exp underflows to 0).


def supported(length: int, head_dim: int) -> bool:
  """Row lengths and head sizes the kernels take: powers of two, length 16..128, head 16..128."""
  power_of_two = lambda n: n > 0 and n & (n - 1) == 0  # noqa: E731
  return (power_of_two(length) and 16 <= length <= MAX_LENGTH and power_of_two(head_dim)
          and 16 <= head_dim <= 128)


DRAW_BITS = 32
# A probability is dropped when its 32-bit draw is below round(rate * 2^32); kept ones are scaled
# by 1 / P(keep) (0 when every one drops). fused_norm's quantisation, at 32 bits.
dropout_threshold = functools.partial(fused_norm.dropout_threshold, bits=DRAW_BITS)
keep_scale = functools.partial(fused_norm.keep_scale, bits=DRAW_BITS)


def tile_keys(rng, batch: int, heads: int) -> jax.Array:
  """One uint32 dropout key per (row, head): [batch, heads, 1]."""
  return jax.random.bits(rng, (batch, heads, 1), jnp.uint32)


def _mix(x):
  """A 32-bit integer finaliser (xor-shift-multiply; Wellons' lowbias32): uint32 -> uint32."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _keep(key, queries, keys, length: int, threshold: int):
  """Bool keep mask of the probabilities [queries, keys] (index arrays) under one tile key."""
  counter = (queries * length + keys).astype(jnp.uint32)
  return _mix(counter ^ key) >= jnp.uint32(threshold)


def keep_mask(keys, length: int, threshold: int):
  """[batch, heads, length, length] keep mask of all tiles (jnp; what the kernels draw)."""
  queries = jnp.arange(length, dtype=jnp.uint32)[:, None]
  key_index = jnp.arange(length, dtype=jnp.uint32)[None, :]
  return _keep(keys[..., None], queries, key_index, length, threshold)


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


def _scores(q, k, seg, scale):
  """Masked, scaled scores [length, length] in float32."""
  s = _dot(q, k, trans_b=True) * scale
  return jnp.where(seg[:, None] == seg[None, :], s, _MASKED)


def _tile_keep(keys_ref, length: int, threshold: int):
  queries = jax.lax.broadcasted_iota(jnp.uint32, (length, length), 0)
  key_index = jax.lax.broadcasted_iota(jnp.uint32, (length, length), 1)
  key = keys_ref[...].reshape(1, 1)
  return _keep(key, queries, key_index, length, threshold)


def _forward_kernel(*refs, scale: float, threshold: int, length: int):
  if threshold:
    keys_ref, seg_ref, q_ref, k_ref, v_ref, o_ref, lse_ref = refs
  else:
    seg_ref, q_ref, k_ref, v_ref, o_ref, lse_ref = refs
  s = _scores(q_ref[...], k_ref[...], seg_ref[...], scale)  # [length, length]
  m = jnp.max(s, axis=1)
  p = jnp.exp(s - m[:, None])
  l = jnp.sum(p, axis=1)
  norm = 1.0 / l
  if threshold:
    p = jnp.where(_tile_keep(keys_ref, length, threshold), p, 0.0)
    norm = norm * keep_scale(threshold)
  v = v_ref[...]
  o = _dot(p.astype(v.dtype), v) * norm[:, None]
  o_ref[...] = o.astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log(l)


def _backward_kernel(*refs, scale: float, threshold: int, length: int):
  if threshold:
    keys_ref, seg_ref, q_ref, k_ref, v_ref, o_ref, do_ref, lse_ref, dq_ref, dk_ref, dv_ref = refs
  else:
    seg_ref, q_ref, k_ref, v_ref, o_ref, do_ref, lse_ref, dq_ref, dk_ref, dv_ref = refs
  q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
  p = jnp.exp(_scores(q, k, seg_ref[...], scale) - lse_ref[...][:, None])  # [length, length]
  dp = _dot(do, v, trans_b=True)  # d(dropped probabilities)
  if threshold:
    keep = _tile_keep(keys_ref, length, threshold)
    factor = keep_scale(threshold)
    dropped = jnp.where(keep, p * factor, 0.0)
    dp = jnp.where(keep, dp * factor, 0.0)
  else:
    dropped = p
  dv_ref[...] = _dot(dropped.astype(do.dtype), do, trans_a=True).astype(dv_ref.dtype)
  # rowsum(dP * P) = rowsum(dO * O): O = dropped @ v.
  delta = jnp.sum(do.astype(jnp.float32) * o_ref[...].astype(jnp.float32), axis=1)
  ds = (p * (dp - delta[:, None])).astype(q.dtype)
  dq_ref[...] = (_dot(ds, k) * scale).astype(dq_ref.dtype)
  dk_ref[...] = (_dot(ds, q, trans_a=True) * scale).astype(dk_ref.dtype)


def _specs(length: int, head_dim: int, has_keys: bool):
  """BlockSpecs over grid (batch, heads): keys, segment ids, a [length, head_dim] head tile."""
  head = pl.BlockSpec((None, length, None, head_dim), lambda b, h: (b, 0, h, 0))
  seg = pl.BlockSpec((None, length), lambda b, h: (b, 0))
  keys = [pl.BlockSpec((None, None, 1), lambda b, h: (b, h, 0))] if has_keys else []
  lse = pl.BlockSpec((None, None, length), lambda b, h: (b, h, 0))
  return keys, seg, head, lse


def _pallas_forward(q, k, v, segment_ids, keys, rate, interpret, num_warps):
  batch, length, heads, head_dim = q.shape
  threshold = dropout_threshold(rate) if keys is not None else 0
  key_specs, seg, head, lse = _specs(length, head_dim, bool(threshold))
  kernel = functools.partial(_forward_kernel, scale=1.0 / head_dim ** 0.5, threshold=threshold,
                             length=length)
  o, lse_value = pl.pallas_call(
      kernel, grid=(batch, heads), in_specs=[*key_specs, seg, head, head, head],
      out_specs=[head, lse],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
      compiler_params=None if interpret else fused_norm.triton_params(num_warps),
      interpret=interpret, name='short_attention_fwd',
  )(*([keys] if threshold else []), segment_ids, q, k, v)
  return o, (q, k, v, segment_ids, keys, o, lse_value)


def _pallas_backward(rate, interpret, num_warps, saved, do):
  q, k, v, segment_ids, keys, o, lse_value = saved
  batch, length, heads, head_dim = q.shape
  threshold = dropout_threshold(rate) if keys is not None else 0
  key_specs, seg, head, lse = _specs(length, head_dim, bool(threshold))
  kernel = functools.partial(_backward_kernel, scale=1.0 / head_dim ** 0.5, threshold=threshold,
                             length=length)
  dq, dk, dv = pl.pallas_call(
      kernel, grid=(batch, heads), in_specs=[*key_specs, seg, head, head, head, head, head, lse],
      out_specs=[head, head, head],
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
      compiler_params=None if interpret else fused_norm.triton_params(num_warps),
      interpret=interpret, name='short_attention_bwd',
  )(*([keys] if threshold else []), segment_ids, q, k, v, o, do, lse_value)
  return dq, dk, dv, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _pallas(q, k, v, segment_ids, keys, rate, interpret, num_warps):
  return _pallas_forward(q, k, v, segment_ids, keys, rate, interpret, num_warps)[0]


_pallas.defvjp(_pallas_forward, _pallas_backward)


def attention(q, k, v, segment_ids, keys, *, rate: float, impl: str = 'pallas',
              interpret: bool = False, num_warps: int | None = None):
  """Softmax attention within segments, dropout `rate` on the probabilities.

  q, k, v: [batch, length, heads, head_dim]; segment_ids: [batch, length] int32 (a query sees the
  keys of its own segment); keys: tile_keys(rng, batch, heads), or None for no dropout.
  Returns [batch, length, heads, head_dim] in q's dtype.
  """
  if impl not in IMPLS:
    raise ValueError(f'impl={impl!r}; valid: {IMPLS}')
  batch, length, heads, head_dim = q.shape
  if not supported(length, head_dim):
    raise ValueError(f'fused_attention takes lengths 16..{MAX_LENGTH} and head sizes 16..128, '
                     f'powers of two; got length {length}, head_dim {head_dim}.')
  if keys is not None and (keys.shape != (batch, heads, 1) or keys.dtype != jnp.uint32):
    raise ValueError(f'keys must be tile_keys(rng, {batch}, {heads}): uint32 {(batch, heads, 1)}; '
                     f'got {keys.dtype} {keys.shape}.')
  threshold = dropout_threshold(rate)
  keys = keys if threshold > 0 else None
  if keys is not None and keep_scale(threshold) == 0:  # Everything dropped.
    return jnp.zeros_like(q)
  if impl == 'xla':
    return reference(q, k, v, segment_ids, keys, rate=rate)
  return _pallas(q, k, v, segment_ids.astype(jnp.int32), keys, float(rate), bool(interpret),
                 int(num_warps or NUM_WARPS))

"""Attention with dropout in the kernel over whole rows (Pallas TPU, Mosaic): BERT's rows of up
to 512 tokens.

One program per (row, head) each way, as the GPU kernels' short rows: a row's queries see all its
keys in one [length, length] float32 tile in VMEM (1 MiB at 512 tokens), so one program does the
whole softmax. No running maxima and no log-sum-exp residual: the backward recomputes the
probabilities from q and k (one matmul of the five it runs) and needs only the forward's output
besides its inputs.

  forward   reads q, k, v, the segment ids (and dropout keys); writes o
  backward  reads q, k, v, o, dO, the segment ids (and keys); recomputes the probabilities and
            the dropout mask; writes dq, dk, dv

Masking: a query attends to the keys of its own segment (`segment_ids`: the input mask for plain
rows, 1 real / 0 padding; the pair ids for packed rows), and with `causal` to those at or before
it. Padding tokens attend among themselves; nothing reads their outputs.

Dropout of the attention probabilities: JAX draws one 32-bit key per (row, head) (`tile_keys`);
probability (query, key) of a row of `length` tokens has the 16-bit draw of index
query * length + key that bert_jax.kernels.gpu.fused_attention draws (`value_draws`: the low or
high half of one hash per pair of neighbouring indices), so the same keys drop the same
probabilities on TPUs and GPUs. Here each value hashes its pair itself (two hashes per pair:
TPU vector lanes do not interleave two halves cheaply). A probability is kept when its draw is
at least `dropout_threshold(rate)` = round(rate * 2^16), and kept ones are scaled by 1/P(keep).
`reference` is the same function in jnp (the test oracle).

Each pallas_call declares its cost (`forward_cost`, `backward_cost`): XLA cannot see inside a
Mosaic kernel, and without it libtpu's cost analysis would count the attention as free.
`interpret=True` runs the kernels on any backend (the tests, on CPU).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

MAX_LENGTH = 512  # Longest row one program holds (BERT's position table); its VMEM bound.
DRAW_BITS = 16  # Width of a dropout draw (bert_jax.kernels.gpu.fused_norm's).
DRAW_RANGE = 1 << DRAW_BITS
# mix's steps: x ^= x >> shift, then x *= factor (none after the last shift).
MIX_STEPS = ((16, 0x7FEB352D), (15, 0x846CA68B), (16, None))
SPREAD = 0x9E3779B9  # Odd (2^32 / golden ratio): spreads the pair index over all 32 bits.
_MASKED = -1e30  # Score of a key outside the query's segment (exp underflows to 0).
_LANES, _SUBLANES = 128, 8  # A TPU vector register's [8, 128] tile.


def supported(length: int, head_dim: int) -> bool:
  """Row lengths and head sizes the kernels take: rows of 8..MAX_LENGTH tokens in whole
  sublanes (multiples of 8), heads of 8..256 in multiples of 8."""
  return (length % _SUBLANES == 0 and _SUBLANES <= length <= MAX_LENGTH
          and head_dim % _SUBLANES == 0 and _SUBLANES <= head_dim <= 256)


def dropout_threshold(rate: float) -> int:
  """16-bit draws below this are dropped: rate * 65536, rounded."""
  return int(round(rate * DRAW_RANGE))


def keep_scale(threshold: int) -> float:
  """1 / P(keep) for a threshold: the scale of the kept values (0 when every value drops)."""
  return 0.0 if threshold >= DRAW_RANGE else DRAW_RANGE / (DRAW_RANGE - threshold)


def tile_keys(rng, batch: int, heads: int) -> jax.Array:
  """One uint32 dropout key per (row, head): [batch, heads, 1] (the GPU kernels' keys)."""
  return jax.random.bits(rng, (batch, heads, 1), jnp.uint32)


def mix(x):
  """A 32-bit integer finaliser (xor-shift-multiply; Wellons' lowbias32): uint32 -> uint32."""
  for shift, factor in MIX_STEPS:
    x = x ^ (x >> shift)
    x = x if factor is None else x * jnp.uint32(factor)
  return x


def value_draws(keys, index):
  """The 16-bit draw of value `index` (uint32; broadcasts with keys): the low half of the hash
  of pair index // 2 for even indices, the high half for odd ones."""
  hashed = mix(keys ^ ((index >> 1) * jnp.uint32(SPREAD)))
  return jnp.where((index & 1) == 1, hashed >> DRAW_BITS, hashed & jnp.uint32(DRAW_RANGE - 1))


def keep_mask(keys, length: int, threshold: int):
  """[batch, heads, length, length] bool, True where a probability is kept; keys: tile_keys."""
  queries = jnp.arange(length, dtype=jnp.uint32)[:, None]
  key_index = jnp.arange(length, dtype=jnp.uint32)[None, :]
  return value_draws(keys[..., None], queries * length + key_index) >= jnp.uint32(threshold)


def reference(q, k, v, segment_ids, keys, *, rate: float, causal: bool = False):
  """The function of the kernels in jnp. q, k, v: [batch, length, heads, head_dim];
  segment_ids: [batch, length] int32; keys: tile_keys(...) or None (no dropout)."""
  length = q.shape[1]
  scores = jnp.einsum('bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32)
  scores = scores * (1.0 / math.sqrt(q.shape[3]))
  allowed = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
  if causal:
    allowed &= jnp.tril(jnp.ones((length, length), bool))
  probs = jax.nn.softmax(jnp.where(allowed, scores, _MASKED), axis=-1)
  if keys is not None:
    threshold = dropout_threshold(rate)
    probs = jnp.where(keep_mask(keys, length, threshold), probs * keep_scale(threshold), 0.0)
  return jnp.einsum('bhqk,bkhd->bqhd', probs.astype(v.dtype), v,
                    preferred_element_type=jnp.float32).astype(q.dtype)


def forward_cost(batch: int, heads: int, length: int, head_dim: int) -> tuple[int, int]:
  """(FLOPs, exponentials) of the forward: q k^T and p v, 2 * length^2 * head_dim each."""
  return 4 * batch * heads * length * length * head_dim, batch * heads * length * length


def backward_cost(batch: int, heads: int, length: int, head_dim: int) -> tuple[int, int]:
  """(FLOPs, exponentials) of the backward: q k^T again, dO v^T, p^T dO, ds k, ds^T q."""
  return 10 * batch * heads * length * length * head_dim, batch * heads * length * length


def _cost(flops_and_exps, arrays) -> pl.CostEstimate:
  """The CostEstimate of a call with these FLOPs that reads and writes `arrays` once."""
  flops, exps = flops_and_exps
  return pl.CostEstimate(flops=flops, transcendentals=exps,
                         bytes_accessed=sum(x.size * jnp.dtype(x.dtype).itemsize
                                            for x in arrays))


def _dot(a, b, trans_b: bool = False):
  """a @ b (b transposed) accumulated in float32 on the MXU."""
  dims = (((1,), (1 if trans_b else 0,)), ((), ()))
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _probs(q, k, seg_q_ref, seg_k_ref, *, scale: float, causal: bool, normalise: bool):
  """Softmax probabilities of this (row, head), [length, length] float32, and 1 / the rows'
  sums [length, 1] (the probabilities left unnormalised unless `normalise`)."""
  s = _dot(q, k, trans_b=True) * scale  # [length, length]
  allowed = seg_q_ref[:, :1] == seg_k_ref[:1, :]  # [length, 1] == [1, length]
  if causal:
    shape = s.shape
    allowed &= (jax.lax.broadcasted_iota(jnp.int32, shape, 1)
                <= jax.lax.broadcasted_iota(jnp.int32, shape, 0))
  s = jnp.where(allowed, s, _MASKED)
  p = jnp.exp(s - jnp.max(s, axis=1, keepdims=True))
  norm = 1.0 / jnp.sum(p, axis=1, keepdims=True)  # [length, 1]
  return (p * norm if normalise else p), norm


def _tile_keep(keys_ref, length: int, threshold: int):
  """keep_mask of this program's (row, head): [length, length] bool."""
  shape = (length, length)
  index = (jax.lax.broadcasted_iota(jnp.uint32, shape, 0) * jnp.uint32(length)
           + jax.lax.broadcasted_iota(jnp.uint32, shape, 1))
  return value_draws(keys_ref[...], index) >= jnp.uint32(threshold)  # keys_ref: [1, 1]


def _forward_kernel(*refs, scale: float, threshold: int, causal: bool):
  if threshold:
    keys_ref, *refs = refs
  seg_q_ref, seg_k_ref, q_ref, k_ref, v_ref, o_ref = refs
  length = q_ref.shape[0]
  p, norm = _probs(q_ref[...], k_ref[...], seg_q_ref, seg_k_ref, scale=scale, causal=causal,
                   normalise=False)
  if threshold:
    p = jnp.where(_tile_keep(keys_ref, length, threshold), p, 0.0)
    norm = norm * keep_scale(threshold)
  v = v_ref[...]
  # Normalised after p v: [length, head_dim] multiplies instead of [length, length].
  o_ref[...] = (_dot(p.astype(v.dtype), v) * norm).astype(o_ref.dtype)


def _backward_kernel(*refs, scale: float, threshold: int, causal: bool):
  if threshold:
    keys_ref, *refs = refs
  seg_q_ref, seg_k_ref, q_ref, k_ref, v_ref, o_ref, do_ref, dq_ref, dk_ref, dv_ref = refs
  length = q_ref.shape[0]
  q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
  p, _ = _probs(q, k, seg_q_ref, seg_k_ref, scale=scale, causal=causal, normalise=True)
  dp = _dot(do, v, trans_b=True)  # [length, length]: the gradient of the dropped probabilities
  if threshold:
    keep = _tile_keep(keys_ref, length, threshold)
    factor = keep_scale(threshold)
    dropped = jnp.where(keep, p * factor, 0.0)
    dp = jnp.where(keep, dp * factor, 0.0)
  else:
    dropped = p
  # rowsum(dP * P) = rowsum(dO * O): [length, 1]
  delta = jnp.sum(do.astype(jnp.float32) * o_ref[...].astype(jnp.float32), axis=1, keepdims=True)
  ds = p * (dp - delta)  # [length, length]: the gradient of the scaled scores
  dv_ref[...] = _dot(dropped.T.astype(do.dtype), do).astype(dv_ref.dtype)
  dq_ref[...] = (_dot(ds.astype(k.dtype), k) * scale).astype(dq_ref.dtype)
  dk_ref[...] = (_dot(ds.T.astype(q.dtype), q) * scale).astype(dk_ref.dtype)


def _specs(length: int, head_dim: int, has_keys: bool, tiles: int):
  """BlockSpecs over grid (batch, heads): the keys' [1, 1], the segment ids of queries
  [length, lanes] and keys [sublanes, length], then `tiles` [length, head_dim] head tiles."""
  squeezed = pl.Squeezed()
  tile = pl.BlockSpec((squeezed, squeezed, length, head_dim), lambda b, h: (b, h, 0, 0))
  specs = [pl.BlockSpec((squeezed, length, _LANES), lambda b, h: (b, 0, 0)),
           pl.BlockSpec((squeezed, _SUBLANES, length), lambda b, h: (b, 0, 0))]
  if has_keys:
    specs.insert(0, pl.BlockSpec((squeezed, squeezed, 1, 1), lambda b, h: (b, h, 0, 0)))
  return specs + [tile] * tiles, tile


def _params():
  # Rows and heads are independent: a megacore chip (v4, v5p) splits them over its cores.
  return pltpu.CompilerParams(dimension_semantics=('parallel', 'parallel'))


def _forward(q, k, v, seg_q, seg_k, keys, threshold, causal, interpret):
  batch, heads, length, head_dim = q.shape
  in_specs, tile = _specs(length, head_dim, keys is not None, 3)
  args = ((keys,) if keys is not None else ()) + (seg_q, seg_k, q, k, v)
  out = jax.ShapeDtypeStruct(q.shape, q.dtype)
  return pl.pallas_call(
      functools.partial(_forward_kernel, scale=1.0 / math.sqrt(head_dim), threshold=threshold,
                        causal=causal),
      grid=(batch, heads), in_specs=in_specs, out_specs=tile, out_shape=out,
      compiler_params=_params(), interpret=interpret,
      cost_estimate=_cost(forward_cost(batch, heads, length, head_dim), args + (out,)),
      name='tpu_attention_forward')(*args)


def _backward(q, k, v, seg_q, seg_k, keys, o, do, threshold, causal, interpret):
  batch, heads, length, head_dim = q.shape
  in_specs, tile = _specs(length, head_dim, keys is not None, 5)
  args = ((keys,) if keys is not None else ()) + (seg_q, seg_k, q, k, v, o, do)
  out = (jax.ShapeDtypeStruct(q.shape, q.dtype),) * 3
  return pl.pallas_call(
      functools.partial(_backward_kernel, scale=1.0 / math.sqrt(head_dim), threshold=threshold,
                        causal=causal),
      grid=(batch, heads), in_specs=in_specs, out_specs=(tile,) * 3, out_shape=out,
      compiler_params=_params(), interpret=interpret,
      cost_estimate=_cost(backward_cost(batch, heads, length, head_dim), args + out),
      name='tpu_attention_backward')(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _attention(q, k, v, seg_q, seg_k, keys, threshold, causal, interpret):
  return _forward(q, k, v, seg_q, seg_k, keys, threshold, causal, interpret)


def _attention_fwd(q, k, v, seg_q, seg_k, keys, threshold, causal, interpret):
  o = _forward(q, k, v, seg_q, seg_k, keys, threshold, causal, interpret)
  return o, (q, k, v, seg_q, seg_k, keys, o)


def _attention_bwd(threshold, causal, interpret, residuals, do):
  q, k, v, seg_q, seg_k, keys, o = residuals
  dq, dk, dv = _backward(q, k, v, seg_q, seg_k, keys, o, do, threshold, causal, interpret)
  return dq, dk, dv, None, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, segment_ids, keys, *, rate: float, causal: bool = False,
              interpret: bool = False):
  """Softmax(q k^T / sqrt(head_dim)) v within segments, dropout on the probabilities.

  q, k, v: [batch, length, heads, head_dim] (supported(length, head_dim)); segment_ids:
  [batch, length] int; keys: tile_keys(...) [batch, heads, 1] uint32, or None for no dropout.
  Returns [batch, length, heads, head_dim] in q's dtype.
  """
  batch, length, heads, head_dim = q.shape
  if not supported(length, head_dim):
    raise ValueError(f'The TPU attention kernels take rows of 8..{MAX_LENGTH} tokens and heads '
                     f'of 8..256 in multiples of 8; got rows of {length}, heads of {head_dim}.')
  threshold = dropout_threshold(rate) if keys is not None else 0
  segment_ids = segment_ids.astype(jnp.int32)
  # Query ids along sublanes, key ids along lanes, each broadcast to whole vector tiles.
  seg_q = jnp.broadcast_to(segment_ids[:, :, None], (batch, length, _LANES))
  seg_k = jnp.broadcast_to(segment_ids[:, None, :], (batch, _SUBLANES, length))
  if threshold:
    keys = keys.reshape(batch, heads, 1, 1)
  else:
    keys = None
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [batch, heads, length, head_dim]
  o = _attention(heads_first(q), heads_first(k), heads_first(v), seg_q, seg_k, keys, threshold,
                 causal, interpret)
  return heads_first(o)

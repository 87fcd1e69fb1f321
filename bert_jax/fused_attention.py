"""Attention over short rows (up to 128 tokens) in one Triton program per (row, head), dropout in
the kernel (Pallas; NVIDIA GPUs).

At BERT's phase-1 length every query of a row sees all its keys in one [128, 128] tile, so one
program does the whole softmax, and the backward one program per (row, head) as well: no running
maxima, no dQ accumulator in float32, no separate pass for rowsum(dO * O) (cuDNN's flash backward
spends about a third of its time on those two at this length; experiments/perf_notes.md).

  forward   reads q, k, v, the segment ids; writes o and the log-sum-exp of each query's scores
  backward  reads q, k, v, o, dO, the log-sum-exp; recomputes the probabilities and the dropout
            mask; writes dq, dk, dv and their sums over the tile's tokens

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
scaled by 1/P(keep). Half the hashing of a 32-bit draw each: 0.310 against 0.429 ms per Large
layer forward+backward on an H100 (experiments/perf_notes.md). The backward recomputes the same
draws. `reference` is the same function in jnp (the test oracle).

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


def _scores(q, k, seg, scale):
  """Masked, scaled scores [length, length] in float32."""
  s = _dot(q, k, trans_b=True) * scale
  return jnp.where(seg[:, None] == seg[None, :], s, _MASKED)


def _tile_keep(keys_ref, length: int, threshold: int):
  """keep_mask of this program's tile, [length, length]: one hash per pair of keys."""
  key = keys_ref[...].reshape(1, 1)
  pairs = (length, length // 2)
  queries = jax.lax.broadcasted_iota(jnp.uint32, pairs, 0)
  pair = jax.lax.broadcasted_iota(jnp.uint32, pairs, 1)
  hashed = fused_norm.pair_draws(key, queries * (length // 2) + pair)
  return fused_norm.split_pairs(hashed) >= jnp.uint32(threshold)


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
    keys_ref, *refs = refs
  seg_ref, q_ref, k_ref, v_ref, o_ref, do_ref, lse_ref, dqkv_ref, *sum_refs = refs
  row, head = pl.program_id(0), pl.program_id(1)

  def store(part, value):  # value: [length, head_dim] float32, the gradient of q, k or v
    dqkv_ref[row, :, part, head, :] = value.astype(dqkv_ref.dtype)
    sum_refs[part][...] = jnp.sum(value, axis=0)
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
  store(2, _dot(dropped.astype(do.dtype), do, trans_a=True))
  # rowsum(dP * P) = rowsum(dO * O): O = dropped @ v.
  delta = jnp.sum(do.astype(jnp.float32) * o_ref[...].astype(jnp.float32), axis=1)
  ds = (p * (dp - delta[:, None])).astype(q.dtype)
  store(0, _dot(ds, k) * scale)
  store(1, _dot(ds, q, trans_a=True) * scale)


def _specs(length: int, head_dim: int, has_keys: bool):
  """BlockSpecs over grid (batch, heads): keys, segment ids, the q / k / v tiles [length,
  head_dim] of one head in qkv [batch, length, 3, heads, head_dim], an output head tile of
  [batch, length, heads, head_dim], the log-sum-exps, a per-(row, head) vector [head_dim]."""
  part = lambda j: pl.BlockSpec((None, length, None, None, head_dim),  # noqa: E731
                                lambda b, h: (b, 0, j, h, 0))
  head = pl.BlockSpec((None, length, None, head_dim), lambda b, h: (b, 0, h, 0))
  seg = pl.BlockSpec((None, length), lambda b, h: (b, 0))
  keys = [pl.BlockSpec((None, None, 1), lambda b, h: (b, h, 0))] if has_keys else []
  lse = pl.BlockSpec((None, None, length), lambda b, h: (b, h, 0))
  vector = pl.BlockSpec((None, None, head_dim), lambda b, h: (b, h, 0))
  return keys, seg, [part(0), part(1), part(2)], head, lse, vector


def _pallas_forward(qkv, segment_ids, keys, rate, interpret, num_warps):
  batch, length, _, heads, head_dim = qkv.shape
  threshold = dropout_threshold(rate) if keys is not None else 0
  key_specs, seg, parts, head, lse, _ = _specs(length, head_dim, bool(threshold))
  kernel = functools.partial(_forward_kernel, scale=1.0 / head_dim ** 0.5, threshold=threshold,
                             length=length)
  return pl.pallas_call(
      kernel, grid=(batch, heads), in_specs=[*key_specs, seg, *parts],
      out_specs=[head, lse],
      out_shape=[jax.ShapeDtypeStruct((batch, length, heads, head_dim), qkv.dtype),
                 jax.ShapeDtypeStruct((batch, heads, length), jnp.float32)],
      compiler_params=None if interpret else fused_norm.triton_params(num_warps),
      interpret=interpret, name='short_attention_fwd',
  )(*([keys] if threshold else []), segment_ids, qkv, qkv, qkv)


def _pallas_backward(qkv, segment_ids, keys, o, lse_value, do, rate, interpret, num_warps):
  """dqkv [batch, length, 3, heads, head_dim] and the column sums of dq, dk, dv per (row, head),
  three float32 [batch, heads, head_dim] (the bias gradients before the sum over rows)."""
  batch, length, _, heads, head_dim = qkv.shape
  threshold = dropout_threshold(rate) if keys is not None else 0
  key_specs, seg, parts, head, lse, vector = _specs(length, head_dim, bool(threshold))
  kernel = functools.partial(_backward_kernel, scale=1.0 / head_dim ** 0.5, threshold=threshold,
                             length=length)
  sums = jax.ShapeDtypeStruct((batch, heads, head_dim), jnp.float32)
  return pl.pallas_call(
      kernel, grid=(batch, heads), in_specs=[*key_specs, seg, *parts, head, head, lse],
      # dqkv is written whole-array: one program writes its head's three tiles.
      out_specs=[pl.BlockSpec(memory_space=pl.ANY), vector, vector, vector],
      out_shape=[jax.ShapeDtypeStruct(qkv.shape, qkv.dtype), sums, sums, sums],
      compiler_params=None if interpret else fused_norm.triton_params(num_warps),
      interpret=interpret, name='short_attention_bwd',
  )(*([keys] if threshold else []), segment_ids, qkv, qkv, qkv, o, do, lse_value)


def _add_bias(qkv, bias):
  """qkv + bias as the 2-d add XLA folds into the projection's matmul epilogue."""
  if bias is None:
    return qkv
  flat = qkv.reshape(-1, bias.size) + bias.reshape(-1).astype(qkv.dtype)
  return flat.reshape(qkv.shape)


def _pallas_fwd(qkv, bias, segment_ids, keys, rate, interpret, num_warps):
  qkv = _add_bias(qkv, bias)
  o, lse_value = _pallas_forward(qkv, segment_ids, keys, rate, interpret, num_warps)
  return o, (qkv, bias, segment_ids, keys, o, lse_value)


def _pallas_bwd(rate, interpret, num_warps, saved, do):
  qkv, bias, segment_ids, keys, o, lse_value = saved
  dqkv, *sums = _pallas_backward(qkv, segment_ids, keys, o, lse_value, do, rate, interpret,
                                 num_warps)
  dbias = None
  if bias is not None:  # [3, heads, head_dim]: the column sums over every row.
    dbias = jnp.stack([jnp.sum(s, axis=0) for s in sums]).astype(bias.dtype)
  return dqkv, dbias, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _pallas(qkv, bias, segment_ids, keys, rate, interpret, num_warps):
  return _pallas_fwd(qkv, bias, segment_ids, keys, rate, interpret, num_warps)[0]


_pallas.defvjp(_pallas_fwd, _pallas_bwd)


def attention_qkv(qkv, bias, segment_ids, keys, *, rate: float, impl: str = 'pallas',
                  interpret: bool = False, num_warps: int | None = None):
  """Softmax attention within segments over one packed projection, dropout `rate` on the
  probabilities.

  qkv: [batch, length, 3, heads, head_dim], the query, key and value projections before their
  bias (one matmul's output); bias: [3, heads, head_dim] or None; segment_ids: [batch, length]
  int32 (a query sees the keys of its own segment); keys: tile_keys(rng, batch, heads), or None
  for no dropout. Returns [batch, length, heads, head_dim] in qkv's dtype.

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
    raise ValueError(f'fused_attention takes lengths 16..{MAX_LENGTH} and head sizes 16..128, '
                     f'powers of two; got length {length}, head_dim {head_dim}.')
  if keys is not None and (keys.shape != (batch, heads, 1) or keys.dtype != jnp.uint32):
    raise ValueError(f'keys must be tile_keys(rng, {batch}, {heads}): uint32 {(batch, heads, 1)}; '
                     f'got {keys.dtype} {keys.shape}.')
  threshold = dropout_threshold(rate)
  keys = keys if threshold > 0 else None
  if keys is not None and keep_scale(threshold) == 0:  # Everything dropped.
    return jnp.zeros((batch, length, heads, head_dim), qkv.dtype)
  if impl == 'xla':
    q, k, v = (_add_bias(qkv, bias)[:, :, j] for j in range(3))
    return reference(q, k, v, segment_ids, keys, rate=rate)
  return _pallas(qkv, bias, segment_ids.astype(jnp.int32), keys, float(rate), bool(interpret),
                 int(num_warps or NUM_WARPS))


def attention(q, k, v, segment_ids, keys, *, rate: float, impl: str = 'pallas',
              interpret: bool = False, num_warps: int | None = None):
  """attention_qkv over separate q, k, v [batch, length, heads, head_dim] (stacked first)."""
  if not q.shape == k.shape == v.shape or q.ndim != 4:
    raise ValueError(f'q, k, v must be [batch, length, heads, head_dim] alike; got {q.shape}, '
                     f'{k.shape}, {v.shape}.')
  return attention_qkv(jnp.stack([q, k, v], axis=2), None, segment_ids, keys, rate=rate,
                       impl=impl, interpret=interpret, num_warps=num_warps)

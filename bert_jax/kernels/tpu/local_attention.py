"""Sliding-window (local) and whole-row attention over segment ids on TPUs: JAX's splash
attention kernels (Pallas TPU, jax.experimental.pallas.ops.tpu.splash_attention).

The modern encoder's local layers attend within `window` tokens each side of a query. The XLA
path computes every score of the row and masks most of them (at ModernBERT's 1024 tokens and a
window of 64 each side, 7/8 of a local layer's scores); splash attention tiles the scores in
blocks and skips the blocks its mask leaves empty, so a local layer reads and computes only the
blocks on the band. Masking is the XLA path's: a query sees the keys of its own segment
(`segment_ids`: the input mask for plain rows, 1 real / 0 padding, or the pair ids of packed
rows) within `window` positions of it (every key of its segment with window 0). No dropout: the
modern encoder's attention has none.

`interpret=True` runs the kernels on any backend (the tests, on CPU).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

BLOCK = 128  # Rows and keys per tile: a TPU vector register's lanes.


def supported(length: int) -> bool:
  """Row lengths the kernels take: whole tiles."""
  return length >= BLOCK and length % BLOCK == 0


@functools.lru_cache(maxsize=None)
def _kernel(length: int, heads: int, window: int, interpret: bool):
  """The splash kernel of one row of `length` tokens and `heads` heads."""
  shape = (length, length)
  mask = masks.LocalMask(shape, (window, window), offset=0) if window else masks.FullMask(shape)
  block = min(length, 4 * BLOCK)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                            block_q_dq=block, block_kv_dq=block)
  return splash.make_splash_mha(masks.MultiHeadMask([mask] * heads), block_sizes=sizes,
                                head_shards=1, q_seq_shards=1, interpret=interpret)


def attention(query, key, value, segment_ids, *, window: int, interpret: bool = False):
  """softmax(q k^T / sqrt(d), masked) v over segments and the window.

  query, key, value: [batch, length, heads, head_dim]; segment_ids: [batch, length] int;
  window: keys each side a query sees (0: the whole row). Returns [batch, length, heads,
  head_dim] in query's dtype.
  """
  _, length, heads, depth = query.shape
  kernel = _kernel(length, heads, window, interpret)
  to_heads = lambda t: jnp.swapaxes(t, 1, 2)  # noqa: E731 [batch, heads, length, head_dim]
  scaled = query * jnp.asarray(depth ** -0.5, query.dtype)
  segments = segment_ids.astype(jnp.int32)
  out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s)))(
      to_heads(scaled), to_heads(key), to_heads(value), segments)
  return to_heads(out).astype(query.dtype)

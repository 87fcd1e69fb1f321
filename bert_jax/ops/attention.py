"""Self-attention, dispatched on model.attention_impl: 'xla' | 'cudnn' | 'pallas' | 'tpu' |
'splash'.

- 'xla': softmax(q k^T / sqrt(d) + bias) v as einsums, dropout on the probabilities (any device).
- 'cudnn': cuDNN's fused flash attention through jax.nn.dot_product_attention (NVIDIA GPUs).
- 'pallas': bert_jax.kernels.gpu.fused_attention's Triton (and, per backward setting, Mosaic GPU)
  kernels over one packed query/key/value projection, for the rows they take (16-512 tokens,
  powers of two); cuDNN's for other rows.
- 'tpu': bert_jax.kernels.tpu.fused_attention's Pallas TPU (Mosaic) kernels, dropout in the
  kernel, for the rows they take (8-512 tokens, multiples of 8); the 'xla' einsums for other
  rows. Off TPUs the kernels run interpreted (tests).
- 'splash': JAX's splash attention (Pallas TPU; bert_jax.kernels.tpu.local_attention), which
  skips the score blocks outside a sliding window: the modern encoder's local and global layers,
  rows in whole tiles of 128, no dropout. Off TPUs it runs interpreted (tests).
- a registered kernel's name (ops.register_attention): its `attend` on the three projections and
  the additive bias, every row.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import ops
from bert_jax.ops import per_device

IMPLS = ops.ATTENTION_IMPLS
# The kernels of each attention backward with attention_impl='pallas' (model.short_ and
# long_attention_backward): Pallas Triton, or Pallas Mosaic GPU (Hopper's wgmma).
BACKWARDS = ops.ATTENTION_BACKWARDS


def _fused():
  # Imported when chosen: a run that does not use the kernels never loads them.
  from bert_jax.kernels.gpu import fused_attention  # pylint: disable=g-import-not-at-top
  return fused_attention


def _tpu():
  # Imported when chosen, as _fused.
  from bert_jax.kernels.tpu import fused_attention  # pylint: disable=g-import-not-at-top
  return fused_attention


def _local():
  # Imported when chosen, as _fused.
  from bert_jax.kernels.tpu import local_attention  # pylint: disable=g-import-not-at-top
  return local_attention


def draws_dropout_rng(impl: str) -> bool:
  """Whether `impl` drops attention probabilities with keys of the 'dropout' rng stream (the
  einsums, the TPU kernels and registered kernels; cuDNN seeds its own, and 'pallas' draws its
  keys through dropout_keys)."""
  return impl in ('xla', 'tpu') or ops.registered_attention(impl) is not None


def takes_segment_ids(impl: str, length: int, head_dim: int, causal: bool = False) -> bool:
  """Whether rows of `length` go through the fused kernels (GPU 'pallas' or 'tpu'), which take
  segment ids [batch, length] instead of an additive bias; with `causal` only the TPU kernels,
  which apply the causal mask themselves."""
  if impl == 'tpu':
    return _tpu().supported(length, head_dim)
  if impl == 'splash':
    return not causal and _local().supported(length)
  return impl == 'pallas' and not causal and _fused().supported(length, head_dim)


def packs_qkv(impl: str) -> bool:
  """Whether the kernels of `impl` take one packed query/key/value projection
  (packed_qkv_attention) rather than three (attention)."""
  return impl == 'pallas'


def kernel_rows(length: int, head_dim: int) -> bool:
  """Whether the fused kernels take rows of `length` at this head size."""
  return _fused().supported(length, head_dim)


def long_row_threshold() -> int:
  """Rows longer than this go to the long-row (flash) kernels, up to it to the one-block ones."""
  return _fused().MAX_LENGTH


def wants_dropout_keys(rate: float) -> bool:
  """Whether the fused kernels drop anything at this rate (their 16-bit quantised threshold)."""
  return _fused().dropout_threshold(rate) > 0


def dropout_keys(rng, batch: int, heads: int) -> jax.Array:
  """The fused kernels' dropout keys for the whole batch: [batch, heads, 1] uint32, drawn before
  any split over devices so that the masks do not depend on the mesh."""
  return _fused().tile_keys(rng, batch, heads)


def packed_qkv_attention(qkv, qkv_bias, segment_ids, keys, *, rate: float,
                         long_backward: str = 'triton', short_backward: str = 'triton'):
  """The fused kernels over one packed projection (interpreted off GPUs, for tests); on a mesh
  of several devices each runs them on its rows and heads, under shard_map.

  qkv: [batch, length, 3, heads, head_dim] before the bias; qkv_bias: [3, heads, head_dim] (the
  parameters, in their dtype: the kernels' float32 sums give their gradient); segment_ids:
  [batch, length]; keys: dropout_keys(...) or None; long_backward, short_backward: BACKWARDS, the
  kernels of the backward of rows over and up to long_row_threshold(). Returns [batch, length,
  heads, head_dim].
  """
  fused = _fused()
  attend = functools.partial(fused.attention_qkv, rate=rate,
                             long_blocks=fused.long_blocks(long_backward),
                             short_backward=short_backward,
                             interpret=jax.default_backend() != 'gpu')
  heads = nn.logical_to_mesh_axes(('batch', 'length', None, 'heads', 'kv'))
  spec = jax.sharding.PartitionSpec
  keys_spec = None if keys is None else spec(heads[0], heads[3], None)
  # The bias is replicated over the batch axes; shard_map's transpose sums its gradient there.
  return per_device.on_each_device(
      attend, (qkv, qkv_bias, segment_ids, keys),
      (heads, spec(None, heads[3], None), spec(heads[0], None), keys_spec),
      spec(heads[0], None, heads[3], None), whole={'rows': heads[1], 'heads': heads[4]},
      setting="attention_impl='pallas'")


def attention(impl: str, query, key, value, bias, *, rate: float, deterministic: bool,
              dropout_rng, dtype, cudnn_seed: int = 0, causal: bool = False, window: int = 0):
  """Attention of separate projections: 'xla' (einsums), cuDNN's for 'cudnn' and for the rows
  'pallas' leaves to it, the TPU kernels for 'tpu' (bias: segment ids) and 'xla' for the rows
  'tpu' leaves to it, a registered kernel's attend for its name.

  query, key, value: [batch, length, heads, head_dim]; bias: [batch, 1, 1 or length, length]
  (additive), or [batch, length] segment ids for the rows takes_segment_ids('tpu', ...) says;
  dropout_rng: the rng of the dropout ('xla' and 'tpu'); cudnn_seed: cuDNN's in-kernel dropout
  seed (cudnn_dropout_seed); causal: the TPU kernels' causal mask (in the additive bias
  otherwise); window: 'splash''s keys each side of a query (0: the whole row; in the additive
  bias otherwise). Returns [batch, length, heads, head_dim].
  """
  kernel = ops.registered_attention(impl)
  if kernel is not None:
    rate = 0.0 if deterministic else rate
    return kernel.attend(query, key, value, bias, rate=rate,
                         dropout_rng=dropout_rng if rate > 0 else None)
  if impl == 'splash' and bias.ndim == 2:
    return local_attention(query, key, value, bias, window=window)
  if impl == 'tpu' and bias.ndim == 2:
    rate = 0.0 if deterministic else rate
    keys = None
    if _tpu().dropout_threshold(rate) > 0:
      keys = _tpu().tile_keys(dropout_rng, query.shape[0], query.shape[2])
    return tpu_attention(query, key, value, bias, keys, rate=rate, causal=causal)
  if impl in ('cudnn', 'pallas'):
    return cudnn_attention(query, key, value, bias, 0.0 if deterministic else rate, cudnn_seed)
  return dot_product_attention(query, key, value, bias, dropout_rng, rate, deterministic, dtype)


def _compiles_for_tpu() -> bool:
  """Whether the step being traced compiles for TPUs: the mesh in scope holds TPU devices (the
  AOT compile on a CPU host), or, with none, JAX's default backend is a TPU."""
  device = jax.sharding.get_abstract_mesh().abstract_device
  if device is not None:
    return device.platform == 'tpu'
  return jax.default_backend() == 'tpu'


def tpu_attention(query, key, value, segment_ids, keys, *, rate: float, causal: bool = False):
  """The TPU kernels (interpreted when the step does not compile for TPUs); on a mesh of several
  devices each runs them on its rows and heads, under shard_map.

  query, key, value: [batch, length, heads, head_dim]; segment_ids: [batch, length]; keys:
  [batch, heads, 1] uint32 (kernels.tpu.fused_attention.tile_keys, drawn for the whole batch so
  that the masks do not depend on the mesh) or None. Returns [batch, length, heads, head_dim].
  """
  attend = functools.partial(_tpu().attention, rate=rate, causal=causal,
                             interpret=not _compiles_for_tpu())
  return _on_rows_and_heads(attend, query, key, value, segment_ids, keys, "attention_impl='tpu'")


def local_attention(query, key, value, segment_ids, *, window: int):
  """JAX's splash attention over segments and a window of `window` keys each side (interpreted
  when the step does not compile for TPUs); on a mesh of several devices each runs it on its
  rows and heads, under shard_map. Shapes as tpu_attention's."""
  interpret = not _compiles_for_tpu()
  attend = lambda q, k, v, s, _: _local().attention(  # noqa: E731 (no dropout keys)
      q, k, v, s, window=window, interpret=interpret)
  return _on_rows_and_heads(attend, query, key, value, segment_ids, None,
                            "attention_impl='splash'")


def _on_rows_and_heads(attend, query, key, value, segment_ids, keys, setting: str):
  """attend(query, key, value, segment_ids, keys) of the TPU kernels, on a mesh of several
  devices each device on its rows and heads under shard_map (rows and heads whole); keys
  [batch, heads, 1] or None."""
  heads = nn.logical_to_mesh_axes(('batch', 'length', 'heads', 'kv'))
  spec = jax.sharding.PartitionSpec
  keys_spec = None if keys is None else spec(heads[0], heads[2], None)
  return per_device.on_each_device(
      attend, (query, key, value, segment_ids, keys), (heads, heads, heads, spec(heads[0], None),
                                                      keys_spec),
      heads, whole={'rows': heads[1], 'heads': heads[3]}, setting=setting)


def dot_product_attention(query, key, value, bias, dropout_rng, dropout_rate, deterministic,
                          dtype):
  """Softmax(q k^T / sqrt(d) + bias) v, softmax in float32, dropout on the probabilities."""
  # query, key, value: [batch, length, heads, head_dim]; bias: [batch, 1, 1 or length, length].
  depth = query.shape[-1]
  scores = jnp.einsum('bqhd,bkhd->bhqk', query, key) / np.sqrt(depth).astype(dtype)
  scores = scores.astype(jnp.float32) + bias.astype(jnp.float32)
  probs = jax.nn.softmax(scores, axis=-1)  # [batch, heads, q_length, k_length]
  if not deterministic and dropout_rate > 0.0:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  return jnp.einsum('bhqk,bkhd->bqhd', probs.astype(dtype), value)


def cudnn_dropout_seed(run_seed: int, layer: int) -> int:
  """The static seed of one layer's cuDNN attention dropout: distinct per (run seed, layer)."""
  return int(np.random.SeedSequence([run_seed, layer]).generate_state(1)[0] & 0x7FFFFFFF)


def cudnn_attention(query, key, value, bias, dropout_rate: float = 0.0, seed: int = 0):
  """cuDNN's fused (flash) attention, the padding given as key lengths; GPU only.

  Rows are right-padded (real tokens first), so a row's key length is its count of unmasked keys.
  Padded query positions come out as zeros instead of attending; nothing reads them (the MLM head
  gathers real positions, the pooler reads [CLS]), so the loss equals the einsum path's.

  With dropout_rate > 0 the probabilities are dropped inside the kernel by cuDNN's Philox
  generator: XLA gives each attention call a static `seed` and an offset that advances on every
  execution, so the mask changes every step and the backward kernel, which advances in step with
  its own forward, drops the same probabilities. That pairing holds only when every layer is its
  own call executed once per step (`scan_layers=False`, no remat of attention): config
  validation (ops.checks) enforces it.
  """
  # query, key, value: [batch, length, heads, head_dim]; bias: [batch, 1, 1 or length, length].
  packed = bias.shape[2] > 1  # Packed pairs: the block-diagonal bias itself.
  lengths = None if packed else jnp.sum(bias[:, 0, 0, :] == 0, axis=-1).astype(jnp.int32)
  if dropout_rate == 0.0:
    if packed:
      return jax.nn.dot_product_attention(query, key, value, bias=bias, implementation='cudnn')
    return jax.nn.dot_product_attention(query, key, value, query_seq_lengths=lengths,
                                        key_value_seq_lengths=lengths, implementation='cudnn')
  # The public API has no dropout; the cuDNN wrapper underneath it does.
  # pylint: disable-next=g-import-not-at-top
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
  scale = 1.0 / np.sqrt(query.shape[-1])
  if packed:
    return cudnn_fa.dot_product_attention(query, key, value, bias=bias, scale=scale, seed=seed,
                                          dropout_rate=dropout_rate)
  return cudnn_fa.dot_product_attention(query, key, value, q_seqlen=lengths, kv_seqlen=lengths,
                                        scale=scale, mask_type=cudnn_fa.MaskType.PADDING,
                                        seed=seed, dropout_rate=dropout_rate)

"""LayerNorm(dropout(y + bias) + residual) after each sublayer, dispatched on
model.layer_norm_impl: 'xla' (the model's own flax ops) | 'pallas' (one Triton kernel each way,
bert_jax.kernels.gpu.fused_norm; NVIDIA GPUs).
"""

import functools

import flax.linen as nn
import jax

from bert_jax import ops
from bert_jax.ops import per_device

IMPLS = ops.NORM_IMPLS


def _fused():
  # Imported when chosen: a run that does not use the kernel never loads it.
  from bert_jax.kernels.gpu import fused_norm  # pylint: disable=g-import-not-at-top
  return fused_norm


def wants_dropout_keys(rate: float) -> bool:
  """Whether the kernel drops anything at this rate (its 16-bit quantised threshold)."""
  return _fused().dropout_threshold(rate) > 0


def dropout_keys(rng, shape) -> jax.Array:
  """One uint32 dropout key per row of `shape` ([batch, length]), drawn for the whole batch so
  that the masks do not depend on the mesh."""
  rows = 1
  for size in shape:
    rows *= size
  return _fused().row_keys(rng, rows).reshape(shape)


def fused_dropout_add_layer_norm(y, dense_bias, residual, keys, scale, offset, *, rate: float,
                                 eps: float):
  """The kernel over [batch, length, embed] rows (interpreted off GPUs, for tests); on a mesh of
  several devices each runs it on its rows, under shard_map. keys: dropout_keys(...) or None."""
  norm = functools.partial(_rows, rate=rate, eps=eps, interpret=jax.default_backend() != 'gpu')
  args = (y, dense_bias, residual.astype(y.dtype), keys, scale, offset)
  rows = nn.logical_to_mesh_axes(('batch', 'length', 'embed'))
  replicated = jax.sharding.PartitionSpec()
  keys_spec = None if keys is None else jax.sharding.PartitionSpec(*rows[:-1])
  return per_device.on_each_device(
      norm, args, (rows, replicated, rows, keys_spec, replicated, replicated), rows,
      whole={'embed rows': rows[2]}, setting="layer_norm_impl='pallas'")


def _rows(y, bias, residual, keys, scale, offset, *, rate, eps, interpret):
  """fused_norm.dropout_add_layer_norm on [..., embed] rows; keys [...] (one per row)."""
  if keys is not None:
    keys = keys.reshape(-1)
  return _fused().dropout_add_layer_norm(y, bias, residual, keys, scale, offset, rate=rate,
                                         eps=eps, impl='pallas', interpret=interpret)

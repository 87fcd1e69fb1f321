"""The feed-forward block, dispatched on model.ffn_impl: 'xla' (the model's dense layers and
GELU) | 'pallas' (two Mosaic GPU kernels on both sides of the tanh GELU,
bert_jax.kernels.gpu.fused_ffn; NVIDIA Hopper GPUs).
"""

import flax.linen as nn
import jax

from bert_jax import ops
from bert_jax.kernels import activations
from bert_jax.ops import per_device

IMPLS = ops.FFN_IMPLS
# The tanh GELU the fused kernels compute, for the model's XLA path (models/layers.gelu).
gelu_tanh = activations.gelu_tanh
gelu_tanh_and_grad = activations.gelu_tanh_and_grad
gelu_tanh_grad = activations.gelu_tanh_grad


def _fused():
  # Imported when chosen: a run that does not use the kernels never loads them.
  from bert_jax.kernels.gpu import fused_ffn  # pylint: disable=g-import-not-at-top
  return fused_ffn


def fused_ffn(x, up_kernel, up_bias, kernel):
  """gelu_tanh(x @ up_kernel + up_bias) @ kernel over [batch, length, embed] rows (the kernels
  on Hopper GPUs; elsewhere the same custom VJP the XLA way): on a mesh of several devices each
  runs it on its rows, under shard_map (the parameters gathered, their gradients summed by
  shard_map's transpose). Returns [batch, length, embed] without the down-projection's bias."""
  rows = nn.logical_to_mesh_axes(('batch', 'length', 'embed'))
  mlp = nn.logical_to_mesh_axes(('mlp',))[0]
  spec = jax.sharding.PartitionSpec
  return per_device.on_each_device(
      _rows, (x, up_kernel, up_bias, kernel), (rows, spec(), spec(), spec()),
      spec(rows[0], None, None),
      whole={'rows': rows[1], 'embed rows': rows[2], 'feed-forward rows': mlp},
      setting="ffn_impl='pallas'")


def _rows(x, up_kernel, up_bias, kernel):
  """fused_ffn.ffn on [..., embed] rows."""
  y = _fused().ffn(x.reshape(-1, x.shape[-1]), up_kernel, up_bias, kernel)
  return y.reshape(x.shape)


def on_hopper() -> bool:
  """Whether this process's devices are NVIDIA Hopper GPUs (the Mosaic GPU kernels' wgmma, TMA)."""
  return _fused().on_hopper()

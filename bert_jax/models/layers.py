"""Building blocks with logical axis names on every parameter."""

from collections.abc import Sequence
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.ops import ffn as ffn_ops

Dtype = Any
Initializer = Any


def truncated_normal(stddev: float) -> Initializer:
  """The original BERT initialiser: normal(stddev) truncated at two stddevs."""
  return nn.initializers.truncated_normal(stddev=stddev)


def declare_dense_params(module: nn.Module, in_shape, features, kernel_axes, use_bias: bool,
                         param_dtype, kernel_init):
  """A dense layer's `kernel` [in..., out...] and `bias` [out...] (None without) in `module`'s
  scope, with logical axes (kernel_axes: inputs then outputs)."""
  shape = tuple(in_shape) + tuple(features)
  if len(kernel_axes) != len(shape):
    raise ValueError(f'kernel_axes {kernel_axes} do not match kernel shape {shape}.')
  kernel = module.param('kernel', nn.with_logical_partitioning(kernel_init, kernel_axes),
                        shape, param_dtype)
  bias = None
  if use_bias:
    bias = module.param(
        'bias', nn.with_logical_partitioning(nn.initializers.zeros, kernel_axes[len(in_shape):]),
        tuple(features), param_dtype)
  return kernel, bias


class DenseParams(nn.Module):
  """The parameters of a DenseGeneral (same names, shapes, axes, initialisers) without its
  matmul, for a caller that does the matmul itself (the model's packed query/key/value)."""
  in_shape: tuple[int, ...]
  features: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  param_dtype: Dtype = jnp.float32
  kernel_init: Initializer = truncated_normal(0.02)

  @nn.compact
  def __call__(self):  # -> (kernel, bias)
    return declare_dense_params(self, self.in_shape, self.features, self.kernel_axes, True,
                                self.param_dtype, self.kernel_init)


class DenseGeneral(nn.Module):
  """Dense over one or more input axes; annotates the full n-d kernel."""
  features: int | Sequence[int]  # Output dims, e.g. (heads, head_dim).
  kernel_axes: tuple[str, ...]  # One logical name per kernel dim: inputs then outputs.
  axis: int | Sequence[int] = -1  # Input axes contracted.
  use_bias: bool = True
  bias_apart: bool = False  # Return (x @ kernel, bias) for a consumer that adds the bias itself.
  # Contract trailing input axes as one 2-d matmul [tokens, in] @ [in, out] + bias[out]: the same
  # function, a different HLO for XLA to fuse (model.flat_matmuls; docs/performance.md).
  flatten: bool = False
  dtype: Dtype = jnp.float32  # Compute dtype.
  param_dtype: Dtype = jnp.float32  # Storage dtype.
  kernel_init: Initializer = truncated_normal(0.02)

  @nn.compact
  def __call__(self, x):
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    axis = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
    axis = tuple(a % x.ndim for a in axis)
    in_shape = tuple(x.shape[a] for a in axis)
    kernel, bias = declare_dense_params(self, in_shape, features, self.kernel_axes,
                                        self.use_bias, self.param_dtype, self.kernel_init)
    kernel = jnp.asarray(kernel, self.dtype)
    x = jnp.asarray(x, self.dtype)
    if self.flatten and axis != tuple(range(x.ndim - len(axis), x.ndim)):
      raise ValueError(f'flatten needs the contracted axes {axis} to be the trailing ones.')
    if self.flatten:
      lead = x.shape[:x.ndim - len(axis)]
      flat_x = x.reshape(-1, math.prod(in_shape))  # [tokens, in]
      y = flat_x @ kernel.reshape(flat_x.shape[1], -1)  # [tokens, out]
      if bias is not None and not self.bias_apart:
        y = y + jnp.asarray(bias, self.dtype).reshape(-1)
      y = y.reshape(lead + features)
    else:
      contract = (axis, tuple(range(len(axis))))
      y = jax.lax.dot_general(x, kernel, (contract, ((), ())))
      if bias is not None and not self.bias_apart:
        y = y + jnp.asarray(bias, self.dtype)
    return (y, bias) if bias is not None and self.bias_apart else y


# The tanh GELU lives beside the kernels that share it (kernels/activations.py), through ops.
gelu_tanh = ffn_ops.gelu_tanh
gelu_tanh_and_grad = ffn_ops.gelu_tanh_and_grad
gelu_tanh_grad = ffn_ops.gelu_tanh_grad


def gelu(x: jax.Array, kind: str) -> jax.Array:
  """GELU: 'erf' (exact, as HF) or 'tanh' (the original TF BERT code's approximation)."""
  return gelu_tanh(x) if kind == 'tanh' else nn.gelu(x, approximate=False)


def layer_norm_inits(axis_name: str = 'embed') -> dict[str, Initializer]:
  """Initialisers of a LayerNorm's `scale` (ones) and `bias` (zeros), with the logical axis."""
  return {'scale': nn.with_logical_partitioning(nn.initializers.ones, (axis_name,)),
          'bias': nn.with_logical_partitioning(nn.initializers.zeros, (axis_name,))}


def layer_norm(eps: float, dtype: Dtype, param_dtype: Dtype, axis_name: str = 'embed',
               name: str = 'LayerNorm') -> nn.LayerNorm:
  """LayerNorm whose scale and bias carry a logical axis name."""
  inits = layer_norm_inits(axis_name)
  return nn.LayerNorm(epsilon=eps, dtype=dtype, param_dtype=param_dtype, name=name,
                      scale_init=inits['scale'], bias_init=inits['bias'])


def norm(kind: str, eps: float, use_bias: bool, dtype: Dtype, param_dtype: Dtype,
         name: str, axis_name: str = 'embed') -> nn.Module:
  """A LayerNorm ('layer_norm', with or without its bias) or an RMSNorm ('rms_norm': scale only)
  whose parameters carry a logical axis name; the modern encoder's norms and its MLM head's."""
  inits = layer_norm_inits(axis_name)
  if kind == 'rms_norm':
    return nn.RMSNorm(epsilon=eps, dtype=dtype, param_dtype=param_dtype, name=name,
                      scale_init=inits['scale'])
  return nn.LayerNorm(epsilon=eps, dtype=dtype, param_dtype=param_dtype, name=name,
                      use_bias=use_bias, scale_init=inits['scale'], bias_init=inits['bias'])


def first_or_gathered(x: jax.Array, cls_positions: jax.Array | None) -> jax.Array:
  """The states an encoder pools: each row's first token's [batch, embed], or with packed rows
  each pair's at cls_positions [batch, pairs] -> [batch, pairs, embed]."""
  return x[:, 0] if cls_positions is None else gather_positions(x, cls_positions)


def row_positions(input_ids: jax.Array) -> jax.Array:
  """0, 1, ... along each row of [batch, length] ids: the position ids of unpacked rows."""
  return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)


def gather_positions(x: jax.Array, positions: jax.Array) -> jax.Array:
  """x[b, positions[b, p]] for [batch, length, embed] x and [batch, picks] positions, as a one-hot
  matmul: [batch, picks, embed].

  Exact (one 1 per row, HIGHEST precision for float32). take_along_axis computes the same, but its
  backward is a scatter-add whose output XLA lays out length-minor on GPUs, and that layout then
  spreads through the whole encoder backward as transposes (13 ms of a 90 ms BERT-Large step on an
  H100); the one-hot product's backward is a plain batched matmul.
  """
  one_hot = jax.nn.one_hot(positions, x.shape[1], dtype=x.dtype)  # [batch, picks, length]
  precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
  return jnp.einsum('bpl,bld->bpd', one_hot, x, precision=precision)


def attention_bias(input_mask: jax.Array, dtype: Dtype) -> jax.Array:
  """[batch, length] 1/0 mask -> additive bias [batch, 1, 1, length]."""
  big_negative = jnp.finfo(dtype).min
  return jnp.where(input_mask[:, None, None, :] > 0, 0.0, big_negative).astype(dtype)


def pair_attention_bias(pair_ids: jax.Array, dtype: Dtype) -> jax.Array:
  """[batch, length] ids of packed pairs (0: padding) -> additive bias [batch, 1, length, length]
  that lets a token attend only to the tokens of its own pair."""
  big_negative = jnp.finfo(dtype).min
  same = (pair_ids[:, :, None] == pair_ids[:, None, :]) & (pair_ids[:, None, :] > 0)
  return jnp.where(same[:, None], 0.0, big_negative).astype(dtype)


def row_attention_bias(input_mask: jax.Array, pair_ids, dtype: Dtype) -> jax.Array:
  """The additive bias of rows as the batch has them: padding only ([batch, 1, 1, length]), or
  with packed pairs (pair_ids [batch, length]) attention within each ([batch, 1, length,
  length])."""
  if pair_ids is None:
    return attention_bias(input_mask, dtype)
  return pair_attention_bias(pair_ids, dtype)


def tied_logits(x: jax.Array, table: jax.Array, dtype: Dtype) -> jax.Array:
  """Logits against a (tied) word embedding table [vocab, embed]: [..., embed] -> [..., vocab]."""
  return jnp.einsum('...e,ve->...v', x.astype(dtype), jnp.asarray(table, dtype))


def causal_attention_bias(input_mask: jax.Array, dtype: Dtype) -> jax.Array:
  """[batch, length] 1/0 mask -> additive bias [batch, 1, length, length] that lets a token attend
  to itself and the real tokens before it."""
  big_negative = jnp.finfo(dtype).min
  length = input_mask.shape[1]
  earlier = jnp.arange(length)[None, :] <= jnp.arange(length)[:, None]  # [query, key]
  # One where(): adding a padding bias to a causal one would overflow to -inf, and a query with
  # no key left (an all-padding row) would then softmax to NaN instead of uniform.
  allowed = earlier[None, None] & (input_mask[:, None, None, :] > 0)
  return jnp.where(allowed, 0.0, big_negative).astype(dtype)


def last_positions(input_mask: jax.Array) -> jax.Array:
  """[batch, length] 1/0 mask -> [batch] int32 position of each row's last real token (0 for a
  row without one)."""
  positions = jnp.arange(input_mask.shape[1], dtype=jnp.int32)
  return jnp.max(jnp.where(input_mask > 0, positions[None, :], 0), axis=1)

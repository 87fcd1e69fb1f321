"""A pytest plugin (`-p registered_kernels`) registering attention kernels from outside
bert_jax, as a user's package would (the how-to in docs/ARCHITECTURE.md, "How to add a
kernel"), for tests/test_kernel_registry.py and tests/test_conformance_proof.py.

- 'pallas_rows': a Pallas kernel, one program per (row, head) computing softmax(q k^T / sqrt(d) +
  bias) v in float32 (always interpreted, so it runs on any backend); its backward is
  the einsums' (ops.attention.dot_product_attention), the way a kernel starts before its
  backward kernel exists. No dropout.
- 'pallas_rows_no_key_gradient': the same forward with the keys' gradient dropped, as a backward
  kernel that forgets a term would be: it runs, and trains elsewhere than the reference.
- 'einsum_dropout': the einsums with their dropout, to see what the dispatch hands a kernel.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
import numpy as np

from bert_jax import ops
from bert_jax.ops import attention as attention_ops


def _forward_kernel(q_ref, k_ref, v_ref, bias_ref, o_ref):
  # q_ref, k_ref, v_ref, o_ref: [length, head_dim] of one (row, head); bias_ref: [1 or length,
  # length], the row's additive mask.
  q, k, v = (ref[...].astype(jnp.float32) for ref in (q_ref, k_ref, v_ref))
  scores = q @ k.T / np.sqrt(q.shape[-1]).astype(np.float32) + bias_ref[...].astype(jnp.float32)
  probs = jax.nn.softmax(scores, axis=-1)  # [length, length]
  o_ref[...] = (probs @ v).astype(o_ref.dtype)


def _forward(query, key, value, bias):
  # query, key, value: [batch, length, heads, head_dim]; bias: [batch, 1, 1 or length, length].
  batch, length, heads, head_dim = query.shape
  squeezed = pl.Squeezed()
  tile = pl.BlockSpec((squeezed, length, squeezed, head_dim), lambda b, h: (b, 0, h, 0))
  bias_tile = pl.BlockSpec((squeezed, squeezed, bias.shape[2], length), lambda b, h: (b, 0, 0, 0))
  return pl.pallas_call(
      _forward_kernel, grid=(batch, heads), in_specs=[tile, tile, tile, bias_tile],
      out_specs=tile, out_shape=jax.ShapeDtypeStruct(query.shape, query.dtype),
      interpret=True)(query, key, value, bias)


def _reference(query, key, value, bias):
  return attention_ops.dot_product_attention(query, key, value, bias, None, 0.0, True,
                                             query.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _pallas_rows(query, key, value, bias, key_gradient):
  del key_gradient
  return _forward(query, key, value, bias)


def _pallas_rows_fwd(query, key, value, bias, key_gradient):
  del key_gradient
  return _forward(query, key, value, bias), (query, key, value, bias)


def _pallas_rows_bwd(key_gradient, inputs, grad):
  query, key, value, bias = inputs
  _, vjp = jax.vjp(_reference, query, key, value, bias)
  grad_q, grad_k, grad_v, grad_bias = vjp(grad)
  return grad_q, grad_k * key_gradient, grad_v, grad_bias


_pallas_rows.defvjp(_pallas_rows_fwd, _pallas_rows_bwd)


def pallas_rows(query, key, value, bias, *, rate, dropout_rng):
  del dropout_rng
  assert rate == 0.0, rate  # Validation refuses dropout for a kernel without it.
  return _pallas_rows(query, key, value, bias, 1.0)


def pallas_rows_no_key_gradient(query, key, value, bias, *, rate, dropout_rng):
  del rate, dropout_rng
  return _pallas_rows(query, key, value, bias, 0.0)


def einsum_dropout(query, key, value, bias, *, rate, dropout_rng):
  return attention_ops.dot_product_attention(query, key, value, bias, dropout_rng, rate,
                                             rate == 0.0, query.dtype)


PALLAS_ROWS = ops.AttentionKernel('pallas_rows', pallas_rows, dropout=False)
NO_KEY_GRADIENT = ops.AttentionKernel('pallas_rows_no_key_gradient', pallas_rows_no_key_gradient,
                                      dropout=False)
EINSUM_DROPOUT = ops.AttentionKernel('einsum_dropout', einsum_dropout)
KERNELS = (PALLAS_ROWS, NO_KEY_GRADIENT, EINSUM_DROPOUT)


def pytest_configure(config):
  """As a pytest plugin (`-p registered_kernels`): registers KERNELS before collection."""
  del config
  for kernel in KERNELS:
    ops.register_attention(kernel)

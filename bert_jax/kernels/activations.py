"""Activations the kernels and the model compute alike: the tanh GELU, its derivative from the
same tanh, and its custom VJP. Pure jax, at the bottom of the compute layers, so that a kernel
(kernels/gpu/fused_ffn.py) and the model's XLA path (models/layers.gelu, through ops/ffn) share
one definition.
"""

import math

import jax
import jax.numpy as jnp

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_GELU_CUBIC = 0.044715


@jax.custom_vjp
def gelu_tanh(x: jax.Array) -> jax.Array:
  """The tanh GELU of the original BERT code (= jax.nn.gelu(approximate=True)).

  Written in the operand order of XLA's GPU GELU pattern (gemm_rewriter), and its VJP saves only
  the input: under JAX's own autodiff the tanh is saved too, which gives it a second user, so
  XLA cannot fold the GELU into the matmul before it (cuBLASLt's GELU_AUX epilogue writes the
  activation and its input in one pass). The backward recomputes the tanh, in float32.
  """
  return x * (0.5 * (1 + jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_CUBIC * (x * (x * x))))))


def _gelu_tanh_fwd(x):
  return gelu_tanh(x), x


def gelu_tanh_and_grad(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """gelu_tanh(x) and its derivative from one tanh, in x's dtype (for Pallas kernels, which
  cannot hold gelu_tanh's custom VJP: fused_ffn's forward kernel saves the derivative)."""
  x2 = x * x
  t = jnp.tanh(_SQRT_2_OVER_PI * x * (1 + _GELU_CUBIC * x2))
  half_1pt = 0.5 + 0.5 * t
  return x * half_1pt, half_1pt + (0.5 * _SQRT_2_OVER_PI) * x * (1 - t * t) * (
      1 + (3 * _GELU_CUBIC) * x2)


def gelu_tanh_grad(x: jax.Array) -> jax.Array:
  """d gelu_tanh / dx in float32 (the tanh recomputed)."""
  return gelu_tanh_and_grad(x.astype(jnp.float32))[1]


def _gelu_tanh_bwd(x, g):
  return ((g.astype(jnp.float32) * gelu_tanh_grad(x)).astype(g.dtype),)


gelu_tanh.defvjp(_gelu_tanh_fwd, _gelu_tanh_bwd)

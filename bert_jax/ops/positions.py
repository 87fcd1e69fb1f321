"""Rotary position embeddings and bidirectional sliding windows: how modern encoders (ModernBERT,
NeoBERT) place tokens, computed as transformers computes them so that their checkpoints load.

Rotary embeddings (Su et al., 2021) rotate each query and key pair of features (i, i + D/2) by
an angle proportional to the token's position, so that q . k depends on the two positions only
through their difference. A sliding window lets a token attend to the tokens at most
`half_window` positions away (ModernBERT's local layers: local_attention = 128, half 64).
"""

import jax.numpy as jnp


def inverse_frequencies(head_dim: int, theta: float) -> jnp.ndarray:
  """theta^(-2i / head_dim) for i < head_dim / 2: [head_dim // 2], float32."""
  if head_dim <= 0 or head_dim % 2:
    raise ValueError(f'Rotary embeddings need an even head_dim > 0, got head_dim={head_dim}.')
  if theta <= 0:
    raise ValueError(f'Rotary embeddings need theta > 0, got theta={theta}.')
  return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def cos_sin(positions: jnp.ndarray, head_dim: int, theta: float = 10_000.0):
  """The rotation of each position: cos and sin, each [*positions.shape, head_dim] float32, the
  head_dim / 2 angles repeated once (the rotate-half layout)."""
  angles = positions[..., None].astype(jnp.float32) * inverse_frequencies(head_dim, theta)
  angles = jnp.concatenate([angles, angles], axis=-1)  # [..., head_dim]
  return jnp.cos(angles), jnp.sin(angles)


def rotate(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
  """x [batch, length, heads, head_dim] rotated by cos, sin [batch, length, head_dim]; computed
  in float32 and returned in x's dtype."""
  half = x.shape[-1] // 2
  x32 = x.astype(jnp.float32)
  rotated_half = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # Broadcast over heads.
  return (x32 * cos + rotated_half * sin).astype(x.dtype)


def sliding_window_mask(length: int, half_window: int) -> jnp.ndarray:
  """[length, length] bool: query i may attend to key j when |i - j| <= half_window. Distances
  are row indices, so in a packed row a sequence's window is the same as in its own row (the
  segment mask still keeps sequences apart)."""
  if half_window < 0:
    raise ValueError(f'A sliding window needs half_window >= 0, got half_window={half_window}.')
  index = jnp.arange(length)
  return jnp.abs(index[:, None] - index[None, :]) <= half_window

"""Rotary embeddings and sliding windows (bert_jax.ops.positions) against transformers'
ModernBERT, and the property that makes rotary embeddings relative."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from bert_jax.ops import positions

torch = pytest.importorskip('torch')
modernbert = pytest.importorskip('transformers.models.modernbert.modeling_modernbert')
masking_utils = pytest.importorskip('transformers.masking_utils')


@pytest.mark.parametrize('head_dim,theta', [(12, 10_000.0), (6, 160_000.0)])
def test_rotary_equals_modernberts(head_dim, theta):
  """ModernBERT's rotary module and apply_rotary_pos_emb at odd sizes (3 heads of 12, or 5 of
  6; global layers use theta 160,000, local ones 10,000), positions not starting at 0."""
  from transformers import ModernBertConfig  # pylint: disable=g-import-not-at-top
  batch, length, heads = 2, 7, 30 // head_dim
  config = ModernBertConfig(hidden_size=heads * head_dim, num_attention_heads=heads,
                            num_hidden_layers=1, global_rope_theta=theta,
                            local_rope_theta=theta)
  rotary = modernbert.ModernBertRotaryEmbedding(config)
  rng = np.random.default_rng(0)
  q = rng.standard_normal((batch, length, heads, head_dim)).astype(np.float32)
  k = rng.standard_normal((batch, length, heads, head_dim)).astype(np.float32)
  position_ids = np.stack([np.arange(length), np.arange(3, 3 + length)])
  layer_type = config.layer_types[0]
  cos_hf, sin_hf = rotary(torch.from_numpy(q), torch.from_numpy(position_ids), layer_type)
  q_hf, k_hf = modernbert.apply_rotary_pos_emb(torch.from_numpy(q).transpose(1, 2),
                                               torch.from_numpy(k).transpose(1, 2),
                                               cos_hf, sin_hf)
  cos, sin = positions.cos_sin(jnp.asarray(position_ids), head_dim, theta)
  np.testing.assert_allclose(cos, cos_hf.numpy(), atol=1e-6)
  np.testing.assert_allclose(sin, sin_hf.numpy(), atol=1e-6)
  np.testing.assert_allclose(positions.rotate(jnp.asarray(q), cos, sin),
                             q_hf.transpose(1, 2).numpy(), atol=1e-5)
  np.testing.assert_allclose(positions.rotate(jnp.asarray(k), cos, sin),
                             k_hf.transpose(1, 2).numpy(), atol=1e-5)


def test_rotary_scores_depend_on_the_distance_only():
  """q . k after rotation is the same for positions (m, n) and (m + s, n + s)."""
  head_dim = 8
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.standard_normal((1, 1, 1, head_dim)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((1, 1, 1, head_dim)), jnp.float32)

  def score(m, n):
    cos_m, sin_m = positions.cos_sin(jnp.array([[m]]), head_dim)
    cos_n, sin_n = positions.cos_sin(jnp.array([[n]]), head_dim)
    return float(jnp.sum(positions.rotate(q, cos_m, sin_m) * positions.rotate(k, cos_n, sin_n)))

  for shift in (1, 17, 250):
    assert score(5, 2) == pytest.approx(score(5 + shift, 2 + shift), abs=1e-4)
  assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)  # The distance does matter.
  assert score(0, 0) == pytest.approx(float(jnp.sum(q * k)), abs=1e-5)  # Position 0: no turn.


def test_rotate_keeps_the_dtype_and_the_norm():
  x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 5, 3, 4)), jnp.bfloat16)
  cos, sin = positions.cos_sin(jnp.broadcast_to(jnp.arange(5), (2, 5)), 4)
  y = positions.rotate(x, cos, sin)
  assert y.dtype == jnp.bfloat16 and y.shape == x.shape
  np.testing.assert_allclose(jnp.linalg.norm(y.astype(jnp.float32), axis=-1),
                             jnp.linalg.norm(x.astype(jnp.float32), axis=-1), rtol=2e-2)


@pytest.mark.parametrize('length,half_window', [(9, 2), (6, 0), (5, 64)])
def test_sliding_window_equals_transformers_bidirectional_window(length, half_window):
  overlay = masking_utils.sliding_window_bidirectional_overlay(half_window)
  expected = np.array([[bool(overlay(0, 0, torch.tensor(q), torch.tensor(k)))
                        for k in range(length)] for q in range(length)])
  np.testing.assert_array_equal(positions.sliding_window_mask(length, half_window), expected)


def test_sliding_window_attention_ignores_tokens_outside_the_window():
  """Attention under the window's bias: changing a key and value outside a query's window
  leaves that query's output as it was, and changing one inside changes it."""
  length, half_window, dim = 8, 2, 4
  rng = np.random.default_rng(3)
  q, k, v = (jnp.asarray(rng.standard_normal((length, dim)), jnp.float32) for _ in range(3))
  bias = jnp.where(positions.sliding_window_mask(length, half_window), 0.0, -1e9)

  def attend(k, v):
    return jax.nn.softmax(q @ k.T + bias, axis=-1) @ v

  before = attend(k, v)
  far = attend(k.at[7].add(5.0), v.at[7].add(5.0))  # Key 7 is 7 - 0 > 2 away from query 0.
  near = attend(k.at[2].add(5.0), v.at[2].add(5.0))  # Key 2 is inside query 0's window.
  np.testing.assert_allclose(far[0], before[0], atol=1e-6)
  assert not np.allclose(near[0], before[0], atol=1e-3)


@pytest.mark.parametrize('call,message', [
    (lambda: positions.cos_sin(jnp.arange(3)[None], 7), 'even head_dim > 0, got head_dim=7'),
    (lambda: positions.cos_sin(jnp.arange(3)[None], 8, theta=0.0), 'theta > 0, got theta=0.0'),
    (lambda: positions.sliding_window_mask(4, -1), 'half_window >= 0, got half_window=-1'),
])
def test_bad_settings_are_named(call, message):
  with pytest.raises(ValueError, match=message):
    call()

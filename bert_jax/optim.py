"""BERT's optimizers: AdamW (the paper's) or LAMB (You et al.), warmup + linear decay.

AdamW: eps 1e-6, decoupled weight decay 0.01 not on LayerNorm or biases, as the original BERT
(optax's has bias correction; the original AdamWeightDecayOptimizer had none).
LAMB: the same Adam update and decay, then each parameter's update is scaled by the trust ratio
||w|| / ||update|| (layer-wise adaptation); LayerNorm parameters and biases are left out of the
adaptation and the decay, as in You et al.'s BERT recipe.
"""

import flax
import jax
import jax.numpy as jnp
import optax

# Leaves that get no weight decay, as in the original BERT ("LayerNorm", "layer_norm", "bias").
NO_DECAY_LEAVES = ('bias', 'scale', 'output_bias')


# Leaves of at most this many values are squared and summed as one concatenated vector by
# global_norm. On a GPU each leaf's sum is otherwise a kernel of its own, about 1-2 us however
# small: BERT-Large has some 350 such leaves (biases, LayerNorm parameters).
SMALL_LEAF = 1 << 16


def global_norm(tree) -> jax.Array:
  """The L2 norm of all of the tree's leaves together (optax.tree.norm's value), the small
  leaves (SMALL_LEAF) summed in one pass over their concatenation, each larger one alone."""
  leaves = jax.tree.leaves(tree)
  small = [jnp.ravel(x).astype(jnp.float32) for x in leaves if x.size <= SMALL_LEAF]
  squares = [jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves if x.size > SMALL_LEAF]
  if small:
    squares.append(jnp.sum(jnp.square(jnp.concatenate(small))))
  return jnp.sqrt(sum(squares, jnp.float32(0)))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """optax.clip_by_global_norm (the same state, the same updates) with global_norm above: the
  updates scaled by max_norm / norm when their norm is at least max_norm."""

  def update(updates, state, params=None):
    del params
    norm = global_norm(updates)
    keep = norm < max_norm
    clip = lambda t: jax.lax.select(keep, t, (t / norm.astype(t.dtype)) * max_norm)  # noqa: E731
    return jax.tree.map(clip, updates), state

  return optax.GradientTransformation(optax.init_empty_state, update)


def learning_rate_schedule(peak: float, warmup_steps: int, num_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to `peak`, then linear decay to 0 at `num_steps`."""
  warmup = optax.linear_schedule(0.0, peak, max(warmup_steps, 1))
  decay = optax.linear_schedule(peak, 0.0, max(num_steps - warmup_steps, 1))
  return optax.join_schedules([warmup, decay], [warmup_steps])


def weight_decay_mask(params):
  """True for parameters that are decayed (and, under LAMB, adapted): kernels and embeddings."""
  flat = flax.traverse_util.flatten_dict(params)
  mask = {path: path[-1] not in NO_DECAY_LEAVES for path in flat}
  return flax.traverse_util.unflatten_dict(mask)


def lamb(learning_rate, b1, b2, eps, weight_decay, mu_dtype=None) -> optax.GradientTransformation:
  """LAMB with decay and trust ratio on weight_decay_mask's parameters only."""
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype),
      optax.add_decayed_weights(weight_decay, mask=weight_decay_mask),
      optax.masked(optax.scale_by_trust_ratio(), weight_decay_mask),
      optax.scale_by_learning_rate(learning_rate))


def create_optimizer(train_config) -> optax.GradientTransformation:
  """Global-norm clipping then AdamW or LAMB, as config.train describes."""
  schedule = learning_rate_schedule(train_config.learning_rate, train_config.warmup_steps,
                                    train_config.num_steps)
  # Adam's first moment may be stored in bfloat16 (train.adam_mu_dtype); the second moment and
  # the master weights stay in their own (float32) dtype.
  mu_dtype = jnp.dtype(train_config.get('adam_mu_dtype', 'float32'))
  if train_config.optimizer == 'lamb':
    update = lamb(schedule, train_config.adam_b1, train_config.adam_b2, train_config.adam_eps,
                  train_config.weight_decay, mu_dtype)
  else:
    update = optax.adamw(schedule, b1=train_config.adam_b1, b2=train_config.adam_b2,
                         eps=train_config.adam_eps, weight_decay=train_config.weight_decay,
                         mask=weight_decay_mask, mu_dtype=mu_dtype)
  return optax.chain(clip_by_global_norm(train_config.max_grad_norm), update)

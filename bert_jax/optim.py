"""BERT's optimizer: AdamW (eps 1e-6, decay not on LayerNorm or biases), warmup + linear decay."""

import flax
import optax

# Leaves that get no weight decay, as in the original BERT ("LayerNorm", "layer_norm", "bias").
NO_DECAY_LEAVES = ('bias', 'scale', 'output_bias')


def learning_rate_schedule(peak: float, warmup_steps: int, num_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to `peak`, then linear decay to 0 at `num_steps`."""
  warmup = optax.linear_schedule(0.0, peak, max(warmup_steps, 1))
  decay = optax.linear_schedule(peak, 0.0, max(num_steps - warmup_steps, 1))
  return optax.join_schedules([warmup, decay], [warmup_steps])


def weight_decay_mask(params):
  """True for parameters that are decayed: kernels and embeddings."""
  flat = flax.traverse_util.flatten_dict(params)
  mask = {path: path[-1] not in NO_DECAY_LEAVES for path in flat}
  return flax.traverse_util.unflatten_dict(mask)


def create_optimizer(train_config) -> optax.GradientTransformation:
  """Global-norm clipping then AdamW, as config.train describes."""
  schedule = learning_rate_schedule(train_config.learning_rate, train_config.warmup_steps,
                                    train_config.num_steps)
  return optax.chain(
      optax.clip_by_global_norm(train_config.max_grad_norm),
      optax.adamw(schedule, b1=train_config.adam_b1, b2=train_config.adam_b2,
                  eps=train_config.adam_eps, weight_decay=train_config.weight_decay,
                  mask=weight_decay_mask))

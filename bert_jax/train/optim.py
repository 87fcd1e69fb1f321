"""BERT's optimizers: AdamW (the paper's), LAMB (You et al.) or StableAdamW (Wortsman et al.,
ModernBERT's), warmup + linear decay or warmup-stable-decay.

AdamW: eps 1e-6, decoupled weight decay 0.01 not on LayerNorm or biases, as the original BERT
(optax's has bias correction; the original AdamWeightDecayOptimizer had none).
LAMB: the same Adam update and decay, then each parameter's update is scaled by the trust ratio
||w|| / ||update|| (layer-wise adaptation); LayerNorm parameters and biases are left out of the
adaptation and the decay, as in You et al.'s BERT recipe.
StableAdamW: AdamW whose step on each parameter tensor (its update and its decay) is divided by
max(1, RMS), RMS = sqrt(mean(g^2 / max(v_hat, eps^2))) over the tensor: Adafactor's update
clipping (Wortsman et al. 2023, "Stable and low-precision training for large-scale
vision-language models", Algorithm 2, whose debiased betas are Adam's bias correction).
Layer-wise learning-rate decay (fine-tuning, ELECTRA's recipe): each parameter's update scaled by
its depth in the encoder (`scale_by_layer_depth`).
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.models import albert

# Leaves that get no weight decay, as in the original BERT ("LayerNorm", "layer_norm", "bias").
NO_DECAY_LEAVES = ('bias', 'scale', 'output_bias')


def learning_rate_schedule(peak: float, warmup_steps: int, num_steps: int, kind: str = 'linear',
                           decay_steps: int = 0, decay_shape: str = 'linear') -> optax.Schedule:
  """Linear warmup from 0 to `peak`, then to 0 at `num_steps`: kind 'linear' decays linearly
  from the warmup's end (BERT's); 'wsd' (warmup-stable-decay, ModernBERT's trapezoid) holds the
  peak until the last `decay_steps` steps, which fall to 0 by `decay_shape`: 'linear', 'cosine'
  (half a cosine) or '1-sqrt' (1 - sqrt(t / decay_steps)). A WSD schedule is the same as that of
  a longer run up to its decay, so a decay can branch from any stable-phase checkpoint."""
  warmup = optax.linear_schedule(0.0, peak, max(warmup_steps, 1))
  if kind == 'linear':
    decay = optax.linear_schedule(peak, 0.0, max(num_steps - warmup_steps, 1))
    return optax.join_schedules([warmup, decay], [warmup_steps])
  length = max(decay_steps, 1)
  if decay_shape == 'cosine':
    decay = optax.cosine_decay_schedule(peak, length)
  elif decay_shape == '1-sqrt':
    decay = lambda count: peak * (1.0 - jnp.sqrt(jnp.clip(count / length, 0.0, 1.0)))  # noqa: E731
  else:
    decay = optax.linear_schedule(peak, 0.0, length)
  stable = optax.constant_schedule(peak)
  return optax.join_schedules([warmup, stable, decay],
                              [warmup_steps, num_steps - decay_steps])


def schedule_of(train_config, num_steps: int | None = None,
                warmup_steps: int | None = None) -> optax.Schedule:
  """The learning-rate schedule config.train sets (its num_steps and warmup_steps unless given:
  fine-tuning passes its own)."""
  return learning_rate_schedule(
      train_config.learning_rate,
      train_config.warmup_steps if warmup_steps is None else warmup_steps,
      train_config.num_steps if num_steps is None else num_steps,
      train_config.get('schedule', 'linear'), train_config.get('decay_steps', 0),
      train_config.get('decay_shape', 'linear'))


def weight_decay_mask(params):
  """True for parameters that are decayed (and, under LAMB, adapted): kernels and embeddings."""
  flat = flax.traverse_util.flatten_dict(params)
  mask = {path: path[-1] not in NO_DECAY_LEAVES for path in flat}
  return flax.traverse_util.unflatten_dict(mask)


# The encoder's scope in every model (models.Family.scope) and its parameters outside the layers
# that sit above the last layer (ModernBERT's final norm); the rest sit below the first.
ENCODER_SCOPE = 'bert'
ABOVE_LAYERS = ('final_norm',)


def layer_depth(path: tuple, num_layers: int):
  """A parameter's depth (ELECTRA's _get_layer_lrs): 0 for the embeddings (and encoder
  parameters every layer reads, such as DeBERTa's relative embeddings), i + 1 for encoder layer
  i, num_layers + 1 for what follows the last layer inside the encoder, num_layers + 2 for every
  parameter outside the encoder (pooler, task head). A scanned stack ('encoder/layer', layers on
  axis 0) gets an array of depths, 1..num_layers. path: the parameter's keys from the root."""
  if path[0] != ENCODER_SCOPE:
    return num_layers + 2
  if len(path) < 3 or path[1] != 'encoder':
    return num_layers + 2 if path[1] == 'pooler' else 0
  name = path[2]
  if name == 'layer':
    return np.arange(1, num_layers + 1)
  if name.startswith('layer_') and name[len('layer_'):].isdigit():
    return int(name[len('layer_'):]) + 1
  if name == 'shared_layer':
    raise ValueError('config.train.layerwise_lr_decay ' + albert.SHARED_LAYERS_REFUSAL)
  return num_layers + 1 if name in ABOVE_LAYERS else 0


def scale_by_layer_depth(decay: float, num_layers: int) -> optax.GradientTransformation:
  """Scales each update by decay ** (num_layers + 2 - layer_depth): the task head at the full
  rate, the top layer at decay^2, the embeddings at decay^(num_layers + 2), as
  google-research/electra's fine-tuning (whose head sits two steps above the top layer). Placed
  after the optimizer's update, it scales that parameter's learning rate (and its decay)."""

  def factor(path, update):
    keys = tuple(getattr(k, 'key', getattr(k, 'name', k)) for k in path)
    depth = layer_depth(keys, num_layers)
    scale = np.power(float(decay), num_layers + 2 - np.asarray(depth, np.float64))
    if scale.ndim:  # A scanned stack: one factor per layer along axis 0.
      if update.shape[0] != num_layers:
        raise ValueError(f'{"/".join(map(str, keys))} stacks {update.shape[0]} layers, not '
                         f'model.num_layers={num_layers}.')
      scale = scale.reshape((num_layers,) + (1,) * (update.ndim - 1))
    return update * jnp.asarray(scale, update.dtype)

  def update_fn(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(factor, updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def lamb(learning_rate, b1, b2, eps, weight_decay, mu_dtype=None) -> optax.GradientTransformation:
  """LAMB with decay and trust ratio on weight_decay_mask's parameters only."""
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype),
      optax.add_decayed_weights(weight_decay, mask=weight_decay_mask),
      optax.masked(optax.scale_by_trust_ratio(), weight_decay_mask),
      optax.scale_by_learning_rate(learning_rate))


def scale_by_stable_adam(b1: float, b2: float, eps: float, weight_decay: float, mask,
                         mu_dtype=None) -> optax.GradientTransformation:
  """StableAdamW's step before the learning rate: per tensor, (m_hat / (sqrt(v_hat) + eps) +
  weight_decay * param where `mask` is True) / max(1, RMS), RMS = sqrt(mean(g^2 / max(v_hat,
  eps^2))). Its state is optax's: (ScaleByAdamState, the decay's), as AdamW's."""
  inner = optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype),
                      optax.add_decayed_weights(weight_decay, mask=mask))

  def update_fn(grads, state, params):
    steps, state = inner.update(grads, state, params)
    adam = state[0]
    debias = 1 - b2 ** adam.count.astype(jnp.float32)

    def clip(step, grad, nu):  # One tensor: its step / max(1, RMS).
      rms = jnp.sqrt(jnp.mean(jnp.square(grad) / jnp.maximum(nu / debias, eps * eps)))
      return step / jnp.maximum(1.0, rms).astype(step.dtype)

    return jax.tree.map(clip, steps, grads, adam.nu), state

  return optax.GradientTransformation(inner.init, update_fn)


def stable_adamw(learning_rate, b1, b2, eps, weight_decay,
                 mu_dtype=None) -> optax.GradientTransformation:
  """StableAdamW with decay on weight_decay_mask's parameters only."""
  return optax.chain(scale_by_stable_adam(b1, b2, eps, weight_decay, weight_decay_mask, mu_dtype),
                     optax.scale_by_learning_rate(learning_rate))


def create_optimizer(train_config, num_steps: int | None = None,
                     warmup_steps: int | None = None, frozen: tuple[str, ...] = (),
                     num_layers: int = 0):
  """Global-norm clipping then AdamW, LAMB or StableAdamW under config.train's schedule
  (schedule_of): the one optimizer of every mode.

  train_config: config.train (learning_rate, adam_b1/b2/eps, weight_decay, max_grad_norm; optimizer
  'adamw' (default), 'lamb' or 'stableadamw'; adam_mu_dtype). num_steps and warmup_steps default to
  train_config.num_steps and warmup_steps (pretraining); fine-tuning passes its own. frozen: top
  level parameter subtrees that never change and carry no optimizer state (the feature-based mode's
  encoder, 'bert'). train_config.layerwise_lr_decay (fine-tuning; absent or 0: off) scales each
  update by its depth among the encoder's num_layers layers (scale_by_layer_depth).
  """
  schedule = schedule_of(train_config, num_steps, warmup_steps)
  # Adam's first moment may be stored in bfloat16 (train.adam_mu_dtype); the second moment and
  # the master weights stay in their own (float32) dtype.
  mu_dtype = jnp.dtype(train_config.get('adam_mu_dtype', 'float32'))
  name = train_config.get('optimizer', 'adamw')
  if name in ('lamb', 'stableadamw'):
    update = (lamb if name == 'lamb' else stable_adamw)(
        schedule, train_config.adam_b1, train_config.adam_b2, train_config.adam_eps,
        train_config.weight_decay, mu_dtype)
  else:
    update = optax.adamw(schedule, b1=train_config.adam_b1, b2=train_config.adam_b2,
                         eps=train_config.adam_eps, weight_decay=train_config.weight_decay,
                         mask=weight_decay_mask, mu_dtype=mu_dtype)
  tx = optax.chain(optax.clip_by_global_norm(train_config.max_grad_norm), update)
  decay = train_config.get('layerwise_lr_decay', 0.0)
  if decay:
    tx = optax.chain(tx, scale_by_layer_depth(decay, num_layers))
  if frozen:
    labels = lambda params: {k: 'frozen' if k in frozen else 'train' for k in params}  # noqa: E731
    tx = optax.multi_transform({'train': tx, 'frozen': optax.set_to_zero()}, labels)
  return tx


def for_pretraining(config):
  """A pretraining run's optimizer (create_optimizer of config.train) with the parameter scopes
  its objectives freeze (a distillation teacher, objectives.Objective.frozen) frozen; a run
  whose objectives freeze nothing gets create_optimizer(config.train) itself."""
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  return create_optimizer(config.train, frozen=objectives.resolve(config).frozen_scopes)

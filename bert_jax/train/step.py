"""Train state, its sharded creation, and the pure train and eval steps."""

import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax.models import bert as model_lib
from bert_jax import sharding

# Keys of a pretraining batch, and their per-example trailing shape (see data/pretraining.py).
BATCH_KEYS = ('input_ids', 'input_mask', 'segment_ids', 'masked_lm_positions',
              'masked_lm_ids', 'masked_lm_weights', 'next_sentence_labels')


@flax.struct.dataclass
class TrainState:
  """Everything a step changes; saved whole in checkpoints."""
  step: jax.Array  # [] int32
  params: Any
  opt_state: Any
  rng: jax.Array  # [2] uint32; dropout key of step s is fold_in(rng, s)


# Extra keys of packed batches (several pairs per row; see data/streaming.py).
PACKING_KEYS = ('position_ids', 'pair_ids', 'nsp_positions', 'nsp_weights')


def dummy_batch(batch_size: int, max_seq_length: int, max_predictions: int,
                max_pairs_per_row: int = 0):
  """Shape-only batch (as jax.ShapeDtypeStruct) for init, lowering and compilation.

  max_pairs_per_row > 0: a packed batch (NSP labels per pair, and the PACKING_KEYS).
  """
  s, p, k = max_seq_length, max_predictions, max_pairs_per_row
  spec = {'input_ids': (s,), 'input_mask': (s,), 'segment_ids': (s,),
          'masked_lm_positions': (p,), 'masked_lm_ids': (p,), 'masked_lm_weights': (p,),
          'next_sentence_labels': (k,) if k else ()}
  if k:
    spec.update({'position_ids': (s,), 'pair_ids': (s,), 'nsp_positions': (k,),
                 'nsp_weights': (k,)})
  floats = ('masked_lm_weights', 'nsp_weights')
  return {k: jax.ShapeDtypeStruct((batch_size,) + shape,
                                  jnp.float32 if k in floats else jnp.int32)
          for k, shape in spec.items()}


def _init_variables(model, rng, max_seq_length, max_predictions):
  ids = jnp.zeros((1, max_seq_length), jnp.int32)
  positions = jnp.zeros((1, max_predictions), jnp.int32)
  return model.init({'params': rng}, ids, ids, ids, positions, deterministic=True)


def state_initializer(config, model, tx):
  """init(rng) -> TrainState with logically annotated (boxed) parameters."""
  s, p = config.data.max_seq_length, config.data.max_predictions_per_seq

  def init(rng):
    params_rng, dropout_rng = jax.random.split(rng)
    params = _init_variables(model, params_rng, s, p)['params']
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=dropout_rng)
  return init


def abstract_train_state(config, model, tx):
  """The state's shapes and dtypes (boxed with logical names); nothing is materialised."""
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)  # A raw PRNGKey's shape: nothing runs eagerly.
  return jax.eval_shape(state_initializer(config, model, tx), key)


def train_state_shardings(config, model, tx, mesh, rules):
  """The state's NamedShardings, from its logical axis names under `rules`."""
  logical_specs = nn.get_partition_spec(abstract_train_state(config, model, tx))
  return sharding.logical_to_sharding(logical_specs, mesh, rules)


# Model sizes whose multiples a mesh axis may need, and the config key that sets each.
_SIZE_KEYS = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_heads', 'type_vocab_size',
              'max_position_embeddings')


def check_state_divides(config, model, tx, mesh, rules):
  """The abstract (unboxed) state; sharding.MeshError, naming a parameter and a fix, when the mesh
  cannot split it.

  E.g. the paper's vocab of 30522 rows cannot be split 4 ways over tensor=4. Runs before anything
  compiles (shapes only).
  """
  boxed = abstract_train_state(config, model, tx)
  shardings = sharding.logical_to_sharding(nn.get_partition_spec(boxed), mesh, rules)
  abstract = nn.meta.unbox(boxed)
  problems = sharding.indivisible(abstract.params, shardings.params)
  if not problems:
    return abstract
  path, shape, dim, ways, axes = problems[0]
  size = shape[dim]
  keys = [f'config.model.{k}={size}' for k in _SIZE_KEYS if config.model[k] == size]
  fix = (f'set {keys[0].split("=")[0]} to a multiple of {ways} (e.g. {-(-size // ways) * ways})'
         if keys else f'make that size a multiple of {ways}')
  raise sharding.MeshError(
      f'mesh {dict(mesh.shape)} with preset {config.mesh.preset!r} cannot split parameter '
      f'{path} {tuple(shape)}: dimension {dim} ({size}{", " + keys[0] if keys else ""}) '
      f'over {axes} ({ways} ways); {fix}, or use a mesh whose {axes} size divides it '
      f'({len(problems)} parameter(s) affected).')


def create_train_state(config, model, tx, mesh, rules):
  """Builds the state abstractly, derives its shardings, then materialises it sharded.

  Returns (state, state_shardings).
  """
  init_boxed = state_initializer(config, model, tx)
  state_shardings = train_state_shardings(config, model, tx, mesh, rules)
  init = lambda rng: nn.meta.unbox(init_boxed(rng))  # noqa: E731
  state = jax.jit(init, out_shardings=state_shardings)(jax.random.PRNGKey(config.seed))
  return state, state_shardings


def pretraining_losses(outputs, batch):
  """Sums and counts for MLM and NSP, so batches and devices can be pooled exactly."""
  logits = outputs['mlm_logits']  # [batch, predictions, vocab] float32
  labels = batch['masked_lm_ids']
  weights = batch['masked_lm_weights']
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  stats = {
      'mlm_loss_sum': jnp.sum(ce * weights),
      'mlm_weight': jnp.sum(weights),
      'mlm_correct': jnp.sum((jnp.argmax(logits, -1) == labels) * weights),
  }
  if 'nsp_logits' in outputs:
    nsp_logits = outputs['nsp_logits']  # [batch, 2], packed: [batch, pairs, 2]
    nsp_labels = batch['next_sentence_labels']
    nsp_weights = batch.get('nsp_weights', jnp.ones(nsp_labels.shape, jnp.float32))
    stats['nsp_loss_sum'] = jnp.sum(
        optax.softmax_cross_entropy_with_integer_labels(nsp_logits, nsp_labels) * nsp_weights)
    stats['nsp_count'] = jnp.sum(nsp_weights)
    stats['nsp_correct'] = jnp.sum((jnp.argmax(nsp_logits, -1) == nsp_labels) * nsp_weights)
  return stats


def total_loss(stats):
  """Mean MLM cross-entropy over real masked positions + mean NSP cross-entropy."""
  loss = stats['mlm_loss_sum'] / (stats['mlm_weight'] + 1e-5)
  if 'nsp_loss_sum' in stats:
    loss = loss + stats['nsp_loss_sum'] / stats['nsp_count']
  return loss


def summarize(stats) -> dict[str, float]:
  """Pooled sums/counts -> the metrics.jsonl fields (loss, mlm_*, nsp_*)."""
  stats = {k: float(v) for k, v in stats.items()}
  out = {'mlm_loss': stats['mlm_loss_sum'] / max(stats['mlm_weight'], 1e-5),
         'mlm_accuracy': stats['mlm_correct'] / max(stats['mlm_weight'], 1e-5)}
  out['loss'] = out['mlm_loss']
  if 'nsp_loss_sum' in stats:
    out['nsp_loss'] = stats['nsp_loss_sum'] / stats['nsp_count']
    out['nsp_accuracy'] = stats['nsp_correct'] / stats['nsp_count']
    out['loss'] += out['nsp_loss']
  return out


def _apply(model, params, batch, deterministic, rngs=None):
  return model.apply({'params': params}, batch['input_ids'], batch['segment_ids'],
                     batch['input_mask'], batch['masked_lm_positions'],
                     deterministic=deterministic, rngs=rngs,
                     position_ids=batch.get('position_ids'), pair_ids=batch.get('pair_ids'),
                     nsp_positions=batch.get('nsp_positions'))


def train_step(state: TrainState, batch, *, model, tx, skip_nonfinite: bool = False):
  """One optimizer step on a global batch. Pure: (state, batch) -> (state, stats).

  stats['finite'] is 1.0 when the loss and the gradient norm are finite. With skip_nonfinite,
  a step where they are not keeps the old parameters and optimizer state (the step counter still
  advances) and its stats are zeroed, so the interval's means cover the applied steps only.
  """
  dropout_rng = jax.random.fold_in(state.rng, state.step)
  if model.config.dropout_rng_impl == 'rbg':
    # XLA's RngBitGenerator draws the masks at a fraction of threefry's cost on GPUs.
    dropout_rng = jax.random.wrap_key_data(
        jax.random.bits(dropout_rng, (4,), jnp.uint32), impl='rbg')

  def loss_fn(params):
    outputs = _apply(model, params, batch, False, {'dropout': dropout_rng})
    stats = pretraining_losses(outputs, batch)
    return total_loss(stats), stats

  grads, stats = jax.grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  stats['grad_norm'] = optax.tree_utils.tree_norm(grads)
  finite = jnp.isfinite(total_loss(stats)) & jnp.isfinite(stats['grad_norm'])
  if skip_nonfinite:
    keep_old = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    params = jax.tree.map(keep_old, params, state.params)
    opt_state = jax.tree.map(keep_old, opt_state, state.opt_state)
    stats = jax.tree.map(lambda v: jnp.where(finite, v, jnp.zeros_like(v)), stats)
  stats['finite'] = finite.astype(jnp.float32)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, stats


def jit_train_step(model, tx, state_shardings, batch_shardings, skip_nonfinite=False,
                   compiler_options=None):
  """train_step jitted as it trains (and as aot.py compiles it): donated, sharded state.

  compiler_options: XLA debug options for this computation (config_lib.xla_options).
  """
  return jax.jit(functools.partial(train_step, model=model, tx=tx,
                                   skip_nonfinite=skip_nonfinite),
                 in_shardings=(state_shardings, batch_shardings),
                 out_shardings=(state_shardings, None), donate_argnums=0,
                 compiler_options=compiler_options or None)


def eval_step(params, batch, *, model):
  """Sums and counts of the eval metrics on one batch (no dropout)."""
  return pretraining_losses(_apply(model, params, batch, True), batch)


def build_model(config) -> model_lib.BertForPreTraining:
  return model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config))

"""The pure train step every mode jits, and the pretraining model's batch, losses and state.

train_step(state, batch) is one function for pretraining and fine-tuning: the mode hands it a
loss function. It is jitted once with explicit shardings and a donated state (jit_train_step), so
that the AOT compiler and the benchmark lower exactly what trains.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from bert_jax import objectives as objectives_lib
from bert_jax import sharding
from bert_jax.objectives import pretraining
from bert_jax.train import state as state_lib

TrainState = state_lib.TrainState


def train_step(state: TrainState, batch, *, loss_fn, tx, skip_nonfinite: bool = False,
               dropout_rng_impl: str = 'threefry', grad_accum_steps: int = 1, counts_fn=None):
  """One optimizer step on a global batch. Pure: (state, batch) -> (state, stats).

  loss_fn(params, batch, rngs) -> (loss, stats): the mode's loss and the sums it reports; the
  step adds stats['loss'], stats['grad_norm'] and stats['finite'] (1.0 when the loss and the
  gradient norm are finite). With skip_nonfinite, a step where they are not keeps the old
  parameters and optimizer state (the step counter still advances) and its stats are zeroed, so
  the interval's means cover the applied steps only. dropout_rng_impl: 'threefry', or 'rbg'
  (XLA's RngBitGenerator draws the masks at a fraction of threefry's cost on GPUs).
  grad_accum_steps > 1: the gradients come from that many micro-batches of the batch's rows in
  turn (accumulate_gradients), which then needs counts_fn and a loss_fn taking the counts.
  """
  dropout_rng = jax.random.fold_in(state.rng, state.step)
  if grad_accum_steps > 1:
    grads, stats = accumulate_gradients(state.params, batch, dropout_rng, loss_fn=loss_fn,
                                        counts_fn=counts_fn, num_micro_batches=grad_accum_steps,
                                        dropout_rng_impl=dropout_rng_impl)
  else:
    dropout_rng = dropout_key(dropout_rng, dropout_rng_impl)

    def loss_and_stats(params):
      loss, stats = loss_fn(params, batch, {'dropout': dropout_rng})
      return loss, {**stats, 'loss': loss}

    grads, stats = jax.grad(loss_and_stats, has_aux=True)(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  stats['grad_norm'] = optax.tree_utils.tree_norm(grads)
  finite = jnp.isfinite(stats['loss']) & jnp.isfinite(stats['grad_norm'])
  if skip_nonfinite:
    keep_old = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    params = jax.tree.map(keep_old, params, state.params)
    opt_state = jax.tree.map(keep_old, opt_state, state.opt_state)
    stats = jax.tree.map(lambda v: jnp.where(finite, v, jnp.zeros_like(v)), stats)
  stats['finite'] = finite.astype(jnp.float32)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, stats


def dropout_key(key, dropout_rng_impl: str = 'threefry'):
  """A raw threefry key as the dropout key of dropout_rng_impl ('rbg': an RngBitGenerator key)."""
  if dropout_rng_impl == 'rbg':
    return jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl='rbg')
  return key


def split_rows(x, num_micro_batches: int):
  """[batch, ...] -> [micro-batches, batch / micro-batches, ...]; micro-batch i holds rows i,
  i + n, i + 2n, ... (n micro-batches).

  Each device's block of rows splits evenly among the micro-batches, so no row moves between
  devices: the rows axis keeps the batch's sharding and the micro-batch axis is unsharded.
  """
  rows = x.reshape((x.shape[0] // num_micro_batches, num_micro_batches) + x.shape[1:])
  return nn.with_logical_constraint(rows.swapaxes(0, 1), (None, 'batch') + (None,) * (x.ndim - 1))


def accumulate_gradients(params, batch, dropout_rng, *, loss_fn, counts_fn,
                         num_micro_batches: int, dropout_rng_impl: str = 'threefry'):
  """(gradients, stats) of the whole batch from num_micro_batches micro-batches of its rows, run
  in turn (lax.scan): a step of a large batch with the activations of a micro-batch.

  counts_fn(batch) gives the whole batch's counts (what the loss divides by: masked positions,
  sequences); loss_fn(params, micro_batch, rngs, counts) divides each micro-batch's sums by them,
  so the micro-batches' losses, gradients and stats add up to the whole batch's (to float
  rounding; gradients are summed in float32). Micro-batch i draws its dropout from
  fold_in(dropout_rng, i).
  """
  counts = counts_fn(batch)
  micro_batches = jax.tree.map(lambda x: split_rows(x, num_micro_batches), batch)

  def micro_step(micro_batch, index):
    rngs = {'dropout': dropout_key(jax.random.fold_in(dropout_rng, index), dropout_rng_impl)}

    def loss_and_stats(params):
      loss, stats = loss_fn(params, micro_batch, rngs, counts)
      return loss, {**stats, 'loss': loss}
    return jax.grad(loss_and_stats, has_aux=True)(params)

  def add(totals, xs):
    return jax.tree.map(lambda t, x: t + x.astype(t.dtype), totals, micro_step(*xs)), None

  shapes = jax.eval_shape(micro_step, jax.tree.map(lambda x: x[0], micro_batches), 0)
  zeros = jax.tree.map(
      lambda s: jnp.zeros(s.shape, jnp.promote_types(s.dtype, jnp.float32)), shapes)
  (grads, stats), _ = jax.lax.scan(add, zeros,
                                   (micro_batches, jnp.arange(num_micro_batches)))
  return jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params), stats


def jit_train_step(loss_fn, tx, state_shardings, batch_shardings, skip_nonfinite=False,
                   dropout_rng_impl='threefry', compiler_options=None, grad_accum_steps=1,
                   counts_fn=None):
  """train_step jitted as it trains (and as aot.py compiles it): donated, sharded state.

  compiler_options: XLA debug options for this computation (core/xla_options.parse).
  """
  step = functools.partial(train_step, loss_fn=loss_fn, tx=tx, skip_nonfinite=skip_nonfinite,
                           dropout_rng_impl=dropout_rng_impl, grad_accum_steps=grad_accum_steps,
                           counts_fn=counts_fn)
  return jax.jit(step, in_shardings=(state_shardings, batch_shardings),
                 out_shardings=(state_shardings, None), donate_argnums=0,
                 compiler_options=compiler_options or None)


# Pretraining.

# The pretraining model and its shape-only batches live with the objectives
# (objectives/pretraining.py); the modes and tools reach them here.
build_model = pretraining.build
build_model_from = pretraining.build_from
objectives_of = pretraining.objectives_of
dummy_batch = pretraining.dummy_batch


def batch_shape(config) -> objectives_lib.BatchShape:
  """The rows of a run's (phase's) batches, from its config."""
  pairs = config.data.max_pairs_per_row if config.data.get('packing') else 0
  return objectives_lib.BatchShape(config.data.max_seq_length,
                                   config.data.max_predictions_per_seq, pairs,
                                   languages=bool(config.data.get('languages')))


def init_batch(model: pretraining.PretrainingModel, config):
  """Zeros of one row of the model's (unpacked) batch: what init traces. Host numpy, so that
  building the state abstractly runs nothing on a device."""
  spec = dummy_batch(1, config.data.max_seq_length, config.data.max_predictions_per_seq,
                     objectives=model.objectives)
  return {k: np.zeros(v.shape, v.dtype) for k, v in spec.items()}


def state_initializer(config, model, tx):
  """init(rng) -> the pretraining TrainState, parameters boxed with their logical names."""
  return state_lib.initializer(model, tx, init_batch(model, config))


def pretraining_loss_fn(model: pretraining.PretrainingModel):
  """loss_fn for train_step: the objectives' summed loss and their sums and counts.

  counts (a micro-batch's step): the whole batch's counts, which the loss divides by in place of
  the micro-batch's own.
  """
  objectives = objectives_of(model)

  def loss_fn(params, batch, rngs, counts=None):
    outputs = model.apply({'params': params}, batch, deterministic=False, rngs=rngs)
    stats = objectives_lib.losses(objectives, outputs, batch)
    divided = stats if counts is None else {**stats, **counts}
    return objectives_lib.total_loss(objectives, divided), stats
  return loss_fn


def pretraining_counts_fn(model: pretraining.PretrainingModel):
  """counts_fn for train_step: the objectives' counts of a batch (what their losses divide by)."""
  objectives = objectives_of(model)
  return lambda batch: objectives_lib.counts(objectives, batch)


def eval_step(params, batch, *, model):
  """Sums and counts of the objectives' metrics on one batch (no dropout)."""
  outputs = model.apply({'params': params}, batch, deterministic=True)
  return objectives_lib.losses(objectives_of(model), outputs, batch)


def summarize(model, stats) -> dict[str, float]:
  """Pooled sums and counts -> the metrics.jsonl fields (loss, mlm_*, nsp_*, ...)."""
  return objectives_lib.summarize(objectives_of(model), stats)


def jit_pretraining_step(config, model, tx, state_shardings, batch_shardings,
                         compiler_options=None):
  """The pretraining train step, jitted as it trains."""
  return jit_train_step(pretraining_loss_fn(model), tx, state_shardings, batch_shardings,
                        skip_nonfinite=config.train.max_nonfinite_skips > 0,
                        dropout_rng_impl=config.model.dropout_rng_impl,
                        compiler_options=compiler_options,
                        grad_accum_steps=config.train.grad_accum_steps,
                        counts_fn=pretraining_counts_fn(model))


def abstract_train_state(config, model, tx):
  """The pretraining state's shapes and dtypes (boxed); nothing is materialised."""
  return state_lib.abstract(state_initializer(config, model, tx))


def train_state_shardings(config, model, tx, mesh, rules):
  """The pretraining state's NamedShardings, from its logical axis names under `rules`."""
  return state_lib.shardings(state_initializer(config, model, tx), mesh, rules)


def create_train_state(config, model, tx, mesh, rules):
  """The pretraining state, materialised sharded: (state, state_shardings)."""
  seed = config.get('init_seed', -1)  # -1: config.seed (configs/base.py).
  return state_lib.create(state_initializer(config, model, tx),
                          config.seed if seed < 0 else seed, mesh, rules)


# Model sizes whose multiples a mesh axis may need, and the config key that sets each.
_SIZE_KEYS = ('vocab_size', 'hidden_size', 'intermediate_size', 'num_heads', 'type_vocab_size',
              'max_position_embeddings', 'embedding_size')


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
    check_state_fits(config, abstract, shardings, mesh)
    return abstract
  path, shape, dim, ways, axes = problems[0]
  size = shape[dim]
  keys = [f'config.model.{k}={size}' for k in _SIZE_KEYS if config.model.get(k) == size]
  fix = (f'set {keys[0].split("=")[0]} to a multiple of {ways} (e.g. {-(-size // ways) * ways})'
         if keys else f'make that size a multiple of {ways}')
  raise sharding.MeshError(
      f'mesh {dict(mesh.shape)} with preset {config.mesh.preset!r} cannot split parameter '
      f'{path} {tuple(shape)}: dimension {dim} ({size}{", " + keys[0] if keys else ""}) '
      f'over {axes} ({ways} ways); {fix}, or use a mesh whose {axes} size divides it '
      f'({len(problems)} parameter(s) affected).')


def state_bytes_per_device(abstract_tree, shardings) -> int:
  """Bytes of `abstract_tree` on one device: each array's shard under its sharding."""
  leaves, placements = jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings)
  assert len(leaves) == len(placements), (len(leaves), len(placements))
  return sum(int(np.prod(placement.shard_shape(leaf.shape))) * leaf.dtype.itemsize
             for leaf, placement in zip(leaves, placements))


def device_memory_limit(mesh) -> int | None:
  """Bytes one device of `mesh` can allocate (XLA's bytes_limit), or None where the backend does
  not say (CPU)."""
  local = [d for d in mesh.devices.flat if getattr(d, 'process_index', 0) == jax.process_index()]
  try:
    stats = (local or list(mesh.devices.flat))[0].memory_stats()
  # An AOT topology's devices, or a backend without the call: no limit to check against.
  except Exception:  # pylint: disable=broad-except
    return None
  return (stats or {}).get('bytes_limit')


def check_state_fits(config, abstract, shardings, mesh) -> None:
  """Before anything compiles: the train state and its gradients, which every step holds at
  once, must fit one device's memory (activations come on top, so this is a floor). MeshError
  naming the sizes and the settings that shrink them otherwise."""
  limit = device_memory_limit(mesh)
  if not limit:
    return
  params = state_bytes_per_device(abstract.params, shardings.params)
  optimizer = state_bytes_per_device(abstract.opt_state, shardings.opt_state)
  need = 2 * params + optimizer  # The gradients are a second copy of the parameters.
  if need <= limit:
    logging.info('Train state and gradients: %s per device of %s.', _size(need), _size(limit))
    return
  raise sharding.MeshError(
      f'This config does not fit the device: its parameters ({_size(params)} per device), their '
      f'gradients (as much) and the optimizer state ({_size(optimizer)}) need {_size(need)} '
      f'before any activation, and one {mesh.devices.flat[0].device_kind} has {_size(limit)}. '
      'Shard them over the devices (config.mesh.preset=\'fsdp\'; now '
      f'{config.mesh.preset!r}), keep Adam\'s first moment in bfloat16 '
      '(config.train.adam_mu_dtype=\'bfloat16\'), or train a smaller model.')


def _size(num_bytes: int) -> str:
  if num_bytes >= 2**30:
    return f'{num_bytes / 2**30:.2f} GiB'
  return f'{num_bytes / 2**20:.1f} MiB' if num_bytes >= 2**20 else f'{num_bytes / 2**10:.0f} KiB'


def lower_pretraining_step(config, mesh):
  """The pretraining train step lowered as pretrain.py jits and traces it, over `mesh` (shapes
  only: the mesh's devices need not be able to run anything)."""
  from bert_jax.core import xla_options  # pylint: disable=g-import-not-at-top
  from bert_jax.train import optim  # pylint: disable=g-import-not-at-top
  rules = sharding.logical_axis_rules(config.mesh.preset)
  model = build_model(config)
  tx = optim.for_pretraining(config)
  # The shardings do not depend on the context (rules are explicit).
  state_shardings = train_state_shardings(config, model, tx, mesh, rules)
  state = nn.meta.unbox(abstract_train_state(config, model, tx))
  batch = dummy_batch(config.train.batch_size, config.data.max_seq_length,
                      config.data.max_predictions_per_seq,
                      config.data.max_pairs_per_row if config.data.packing else 0,
                      objectives=model.objectives, languages=bool(config.data.get('languages')))
  train_step = jit_pretraining_step(config, model, tx, state_shardings,
                                    sharding.batch_sharding(mesh),
                                    compiler_options=xla_options.parse(config))
  with sharding.activation_rules(mesh, rules):  # As pretrain.py traces it.
    return train_step.lower(state, batch)

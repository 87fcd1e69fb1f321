"""The train state and its sharded creation, for every mode (pretraining, fine-tuning).

The state is built abstractly first (eval_shape), its shardings derived from the parameters'
logical axis names, and only then materialised, sharded, by a jitted init: nothing is put on one
device whole.
"""

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import sharding


@flax.struct.dataclass
class TrainState:
  """Everything a step changes; saved whole in checkpoints."""
  step: jax.Array  # [] int32
  params: Any
  opt_state: Any
  rng: jax.Array  # [2] uint32; dropout key of step s is fold_in(rng, s)


def initializer(model, tx, *init_args):
  """init(rng) -> TrainState with logically annotated (boxed) parameters; init_args: inputs of
  the model's shapes (batch of 1), passed to model.init with deterministic=True."""
  def init(rng):
    params_rng, dropout_rng = jax.random.split(rng)
    params = model.init({'params': params_rng}, *init_args, deterministic=True)['params']
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=dropout_rng)
  return init


def abstract(init):
  """The state's shapes and dtypes (boxed with logical names); nothing is materialised."""
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)  # A raw PRNGKey's shape: nothing runs eagerly.
  return jax.eval_shape(init, key)


def shardings(init, mesh, rules):
  """The state's NamedShardings, from its logical axis names under `rules`."""
  return sharding.logical_to_sharding(nn.get_partition_spec(abstract(init)), mesh, rules)


def jit_init(init, state_shardings):
  """init compiled to build the (unboxed) state directly in its shardings: rng -> state."""
  return jax.jit(lambda rng: nn.meta.unbox(init(rng)), out_shardings=state_shardings)


def create(init, seed: int, mesh, rules):
  """Materialises the state, sharded: (state, state_shardings)."""
  state_shardings = shardings(init, mesh, rules)
  return jit_init(init, state_shardings)(jax.random.PRNGKey(seed)), state_shardings

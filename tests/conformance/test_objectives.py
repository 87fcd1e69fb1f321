"""What every registered objective owes, checked over objectives.available(): an objective
registered before collection (a built-in one, or one a plugin registers: test_conformance_proof.py)
is checked here with no edit to this file.

Each is built in the smallest run that validates with it: configs/tiny.py at micro sizes naming
it (alone, then after 'mlm', with the attention it declares), else the first recipe in configs/
naming it (at size=tiny where the recipe has one) shrunk to the same sizes. On a random batch:
its stats and metrics are its own ('<name>_...', so objectives compose), its loss is its
'<name>_loss' metric, its counts are the batch's, its stats pool exactly over rows (the eval
and the devices add them up), and micro-batches divided by the whole batch's counts give the
whole batch's loss (gradient accumulation); an objective without counts is refused
train.grad_accum_steps > 1 before anything is built.
"""

import functools
import importlib
import pkgutil

import jax
import numpy as np
import pytest

import configs
from bert_jax import config_lib
from bert_jax import objectives
from bert_jax.train import step as steps
from conftest import MICRO, micro_config, random_pretraining_batch

OBJECTIVES = objectives.available()
ROWS = 4


def recipes():
  """(where, config) of every pretraining recipe in configs/, at size=tiny where it has one."""
  for info in sorted(pkgutil.iter_modules(configs.__path__), key=lambda i: i.name):
    module = importlib.import_module(f'configs.{info.name}')
    for arg in ('size=tiny', None):
      try:
        config = module.get_config(arg)
      except ValueError:  # No size= argument.
        continue
      if 'objectives' in config:
        yield f'configs/{info.name}.py' + (f':{arg}' if arg else ''), config
      break


def shrink(config):
  """`config` at micro sizes: MICRO's keys, on every model shape it holds (a teacher's too), a
  factorised embedding at half the width, one micro-batch, the built-in corpus."""
  for key, value in MICRO.items():
    section, leaf = key.split('.')
    config[section][leaf] = value
    if section == 'model':
      for node in config.values():
        for shape in (node.values() if hasattr(node, 'values') else ()):
          if hasattr(shape, 'keys') and 'hidden_size' in shape and leaf in shape:
            shape[leaf] = value
  if config.model.get('embedding_size', 0):
    config.model.embedding_size = config.model.hidden_size // 2
  config.train.grad_accum_steps = 1
  config.data.corpus = 'builtin'
  return config


def candidates(name):
  causal = {'model.causal': objectives.get(name).causal}
  for names in (name, f'mlm,{name}'):
    yield f'configs/tiny.py at micro sizes, objectives={names!r}', micro_config(
        objectives=names, **causal)
  for where, config in recipes():
    if name in objectives.parse(config.objectives):
      yield f'{where} at micro sizes', shrink(config)


@functools.cache
def objective_config(name):
  """The first candidate run that validates with objective `name`."""
  refusals = []
  for where, config in candidates(name):
    try:
      config_lib.validate(config)
      return config
    except config_lib.ConfigError as e:
      refusals.append(f'{where}: {e}')
  pytest.fail(f'No run validates with objective {name!r}: name it in a recipe under configs/, '
              'or let it train after mlm. Refused:\n' + '\n'.join(refusals))


@functools.cache
def built(name):
  """(the objective as the run configures it, a random batch of ROWS rows, the pretraining
  model's outputs on it, deterministic)."""
  config = objective_config(name)
  model = steps.build_model(config)
  shape = steps.batch_shape(config)
  spec = steps.dummy_batch(ROWS, shape.max_seq_length, shape.max_predictions,
                           objectives=model.objectives)
  batch = {**{k: np.zeros(v.shape, v.dtype) for k, v in spec.items()},
           **random_pretraining_batch(config, rows=ROWS, vocab=config.model.vocab_size)}
  params = jax.jit(lambda: model.init(jax.random.key(0), batch, deterministic=True))()
  outputs = jax.device_get(jax.jit(lambda p: model.apply(p, batch, deterministic=True))(params))
  objective = next(o for o in steps.objectives_of(model) if o.name == name)
  return objective, batch, outputs


def rows(tree, part: slice):
  """The rows `part` of every array whose leading axis is the batch's."""
  return jax.tree.map(lambda x: x[part] if np.ndim(x) and np.shape(x)[0] == ROWS else x, tree)


def as_floats(stats) -> dict:
  return {k: np.asarray(v, np.float64) for k, v in stats.items()}


@pytest.mark.parametrize('name', OBJECTIVES)
def test_its_stats_and_metrics_are_its_own_and_its_loss_is_its_metric(name):
  objective, batch, outputs = built(name)
  stats = as_floats(objective.losses(outputs, batch))
  assert stats and all(k.startswith(f'{name}_') for k in stats), sorted(stats)
  assert all(np.all(np.isfinite(v)) for v in stats.values()), stats
  fields = objective.metrics({k: float(v) if np.ndim(v) == 0 else v for k, v in stats.items()})
  assert all(k.startswith(f'{name}_') for k in fields), sorted(fields)
  assert float(objective.loss(stats)) == pytest.approx(fields[f'{name}_loss'], rel=1e-5)


@pytest.mark.parametrize('name', OBJECTIVES)
def test_its_stats_pool_exactly_over_rows(name):
  objective, batch, outputs = built(name)
  whole = as_floats(objective.losses(outputs, batch))
  parts = [as_floats(objective.losses(rows(outputs, part), rows(batch, part)))
           for part in (slice(0, 1), slice(1, ROWS))]
  for key, value in whole.items():
    np.testing.assert_allclose(parts[0][key] + parts[1][key], value, rtol=1e-5, atol=1e-5,
                               err_msg=key)


@pytest.mark.parametrize('name', OBJECTIVES)
def test_micro_batches_over_its_counts_add_up_to_the_batchs_loss(name):
  objective, batch, outputs = built(name)
  if objective.counts is None:
    config = objective_config(name).copy_and_resolve_references()
    config.train.grad_accum_steps = 2
    with pytest.raises(config_lib.ConfigError, match=rf'grad_accum_steps=2: .*{name}'):
      config_lib.validate(config)
    return
  stats = objective.losses(outputs, batch)
  counts = objective.counts(batch)
  assert counts and set(counts) <= set(stats), (sorted(counts), sorted(stats))
  for key, value in counts.items():
    np.testing.assert_allclose(np.asarray(value), np.asarray(stats[key]), err_msg=key)
  accumulated = sum(
      float(objective.loss({**objective.losses(rows(outputs, part), rows(batch, part)),
                            **counts}))
      for part in (slice(0, 1), slice(1, 3), slice(3, ROWS)))
  assert accumulated == pytest.approx(float(objective.loss(stats)), rel=1e-5)

"""size=tiny of every family config: configs/tiny.py's shape and schedule on the built-in
corpus, with the family's own objectives, masking, rows, tokenizer and switches kept. The fast
tier checks each config; the slow tier trains each a few steps from the config as shipped."""

import importlib
import json
import os

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.train import pretrain
from configs import base

# (config file, its arguments beside size=tiny): every family config with sizes.
FAMILIES = [('roberta', ''), ('albert', ''), ('spanbert', ''), ('electra', ''),
            ('modernbert', ''), ('deberta', ''), ('deberta', 'objective=rtd'), ('xlm', '')]
IDS = [name + (f'_{extra.split("=")[1]}' if extra else '') for name, extra in FAMILIES]


def tiny_config(name, extra='', more=''):
  module = importlib.import_module(f'configs.{name}')
  return module.get_config(','.join(filter(None, ('size=tiny', extra, more))))


def recipe_config(name, extra=''):
  module = importlib.import_module(f'configs.{name}')
  return module.get_config(extra or None)


@pytest.mark.parametrize('name, extra', FAMILIES, ids=IDS)
def test_a_tiny_family_keeps_its_recipe_at_tiny_shape_and_validates(name, extra):
  config, recipe = tiny_config(name, extra), recipe_config(name, extra)
  config_lib.validate(config)
  model, data, train = config.model, config.data, config.train
  assert (model.num_layers, model.hidden_size, model.num_heads) == (2, 128, 2)
  assert model.intermediate_size / 128 == pytest.approx(
      recipe.model.intermediate_size / recipe.model.hidden_size, rel=0.01)
  assert (data.corpus, data.max_seq_length, data.tokenizer_vocab_size) == ('builtin', 64, 4096)
  assert model.vocab_size - data.tokenizer_vocab_size == (
      recipe.model.vocab_size - recipe.data.tokenizer_vocab_size)
  # Masked positions per row in the recipe's proportion to the row, never below its rate.
  assert data.max_predictions_per_seq >= round(64 * config.masking.rate)
  assert (train.batch_size, train.grad_accum_steps, train.num_steps) == (32, 1, 2000)
  assert train.log_every <= 100 and train.eval_every <= train.num_steps
  # What makes the recipe its family's stays.
  assert config.objectives == recipe.objectives and config.masking == recipe.masking
  for key in ('tokenizer', 'rows', 'lowercase'):
    assert data[key] == recipe.data[key], key
  assert train.optimizer == recipe.train.optimizer
  switches = [k for k in recipe.model if k not in (
      'num_layers', 'hidden_size', 'num_heads', 'intermediate_size', 'embedding_size',
      'vocab_size')]
  assert {k: model[k] for k in switches} == {k: recipe.model[k] for k in switches}


def test_a_factorised_embedding_stays_factorised_at_half_the_width():
  assert tiny_config('albert').model.embedding_size == 64  # ALBERT: E = 128 < H = 768.
  assert tiny_config('electra').model.embedding_size == 64  # ELECTRA-Small: 128 < 256.
  assert tiny_config('roberta').model.embedding_size == 0  # E = H.


def test_arguments_after_size_tiny_still_apply():
  config = tiny_config('roberta', more='steps=40,seq=128')
  assert (config.train.num_steps, config.train.warmup_steps) == (40, 4)  # Its share: 10%.
  assert config.data.max_seq_length == 128 and config.data.max_predictions_per_seq >= 20


def test_another_size_names_tiny_among_the_valid_ones():
  with pytest.raises(ValueError, match=r"size='huge'.*base, large, tiny"):
    tiny_config('roberta', more='size=huge')
  with pytest.raises(ValueError, match=r"size='tiny' with recipe='xlm'"):
    tiny_config('xlm', extra='recipe=xlm')
  assert base.TINY['hidden'] == 128


@pytest.fixture(scope='module', name='vocab_cache')
def fixture_vocab_cache(tmp_path_factory):
  """One vocab cache for the runs below: families of one tokenizer kind train it once."""
  return str(tmp_path_factory.mktemp('vocab-cache'))


@pytest.mark.slow
@pytest.mark.parametrize('name, extra', FAMILIES, ids=IDS)
def test_each_tiny_family_trains_from_its_shipped_config(name, extra, tmp_path, vocab_cache):
  """A few steps of the tiny recipe as a user runs it (`--config=configs/NAME.py:size=tiny`),
  its vocab trained on the built-in corpus: finite losses that fall."""
  config = tiny_config(name, extra, 'steps=12')
  config.train.update(log_every=4, eval_every=12, eval_batches=2, checkpoint_every=12)
  config.data.tokenizer_cache_dir = vocab_cache
  workdir = str(tmp_path / 'run')
  pretrain.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  train = [r for r in records if r['split'] == 'train']
  evals = [r for r in records if r['split'] == 'eval']
  assert [r['step'] for r in train] == [4, 8, 12] and [r['step'] for r in evals] == [0, 12]
  assert all(np.isfinite(r['loss']) for r in records)
  assert evals[-1]['loss'] < evals[0]['loss']

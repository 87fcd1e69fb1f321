"""The fine-tuning learning-rate grid: parsing and its errors, the config argument, picking the
rate with the best median on dev, and the convergence evidence kept per rate."""

import math

import ml_collections
import pytest

from bert_jax import config_lib
from bert_jax.train import lr_grid
from configs import finetune as finetune_config
from configs import glue as glue_config


def seed_result(seed, accuracy, losses=()):
  """A seed's results.json as finetune._run_seed writes it: dev metrics and an eval per epoch."""
  curve = [{'epoch': float(i + 1), 'step': 10 * (i + 1), 'accuracy': accuracy, 'loss': loss}
           for i, loss in enumerate(losses)]
  return {'seed': seed, 'metrics': {'dev': {'accuracy': accuracy, 'f1': accuracy - 1}},
          'curve': {'dev': curve}}


@pytest.mark.parametrize('value,rates', [
    ('5e-5,4e-5,3e-5,2e-5', (5e-5, 4e-5, 3e-5, 2e-5)),
    (' 1e-4 , 3e-4 ', (1e-4, 3e-4)),
    ('', ()),
    ((2e-5, 3e-5), (2e-5, 3e-5)),
])
def test_a_grid_parses_to_its_rates_in_order(value, rates):
  assert lr_grid.parse(value) == rates


@pytest.mark.parametrize('value,match', [
    ('5e-5,fast', r"config\.train\.learning_rates='5e-5,fast': 'fast' is not a number"),
    ('5e-5,0', r"'0' is not a valid learning rate; each rate must be a finite number > 0"),
    ('-1e-5', r"'-1e-5' is not a valid learning rate"),
    ('nan', r"'nan' is not a valid learning rate"),
    ('inf,1e-5', r"'inf' is not a valid learning rate"),
    ('5e-5,,4e-5', r"'' is not a number"),
    ('5e-5,5e-05', r'names 5e-05 twice'),
    ('5e-5/4e-5', r"separate the rates with commas; the config argument lrs= takes them "
                  r"separated by '/'"),
    (5e-5, r'expected learning rates separated by commas'),
    ((True,), r'True is not a valid learning rate'),
])
def test_a_bad_grid_is_refused_naming_the_entry(value, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    lr_grid.parse(value)


def test_an_empty_grid_is_the_one_configured_rate():
  train = finetune_config.get_config().train
  assert train.learning_rates == ''
  assert lr_grid.rates(train) == (train.learning_rate,)
  train.learning_rates = '3e-5,2e-5'
  assert lr_grid.rates(train) == (3e-5, 2e-5)


@pytest.mark.parametrize('arg,grid', [
    ('task=mrpc,lrs=5e-5/4e-5', '5e-5,4e-5'),
    ('lrs=paper,task=stsb', '5e-5,4e-5,3e-5,2e-5'),
    ('task=mrpc', ''),
])
def test_the_lrs_argument_sets_the_grid(arg, grid):
  config = glue_config.get_config(arg)
  assert config.train.learning_rates == grid
  assert lr_grid.rates(config.train) == (tuple(float(r) for r in grid.split(',')) if grid
                                         else (config.train.learning_rate,))


def test_with_rate_changes_only_the_rate():
  train = finetune_config.get_config().train
  copy = lr_grid.with_rate(train, 4e-5)
  assert copy.learning_rate == 4e-5 and train.learning_rate == 2e-5
  assert {k: v for k, v in copy.items() if k != 'learning_rate'} == {
      k: v for k, v in train.items() if k != 'learning_rate'}
  assert isinstance(copy, ml_collections.ConfigDict)


def test_the_rate_with_the_best_median_is_selected():
  # 4e-5 has the best single seed, 3e-5 the best median.
  assert lr_grid.select({5e-5: 80.0, 4e-5: 81.0, 3e-5: 83.5, 2e-5: 82.0}) == 3e-5


def test_ties_go_to_the_rate_listed_first_and_nan_ranks_last():
  assert lr_grid.select({5e-5: 82.0, 4e-5: 82.0, 3e-5: 81.0}) == 5e-5
  assert lr_grid.select({5e-5: math.nan, 4e-5: 10.0}) == 4e-5
  assert lr_grid.select({5e-5: math.nan, 4e-5: math.nan}) == 5e-5


def test_the_summary_selects_on_medians_and_keeps_every_rates_seeds():
  per_rate = {
      5e-5: [seed_result(0, 70.0), seed_result(1, 95.0), seed_result(2, 71.0)],  # median 71
      3e-5: [seed_result(0, 80.0), seed_result(1, 82.0), seed_result(2, 78.0)],  # median 80
  }
  summary = lr_grid.summarize(per_rate, 'dev', 'accuracy', grid=True)
  assert summary['learning_rate'] == 3e-5 and summary['learning_rates'] == [5e-5, 3e-5]
  assert summary['selection']['split'] == 'dev' and summary['selection']['metric'] == 'accuracy'
  assert set(summary['by_rate']) == {'5e-05', '3e-05'}
  first = summary['by_rate']['5e-05']
  assert (first['scores'], first['median'], first['min'], first['max']) == (
      [70.0, 95.0, 71.0], 71.0, 70.0, 95.0)
  assert first['medians'] == {'dev': {'accuracy': 71.0, 'f1': 70.0}}
  assert {k: summary['selected'][k] for k in ('median', 'min', 'max')} == {
      'median': 80.0, 'min': 78.0, 'max': 82.0}


def test_the_last_epochs_dev_loss_change_is_the_convergence_evidence():
  per_rate = {2e-5: [seed_result(0, 80.0, [0.9, 0.6, 0.5]), seed_result(1, 81.0, [0.8, 0.6, 0.58]),
                     seed_result(2, 79.0, [0.7, 0.5, 0.52])]}
  chosen = lr_grid.summarize(per_rate, 'dev', 'accuracy', grid=False)['selected']
  assert chosen['dev_loss'] == pytest.approx(0.52)
  # Per seed -0.1, -0.02, +0.02: the median still falls a little.
  assert chosen['dev_loss_change'] == pytest.approx(-0.02)
  assert chosen['dev_metric_change'] == 0.0


def test_one_evaluation_per_run_has_no_trend():
  assert lr_grid.last_change([{'loss': 0.4}], 'loss') is None
  assert lr_grid.last_change([{'loss': None}, {'loss': None}], 'loss') is None  # SQuAD dev.
  summary = lr_grid.summarize({5e-5: [seed_result(0, 80.0, [0.4])]}, 'dev', 'accuracy', False)
  assert summary['selected']['dev_loss_change'] is None


def test_rates_are_chosen_on_dev_or_the_first_eval_split():
  assert lr_grid.selection_split(['dev']) == 'dev'
  assert lr_grid.selection_split(['dev_matched', 'dev_mismatched']) == 'dev_matched'


def test_a_rates_folder_and_label_name_it_exactly():
  assert lr_grid.label(3e-5) == '3e-05' and lr_grid.directory(3e-4) == 'lr_0.0003'
  assert lr_grid.parse(lr_grid.text((5e-5, 1.5e-4))) == (5e-5, 1.5e-4)

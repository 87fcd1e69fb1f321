"""The paper's fine-tuning protocol over learning rates: every rate of a grid fine-tunes every
seed, the rate with the best median dev score (the task's main metric) is selected, and results
keep per rate each seed's score, their median and min-max spread, and how the dev loss moved
over the last epoch (whether fine-tuning had converged).

BERT (Devlin et al. 2018, section 4 and appendix A.3) selects among 5e-5, 4e-5, 3e-5 and 2e-5 on
dev (configs/finetune.py's PAPER_LEARNING_RATES). An empty grid is the single
config.train.learning_rate. Pure: finetune.run trains the
runs; this module parses the grid, decides and summarises.
"""

import math
import statistics

import ml_collections
import numpy as np

from bert_jax import config_lib

KEY = 'config.train.learning_rates'


def parse(value, key: str = KEY) -> tuple[float, ...]:
  """The rates of a grid given as comma-separated text ('5e-5,4e-5') or a sequence of numbers;
  () for '' (no grid). ConfigError naming the entry unless each is a finite number > 0, given
  once."""
  if isinstance(value, str):
    if not value.strip():
      return ()
    entries = [entry.strip() for entry in value.split(',')]
  elif isinstance(value, (list, tuple)):
    entries = list(value)
  else:
    raise config_lib.ConfigError(f'{key}={value!r}: expected learning rates separated '
                                 "by commas, e.g. '5e-5,4e-5,3e-5,2e-5' ('' for none).")
  rates = []
  for entry in entries:
    try:
      rate = float(entry)
    except (TypeError, ValueError):
      hint = (' (separate the rates with commas; the config argument lrs= takes them '
              "separated by '/', e.g. lrs=5e-5/4e-5)" if isinstance(entry, str)
              and '/' in entry else '')
      raise config_lib.ConfigError(f'{key}={value!r}: {entry!r} is not a number{hint}; '
                                   'each rate must be a finite number > 0.') from None
    if isinstance(entry, bool) or not (math.isfinite(rate) and rate > 0):
      raise config_lib.ConfigError(f'{key}={value!r}: {entry!r} is not a valid '
                                   'learning rate; each rate must be a finite number > 0.')
    if rate in rates:
      raise config_lib.ConfigError(f'{key}={value!r} names {label(rate)} twice; give '
                                   'each rate once.')
    rates.append(rate)
  return tuple(rates)


def text(rates) -> str:
  """The grid as config.train.learning_rates holds it: '5e-05,4e-05'."""
  return ','.join(label(rate) for rate in rates)


def grid(train_config) -> tuple[float, ...]:
  """config.train.learning_rates, parsed; () when the run has no grid."""
  return parse(train_config.get('learning_rates', ''))


def rates(train_config) -> tuple[float, ...]:
  """The rates a fine-tuning run trains at: its grid, or (train.learning_rate,) without one."""
  return grid(train_config) or (train_config.learning_rate,)


def with_rate(train_config, rate: float):
  """A copy of config.train that trains at `rate`."""
  copy = ml_collections.ConfigDict(train_config.to_dict())
  copy.learning_rate = float(rate)
  return copy


def label(rate: float) -> str:
  """A rate's name in results.json and its runs' folders: 3e-05 -> '3e-05'."""
  return f'{rate:g}'


DIRECTORY_PREFIX = 'lr_'


def directory(rate: float) -> str:
  """The folder of a grid rate's seeds inside the workdir: 'lr_3e-05'."""
  return f'{DIRECTORY_PREFIX}{label(rate)}'


def selection_split(splits) -> str:
  """The eval split rates are chosen on: 'dev', else the first (MNLI: 'dev_matched')."""
  splits = list(splits)
  return 'dev' if 'dev' in splits else splits[0]


def spread(scores) -> dict:
  """{'median', 'min', 'max'} of the seeds' scores (NaN when a seed's is: a correlation of
  constant predictions has none)."""
  scores = np.asarray([float(s) for s in scores], np.float64)
  return {'median': float(np.median(scores)), 'min': float(np.min(scores)),
          'max': float(np.max(scores))}


def select(medians: dict) -> float:
  """The rate with the best median score ({rate: median}, in grid order); a NaN median (e.g.
  a correlation of constant predictions) ranks below every number, and ties go to the rate
  listed first."""
  def rank(rate):
    value = medians[rate]
    return value if value is not None and math.isfinite(value) else -math.inf
  best = max(rank(rate) for rate in medians)
  return next(rate for rate in medians if rank(rate) == best)


def last_change(curve: list[dict], key: str) -> float | None:
  """How `key` moved between the last two evaluations of a curve (the last epoch when every
  epoch is evaluated): negative while a loss still falls; None with fewer than two values."""
  values = [point[key] for point in curve if point.get(key) is not None]
  return values[-1] - values[-2] if len(values) >= 2 else None


def _median(values) -> float | None:
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def medians(per_seed: list[dict]) -> dict:
  """{split: {metric: median over the seeds}} of the seeds' results ('metrics' per split)."""
  first = per_seed[0]['metrics']
  return {split: {k: float(np.median([r['metrics'][split][k] for r in per_seed]))
                  for k in first[split]} for split in first}


def rate_summary(rate: float, per_seed: list[dict], split: str, metric: str) -> dict:
  """One rate's seeds on the selection split: scores, median, min and max of `metric`, every
  metric's median, and the convergence evidence: each seed's curve (an eval per epoch), the
  last dev loss and its change over the last epoch (medians over the seeds, and per seed)."""
  curves = [r.get('curve', {}).get(split, []) for r in per_seed]
  loss_changes = [last_change(c, 'loss') for c in curves]
  return {
      'learning_rate': rate, 'seeds': [r['seed'] for r in per_seed],
      'scores': [float(r['metrics'][split][metric]) for r in per_seed],
      **spread(r['metrics'][split][metric] for r in per_seed),
      'medians': medians(per_seed),
      'dev_loss': _median(c[-1].get('loss') if c else None for c in curves),
      'dev_loss_change': _median(loss_changes),
      'dev_loss_change_per_seed': loss_changes,
      'dev_metric_change': _median(last_change(c, metric) for c in curves),
      'curves': curves,
  }


def summarize(per_rate: dict, split: str, metric: str, grid: bool) -> dict:
  """results.json's protocol fields from {rate: its seeds' results} (grid order): the grid, the
  split and metric rates are chosen on, each rate's summary, the selected rate, and the
  median and spread at it. `grid`: whether the rates came from train.learning_rates."""
  by_rate = {label(rate): rate_summary(rate, seeds, split, metric)
             for rate, seeds in per_rate.items()}
  selected = select({rate: by_rate[label(rate)]['median'] for rate in per_rate})
  chosen = by_rate[label(selected)]
  return {
      'learning_rate': selected, 'learning_rates': list(per_rate), 'grid': grid,
      'selection': {'split': split, 'metric': metric,
                    'rule': 'the best median over seeds; ties: the rate listed first'},
      'selected': {key: chosen[key] for key in ('median', 'min', 'max', 'scores', 'dev_loss',
                                                'dev_loss_change', 'dev_metric_change')},
      'by_rate': by_rate,
  }

"""Masking rate: 15% (BERT), 30% (MosaicBERT) and 40% (Wettig et al., 2023) of the tokens.

Each rate's masked positions per row grow with it (configs/base.py's mask_rate argument); the
held-out set is masked at 15% for every arm, so their held-out losses compare.

  python -m bert_jax.sweep run --sweep=sweeps/masking_rate.py --workdir=runs/masking_rate
"""

from sweeps import common


def get_config():
  sweep = common.sweep(
      'masking_rate', 'Masking rate',
      'The same model, data and steps; only the share of tokens chosen for prediction changes '
      '(80/10/10 of them as in BERT). Every arm is scored on the same held-out masks (15%).')
  common.with_arms(sweep, {
      f'rate_{round(100 * rate)}': {'label': f'{round(100 * rate)}%', 'args': f'mask_rate={rate}'}
      for rate in (0.15, 0.3, 0.4)})
  return sweep

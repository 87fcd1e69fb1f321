"""Config arguments carry what depends on them: the warmup with `steps`, the masked positions
per example with `mask_rate` and `seq`."""

from absl import logging
import pytest

from conftest import assert_refused

from bert_jax import config_lib
from bert_jax.train import pretrain
from configs import base, electra, large_lamb, tiny


@pytest.mark.parametrize('module,arg,warmup', [
    (base, 'steps=100_000', 1000),  # 1% of the steps, as 10k of 1M.
    (base, 'steps=50', 1),  # At least one step.
    (tiny, 'steps=20', 2),  # 10%, as 200 of 2000.
    (large_lamb, 'phase=2,steps=100', 13),  # 200 of 1,561.
])
def test_steps_keeps_the_warmups_share(module, arg, warmup):
  config = module.get_config(arg)
  assert config.train.warmup_steps == warmup
  assert config.train.warmup_steps <= config.train.num_steps


def test_warmup_argument_wins_over_the_scaled_one():
  config = tiny.get_config('steps=20,warmup=5')
  assert (config.train.num_steps, config.train.warmup_steps) == (20, 5)


@pytest.mark.parametrize('module,arg,warmup', [
    (base, 'steps=100_000,warmup=paper,corpus=builtin', 10_000),  # The paper's steps, not 1% of them.
    (electra, 'size=base,steps=20000,warmup=paper,corpus=builtin', 10_000),
    (tiny, 'warmup=paper,steps=500', 200),  # Order does not matter.
])
def test_paper_warmup_keeps_the_configs_steps(module, arg, warmup):
  config = module.get_config(arg)
  assert config.train.warmup_steps == warmup
  config_lib.validate(config)


def test_paper_warmup_longer_than_the_run_is_refused():
  config = electra.get_config('steps=3000,warmup=paper')
  assert_refused(config, r'warmup_steps=10000 exceeds')


def test_the_log_says_what_steps_scaled(monkeypatch):
  lines = []
  monkeypatch.setattr(logging, 'info', lambda fmt, *args: lines.append(fmt % args))
  base.get_config('steps=3000,seq=256')
  assert any('steps=3000 keeps the warmup at 1% of the steps: 30 (this config: 10000 of '
             '1000000)' in line and 'warmup=paper keeps 10000' in line for line in lines), lines
  assert any('max_predictions_per_seq 20 -> 40' in line for line in lines), lines
  lines.clear()
  base.get_config('steps=3000,warmup=paper')
  assert any('warmup 10000 steps' in line and 'warmup=paper' in line for line in lines), lines
  lines.clear()
  base.get_config('layers=2')
  assert not lines  # Nothing scaled, nothing said.


def test_without_steps_the_warmup_is_the_configs():
  assert tiny.get_config('layers=1').train.warmup_steps == 200


@pytest.mark.parametrize('module,arg,predictions,phase2', [
    (base, 'mask_rate=0.3', 40, 160),  # The paper's 20 / 80 at rate 0.15, doubled.
    (base, 'layers=6,nsp=False,mask_rate=0.3', 40, 160),  # README's ablation.
    (base, 'seq=512', 80, 80),  # The paper's phase-2 value.
    (base, 'seq=64', 20, 80),  # Never lowered.
    (tiny, 'seq=128,mask_rate=0.2', 27, 107),  # 10 x 2 x 4/3 = 26.7, rounded up.
    (base, 'mask_rate=0.1', 20, 80),
])
def test_mask_rate_and_seq_raise_max_predictions(module, arg, predictions, phase2):
  config = module.get_config(arg)
  assert config.data.max_predictions_per_seq == predictions
  assert config.data.phase2_max_predictions_per_seq == phase2


@pytest.mark.parametrize('arg', ['mask_rate=0.3', 'mask_rate=0.5,seq=96', 'seq=128',
                                 'steps=7,mask_rate=0.4'])
def test_argument_configs_pass_validation(arg):
  config = tiny.get_config(arg)
  config_lib.validate(config)


def test_the_run_log_states_its_schedule():
  assert pretrain.describe_schedule(base.get_config('steps=3000')) == (
      'Schedule: 3000 steps (98.3M tokens), warmup 30 (1% of them) to a peak lr of 0.0001, '
      'then linear decay to 0.')  # 256 rows of 128 tokens a step.
  assert 'warmup 10000 (33.3% of them)' in pretrain.describe_schedule(
      base.get_config('steps=30000,warmup=paper'))

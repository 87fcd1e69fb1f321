"""A schedule in tokens (data/token_budget.py and configs/base.py's tokens=, warmup_tokens=,
decay_tokens=): what a run's steps train, and the steps a token budget needs."""

from absl import logging
import pytest

from bert_jax import config_lib
from bert_jax.data import batch_warmup
from bert_jax.data import token_budget
from bert_jax.train import pretrain
from configs import base, modernbert, tiny


def run_config(**train):
  """tiny's run (32 rows of 64) with `train` keys set."""
  config = tiny.get_config()
  config.train.update(train)
  return config


def test_tokens_count_the_batch_warmup_and_phase_2_rows():
  # 10 steps: 8 of phase 1, then 2 of phase 2 (4 rows of 256).
  config = run_config(num_steps=10, phase2_fraction=0.2, phase2_batch_size=4,
                      batch_warmup_rows=8, batch_warmup_tokens=8 * 64 * 6)
  config.data.phase2_max_seq_length = 256
  # 6 x 512 warmup tokens over 8 + 16 + 24 rows of 64: one step of each size, then 32 rows.
  per_step = [8 * 64, 16 * 64, 24 * 64] + [32 * 64] * 5 + [4 * 256] * 2
  assert [token_budget.tokens_through(config, step) for step in range(11)] == [
      sum(per_step[:step]) for step in range(11)]
  # Phase 2 starts where pretraining's phases put it.
  assert [p.last_step for p in pretrain.phases(config)] == [8, 10]
  assert token_budget.phase2_steps(config.train) == 2


@pytest.mark.parametrize('train', [
    {},
    {'batch_warmup_rows': 8, 'batch_warmup_tokens': 50_000},
    {'phase2_fraction': 0.1, 'phase2_batch_size': 8},
])
def test_steps_for_tokens_is_the_fewest_that_reach_them(train):
  config = run_config(**train)
  config.data.phase2_max_seq_length = 128
  for tokens in (1, 2048, 2049, 100_000, 1_234_567, 10**7):
    steps = token_budget.steps_for_tokens(config, tokens)
    # Each length is its own run: where its phase 2 starts follows its steps.
    assert token_budget.tokens_through(config, steps, steps) >= tokens
    assert steps == 1 or token_budget.tokens_through(config, steps - 1, steps - 1) < tokens


def test_step_reaching_is_the_first_step_that_trained_the_tokens():
  config = run_config(num_steps=100)
  assert [token_budget.step_reaching(config, t) for t in (0, 1, 2048, 2049, 4096)] == [
      0, 1, 1, 2, 2]


@pytest.mark.parametrize('text,count', [
    ('2000000', 2_000_000), ('2M', 2_000_000), ('1.7T', 1_700_000_000_000),
    ('1.7e12', 1_700_000_000_000), ('3b', 3_000_000_000), ('50K', 50_000)])
def test_a_count_of_tokens_reads_its_suffix(text, count):
  assert token_budget.parse_count(text, 'tokens') == count


def test_a_count_of_tokens_reads_back_with_three_digits():
  assert [token_budget.readable(n) for n in (512, 98_304_000, 2 * 10**9, 1_719_000_000_000)] == [
      '512', '98.3M', '2B', '1.72T']


@pytest.mark.parametrize('text', ['two', '2X', '0', '-5', ''])
def test_a_count_that_is_not_one_names_the_argument(text):
  with pytest.raises(ValueError, match=f"tokens={text!r}: expected a positive number of tokens"):
    token_budget.parse_count(text, 'tokens')


def test_tokens_sets_the_steps_and_keeps_the_warmups_share():
  # BERT-Base's 256 x 128 a step: 2B tokens are 61,035.2 steps; the warmup stays 1% (10k of 1M).
  config = base.get_config('tokens=2B,corpus=builtin')
  assert config.train.num_steps == 61_036
  assert config.train.warmup_steps == 611  # 1% of the run's tokens, rounded up to a step.
  config_lib.validate(config)
  # seq= given beside it changes what a step trains.
  assert base.get_config('tokens=2B,seq=512').train.num_steps == 15_259


def test_tokens_keeps_modernberts_shares_of_its_release_run():
  release = modernbert.get_config()
  config = modernbert.get_config('tokens=20B,corpus=builtin')
  share = 20e9 / token_budget.tokens_through(release, release.train.num_steps)  # Of 1,719B.
  assert config.train.batch_warmup_tokens == round(50e9 * share)
  assert token_budget.tokens_through(config, config.train.num_steps) >= 20e9
  assert token_budget.tokens_through(config, config.train.num_steps - 1) < 20e9
  warmup = token_budget.tokens_through(config, config.train.warmup_steps)
  assert warmup >= round(token_budget.tokens_through(release, 3815) * share)
  assert token_budget.tokens_through(config, config.train.warmup_steps - 1) < 3e9 * share
  assert config.train.decay_steps == 0  # The release decays nothing in its run.
  config_lib.validate(config)


def test_warmup_and_decay_tokens_set_those_phases():
  config = modernbert.get_config('tokens=20B,warmup_tokens=100M,decay_tokens=2B,corpus=builtin')
  full = 4608 * 1024  # Tokens of a step past the batch-size warmup.
  assert config.train.decay_steps == 424  # 2B / full = 423.8: the decay trains at least 2B.
  total = token_budget.tokens_through(config, config.train.num_steps)
  stable_end = config.train.num_steps - config.train.decay_steps
  assert total - token_budget.tokens_through(config, stable_end) == 424 * full
  # 100M tokens: the batch-size warmup's 768 rows train 50 steps (39.3M), then 1,536 rows 39.
  assert [s.last_step for s in batch_warmup.stages(config.train, 1024)][:2] == [50, 100]
  assert config.train.warmup_steps == 89
  assert token_budget.tokens_through(config, 88) < 100e6 <= token_budget.tokens_through(config, 89)
  config_lib.validate(config)
  # Without tokens=, they set the config's own run's phases.
  config = tiny.get_config('warmup_tokens=20480')
  assert (config.train.num_steps, config.train.warmup_steps) == (2000, 10)
  # Beside steps=, the warmup is the one given in tokens, not steps='s share of the config's.
  for arg in ('steps=500,warmup_tokens=20480', 'warmup_tokens=20480,steps=500'):
    config = tiny.get_config(arg)
    assert (config.train.num_steps, config.train.warmup_steps) == (500, 10)


@pytest.mark.parametrize('arg,message', [
    ('tokens=2B,steps=10', 'steps= and tokens= both set how long the run is; give one'),
    ('warmup=5,warmup_tokens=1M', 'warmup= and warmup_tokens= both set how long the warmup is'),
    ('tokens=lots', "tokens='lots': expected a positive number of tokens"),
])
def test_a_schedule_given_twice_or_unreadable_is_refused_naming_it(arg, message):
  with pytest.raises(ValueError, match=message):
    base.get_config(arg)


def test_the_log_says_what_the_tokens_became(monkeypatch):
  lines = []
  monkeypatch.setattr(logging, 'info', lambda fmt, *args: lines.append(fmt % args))
  tiny.get_config('tokens=1M')
  assert any('tokens=1M: 489 steps (1,001,472 tokens), warmup 49 steps (100,352 tokens)' in line
             for line in lines), lines

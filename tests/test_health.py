"""Run-health alarms (bert_jax/train/health.py): the conditions on held-out and train records,
and a micro ELECTRA run made to collapse that raises the discriminator alarm in its log,
metrics.jsonl and, with train.stop_on_alarms, stops, while a healthy one raises none."""

import json
import logging
import math
import os

import numpy as np
import pytest

from conftest import micro_config
from bert_jax import config_lib
from bert_jax.sweep import results
from bert_jax.train import health
from bert_jax.train import pretrain

PRIOR = health.binary_entropy(0.15)


def disc_record(step, auc, loss=PRIOR, share=0.15, total=20.0):
  return {'step': step, 'loss': total, 'rtd_disc_loss': loss, 'rtd_replaced_fraction': share,
          'rtd_disc_auc': auc}


def names(alarms):
  return [a.name for a in alarms]


def test_stop_on_alarms_takes_names_all_or_nothing_and_names_a_bad_entry():
  assert health.parse_stop('') == ()
  assert health.parse_stop('loss_spike, discriminator_at_prior') == ('loss_spike',
                                                                     'discriminator_at_prior')
  assert health.parse_stop('all') == health.ALARMS
  with pytest.raises(config_lib.ConfigError, match=r"'disc_dead' is not an alarm; valid: "
                                                   r'discriminator_at_prior, mlm_at_unigram'):
    health.parse_stop('loss_spike,disc_dead')
  with pytest.raises(config_lib.ConfigError, match='expected alarm names'):
    health.parse_stop(['loss_spike'])


def test_binary_entropy_is_the_loss_of_predicting_the_share_everywhere():
  share = 0.133
  assert health.binary_entropy(share) == pytest.approx(
      -(share * math.log(share) + (1 - share) * math.log(1 - share)))
  assert health.binary_entropy(0.133) == pytest.approx(0.393, abs=2e-3)  # The H200 dead run (13.3%, rounded).
  assert health.binary_entropy(0.0) == health.binary_entropy(1.0) == 0.0


def test_unigram_loss_leaves_each_token_out_of_its_own_estimate():
  ids = np.array([[3, 3, 3, 5]])
  weights = np.array([[1.0, 1.0, 1.0, 1.0]])
  padded = {'masked_lm_ids': np.array([[3, 9, 3, 3, 5]]),  # 9 sits in a padded slot.
            'masked_lm_weights': np.array([[1.0, 0.0, 1.0, 1.0, 1.0]])}
  vocab, a = 10, 0.5
  # A 3 sees the two other 3s among 3 tokens; the 5 sees none.
  expected = -(3 * math.log((2 + a) / (3 + a * vocab)) + math.log(a / (3 + a * vocab))) / 4
  loss = health.unigram_loss([{'masked_lm_ids': ids, 'masked_lm_weights': weights}], vocab)
  assert loss == pytest.approx(expected)
  assert health.unigram_loss([padded], vocab) == pytest.approx(expected)
  assert health.unigram_loss([{'masked_lm_ids': ids, 'masked_lm_weights': 0 * weights}],
                             vocab) is None


def test_a_discriminator_at_chance_twice_after_warmup_raises_the_alarm():
  evals = [disc_record(0, 0.48), disc_record(100, 0.5), disc_record(200, 0.5)]
  alarms = health.eval_alarms(evals, warmup_steps=50)
  assert names(alarms) == ['discriminator_at_prior']
  assert alarms[0].step == 200 and 'at steps 100 and 200' in alarms[0].message
  assert 'AUC 0.5000' in alarms[0].message and '15.0% replaced share' in alarms[0].message


def test_one_evaluation_at_chance_or_one_before_warmup_raises_none():
  assert health.eval_alarms([disc_record(100, 0.7), disc_record(200, 0.5)], 50) == []
  assert health.eval_alarms([disc_record(100, 0.5), disc_record(200, 0.5)], 100) == []
  # Only the newest evaluation is judged: a run that recovered raises nothing more.
  assert health.eval_alarms([disc_record(100, 0.5), disc_record(200, 0.5),
                             disc_record(300, 0.6)], 0) == []


def test_a_discriminator_that_ranks_well_at_its_priors_loss_is_learning():
  # Loss at the prior's, AUC 0.70: it learned a ranking, not yet its calibration.
  evals = [disc_record(100, 0.70), disc_record(200, 0.70)]
  assert health.eval_alarms(evals, 0) == []
  # A weak live one (an H200 run's 0.562 at 1,000 steps) is not at chance either.
  assert health.eval_alarms([disc_record(100, 0.562), disc_record(200, 0.562)], 0) == []


def test_a_discriminator_at_its_priors_loss_ranking_barely_above_chance_is_dead():
  # The H100 run of the shipped ELECTRA-Small recipe whose discriminator died (seed 9): loss
  # 0.3917 vs 0.3916 with AUC 0.53 at 8,000-10,000 steps, past AUC_BAND alone.
  share = 0.1337
  prior = health.binary_entropy(share)
  dead = [disc_record(s, 0.53, loss=prior * 1.0003, share=share) for s in (8000, 8250)]
  assert names(health.eval_alarms(dead, 1000)) == ['discriminator_at_prior']
  assert 'AUC 0.5300' in health.eval_alarms(dead, 1000)[0].message
  # The live runs' closest approach (AUC 0.56-0.58 at 1,000 steps, 1.2-2.6% under the prior),
  # and the same weak AUC 1.7% under the prior, are not dead.
  assert health.eval_alarms([disc_record(s, 0.563, loss=prior * 0.983, share=share)
                             for s in (1000, 1250)], 500) == []
  assert health.eval_alarms([disc_record(s, 0.53, loss=prior * 0.983, share=share)
                             for s in (8000, 8250)], 1000) == []


def test_without_an_auc_the_loss_at_the_priors_entropy_decides():
  at_prior = [dict(disc_record(s, None, loss=PRIOR * 0.99)) for s in (100, 200)]
  for record in at_prior:
    del record['rtd_disc_auc']
  assert names(health.eval_alarms(at_prior, 0)) == ['discriminator_at_prior']
  learning = [{**r, 'rtd_disc_loss': PRIOR * 0.9} for r in at_prior]
  assert health.eval_alarms(learning, 0) == []


def lm_record(step, loss, floor=7.0):
  return {'step': step, 'loss': loss, 'mlm_loss': loss, 'unigram_loss': floor}


def test_an_mlm_stuck_at_its_unigram_floor_raises_the_alarm_one_on_its_way_down_does_not():
  stuck = [lm_record(100, 7.10), lm_record(200, 7.05)]
  assert names(health.eval_alarms(stuck, 0)) == ['mlm_at_unigram']
  # At the floor twice but fell 0.3 (over 2% of it) between them: passing through.
  assert health.eval_alarms([lm_record(100, 7.20), lm_record(200, 6.90)], 0) == []
  assert health.eval_alarms([lm_record(100, 6.0), lm_record(200, 5.9)], 0) == []


def test_a_generator_stuck_at_the_unigram_raises_its_own_alarm():
  evals = [{'step': s, 'loss': 30.0, 'rtd_gen_loss': 7.0, 'unigram_loss': 7.0}
           for s in (100, 200)]
  assert names(health.eval_alarms(evals, 0)) == ['generator_at_unigram']


def test_a_held_out_loss_half_again_above_its_lowest_after_warmup_is_diverging():
  evals = [lm_record(0, 11.0), lm_record(100, 3.0), lm_record(200, 4.0), lm_record(300, 4.6)]
  assert health.eval_alarms(evals[:3], 50) == []
  alarms = health.eval_alarms(evals, 50)
  assert names(alarms) == ['loss_diverging'] and '1.53x its lowest' in alarms[0].message
  # The step-0 loss (11.0) is before warmup: not the reference.
  assert health.eval_alarms([lm_record(0, 3.0), lm_record(100, 5.0), lm_record(200, 5.0)],
                            50) == []


def test_train_alarms_see_a_spike_after_warmup_and_skipped_steps():
  assert names(health.train_alarms(300, 6.1, (200, 4.0), [], 100)) == ['loss_spike']
  assert health.train_alarms(300, 5.9, (200, 4.0), [], 100) == []
  assert health.train_alarms(100, 6.1, (50, 4.0), [], 100) == []  # Inside warmup.
  assert health.train_alarms(100, 6.1, None, [], 0) == []
  alarms = health.train_alarms(300, 4.0, (200, 4.0), [251, 260], 100)
  assert names(alarms) == ['nonfinite_steps'] and '[251, 260]' in alarms[0].message


# ---- A micro ELECTRA run: collapsed on purpose, and healthy. ----


def electra_config(tmp_path, learning_rate, **overrides):
  return micro_config(tmp_path, objectives='rtd', **{
      'model.name': 'electra', 'model.embedding_size': 16, 'model.generator_fraction': 0.5,
      'masking.mask_token_fraction': 0.85, 'masking.random_token_fraction': 0.0,
      'masking.keep_fraction': 0.15, 'train.learning_rate': learning_rate,
      'train.num_steps': 60, 'train.log_every': 10, 'train.eval_every': 10,
      'train.checkpoint_every': 30, **overrides})


def records(workdir, split='eval'):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [r for r in map(json.loads, f) if r['split'] == split]


@pytest.mark.slow
def test_a_collapsed_discriminator_raises_its_alarm_and_a_healthy_run_none(tmp_path, caplog):
  # At 3e-2 the micro discriminator outputs a constant from step 20 (AUC exactly 0.5); at 5e-3
  # it learns (AUC ~0.65) and its generator leaves the unigram floor.
  caplog.set_level(logging.WARNING)
  collapsed = str(tmp_path / 'collapsed')
  pretrain.train_and_evaluate(electra_config(tmp_path, 3e-2), collapsed)
  evals = records(collapsed)
  alarmed = [r for r in evals if 'discriminator_at_prior' in r.get('alarms', [])]
  assert alarmed and alarmed[0]['rtd_disc_auc'] <= 0.5 + health.AUC_BAND
  assert all(r['rtd_disc_prior_loss'] == pytest.approx(
      health.binary_entropy(r['rtd_replaced_fraction'])) for r in evals)
  assert 'unigram_loss' in evals[0]
  assert any('ALARM discriminator_at_prior at step' in m for m in caplog.messages)
  # What a sweep's report reads of the run.
  run = results.load_pretrain(str(tmp_path), 'collapsed', {'workdir': 'collapsed'})
  assert run.alarms[0][0] == 'discriminator_at_prior'

  caplog.clear()
  healthy = str(tmp_path / 'healthy')
  pretrain.train_and_evaluate(electra_config(tmp_path, 5e-3), healthy)
  assert not any(r.get('alarms') for r in records(healthy) + records(healthy, 'train'))
  assert not any('ALARM' in m for m in caplog.messages)
  assert records(healthy)[-1]['rtd_disc_auc'] > 0.55


@pytest.mark.slow
def test_an_alarm_named_in_stop_on_alarms_stops_the_run_keeping_its_checkpoint(tmp_path):
  workdir = str(tmp_path / 'run')
  # Saved every 10 steps: whichever evaluation the alarm fires at (its second at the prior, step
  # 20 or later depending on the CPU's arithmetic), a save precedes it.
  config = electra_config(tmp_path, 3e-2, **{'train.checkpoint_every': 10})
  config.train.stop_on_alarms = 'discriminator_at_prior'
  with pytest.raises(pretrain.RunHealthError,
                     match=r"Stopped at step \d+ by the alarm discriminator_at_prior "
                           r"\(config.train.stop_on_alarms='discriminator_at_prior'\)") as stop:
    pretrain.train_and_evaluate(config, workdir)
  evals = records(workdir)
  alarm_step = evals[-1]['step']
  assert evals[-1]['alarms'] == ['discriminator_at_prior'] and 20 <= alarm_step < 60
  # The alarmed step is not saved (a save could rotate out a good one); the save before it is
  # intact and the error names it, so a rerun resumes from it.
  saved = sorted(int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints')) if s.isdigit())
  assert saved[-1] == alarm_step - 10
  assert f'last good checkpoint: step {alarm_step - 10}' in str(stop.value)


def test_a_bad_stop_on_alarms_is_refused_before_anything_runs(tmp_path):
  config = electra_config(tmp_path, 1e-3)
  config.train.stop_on_alarms = 'discriminator_dead'
  with pytest.raises(config_lib.ConfigError, match="'discriminator_dead' is not an alarm"):
    pretrain.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run' / 'metrics.jsonl')

"""Batch-size warmup (data/batch_warmup.py): its sizes, its checks, and runs that read the rows of
a run without it, in order, and resume exactly mid-size."""

import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from bert_jax.data import batch_warmup
from bert_jax.data import token_budget
from bert_jax.train import pretrain
from conftest import assert_refused, micro_config
from test_streaming import final_params, tiny_config, write_prepared_with_vocab


def train_keys(**values):
  return ml_collections.ConfigDict(
      {'batch_size': 8, 'grad_accum_steps': 4, 'batch_warmup_rows': 2,
       'batch_warmup_tokens': 1536, **values})


def run_of(train, seq_length):
  """A config of phase 1 alone, long enough for any count here, with `train`'s warmup keys."""
  config = ml_collections.ConfigDict({
      'train': {**train.to_dict(), 'num_steps': 10**7, 'phase2_fraction': 0.0,
                'phase2_batch_size': 0},
      'data': {'max_seq_length': seq_length, 'phase2_max_seq_length': seq_length}})
  return config


def test_the_batch_grows_by_its_first_size_for_equal_steps():
  # 2, 4 and 6 rows (1, 2 and 3 micro-batches of 2) before the full 8; 1,536 tokens of 64-token
  # rows over 2 + 4 + 6 rows a step each: 2 steps each.
  assert batch_warmup.stages(train_keys(), 64) == [
      batch_warmup.Stage(2, 1, 2), batch_warmup.Stage(4, 2, 4), batch_warmup.Stage(6, 3, 6)]
  # One token more needs a third step of each size.
  assert [s.last_step for s in batch_warmup.stages(train_keys(batch_warmup_tokens=1537), 64)] == [
      3, 6, 9]
  # Without accumulation each size is one batch of its rows.
  assert [s.micro_batches for s in batch_warmup.stages(train_keys(grad_accum_steps=1), 64)] == [
      1, 1, 1]
  assert batch_warmup.stages(train_keys(batch_warmup_rows=0, batch_warmup_tokens=0), 64) == []
  assert batch_warmup.describe(train_keys(), 64) == (
      'Batch-size warmup: 2 to 8 rows, 2 more at a time, 2 steps each (steps 1-6, 1,536 '
      'tokens).')


def test_modernberts_warmup_is_its_release_schedule():
  # 768 to 4,608 rows of 1,024 tokens over 50B tokens (its 96 rows a GPU on 8 GPUs, 1 to 6
  # micro-batches): sizes of 768 x 1..5, ceil(50e9 / (1024 x 768 x 15)) = 4,239 steps each.
  train = train_keys(batch_size=4608, grad_accum_steps=18, batch_warmup_rows=768,
                     batch_warmup_tokens=50_000_000_000)
  modern = batch_warmup.stages(train, 1024)
  assert [(s.rows, s.micro_batches) for s in modern] == [(768 * k, 3 * k) for k in range(1, 6)]
  assert [s.last_step for s in modern] == [4239 * k for k in range(1, 6)]
  trained = sum(4239 * s.rows * 1024 for s in modern)
  assert 50_000_000_000 <= trained < 50_000_000_000 + 15 * 768 * 1024
  # Its 3B-token learning-rate warmup ends inside the first size: ceil(3e9 / (768 x 1024)).
  assert token_budget.step_reaching(run_of(train, 1024), 3e9) == 3815


def test_a_step_stated_in_tokens_counts_the_smaller_batches():
  train = train_keys()  # Steps of 128, 128, 256, 256, 384, 384 tokens, then 512.
  expected = {128: 1, 129: 2, 256: 2, 257: 3, 1536: 6, 1537: 7, 1536 + 1024: 8}
  assert {t: token_budget.step_reaching(run_of(train, 64), t) for t in expected} == expected
  plain = run_of(train_keys(batch_warmup_rows=0, batch_warmup_tokens=0), 64)
  assert [token_budget.step_reaching(plain, t) for t in (512, 513)] == [1, 2]


def test_tokens_through_a_step_count_each_size():
  train = train_keys()  # Steps of 128, 128, 256, 256, 384, 384 tokens, then 512.
  assert [batch_warmup.tokens_through(train, 64, s) for s in range(9)] == [
      0, 128, 256, 512, 768, 1152, 1536, 2048, 2560]
  for tokens in (128, 129, 1536, 2000):  # The inverse of token_budget.step_reaching.
    step = token_budget.step_reaching(run_of(train, 64), tokens)
    assert batch_warmup.tokens_through(train, 64, step - 1) < tokens <= (
        batch_warmup.tokens_through(train, 64, step))
  plain = train_keys(batch_warmup_rows=0, batch_warmup_tokens=0)
  assert batch_warmup.tokens_through(plain, 64, 3) == 3 * 8 * 64


def test_grouped_reads_exactly_its_count_so_the_next_size_reads_on():
  source = iter([({'x': np.array([i])}, {'batch': i + 1}) for i in range(6)])
  first = batch_warmup.grouped(source, 2)
  batch, position = next(first)
  assert batch['x'].tolist() == [0, 1] and position == {'batch': 2}
  batch, position = next(batch_warmup.grouped(source, 3))
  assert batch['x'].tolist() == [2, 3, 4] and position == {'batch': 5}
  assert next(batch_warmup.grouped(source, 1))[0]['x'].tolist() == [5]


@pytest.mark.parametrize('overrides, match', [
    ({'train.batch_warmup_rows': 4}, r'batch_warmup_tokens=0: a batch-size warmup needs both'),
    ({'train.batch_warmup_rows': 3, 'train.batch_warmup_tokens': 100},
     r'batch_warmup_rows=3: the batch grows by it .* so it must divide batch_size and be '
     r'smaller; use one of 4, 2, 1, \.\.\. \(0 and batch_warmup_tokens=0: no warmup\)\.'),
    ({'train.batch_warmup_rows': 8, 'train.batch_warmup_tokens': 100},
     r'batch_warmup_rows=8: the batch grows by it'),
    ({'train.batch_warmup_rows': 1, 'train.batch_warmup_tokens': 100,
      'train.grad_accum_steps': 4},
     r'batch_warmup_rows=1 is not a whole number of micro-batches of 2 rows .* use a multiple '
     r'of 2, or grad_accum_steps=8 \(micro-batches of 1; 0 and batch_warmup_tokens=0: no '
     r'warmup\)\.'),
    # Micro-batches of 2, rows of 32, sizes of 2, 4, 6: 1e6 / (32 x 2 x 6) -> 2,605 steps a
    # size; 6 a size fit in 20 steps: 6 x 32 x 2 x 6 = 2,304 tokens.
    ({'train.batch_warmup_rows': 2, 'train.batch_warmup_tokens': 10**6,
      'train.grad_accum_steps': 4, 'train.num_steps': 20, 'train.warmup_steps': 2},
     r'batch_warmup_tokens=1000000 takes 7815 steps \(3 batch sizes of 2605 steps\), beyond the '
     r'20 steps of the run \(config.train.num_steps=20\); use at most 2304 tokens\.'),
    ({'train.batch_warmup_rows': -4}, r'batch_warmup_rows=-4'),
])
def test_a_warmup_that_does_not_fit_is_refused_before_anything_is_built(overrides, match):
  assert_refused(micro_config(**overrides), match)


def test_a_warmup_without_accumulation_grows_the_batch_itself():
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  config = micro_config(**{'train.batch_warmup_rows': 2, 'train.batch_warmup_tokens': 100})
  config_lib.validate(config)
  with pytest.raises(config_lib.ConfigError, match=r'batch_warmup_rows=2 is not divisible by '
                     r'the 4 devices each smaller batch is split over'):
    batch_warmup.check_devices(config, 4)


def read_train_records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return {r['step']: r for r in map(json.loads, f) if r['split'] == 'train'}


@pytest.mark.slow
def test_each_size_trains_on_the_rows_a_run_of_that_batch_would(tmp_path):
  # In memory, the stream's rows and masks do not depend on its batch size: the warmup's first
  # size (4 rows as 2 micro-batches) trains as a run of batch 4 does, step for step.
  common = {'train.warmup_steps': 3, 'train.log_every': 1, 'train.eval_every': 100,
            'train.checkpoint_every': 0, 'model.hidden_dropout_rate': 0.0,
            'model.attention_dropout_rate': 0.0}
  ramp = micro_config(tmp_path, **common, **{
      'train.num_steps': 6, 'train.grad_accum_steps': 4, 'train.batch_warmup_rows': 4,
      'train.batch_warmup_tokens': 2 * 4 * 32})
  assert [s.last_step for s in batch_warmup.stages(ramp.train, 32)] == [2]
  pretrain.train_and_evaluate(ramp, str(tmp_path / 'ramp'))
  plain = micro_config(tmp_path, **common, **{
      'train.num_steps': 3, 'train.batch_size': 4, 'train.grad_accum_steps': 2})
  pretrain.train_and_evaluate(plain, str(tmp_path / 'plain'))
  ramped, reference = read_train_records(tmp_path / 'ramp'), read_train_records(tmp_path / 'plain')
  for step in (1, 2):
    assert ramped[step]['loss'] == reference[step]['loss']
  assert ramped[3]['loss'] != reference[3]['loss']  # Now 8 rows against 4.
  # The records count the tokens trained: 4 rows of 32 a step, then 8.
  assert [ramped[s]['tokens'] for s in (1, 2, 3, 6)] == [128, 256, 512, 1280]
  assert [reference[s]['tokens'] for s in (1, 2, 3)] == [128, 256, 384]


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  return write_prepared_with_vocab(tmp_path_factory.mktemp('prepared'))


# Micro-batches of 2 (8 rows, 4 of them); 2, 4 and 6 rows for 2 steps each, then 8.
RAMP = {'train.grad_accum_steps': 4, 'train.batch_warmup_rows': 2,
        'train.batch_warmup_tokens': 2 * (2 + 4 + 6) * 64, 'train.checkpoint_every': 3,
        'train.keep_checkpoints': 5, 'train.num_steps': 8, 'train.eval_every': 100}


@pytest.mark.slow
def test_a_run_with_a_warmup_resumes_exactly_mid_size_and_refuses_another_warmup(prepared,
                                                                                 tmp_path):
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  reference = str(tmp_path / 'reference')
  pretrain.train_and_evaluate(tiny_config(prepared, **RAMP), reference)
  # Saved every 3 steps and at the end; none at the ends of the sizes (2, 4, 6): the stream
  # reads on.
  assert sorted(int(s) for s in os.listdir(os.path.join(reference, 'checkpoints'))) == [3, 6, 8]
  restarted = str(tmp_path / 'restarted')
  shutil.copytree(reference, restarted)
  for step in ('8', '6'):  # Resumed at step 3, inside the second size (steps 3-4).
    shutil.rmtree(os.path.join(restarted, 'checkpoints', step))
  with pytest.raises(config_lib.ConfigError, match=r'batch_warmup_rows=4 \(the checkpoint: 2\)'):
    pretrain.train_and_evaluate(tiny_config(prepared, **{**RAMP, 'train.batch_warmup_rows': 4}),
                                restarted)
  pretrain.train_and_evaluate(tiny_config(prepared, **RAMP), restarted)
  for a, b in zip(jax.tree.leaves(final_params(reference, 8)),
                  jax.tree.leaves(final_params(restarted, 8))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

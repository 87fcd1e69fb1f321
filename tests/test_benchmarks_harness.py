"""benchmarks/harness.py: the commands of ours and the peer, one process per measurement, the
fastest of repeats, and warm-up then timed steps under the clock sampler."""

import sys

import pytest

from benchmarks import harness
from bert_jax import config_lib
from bert_jax.tools import gpu_clocks
from configs import large
from configs import large_gpu


def test_large_gpu_variant_is_configs_large_gpu():
  """The variant restates configs/large_gpu.py as flags (so Base runs it too): no drift."""
  config = large.get_config()
  config.model.dtype = 'bfloat16'  # harness.ours sets bf16 for every variant.
  for flag in harness.variant_flags('large_gpu'):
    key, value = flag.removeprefix('--config.').split('=', 1)
    section, name = key.split('.')
    current = config[section][name]
    config[section][name] = (value == 'True') if isinstance(current, bool) else type(current)(value)
  assert config_lib.flatten(config) == config_lib.flatten(large_gpu.get_config())


def test_ours_is_the_benchmark_command_for_a_shape_and_variant():
  command = harness.ours('base', 512, 32, 'paper+--config.model.gelu=tanh+env:--x=1', 7)
  assert command[1:3] == ['-m', 'bert_jax.benchmark']
  assert {'--config=configs/base.py', '--steps=7', '--config.data.max_seq_length=512',
          '--config.data.max_predictions_per_seq=80', '--config.train.batch_size=32',
          '--config.model.dtype=bfloat16'} <= set(command)
  assert command[-2:] == ['--config.model.gelu=tanh', 'env:--x=1']
  with pytest.raises(ValueError, match="unknown variant 'fast'"):
    harness.ours('base', 128, 8, 'fast', 1)


def test_the_peer_command_runs_peer_py_eager_or_compiled():
  eager = harness.peer('large', 128, 16, 'eager', 5)
  assert eager[1].endswith('benchmarks/peer.py') and '--compile' not in eager
  assert '--batch=16' in eager and '--attention_dropout=0.1' in eager
  assert harness.peer('large', 128, 16, 'compile', 5)[-1] == '--compile'
  with pytest.raises(ValueError, match="peer mode 'jit'"):
    harness.peer('large', 128, 16, 'jit', 5)


@pytest.mark.parametrize('shape', ['huge:512:32', 'large:512', 'large:x:32'])
def test_a_bad_shape_is_named(shape):
  with pytest.raises(ValueError, match=f"--shapes entry '{shape}'"):
    harness.parse_shape(shape)


def test_a_process_runs_in_its_tree_with_the_flags_given_once(tmp_path):
  """The tree is the working directory, XLA_FLAGS are the given ones then the command's env:
  entries (the environment's not added again), and a process past its timeout is an error."""
  show = [sys.executable, '-c', 'import json, os; print(json.dumps({"cwd": os.getcwd(), '
          '"flags": os.environ["XLA_FLAGS"]}))', 'env:--b=2']
  record = harness.run_process(show, str(tmp_path), '--a=1', 60)
  assert record == {'cwd': str(tmp_path), 'flags': '--a=1 --b=2', 'xla_flags': '--a=1 --b=2'}
  sleep = [sys.executable, '-c', 'import time; time.sleep(30)']
  assert harness.run_process(sleep, str(tmp_path), '', 0.5) == {'error': 'timed out after 0.5 s'}


def test_best_of_keeps_the_fastest_of_its_repeats():
  """Each measurement run N times, the fastest kept with every run's seq/s; a failed run among
  them is skipped, all failed gives the first failure."""
  records = iter([{'seq_per_s': 406.0, 'step_ms': 78.7}, {'error': 'out of memory'},
                  {'seq_per_s': 438.0, 'step_ms': 73.0}])
  best = harness.best_of(lambda: next(records), 3)
  assert (best['seq_per_s'], best['step_ms'], best['repeats']) == (438.0, 73.0, 3)
  assert best['seq_per_s_all'] == [406.0, None, 438.0]
  failures = iter([{'error': 'first'}, {'error': 'second'}])
  assert harness.best_of(lambda: next(failures), 2) == {'error': 'first'}
  assert 'seq_per_s_all' not in harness.best_of(lambda: {'seq_per_s': 2029.4}, 1)


def test_time_steps_waits_after_the_warm_up_and_after_the_timed_steps():
  events = []
  count = iter(range(100))

  def step():
    events.append('step')
    return next(count)

  timing = harness.time_steps(step, lambda out: events.append(f'sync {out}'), warmup=2, steps=3,
                              read=lambda: [gpu_clocks.Reading(1700, 690.0, 0)])
  assert events == ['step', 'step', 'sync 1', 'step', 'step', 'step', 'sync 4']
  assert timing.last == 4 and timing.seconds_per_step >= 0 and timing.warmup_seconds >= 0
  assert timing.clocks['sm_mhz_median'] == 1700


def test_time_steps_refuses_no_timed_steps():
  with pytest.raises(ValueError, match='steps=0'):
    harness.time_steps(lambda: None, lambda _: None, warmup=1, steps=0)


@pytest.mark.parametrize('model, config', [
    ('roberta-base', 'configs/roberta.py:size=base'),
    ('albert-xlarge', 'configs/albert.py:size=xlarge'),
    ('deberta-large', 'configs/deberta.py:size=large'),
    ('deberta-rtd-base', 'configs/deberta.py:size=base,objective=rtd'),
    ('modernbert-base', 'configs/modernbert.py:size=base'),
    ('xlmr-base', 'configs/xlm.py:size=base')])
def test_a_family_shape_benchmarks_its_recipe_in_one_step(model, config):
  """RoBERTa's and ALBERT's recipes accumulate micro-batches; a shape's batch is one step."""
  assert harness.parse_shape(f'{model}:128:256') == (model, 128, 256)
  command = harness.ours(model, 128, 256, 'paper', 5)
  assert {f'--config={config}', '--config.train.batch_size=256',
          '--config.train.grad_accum_steps=1'} <= set(command)
  with pytest.raises(ValueError, match=f"peer model '{model}'"):
    harness.peer(model, 128, 256, 'compile', 5)


@pytest.mark.parametrize('model, seq, expected', [
    ('base', 128, 20), ('large', 512, 80),  # The paper's.
    ('modernbert-base', 128, 39), ('modernbert-large', 1024, 308)])  # Every position 30% picks.
def test_predictions_cover_the_recipes_masking_rate(model, seq, expected):
  command = harness.ours(model, seq, 8, 'paper', 1)
  assert f'--config.data.max_predictions_per_seq={expected}' in command

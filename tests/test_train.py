"""End to end on CPU: a tiny run writes the workdir contract and resumes exactly, even after SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax.train import metrics
from conftest import MICRO

pytestmark = pytest.mark.slow  # Every test here runs for many seconds.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A micro model on a slice of the built-in corpus: seconds per run.
OVERRIDES = MICRO
TRAIN_FIELDS = {'step', 'split', 'loss', 'mlm_loss', 'mlm_accuracy', 'nsp_loss', 'nsp_accuracy',
                'learning_rate', 'grad_norm', *metrics.TIMING_FIELDS}
TIMING_FIELDS = metrics.TIMING_FIELDS


_VOCAB_CACHE = []


@pytest.fixture(scope='module', autouse=True)
def vocab_cache(tmp_path_factory):
  """Every run of this module shares one trained vocab, as runs on one machine do."""
  _VOCAB_CACHE.append(str(tmp_path_factory.mktemp('vocab-cache')))
  yield
  _VOCAB_CACHE.pop()


def command(workdir, **extra):
  flags = {**OVERRIDES, 'data.tokenizer_cache_dir': _VOCAB_CACHE[-1], **extra}
  return [sys.executable, '-m', 'bert_jax.main', '--config=configs/tiny.py',
          f'--workdir={workdir}'] + [f'--config.{k}={v}' for k, v in flags.items()]


def run(workdir, **extra):
  result = subprocess.run(command(workdir, **extra), cwd=REPO, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def read_metrics(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def without_timing(records):
  return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def final_params(workdir, step):
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  return ocp.StandardCheckpointer().restore(path)['params']


def assert_trees_equal(a, b):
  import jax  # pylint: disable=g-import-not-at-top
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b) > 0
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


SHORT = {'train.num_steps': 12, 'train.log_every': 2, 'train.eval_every': 6,
         'train.checkpoint_every': 4}


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('uninterrupted'))
  run(workdir, **SHORT, **{'train.plots': True})  # The contract includes the curves.
  return workdir


@pytest.mark.xdist_group('train_uninterrupted')
def test_run_writes_the_workdir_contract(uninterrupted):
  names = set(os.listdir(uninterrupted))
  assert {'config.json', 'metrics.jsonl', 'checkpoints', 'tensorboard', 'vocab.txt',
          'eval_results.json', 'plots'} <= names
  with open(os.path.join(uninterrupted, 'plots', 'curves.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'  # Drawn by the run at its end.
  assert sorted(os.listdir(os.path.join(uninterrupted, 'checkpoints'))) == ['12', '8']
  assert os.listdir(os.path.join(uninterrupted, 'tensorboard'))
  records = read_metrics(uninterrupted)
  train = [r for r in records if r['split'] == 'train']
  evals = [r for r in records if r['split'] == 'eval']
  assert [r['step'] for r in train] == [2, 4, 6, 8, 10, 12]
  assert [r['step'] for r in evals] == [0, 6, 12]
  for record in train:
    assert TRAIN_FIELDS <= set(record)
    assert np.isfinite(record['loss']) and record['seq_per_s'] > 0 and record['mfu'] > 0
  assert {'mlm_loss', 'mlm_accuracy', 'nsp_loss', 'nsp_accuracy',
          'mlm_baseline_accuracy'} <= set(evals[-1])
  with open(os.path.join(uninterrupted, 'config.json'), encoding='utf-8') as f:
    assert json.load(f)['model']['hidden_size'] == 32


@pytest.mark.xdist_group('train_uninterrupted')
def test_restart_from_an_earlier_checkpoint_ends_identically(uninterrupted, tmp_path):
  workdir = str(tmp_path / 'restarted')
  run(workdir, **SHORT)
  # Forget everything after step 8, as if the run had died there; the same command resumes.
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '12'))
  result = run(workdir, **SHORT)
  assert 'Resumed from step 8' in result.stderr
  assert_trees_equal(final_params(workdir, 12), final_params(uninterrupted, 12))
  assert without_timing(read_metrics(workdir)) == without_timing(read_metrics(uninterrupted))


LONG = {'train.num_steps': 300, 'train.log_every': 10, 'train.eval_every': 100,
        'train.checkpoint_every': 10}


@pytest.fixture(scope='module')
def long_reference(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('long'))
  run(workdir, **LONG)
  return workdir


@pytest.mark.xdist_group('train_long_reference')
def test_sigkill_after_a_checkpoint_then_the_same_command_ends_identically(
    long_reference, tmp_path):
  long_run, reference = LONG, long_reference
  workdir = str(tmp_path / 'killed')
  process = subprocess.Popen(command(workdir, **long_run), cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  first_checkpoint = os.path.join(workdir, 'checkpoints', '10')
  deadline = time.time() + 240
  while not os.path.isdir(first_checkpoint) and time.time() < deadline:
    time.sleep(0.01)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert process.returncode == -signal.SIGKILL
  steps_saved = sorted(int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints'))
                       if s.isdigit())
  assert steps_saved and steps_saved[-1] < 300, 'the run was not interrupted'
  result = run(workdir, **long_run)
  assert 'Resumed from step' in result.stderr
  assert_trees_equal(final_params(workdir, 300), final_params(reference, 300))
  assert without_timing(read_metrics(workdir)) == without_timing(read_metrics(reference))


@pytest.mark.xdist_group('train_long_reference')
def test_losses_fall_on_the_builtin_corpus(long_reference):
  evals = [r for r in read_metrics(long_reference) if r['split'] == 'eval']
  assert evals[-1]['mlm_loss'] < 0.9 * evals[0]['mlm_loss']
  assert evals[-1]['nsp_loss'] < evals[0]['nsp_loss']


# Warmup-stable-decay: 4 steps of warmup, the last 6 decay; a checkpoint every 3 steps, all kept.
WSD = {'train.schedule': 'wsd', 'train.decay_steps': 6, 'train.decay_shape': '1-sqrt',
       'train.warmup_steps': 4, 'train.log_every': 2, 'train.eval_every': 100,
       'train.checkpoint_every': 3, 'train.keep_checkpoints': 20}


def copy_up_to(workdir, step, target):
  """A copy of `workdir` whose newest checkpoint is `step`: where a rerun resumes."""
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(workdir, target)
  for name in os.listdir(os.path.join(target, 'checkpoints')):
    if name.isdigit() and int(name) > step:
      shutil.rmtree(os.path.join(target, 'checkpoints', name))
  return target


def test_a_decay_branched_from_a_stable_checkpoint_equals_the_run_that_decayed_there(tmp_path):
  decayed = str(tmp_path / 'decayed')  # 12 steps: stable to step 6, then the decay.
  run(decayed, **WSD, **{'train.num_steps': 12})
  stable = str(tmp_path / 'stable')  # 30 steps: stable to step 24.
  run(stable, **WSD, **{'train.num_steps': 30})
  # The stable run's step-6 checkpoint, rerun as a 12-step run: the decay branches there.
  branch = copy_up_to(stable, 6, str(tmp_path / 'branch'))
  result = run(branch, **WSD, **{'train.num_steps': 12})
  assert 'Resumed from step 6' in result.stderr
  assert 'held to step 6, then 1-sqrt decay to 0 over the last 6 steps' in result.stderr
  assert_trees_equal(final_params(branch, 12), final_params(decayed, 12))
  assert without_timing(read_metrics(branch)) == without_timing(read_metrics(decayed))
  rate = {r['step']: r['learning_rate'] for r in read_metrics(decayed) if r['split'] == 'train'}
  # Steps 2, 4: warming up; 6: the peak; 8-12: decaying.
  assert rate[2] < rate[4] < rate[6] > rate[8] > rate[10] > rate[12] > 0
  # Stopped mid-warmup (step 3) or mid-decay (step 9) and rerun: the same end.
  for step in (3, 9):
    resumed = copy_up_to(decayed, step, str(tmp_path / f'resumed_{step}'))
    run(resumed, **WSD, **{'train.num_steps': 12})
    assert_trees_equal(final_params(resumed, 12), final_params(decayed, 12))
    assert without_timing(read_metrics(resumed)) == without_timing(read_metrics(decayed))

"""Ablation sweeps (bert_jax/sweep): plans validated before anything trains, fair held-out sets,
derived schedules, resume, and every shipped sweep file run end to end on a tiny base config."""

import glob
import json
import os
import re
import signal
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from bert_jax.models import architecture
from bert_jax.sweep import runner
from bert_jax.sweep import sizes
from bert_jax.sweep import spec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP_FILES = sorted(glob.glob(os.path.join(REPO, 'sweeps', '[!_]*.py')))
SWEEP_FILES = [f for f in SWEEP_FILES if os.path.basename(f) != 'common.py']


def _data_root():
  root = os.environ.get('BERT_JAX_DATA', '')
  if not os.path.isdir(os.path.join(root, 'glue')):
    pytest.skip('BERT_JAX_DATA (the shared data folder with glue/ and vocab/) is not set.')
  return root


def _vocab():
  return os.path.join(_data_root(), 'vocab', 'bert-base-uncased-vocab.txt')


def tiny(sweep, tasks=None, steps=1, cache=''):
  """`sweep` at size tiny (what --sweep.size=tiny runs, bert_jax/sweep/sizes.py), cheaper still
  for a CPU test: `steps` per pretraining run, a few fine-tuning rows of 32 tokens, and trained
  vocabs TINY_TRAINED_VOCAB wide; compiled steps kept in `cache` (runs of one shape compile
  once)."""
  sizes.shrink_to_tiny(sweep, trained_vocab=TINY_TRAINED_VOCAB)
  sweep.steps = steps
  sweep.pretrain.train = {'eval_batches': 2, 'batch_size': 8, 'compilation_cache_dir': cache}
  if tasks:
    sweep.finetune.tasks = tasks
  sweep.finetune.overrides.data.max_seq_length = 32
  sweep.finetune.overrides.train.update(batch_size=8, num_epochs=1.0,
                                        compilation_cache_dir=cache)
  sweep.finetune.overrides.task.max_train_examples = 16
  return sweep


# The vocab an arm that trains its own tokenizer (RoBERTa's BPE, ALBERT's SentencePiece) gets in
# a CPU test: training even size=tiny's 4,096 pieces and their output layer would be most of the
# test's time.
TINY_TRAINED_VOCAB = 1000


@pytest.fixture(scope='session')
def compile_cache(tmp_path_factory):
  """One persistent compilation cache for every end-to-end sweep of the session."""
  return str(tmp_path_factory.mktemp('compile_cache'))


def table5():
  return spec.load_file(os.path.join(REPO, 'sweeps', 'table5.py'))


def _arm(sweep, name, **fields):
  arms = sweep.arms.to_dict()
  arms[name] = fields
  sweep.arms = arms
  return sweep


# ---- Plans: every check before anything trains. ----


@pytest.mark.parametrize('path', SWEEP_FILES, ids=os.path.basename)
def test_every_shipped_sweep_plans_with_its_real_base(path, tmp_path):
  _data_root()
  plan = spec.plan(spec.load_file(path), str(tmp_path))
  kinds = [job.kind for job in plan.jobs]
  assert kinds[0] == 'prepare' and 'pretrain' in kinds and 'finetune' in kinds
  names = [job.name for job in plan.jobs]
  for job in plan.jobs:  # Jobs come after what they need.
    assert all(names.index(dep) < names.index(job.name) for dep in job.after)
  assert not os.listdir(tmp_path)  # Planning writes nothing.


@pytest.mark.parametrize('path', SWEEP_FILES, ids=os.path.basename)
def test_every_shipped_sweep_plans_at_size_tiny_on_the_tiny_base(path, tmp_path):
  _data_root()
  sweep = spec.load_file(path)
  full = spec.plan(sweep, str(tmp_path / 'full'))
  sweep.size = 'tiny'
  plan = spec.plan(sweep, str(tmp_path / 'tiny'))
  assert plan.summary['size'] == 'tiny' and plan.summary['base'] == sizes.TINY_BASE
  assert plan.summary['seeds'] == 1 and len(plan.summary['learning_rates']) == 1
  assert any('size tiny' in note for note in plan.summary['notes'])
  # The same runs (arms, tasks, steps fine-tuned from), each small.
  assert ([(j.kind, j.arm, j.task) for j in plan.jobs]
          == [(j.kind, j.arm, j.task) for j in full.jobs])
  for job, before in zip(plan.jobs, full.jobs):
    if job.kind == 'pretrain':
      assert job.config.startswith(sizes.TINY_BASE)
      assert job.num_steps < before.num_steps / 10
    elif job.kind == 'finetune':
      assert job.overrides['task.max_train_examples'] == sizes.TINY_TRAIN_EXAMPLES
      assert job.overrides['data.max_seq_length'] <= 128  # The tiny model's positions.
      assert job.overrides['model.dtype'] == 'float32'


def test_size_tiny_keeps_the_arms_proportions():
  sweep = spec.load_file(os.path.join(REPO, 'sweeps', 'model_size.py'))
  sizes.shrink_to_tiny(sweep)
  # 768 wide with 3 or 12 heads: 96 wide, the feed-forward still 4H.
  for name, arm in sweep.arms.items():
    assert 'hidden=96' in arm.args, name
    assert arm.pretrain.model.intermediate_size == 4 * 96
  sweep = spec.load_file(os.path.join(REPO, 'sweeps', 'training_steps.py'))
  sizes.shrink_to_tiny(sweep)
  # At 5,000, 10,000 and 15,000 of 20,000 steps: the same fractions of TINY_STEPS.
  assert sweep.steps == sizes.TINY_STEPS
  assert sweep.finetune.at_steps == '75,150,225'
  sweep = spec.load_file(os.path.join(REPO, 'sweeps', 'family.py'))
  sizes.shrink_to_tiny(sweep)
  assert sweep.arms.roberta.pretrain.data.tokenizer_vocab_size == 4096
  assert sweep.arms.roberta.pretrain.model.vocab_size == 4096
  assert 'tokenizer_vocab_size' not in sweep.arms.electra.pretrain.get('data', {})
  sst2 = sweep.finetune.task_overrides.to_dict().get('sst2', {})
  assert 'max_train_examples' not in sst2.get('task', {})
  assert sst2['data']['max_seq_length'] == 64
  sweep = spec.load_file(os.path.join(REPO, 'sweeps', 'spanbert.py'))
  sizes.shrink_to_tiny(sweep)
  # SQuAD's 384-token rows: as long as the tiny model's 128 positions.
  assert sweep.finetune.task_overrides.squad.data.max_seq_length == 128


def test_an_unknown_size_is_refused_naming_the_valid_ones(tmp_path):
  sweep = table5()
  sweep.size = 'huge'
  with pytest.raises(spec.SweepError, match=r"sweep.size='huge': expected one of '', 'tiny'"):
    spec.plan(sweep, str(tmp_path))


def test_misspelled_key_in_an_arm_is_refused_naming_arm_and_key(tmp_path):
  _data_root()
  sweep = _arm(table5(), 'deep', label='deep', pretrain={'model': {'num_layer': 3}})
  with pytest.raises(spec.SweepError, match=r"Arm 'deep'.*'model.num_layer'.*model.num_layers"):
    spec.plan(sweep, str(tmp_path))


def test_bad_value_in_an_arm_is_refused_before_the_first_arm_trains(tmp_path, monkeypatch):
  _data_root()
  started = []
  monkeypatch.setattr(runner, '_start', lambda *a: started.append(a))
  sweep = _arm(table5(), 'z_bad', label='bad', args='mask_rate=1.5')
  with pytest.raises(spec.SweepError, match=r"Arm 'z_bad'.*masking.rate=1.5"):
    runner.run(spec.plan(sweep, str(tmp_path)), str(tmp_path))
  assert not started and not os.listdir(tmp_path)


def test_unknown_task_and_arm_field_are_refused(tmp_path):
  _data_root()
  sweep = table5()
  sweep.finetune.tasks = 'sst2,mrcp'
  with pytest.raises(spec.SweepError, match=r"unknown task 'mrcp'.*mrpc"):
    spec.plan(sweep, str(tmp_path))
  with pytest.raises(spec.SweepError, match=r"Arm 'x'.*unknown field.*overides"):
    spec.plan(_arm(table5(), 'x', overides={}), str(tmp_path))


def test_every_fine_tuning_run_selects_its_rate_from_the_sweeps_grid(tmp_path):
  _data_root()
  plan = spec.plan(table5(), str(tmp_path))
  finetunes = [job for job in plan.jobs if job.kind == 'finetune']
  assert finetunes and all(job.overrides['train.learning_rates'] == '5e-05,4e-05,3e-05,2e-05'
                           for job in finetunes)
  assert plan.summary['learning_rates'] == [5e-5, 4e-5, 3e-5, 2e-5]
  sweep = table5()
  sweep.finetune.learning_rates = ''  # The overrides' one rate, as before the grid.
  plan = spec.plan(sweep, str(tmp_path))
  assert not any('train.learning_rates' in job.overrides for job in plan.jobs)
  assert plan.summary['learning_rates'] == []


def test_a_bad_learning_rate_grid_is_refused_naming_where_it_is(tmp_path):
  _data_root()
  sweep = table5()
  sweep.finetune.learning_rates = '5e-5,fast'
  with pytest.raises(spec.SweepError,
                     match=r"sweep.finetune.learning_rates='5e-5,fast': 'fast' is not a number"):
    spec.plan(sweep, str(tmp_path))
  sweep = _arm(table5(), 'z_bad', label='bad', finetune={'train': {'learning_rates': '-1e-5'}})
  with pytest.raises(spec.SweepError, match=r"Arm 'z_bad', task 'sst2': config.train."
                                            r"learning_rates='-1e-5': '-1e-5' is not a valid"):
    spec.plan(sweep, str(tmp_path))


def test_arms_must_share_the_held_out_documents(tmp_path):
  _data_root()
  sweep = _arm(table5(), 'other_seed', label='seed 1', pretrain={'seed': 1})
  with pytest.raises(spec.SweepError, match=r'config.seed is .*other_seed'):
    spec.plan(sweep, str(tmp_path))
  sweep = _arm(table5(), 'big_batch', label='batch 512', args='batch=512')
  with pytest.raises(spec.SweepError, match=r'eval_batches'):
    spec.plan(sweep, str(tmp_path))
  sweep = _arm(table5(), 'big_batch', label='batch 512', args='batch=512',
               pretrain={'train': {'eval_batches': 8}})
  notes = spec.plan(sweep, str(tmp_path)).summary['notes']
  assert any('objectives' in note for note in notes)  # NSP pairs and single segments differ.


def test_schedule_and_intervals_follow_the_step_budget(tmp_path):
  _data_root()
  sweep = table5()
  sweep.steps = 500
  plan = spec.plan(sweep, str(tmp_path))
  small = spec.load_config('configs/small.py', 'test')
  share = small.train.warmup_steps / small.train.num_steps
  for job in plan.jobs:
    if job.kind != 'pretrain':
      continue
    config = spec.load_config(job.config, job.name)
    spec.apply_overrides(config, job.overrides, job.name)
    assert config.train.num_steps == job.num_steps == 500
    assert config.train.warmup_steps == round(share * 500)
    assert config.train.eval_every == 500 // sweep.evaluations
    assert config.train.checkpoint_every == 500
  sweep = _arm(table5(), 'own_warmup', label='w', args='warmup=7', pretrain={'seed': 0})
  sweep.steps = 500
  job = next(j for j in spec.plan(sweep, str(tmp_path)).jobs if j.name == 'pretrain/own_warmup')
  config = spec.load_config(job.config, job.name)
  assert config.train.warmup_steps == 7  # Set explicitly: kept.


def test_arms_with_the_same_pretraining_share_one_run(tmp_path):
  _data_root()
  plan = spec.plan(table5(), str(tmp_path))
  pretrain = [job.name for job in plan.jobs if job.kind == 'pretrain']
  assert pretrain == ['pretrain/mlm_nsp', 'pretrain/mlm', 'pretrain/ltr']
  bilstm = next(job for job in plan.jobs if job.name == 'finetune/ltr_bilstm/sst2')
  assert bilstm.after == ('pretrain/ltr',)
  assert bilstm.overrides['init_from'] == os.path.join(str(tmp_path), 'pretrain', 'ltr')
  assert bilstm.overrides['task.lstm_layers'] == 1
  random = next(job for job in plan.jobs if job.name == 'finetune/random/mrpc')
  small = spec.load_config('configs/small.py', 'test')
  assert random.after == () and 'init_from' not in random.overrides
  assert random.overrides['model.num_layers'] == small.model.num_layers
  assert random.overrides['data.vocab_file'] == small.data.vocab_file


def test_a_random_init_arm_fine_tunes_its_pretraining_run_s_whole_architecture(tmp_path):
  # Every key init_from would adopt (architecture.ARCHITECTURE_KEYS), not the shape alone: here the
  # pretraining run's LayerNorm eps, which the fine-tuning config would otherwise keep at 1e-12.
  _data_root()
  sweep = table5()
  sweep.pretrain.model = {'layer_norm_eps': 1e-6}
  random = next(job for job in spec.plan(sweep, str(tmp_path)).jobs
                if job.name == 'finetune/random/mrpc')
  assert random.overrides['model.layer_norm_eps'] == 1e-6
  finetune = spec.load_config('configs/glue.py', 'test')
  assert sorted(k for k in random.overrides if k.startswith('model.')
                and k[len('model.'):] in architecture.ARCHITECTURE_KEYS) == sorted(
                    f'model.{k}' for k in architecture.ARCHITECTURE_KEYS if k in finetune.model)


def test_at_steps_keep_those_checkpoints_and_fine_tune_from_them(tmp_path):
  _data_root()
  sweep = spec.load_file(os.path.join(REPO, 'sweeps', 'training_steps.py'))
  sweep.steps = 3000
  sweep.finetune.at_steps = '1000,2000'
  plan = spec.plan(sweep, str(tmp_path))
  run = next(job for job in plan.jobs if job.kind == 'pretrain')
  assert run.overrides['train.checkpoint_every'] == 1000
  assert run.overrides['train.keep_checkpoints'] >= 3
  froms = sorted(job.overrides['init_from'] for job in plan.jobs if job.task == 'sst2')
  base = os.path.join(str(tmp_path), 'pretrain', 'bert')
  assert froms == [base, f'{base}@1000', f'{base}@2000']
  sweep.finetune.at_steps = '3000'
  with pytest.raises(spec.SweepError, match='outside the steps'):
    spec.plan(sweep, str(tmp_path))


def test_a_rerun_with_another_config_for_an_existing_run_is_refused(tmp_path):
  _data_root()
  runner.write_summary(spec.plan(table5(), str(tmp_path)), str(tmp_path))
  os.makedirs(tmp_path / 'pretrain' / 'mlm')
  sweep = table5()
  sweep.pretrain.train = {'learning_rate': 1e-3}
  with pytest.raises(spec.SweepError, match=r'pretrain/mlm exists .*learning_rate'):
    runner.check_recorded(spec.plan(sweep, str(tmp_path)), str(tmp_path))


def test_pod_commands_list_every_run_after_its_prerequisites(tmp_path):
  _data_root()
  plan = spec.plan(table5(), str(tmp_path))
  script = runner.pod_commands(plan, str(tmp_path))
  lines = [line for line in script.splitlines() if line.startswith('./launch_tpu.sh')]
  assert len(lines) == len(plan.jobs) - 1  # All but the prepare step, which is shown first.
  assert all('--workdir=' in line for line in lines)
  assert script.index('pretrain/ltr') < script.index('finetune/ltr_bilstm/sst2')


def start_stub_sweep(tmp_path, exit_code_when_stopped=None):
  """A sweep of two fine-tuning runs at once in its own process, each run a stub that writes
  <run>.started, then on SIGTERM <run>.stopped and exits; returns (the process, the .started
  files) once both runs have started. With `exit_code_when_stopped` the sweep exits with it when
  runner.Stopped reaches it."""
  _data_root()
  child = ('import signal, sys, time\n'
           'out = sys.argv[1]\n'
           'signal.signal(signal.SIGTERM, lambda *_: (open(out + ".stopped", "w").close(), '
           'sys.exit(0)))\n'
           'open(out + ".started", "w").close()\n'
           'time.sleep(120)\n')
  workdir = str(tmp_path / 'sweep')
  run = f'runner.run(spec.plan(sweep, {workdir!r}), {workdir!r}, parallel=2)\n'
  if exit_code_when_stopped is not None:
    run = f'try:\n  {run}except runner.Stopped:\n  sys.exit({exit_code_when_stopped})\n'
  script = tmp_path / 'sweep_stub.py'
  script.write_text(
      'import os, sys\n'
      f'sys.path.insert(0, {REPO!r})\n'
      'from bert_jax.sweep import runner, spec\n'
      'runner.command = lambda job, workdir, peak_flops=0.0: [\n'
      f'    sys.executable, "-c", {child!r},\n'
      f'    os.path.join({str(tmp_path)!r}, job.name.replace("/", "_"))]\n'
      f'sweep = spec.load_file({os.path.join(REPO, "sweeps", "table5.py")!r})\n'
      'sweep.arms = {"random": {"label": "No pretraining", "init": "random"}}\n'
      'sweep.order = "random"\n' + run)
  process = subprocess.Popen([sys.executable, str(script)])
  deadline = time.monotonic() + 60
  while len(glob.glob(str(tmp_path / '*.started'))) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
  started = sorted(glob.glob(str(tmp_path / '*.started')))
  assert len(started) == 2, started  # Two fine-tuning runs at once.
  return process, started


def stopped_runs(tmp_path, started) -> list[str]:
  """The runs that wrote .stopped, as the .started files name them."""
  stopped = sorted(glob.glob(str(tmp_path / '*.stopped')))
  assert [s[:-len('.stopped')] for s in stopped] == [s[:-len('.started')] for s in started]
  return stopped


def test_sigterm_stops_the_running_jobs_and_the_sweep_with_them(tmp_path):
  """A sweep stopped by SIGTERM (a timeout, a preempted VM) passes it to its running jobs and
  waits for them: none outlives it to hold its workdir's lock against the rerun."""
  process, started = start_stub_sweep(tmp_path, exit_code_when_stopped=7)
  process.send_signal(signal.SIGTERM)
  assert process.wait(timeout=60) == 7
  stopped_runs(tmp_path, started)


def test_a_killed_sweeps_runs_stop_with_it(tmp_path):
  """SIGKILL leaves the sweep no chance to pass a signal on: its runs get SIGTERM from the kernel
  (a checkpoint and a clean exit) instead of running on as orphans that hold their workdirs."""
  process, started = start_stub_sweep(tmp_path)
  process.kill()
  process.wait(timeout=10)
  deadline = time.monotonic() + 30
  while len(glob.glob(str(tmp_path / '*.stopped'))) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
  stopped_runs(tmp_path, started)


@pytest.mark.slow
def test_a_rerun_waits_for_a_run_that_still_holds_its_workdir(tmp_path):
  """A run of a killed sweep may still be saving its checkpoint when the sweep is rerun: the
  rerun waits for it instead of starting a run that the lock refuses (reported FAILED)."""
  from bert_jax.train import guard  # pylint: disable=g-import-not-at-top
  job_dir = str(tmp_path / 'pretrain' / 'bert')
  holder = subprocess.Popen([sys.executable, '-c', (
      'import sys, time\n'
      f'sys.path.insert(0, {REPO!r})\n'
      'from bert_jax.train import guard\n'
      f'with guard.claim({job_dir!r}):\n'
      '  print("held", flush=True)\n'
      '  time.sleep(3)\n')], stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == 'held'
  assert guard.in_use(job_dir) == f'process {holder.pid} on {os.uname().nodename}'
  lines = []
  start = time.monotonic()
  runner.wait_until_free(job_dir, lines.append, timeout_s=60)
  assert 2.0 < time.monotonic() - start < 30  # Until the holder let go, about 3 s after.
  assert holder.wait(timeout=30) == 0
  assert len(lines) == 1 and f'held by process {holder.pid}' in lines[0]
  assert guard.in_use(job_dir) is None
  with guard.claim(job_dir):  # Free for the rerun's run.
    pass


# ---- The held-out set. ----


def test_reference_eval_masking_gives_every_masking_arm_the_same_held_out_set():
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  from configs import tiny as tiny_config  # pylint: disable=g-import-not-at-top

  def held_out(masking_eval, **masking):
    config = tiny_config.get_config('mask_rate=0.4' if masking.pop('rate40', False) else None)
    config.data.max_documents = 40
    config.masking.update(eval=masking_eval, **masking)
    return pretrain.prepare_data(config, '/nonexistent')[1]

  reference = held_out('reference')
  for arm in (dict(mask_token_fraction=1.0, random_token_fraction=0.0, keep_fraction=0.0),
              dict(rate40=True)):
    other = held_out('reference', **dict(arm))
    assert all(np.array_equal(a[k][:, :b[k].shape[1]] if a[k].ndim > 1 else a[k], b[k])
               for a, b in zip(other, reference) for k in ('input_ids', 'masked_lm_positions'))
    own = held_out('train', **dict(arm))
    assert not all(np.array_equal(a['input_ids'], b['input_ids'])
                   for a, b in zip(own, reference))


def test_the_time_left_goes_by_each_kind_s_runs_so_far():
  durations = {'pretrain': [100.0, 300.0], 'finetune': [10.0, 30.0, 20.0]}
  # Pretraining runs one after another; fine-tuning runs `parallel` at a time.
  assert runner.time_left(['pretrain', 'finetune', 'finetune'], durations, 2) == 200 + 20
  assert runner.time_left(['finetune'] * 4, durations, 1) == 80
  assert runner.time_left([], durations, 1) == 0.0
  assert runner.time_left(['prepare'], durations, 1) is None  # No prepare job ran yet.


# ---- Every shipped sweep, end to end on a tiny base. ----


def _run(sweep, workdir, sweep_file=''):
  plan = spec.plan(sweep, workdir, sweep_file)
  lines = []
  failed = runner.run(plan, workdir, in_process=True, log=lines.append)
  assert not failed, lines
  return plan, lines


# Sweeps whose arms fine-tune other families or from other kinds of pretraining run (or from
# steps along one, `at_steps`). The other sweeps' arms are all BERT, fine-tuned through the path
# test_table5_sweep_runs_... runs; their fine-tuning configs are still built and validated (the
# plan), and their pretraining runs.
FINE_TUNED_SWEEPS = ('family.py', 'distillation.py', 'spanbert.py', 'training_steps.py')


def arm_order(sweep):
  """The sweep's arm names in its report order."""
  return ([name for name in str(sweep.get('order') or '').split(',') if name]
          or list(sweep.arms.to_dict()))


def keep_arms(sweep, kept):
  """Leaves only the arms named in `kept` (and their order)."""
  order = arm_order(sweep)
  sweep.arms = {name: arm for name, arm in sweep.arms.to_dict().items() if name in kept}
  sweep.order = ','.join(name for name in order if name in kept)


# table5.py runs end to end in test_table5_sweep_runs_...; every other shipped sweep here.
NOT_RUN_HERE = ('table5.py',)


@pytest.mark.slow
@pytest.mark.parametrize('path', [f for f in SWEEP_FILES if not f.endswith(NOT_RUN_HERE)],
                         ids=os.path.basename)
def test_shipped_sweep_runs_on_a_tiny_base_and_reports(path, tmp_path, compile_cache):
  from bert_jax.sweep import report  # pylint: disable=g-import-not-at-top
  sweep = spec.load_file(path)
  steps = 1
  if sweep.finetune.get('at_steps'):
    steps, sweep.finetune.at_steps = 2, '1'
  tiny(sweep, 'mrpc', steps, compile_cache)
  if os.path.basename(path) not in FINE_TUNED_SWEEPS:
    planned = spec.plan(sweep, str(tmp_path / 'planned'), path)
    assert any(job.kind == 'finetune' for job in planned.jobs)  # Built and validated.
    sweep.finetune.tasks = ''
    # Every arm's pretraining config is built and validated by the plan; the first arm (and the
    # equal-FLOPs reference) trains: the arms differ in config values only, each of which other
    # tests train.
    order = arm_order(sweep)
    if os.path.basename(path) == 'modern_block.py':
      # The modern encoder's arm alone: BERT's is every other sweep's first arm.
      order, sweep.equal_flops = ['modern'], ''
    elif os.path.basename(path) == 'family_recent.py':
      # XLM-R's arm alone: its SentencePiece-with-fairseq-ids corpus and encoder. DeBERTa's
      # arms are test_deberta's and test_deberta_rtd's runs, ModernBERT's modern_block's.
      order, sweep.equal_flops = ['xlmr'], ''
    keep_arms(sweep, order[:1] + [sweep.get('equal_flops') or order[0]])
  elif os.path.basename(path) == 'family.py':
    # Every arm is planned (validated, its equal-FLOPs steps derived); ALBERT (a tokenizer and
    # corpus of its own beside the sweep's WordPiece one) trains and fine-tunes. BERT's own path
    # is table5's; RoBERTa's BPE corpus, pretraining and fine-tuning are test_tokenizers_family's
    # and test_family_finetune's; ELECTRA's pretraining and fine-tuning from its workdir are
    # test_electra's.
    spec.plan(sweep, str(tmp_path / 'planned'), path)
    keep_arms(sweep, ['albert'])
    sweep.equal_flops = ''
  elif os.path.basename(path) == 'distillation.py':
    # The teacher arm, then the student distilled from its workdir; fine-tuning a DistilBERT
    # student is test_distilbert's and test_distill's.
    sweep.finetune.tasks = ''
  elif os.path.basename(path) == 'spanbert.py':
    # Planned whole (equal-FLOPs steps, both arms' SQuAD jobs: test_sweep_spanbert's); the
    # SpanBERT arm trains and fine-tunes on SQuAD. The token-masking arm is BERT's MLM, which
    # table5's sweep test trains and fine-tunes.
    spec.plan(sweep, str(tmp_path / 'planned'), path)
    keep_arms(sweep, ['spanbert'])
    sweep.equal_flops = ''
  workdir = str(tmp_path)
  plan, _ = _run(sweep, workdir, path)
  for job in plan.jobs:
    assert runner.finished(job, workdir), job.name
  text = report.write(workdir)
  for arm in plan.summary['arms']:
    assert arm['label'] in text
  with open(os.path.join(workdir, 'report.md'), encoding='utf-8') as f:
    first = f.read()
  # A rerun skips every finished run and rebuilds the same report.
  _, lines = _run(sweep, workdir, path)
  assert all('finished before; skipped' in line for line in lines), lines
  report.write(workdir)
  with open(os.path.join(workdir, 'report.md'), encoding='utf-8') as f:
    assert f.read() == first


@pytest.mark.slow
def test_table5_sweep_runs_reports_and_redoes_only_unfinished_runs(tmp_path, compile_cache):
  from bert_jax.sweep import report  # pylint: disable=g-import-not-at-top
  sweep = tiny(table5(), 'mrpc', cache=compile_cache)
  # MLM + NSP, BERT's own path, is what most other tests train; the sweep's other arms are its
  # own (MLM only, left-to-right, the BiLSTM head on the left-to-right run, random init).
  keep_arms(sweep, ['mlm', 'ltr', 'ltr_bilstm', 'random'])
  workdir = str(tmp_path)
  plan, lines = _run(sweep, workdir)
  assert all(runner.finished(job, workdir) for job in plan.jobs)
  # Each run's end says how far the sweep is and, once each kind left has run, the time left.
  ends = [line for line in lines if re.match(r'\[sweep\] \S+: done in \d+ s \(', line)]
  assert len(ends) == len(plan.jobs), lines
  assert ends[-1].endswith(f'({len(plan.jobs)}/{len(plan.jobs)} done).')
  assert any(re.search(r'done; about \d+ min left by the runs so far\)\.$', line)
             for line in ends), ends
  text = report.write(workdir)
  assert all(arm['label'] in text for arm in plan.summary['arms'])
  # `sweep report` rebuilds the report and its curves from the workdir alone.
  written = (tmp_path / 'report.md').read_text(encoding='utf-8')
  os.remove(tmp_path / 'report.md')
  shutil.rmtree(tmp_path / 'plots', ignore_errors=True)
  result = subprocess.run([sys.executable, '-m', 'bert_jax.sweep', 'report',
                           f'--workdir={workdir}'], capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert (tmp_path / 'report.md').read_text(encoding='utf-8') == written
  assert os.path.isfile(tmp_path / 'plots' / 'curves.png')
  # As if killed before the MLM arm's fine-tuning finished, and before 'ltr' had pretrained.
  os.remove(tmp_path / 'finetune' / 'mlm' / 'mrpc' / 'results.json')
  os.remove(tmp_path / 'pretrain' / 'ltr' / 'eval_results.json')
  kept = {job.name: os.path.getmtime(os.path.join(workdir, job.workdir, 'results.json'))
          for job in plan.jobs if job.kind == 'finetune' and job.name != 'finetune/mlm/mrpc'}
  _, lines = _run(sweep, workdir)
  started = sorted(line.split()[1].rstrip(':') for line in lines if 'started' in line)
  assert started == ['finetune/mlm/mrpc', 'pretrain/ltr']
  with open(tmp_path / 'finetune' / 'mlm' / 'mrpc' / 'results.json', encoding='utf-8') as f:
    assert json.load(f)['seeds'] == [0]
  assert os.path.isfile(tmp_path / 'pretrain' / 'ltr' / 'eval_results.json')
  for name, stamp in kept.items():  # Finished fine-tuning runs are not redone.
    job = next(j for j in plan.jobs if j.name == name)
    assert os.path.getmtime(os.path.join(workdir, job.workdir, 'results.json')) == stamp


@pytest.mark.slow
def test_report_of_a_directory_that_is_not_a_sweep_exits_with_one_line(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  result = subprocess.run([sys.executable, '-m', 'bert_jax.sweep', 'report',
                           f'--workdir={tmp_path}'], cwd=REPO, capture_output=True, text=True,
                          check=False)
  assert result.returncode == 1
  assert 'sweep.json does not exist' in result.stderr and 'Traceback' not in result.stderr


def test_a_sweep_file_that_does_not_load_exits_with_one_line(tmp_path):
  (tmp_path / 'broken.py').write_text('def get_config(:\n  pass\n')
  for sweep, expected in ((tmp_path / 'broken.py', r"Sweep file '.*broken\.py' does not load: "
                           r'SyntaxError: invalid syntax \(broken\.py, line 1\)'),
                          (tmp_path / 'missing.py', r"Sweep file '.*missing\.py' does not exist"
                           r'.*the sweeps are .*sweeps/table5\.py')):
    result = subprocess.run([sys.executable, '-m', 'bert_jax.sweep', 'check', f'--sweep={sweep}',
                             f'--workdir={tmp_path / "w"}'], cwd=REPO, capture_output=True,
                            text=True, check=False, timeout=120)
    assert result.returncode == 1 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    assert re.match(expected, result.stderr.strip().splitlines()[-1]), result.stderr[-500:]


@pytest.mark.slow
def test_a_two_rate_two_seed_sweep_reports_the_chosen_rate_the_floors_and_the_marks(
    tmp_path, compile_cache):
  from bert_jax.sweep import report  # pylint: disable=g-import-not-at-top
  sweep = tiny(table5(), 'mrpc', cache=compile_cache)
  keep_arms(sweep, ['mlm', 'random'])
  sweep.finetune.seeds = 2
  sweep.finetune.learning_rates = '5e-5,3e-5'
  # 64 rows: MRPC's majority class, paraphrase (68%), is theirs too (16 rows can say otherwise).
  sweep.finetune.overrides.task.max_train_examples = 64
  workdir = str(tmp_path)
  _run(sweep, workdir)
  for arm in ('mlm', 'random'):
    for rate in ('lr_5e-05', 'lr_3e-05'):
      assert sorted(os.listdir(tmp_path / 'finetune' / arm / 'mrpc' / rate)) == [
          'seed_0', 'seed_1']
  loaded = report.load(workdir)
  run = loaded.final('mlm', 'mrpc')
  assert run.learning_rate in (5e-5, 3e-5) and len(run.scores) == 2
  assert [rate for rate, _ in run.rate_medians] == [5e-5, 3e-5]
  header, rows = report.main_rows(loaded)
  labels = [row[0] for row in rows]
  assert labels[-1] == report.BASELINE_LABEL
  # MRPC dev's score of always answering the whole training file's majority class
  # ("paraphrase"), though the run trained on its first rows only.
  baseline = run.baseline
  assert baseline is not None and run.baseline_kind.startswith(
      'majority class of the whole training file (') and 'its first 64' in run.baseline_kind
  assert round(baseline, 1) == 81.2  # F1 of answering "paraphrase" on MRPC's dev set.
  column = header.index(f'mrpc {run.metric}')
  assert rows[0][0] == 'No NSP' and rows[0][column].startswith(
      f'{run.median:.1f} [{min(run.scores):.1f}–{max(run.scores):.1f}]')
  assert rows[-1][column] == f'{baseline:.1f}'
  for row in rows[:-1]:  # Marked exactly where the median is not above the floor.
    arm = next(a['name'] for a in loaded.arms if a.get('label') == row[0])
    below = loaded.final(arm, 'mrpc').median <= baseline
    assert row[column].endswith(report.AT_BASELINE) == below, (row, baseline)
  # Eight steps of fine-tuning do not lift the untrained encoder above the majority class.
  assert rows[1][0] == 'No pretraining' and rows[1][column].endswith(report.AT_BASELINE), rows
  text = report.markdown(loaded)
  assert '## Fine-tuning learning rate' in text and '## Fine-tuning convergence' in text
  assert 'The no-pretraining row: No pretraining' in text


# ---- The sweeps' base picks the kernels this machine takes. ----


@pytest.mark.parametrize('found, attention, norm', [('hopper', 'pallas', 'pallas'),
                                                    ('tpu', 'tpu', 'xla'), ('xla', 'xla', 'xla')])
def test_the_base_recipe_computes_the_same_function_with_the_kernels_found(
    found, attention, norm, monkeypatch):
  from bert_jax.core import chips  # pylint: disable=g-import-not-at-top
  from configs import small  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(chips, 'kernels_here', lambda: found)
  config = small.get_config()
  assert (config.model.attention_impl, config.model.layer_norm_impl) == (attention, norm)
  named = small.get_config(f'kernels={found}')
  assert named.to_dict() == config.to_dict()
  # What the arms compare is the same everywhere: only how it is computed differs.
  hopper = small.get_config('kernels=hopper')
  for key in ('dtype', 'gelu', 'dropout_rng_impl', 'hidden_size', 'num_layers'):
    assert config.model[key] == hopper.model[key], key
  assert config.train.to_dict().keys() == hopper.train.to_dict().keys()
  with pytest.raises(ValueError, match=r"kernels='gpu': expected one of auto, hopper, tpu, xla"):
    small.get_config('kernels=gpu')


@pytest.mark.parametrize('smi, kernels', [('9.0\n', 'hopper'), ('8.0\n', 'xla'), (None, 'xla')])
def test_the_kernels_here_come_from_the_gpu_s_compute_capability(smi, kernels, monkeypatch):
  import subprocess as subprocess_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.core import chips  # pylint: disable=g-import-not-at-top

  def fake_run(*args, **kwargs):
    if smi is None:
      raise FileNotFoundError('nvidia-smi')
    return subprocess_lib.CompletedProcess(args, 0, stdout=smi, stderr='')
  monkeypatch.setattr(subprocess_lib, 'run', fake_run)
  monkeypatch.setattr(chips, 'tpu_attached', lambda: False)
  assert chips.kernels_here() == kernels
  monkeypatch.setattr(chips, 'tpu_attached', lambda: True)
  assert chips.kernels_here() == 'tpu'


def test_sweep_check_refuses_runs_whose_kernels_this_machine_lacks_in_one_line(tmp_path):
  from bert_jax.core import chips  # pylint: disable=g-import-not-at-top
  if chips.kernels_here() != 'xla':
    pytest.skip('This machine takes the GPU or TPU kernels: nothing to refuse.')
  _data_root()
  check = [sys.executable, '-m', 'bert_jax.sweep', 'check', '--sweep=sweeps/table5.py',
           f'--workdir={tmp_path}']
  result = subprocess.run(check, cwd=REPO, capture_output=True, text=True, check=False,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]  # kernels=auto: XLA on this CPU.
  assert '[to run] pretrain/mlm_nsp' in result.stdout
  result = subprocess.run(check + ['--sweep.base=configs/small.py:kernels=hopper'], cwd=REPO,
                          capture_output=True, text=True, check=False, timeout=300)
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert re.match(r"3 run\(s\) cannot run on this machine; the first: pretrain/mlm_nsp: "
                  r"config\.model\.\w+='pallas' runs .* this run has 1 cpu device",
                  result.stderr.strip().splitlines()[-1]), result.stderr[-1000:]

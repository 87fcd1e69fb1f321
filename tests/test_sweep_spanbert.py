"""sweeps/spanbert.py: both arms pretrain for one budget in FLOPs, and the sweep fine-tunes and
reports SQuAD v1.1 from a split of the dev file."""

import json
import os

from bert_jax.sweep import results
from bert_jax.sweep import spec
from conftest import shared_data_dir
from test_sweep_family import pretraining, run_config, training_flops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATH = os.path.join(REPO, 'sweeps', 'spanbert.py')


def test_spanbert_arm_pretrains_for_bert_s_flops_with_spans_and_sbo(tmp_path):
  shared_data_dir()
  jobs = pretraining(spec.plan(spec.load_file(PATH), str(tmp_path)))
  bert, spanbert = run_config(jobs['bert']), run_config(jobs['spanbert'])
  assert (bert.objectives, bert.masking.spans) == ('mlm', '')
  assert (spanbert.objectives, spanbert.masking.spans, spanbert.masking.whole_word) == (
      'mlm,sbo', 'geometric', True)
  per_step = spanbert.train.batch_size * (training_flops(jobs['spanbert'])
                                          / spanbert.train.num_steps / spanbert.train.batch_size)
  assert abs(training_flops(jobs['spanbert']) - training_flops(jobs['bert'])) <= per_step / 2
  # The boundary head costs FLOPs a sequence: the same budget buys fewer steps.
  assert spanbert.train.num_steps < bert.train.num_steps


def test_each_arm_fine_tunes_squad_v1_on_half_the_dev_articles_with_the_paper_settings(tmp_path):
  """The SQuAD jobs as they will run: configs/squad.py (v1.1) from each arm's pretraining
  workdir, trained on half of the dev file's articles and scored on the rest, with the sweep's
  settings; task_overrides a caller sets reach the run. (The fine-tuning itself, the dev split
  included, is test_finetune.py's squad test; the sweep's runner and report end to end are
  test_sweep.py's shipped-sweep test on sweeps/spanbert.py.)"""
  shared_data_dir()
  workdir = str(tmp_path / 'sweep')
  plan = spec.plan(spec.load_file(PATH), workdir)
  jobs = {job.arm: job for job in plan.jobs if job.kind == 'finetune'}
  assert sorted(jobs) == ['bert', 'spanbert'] and all(j.task == 'squad' for j in jobs.values())
  for arm, job in jobs.items():
    assert job.config == 'configs/squad.py'
    assert job.after == (f'pretrain/{arm}',)
    assert job.overrides['init_from'] == os.path.join(workdir, 'pretrain', arm)
    config = run_config(job)
    assert (config.task.kind, config.task.version, config.task.split_dev_fraction) == (
        'squad', '1.1', 0.5)
    assert config.task.train_file == '' and os.path.isfile(config.task.dev_file)
    assert (config.data.max_seq_length, config.task.doc_stride) == (384, 128)
    assert (config.train.learning_rate, config.train.batch_size, config.train.num_epochs,
            config.seeds) == (3e-5, 32, 2.0, 3)
  sweep = spec.load_file(PATH)
  sweep.finetune.task_overrides = {'squad': {'task': {'split_dev_fraction': 0.25,
                                                      'doc_stride': 16}}}
  job = next(j for j in spec.plan(sweep, workdir).jobs if j.kind == 'finetune')
  config = run_config(job)
  assert (config.task.split_dev_fraction, config.task.doc_stride) == (0.25, 16)


def test_report_takes_squad_f1_as_each_arm_s_score(tmp_path):
  """results.json of a SQuAD run (main metric f1, as finetune writes it) is what the report
  scores each arm by."""
  from bert_jax.sweep import report  # pylint: disable=g-import-not-at-top
  from bert_jax.sweep import runner  # pylint: disable=g-import-not-at-top
  shared_data_dir()
  workdir = str(tmp_path / 'sweep')
  plan = spec.plan(spec.load_file(PATH), workdir)
  runner.write_summary(plan, workdir)
  scores = {'bert': [40.0, 42.5, 41.0], 'spanbert': [47.0, 45.5, 46.0]}
  for job in plan.jobs:
    if job.kind == 'finetune':
      per_seed = [{'exact_match': f - 10.0, 'f1': f} for f in scores[job.arm]]
      path = os.path.join(workdir, job.workdir)
      os.makedirs(path)
      with open(os.path.join(path, 'results.json'), 'w', encoding='utf-8') as f:
        json.dump({'task': 'squad', 'main_metric': 'f1', 'seeds': [0, 1, 2],
                   'median': {'dev': {'exact_match': 0.0, 'f1': 0.0}},
                   'per_seed': {'dev': per_seed}}, f)
  runs = [run for run in results.load(workdir).finetune if run.task == 'squad']
  assert sorted(run.arm for run in runs) == ['bert', 'spanbert']
  for run in runs:
    assert run.status == results.FINISHED and run.metric == 'f1'
    assert run.scores == tuple(scores[run.arm])
  text = report.write(workdir)
  for arm in plan.summary['arms']:
    assert arm['label'] in text
  assert '46.0' in text and '41.0' in text  # The medians of the seeds' F1.

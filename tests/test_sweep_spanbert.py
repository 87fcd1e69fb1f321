"""sweeps/spanbert.py: both arms pretrain for one budget in FLOPs, and the sweep fine-tunes and
reports SQuAD v1.1 from a split of the dev file."""

import json
import os

import pytest

from bert_jax.sweep import results
from bert_jax.sweep import spec
from conftest import shared_data_dir
from test_sweep import _run, compile_cache, narrow, tiny  # pylint: disable=unused-import
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


def small_squad(path, articles=3, paragraphs=2):
  """The first `articles` articles of the shared SQuAD v1.1 dev file, `paragraphs` each."""
  with open(shared_data_dir() / 'squad' / 'dev-v1.1.json', encoding='utf-8') as f:
    dev = json.load(f)
  data = [dict(article, paragraphs=article['paragraphs'][:paragraphs])
          for article in dev['data'][:articles]]
  path.write_text(json.dumps({'version': dev['version'], 'data': data}), encoding='utf-8')
  return str(path)


@pytest.mark.slow
def test_sweep_fine_tunes_squad_on_half_the_dev_articles_and_reports_f1(tmp_path, compile_cache):
  from bert_jax.sweep import report  # pylint: disable=g-import-not-at-top
  sweep = tiny(narrow(spec.load_file(PATH)), 'squad', 1, compile_cache)
  dev_file = small_squad(tmp_path / 'dev.json')
  sweep.finetune.task_overrides = {'squad': {
      'task': {'split_dev_fraction': 0.5, 'dev_file': dev_file, 'doc_stride': 16,
               'max_query_length': 16},
      'data': {'max_seq_length': 64}}}
  workdir = str(tmp_path / 'sweep')
  plan, _ = _run(sweep, workdir, PATH)
  runs = [run for run in results.load(workdir).finetune if run.task == 'squad']
  assert sorted(run.arm for run in runs) == ['bert', 'spanbert']
  for run in runs:
    assert run.status == results.FINISHED and run.metric == 'f1'
    assert len(run.scores) == 1 and 0.0 <= run.scores[0] <= 100.0
  text = report.write(workdir)
  for arm in plan.summary['arms']:
    assert arm['label'] in text

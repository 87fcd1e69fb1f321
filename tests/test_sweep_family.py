"""sweeps/family.py and what it needs of the sweep spec: steps chosen for equal training FLOPs,
and a prepared corpus per tokenizer."""

import os

import pytest

from bert_jax.sweep import spec
from bert_jax.train import metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _data_root():
  root = os.environ.get('BERT_JAX_DATA', '')
  if not os.path.isdir(os.path.join(root, 'glue')):
    pytest.skip('BERT_JAX_DATA (the shared data folder with glue/ and vocab/) is not set.')


def family():
  return spec.load_file(os.path.join(REPO, 'sweeps', 'family.py'))


def pretraining(plan):
  return {job.arm: job for job in plan.jobs if job.kind == 'pretrain'}


def run_config(job):
  config = spec.load_config(job.config, job.name)
  spec.apply_overrides(config, job.overrides, job.name)
  return config


def training_flops(job):
  config = run_config(job)
  return config.train.num_steps * config.train.batch_size * metrics.model_flops_per_sequence(config)


@pytest.mark.parametrize('steps', [0, 3000])
def test_every_arm_pretrains_for_the_reference_arms_flops(tmp_path, steps):
  _data_root()
  sweep = family()
  sweep.steps = steps  # 0: the recipe's; --sweep.steps=3000 moves every arm's budget with it.
  jobs = pretraining(spec.plan(sweep, str(tmp_path)))
  bert = run_config(jobs['bert'])
  assert bert.train.num_steps == (steps or 20000)
  budget = training_flops(jobs['bert'])
  for arm in ('bert_mlm', 'roberta', 'albert', 'electra'):
    config = run_config(jobs[arm])
    per_step = config.train.batch_size * metrics.model_flops_per_sequence(config)
    assert abs(training_flops(jobs[arm]) - budget) <= per_step / 2  # The nearest step.
    assert jobs[arm].num_steps == config.train.num_steps
    # The warmup keeps the recipe's share of the steps, as under sweep.steps.
    assert config.train.warmup_steps == round(config.train.num_steps / 10)
  # RoBERTa's 50k-token output layer costs more a sequence, ALBERT's 128-wide head less.
  assert jobs['roberta'].num_steps < bert.train.num_steps < jobs['albert'].num_steps
  # ELECTRA's generator and per-token discriminator head cost more than BERT's MLM head.
  assert jobs['electra'].num_steps < jobs['roberta'].num_steps


def test_each_tokenizer_streams_its_own_prepared_corpus(tmp_path):
  _data_root()
  plan = spec.plan(family(), str(tmp_path))
  prepares = {job.name: job for job in plan.jobs if job.kind == 'prepare'}
  assert [job.kind for job in plan.jobs][:3] == ['prepare'] * 3
  jobs = pretraining(plan)
  corpora = {arm: run_config(job).data.prepared for arm, job in jobs.items()}
  assert corpora == {'bert': str(tmp_path / 'corpus'), 'bert_mlm': str(tmp_path / 'corpus'),
                     'roberta': str(tmp_path / 'corpus-bpe'),
                     'albert': str(tmp_path / 'corpus-sentencepiece'),
                     'electra': str(tmp_path / 'corpus')}  # BERT's WordPiece.
  for arm, job in jobs.items():
    (prepare,) = job.after
    assert prepares[prepare].workdir == corpora[arm]
    tokenizer = run_config(prepares[prepare]).data
    assert tokenizer.tokenizer == run_config(job).data.tokenizer
    assert tokenizer.vocab_file == run_config(job).data.vocab_file
  assert any('differ in their tokenizer' in note for note in plan.summary['notes'])


def test_one_corpus_with_two_vocabularies_is_refused(tmp_path):
  _data_root()
  sweep = family()
  arms = sweep.arms.to_dict()
  arms['cased'] = {'label': 'cased WordPiece', 'pretrain': {'data': {'lowercase': False}}}
  sweep.arms = arms
  with pytest.raises(spec.SweepError,
                     match=r"'bert', 'bert_mlm', 'electra', 'cased' stream one prepared corpus .*config.data.lowercase"):
    spec.plan(sweep, str(tmp_path))


@pytest.mark.parametrize('field, value, message', [
    ('equal_flops', 'deberta', r"sweep.equal_flops='deberta' names no pretrained arm; the "
                               r"pretrained arms are bert, bert_mlm, roberta, albert, electra"),
    ('args', 'steps=100', r"Arm 'roberta' sets steps in its args, but sweep.equal_flops='bert'"),
    ('args', 'tokens=2M', r"Arm 'roberta' sets tokens in its args, but sweep.equal_flops='bert'"),
])
def test_bad_equal_flops_settings_are_named(tmp_path, field, value, message):
  sweep = family()
  if field == 'equal_flops':
    sweep.equal_flops = value
  else:
    arms = sweep.arms.to_dict()
    arms['roberta'][field] = value
    sweep.arms = arms
  with pytest.raises(spec.SweepError, match=message):
    spec.plan(sweep, str(tmp_path))


def test_electra_small_and_bert_small_share_the_papers_small_shape_at_equal_flops(tmp_path):
  _data_root()
  sweep = spec.load_file(os.path.join(REPO, 'sweeps', 'electra_small.py'))
  plan = spec.plan(sweep, str(tmp_path))
  jobs = pretraining(plan)
  electra_config, bert_config = run_config(jobs['electra']), run_config(jobs['bert_small'])
  for config in (electra_config, bert_config):
    model = config.model
    assert (model.name, model.num_layers, model.hidden_size, model.num_heads,
            model.embedding_size, model.intermediate_size) == ('electra', 12, 256, 4, 128, 1024)
    assert (config.train.batch_size, config.train.learning_rate) == (128, 5e-4)
  assert electra_config.objectives == 'rtd' and bert_config.objectives == 'mlm'
  assert electra_config.model.generator_fraction == 0.25
  assert electra_config.train.num_steps == 30000
  # MLM alone costs less a sequence, so it trains more steps for the same FLOPs.
  per_step = bert_config.train.batch_size * metrics.model_flops_per_sequence(bert_config)
  assert abs(training_flops(jobs['bert_small']) - training_flops(jobs['electra'])) <= per_step / 2
  assert jobs['bert_small'].num_steps > 30000
  finetunes = [job for job in plan.jobs if job.kind == 'finetune']
  assert {job.arm for job in finetunes} == {'electra', 'bert_small'}
  for job in finetunes:
    train = run_config(job).train
    assert (train.learning_rate, train.layerwise_lr_decay, train.weight_decay) == (3e-4, 0.8, 0.0)
    # ELECTRA's own grid around its Table 7 rate, not BERT's 5e-5 to 2e-5.
    assert train.learning_rates == '0.0001,0.0002,0.0003'

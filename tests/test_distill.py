"""Distillation ('distill'): its terms, the frozen teacher, the student made from the teacher,
validation, FLOPs, and a tiny run that distils a trained teacher and resumes."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax.interop import hf
from bert_jax.interop import teacher as teacher_lib
from bert_jax.objectives import distill
from bert_jax.train import metrics
from bert_jax.train import optim
from bert_jax.train import step as steps
from conftest import assert_refused, micro_config
from configs import base

# Odd sizes, so a transposed or mis-split axis cannot line up.
SIZES = dict(vocab_size=97, hidden_size=24, num_heads=3, intermediate_size=40,
             max_position_embeddings=17)


def distill_config(student_depth=2, teacher_depth=3, **distill_keys):
  """configs/base.py distilling a BERT of `teacher_depth` layers into a DistilBERT of
  `student_depth`."""
  config = base.get_config('corpus=builtin')
  config.objectives = 'distill'
  config.model.update(name='distilbert', num_layers=student_depth, **SIZES)
  config.distill.teacher_model.update(num_layers=teacher_depth, **SIZES)
  config.distill.update(distill_keys)
  config.data.update(max_seq_length=13, max_predictions_per_seq=3)
  return config


def batch(rows=3, length=13):
  """Ids with padding in two rows and 3 masked positions a row."""
  rng = np.random.default_rng(0)
  mask = np.ones((rows, length), np.int32)
  mask[1, 9:] = mask[2, 5:] = 0
  ids = rng.integers(5, SIZES['vocab_size'], (rows, length)).astype(np.int32) * mask
  return {'input_ids': ids, 'input_mask': mask, 'segment_ids': np.zeros_like(ids),
          'masked_lm_positions': np.array([[1, 4, 7], [0, 2, 8], [1, 2, 3]], np.int32),
          'masked_lm_ids': rng.integers(5, 97, (rows, 3)).astype(np.int32),
          'masked_lm_weights': np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], np.float32)}


def fresh_params(config, seed=0):
  model = steps.build_model(config)
  one_row = jax.tree.map(lambda x: x[:1], batch())
  init = jax.jit(lambda rng: model.init(rng, one_row, deterministic=True)["params"])
  return model, jax.tree.map(np.asarray, nn.meta.unbox(init(jax.random.PRNGKey(seed))))


def layer(tree, index):
  """Layer `index` of a scanned encoder subtree ('bert' of a pretraining tree)."""
  return jax.tree.map(lambda x: x[index], tree['encoder']['layer'])


def test_kl_and_cosine_vanish_when_the_student_is_its_teacher():
  config = distill_config(student_depth=3, teacher_depth=3)
  model, fresh = fresh_params(config)
  student = teacher_lib.student_from_teacher(fresh['teacher'], fresh, [0, 1, 2])
  params = {**student, 'teacher': fresh['teacher']}
  outputs = model.apply({'params': params}, batch(), deterministic=True)
  kl, cos = distill.token_terms(2.0, outputs)
  assert float(jnp.max(jnp.abs(kl))) < 1e-6 and float(jnp.max(jnp.abs(cos))) < 1e-5
  # The folded segment row is what makes them one function: a fresh student is far off.
  fresh_kl, fresh_cos = distill.token_terms(2.0, model.apply({'params': fresh}, batch()))
  assert float(jnp.mean(fresh_kl)) > 1e-3 and float(jnp.mean(fresh_cos)) > 1e-2


def test_the_loss_weights_its_terms_as_distilbert():
  config = distill_config()
  objective = objectives.resolve(config).objectives[0]
  model, params = fresh_params(config)
  outputs = model.apply({'params': params}, batch())
  stats = objective.losses(outputs, batch())
  real = batch()['input_mask'] > 0
  kl, cos = (np.asarray(t) for t in distill.token_terms(2.0, outputs))
  # The MLM term from the student's logits at the masked positions, by hand.
  logits = np.take_along_axis(np.asarray(outputs['distill_logits']),
                              batch()['masked_lm_positions'][..., None], axis=1)
  ce = np.asarray(optax.softmax_cross_entropy_with_integer_labels(logits,
                                                                  batch()['masked_lm_ids']))
  weights = batch()['masked_lm_weights']
  expected = (5.0 * 4.0 * kl[real].mean() + 2.0 * (ce * weights).sum() / weights.sum()
              + 1.0 * cos[real].mean())
  np.testing.assert_allclose(float(objective.loss(stats)), expected, rtol=1e-4)
  fields = objective.metrics({k: float(v) for k, v in stats.items()})
  assert set(fields) == {'distill_loss', 'distill_kl', 'distill_cos', 'distill_mlm_loss',
                         'distill_mlm_accuracy'}
  np.testing.assert_allclose(fields['distill_kl'], kl[real].mean(), rtol=1e-4)


def test_a_train_step_never_changes_the_teacher_and_keeps_no_moments_for_it():
  config = distill_config()
  config.train.update(warmup_steps=0, num_steps=10)  # A first step of the peak rate.
  model, params = fresh_params(config)
  tx = optim.for_pretraining(config)
  state = steps.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=tx.init(params), rng=jax.random.PRNGKey(1))
  step = jax.jit(lambda s, b: steps.train_step(s, b, loss_fn=steps.pretraining_loss_fn(model),
                                               tx=tx))
  new, stats = step(state, batch())
  assert np.isfinite(float(stats['loss']))
  for a, b in zip(jax.tree.leaves(params['teacher']), jax.tree.leaves(new.params['teacher'])):
    np.testing.assert_array_equal(a, b)
  changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params['bert']),
                                                       jax.tree.leaves(new.params['bert']))]
  assert all(changed)
  moments = [leaf for leaf in jax.tree.leaves(new.opt_state) if hasattr(leaf, 'shape')]
  teacher_size = sum(x.size for x in jax.tree.leaves(params['teacher']))
  student_size = sum(x.size for k, v in params.items() if k != 'teacher'
                     for x in jax.tree.leaves(v))
  # Adam's two moments of the student and scalar counters; nothing of the teacher's size.
  assert sum(x.size for x in moments) < 2 * student_size + 10 < 2 * student_size + teacher_size


def test_an_optimizer_without_frozen_scopes_is_the_one_bert_trains_with():
  config = base.get_config()
  params = {'bert': {'w': jnp.ones((3, 2))}, 'predictions': {'output_bias': jnp.ones(2)}}
  grads = jax.tree.map(lambda x: x * 0.5, params)
  ours, reference = optim.for_pretraining(config), optim.create_optimizer(config.train)
  a, b = ours.init(params), reference.init(params)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(ours.update(grads, a, params)[0]),
                  jax.tree.leaves(reference.update(grads, b, params)[0])):
    np.testing.assert_array_equal(x, y)


def test_bert_s_step_is_unchanged_by_the_objective_registry():
  """A BERT model holds its objectives' names, as before configured objectives existed."""
  config = base.get_config()
  assert steps.build_model(config).objectives == ('mlm', 'nsp')
  assert objectives.resolve(config).frozen_scopes == ()


def test_student_layers_spread_over_the_teacher_as_extract_distilbert():
  config = distill_config(student_depth=6, teacher_depth=12)
  assert teacher_lib.teacher_layers(config) == [0, 2, 4, 7, 9, 11]
  config.distill.teacher_layers = '1,3,5,6,8,10'
  assert teacher_lib.teacher_layers(config) == [1, 3, 5, 6, 8, 10]


@pytest.mark.parametrize('change,message', [
    ({'model.num_layers': 4}, 'config.model.num_layers=4 is deeper'),
    ({'model.hidden_size': 30}, 'config.model.hidden_size=30'),
    ({'distill.teacher_layers': '0,3'}, 'layer 3 is out of range'),
    ({'distill.teacher_layers': '0'}, 'names 1 layer(s)'),
    ({'distill.teacher_layers': 'a,b'}, 'valid indices are 0 to 2'),
])
def test_a_student_that_does_not_fit_its_teacher_is_refused(change, message):
  config = distill_config()
  for key, value in change.items():
    section, leaf = key.split('.')
    config[section][leaf] = value
  assert_refused(config, message.replace('(', r'\(').replace(')', r'\)'))


def test_distill_without_a_teacher_is_refused_before_compiling():
  with pytest.raises(config_lib.ConfigError, match='config.distill.teacher is empty'):
    config_lib.validate_and_adopt_source(distill_config(), config_lib.validate)


def test_flops_add_the_teacher_forward_once():
  config = distill_config()
  h, f, v, s = 24, 40, 97, 13
  layer_flops = s * (8 * h * h + 4 * h * f) + 4 * s * s * h
  head = s * (2 * h * h + 2 * h * v)
  student, teacher = 2 * layer_flops + head, 3 * layer_flops + head
  assert metrics.model_flops_per_sequence(config) == pytest.approx(3 * student + teacher)


def test_the_student_takes_its_teacher_s_width_from_the_teacher_s_checkpoint(tmp_path):
  transformers = pytest.importorskip('transformers')
  transformers.BertForMaskedLM(transformers.BertConfig(
      num_hidden_layers=3, hidden_size=24, num_attention_heads=3, intermediate_size=40,
      vocab_size=97, max_position_embeddings=17)).save_pretrained(str(tmp_path))
  (tmp_path / 'vocab.txt').write_text('\n'.join(f'w{i}' for i in range(97)) + '\n')
  from configs import distilbert  # pylint: disable=g-import-not-at-top
  config = distilbert.get_config('layers=2,corpus=builtin,seq=13')  # BERT-base's width: 768.
  config.distill.teacher = f'hf:{tmp_path}'
  config_lib.validate_and_adopt_source(config, config_lib.validate)
  assert {key: config.model[key] for key in SIZES} == SIZES
  assert config.data.vocab_file == str(tmp_path / 'vocab.txt')


def test_student_from_an_hf_bert_takes_the_chosen_layers(tmp_path):
  transformers = pytest.importorskip('transformers')
  torch = pytest.importorskip('torch')
  torch.manual_seed(0)
  hf_bert = transformers.BertForMaskedLM(transformers.BertConfig(
      num_hidden_layers=3, hidden_size=24, num_attention_heads=3, intermediate_size=40,
      vocab_size=97, max_position_embeddings=17))
  hf_bert.save_pretrained(str(tmp_path))
  (tmp_path / 'vocab.txt').write_text('\n'.join(f'w{i}' for i in range(97)) + '\n')
  config = distill_config(teacher=f'hf:{tmp_path}', teacher_layers='0,2')
  config_lib.validate_and_adopt_source(config, config_lib.validate)
  _, fresh = fresh_params(config)
  params = teacher_lib.initial_params(config, fresh)
  state = hf_bert.state_dict()
  query = state['bert.encoder.layer.2.attention.self.query.weight'].numpy()
  np.testing.assert_array_equal(layer(params['bert'], 1)['attention']['self']['query']['kernel'],
                                query.T.reshape(24, 3, 8))
  np.testing.assert_array_equal(params['teacher']['bert']['encoder']['layer']['output']['dense'][
      'kernel'][1], state['bert.encoder.layer.1.output.dense.weight'].numpy().T)
  positions = (state['bert.embeddings.position_embeddings.weight']
               + state['bert.embeddings.token_type_embeddings.weight'][0]).numpy()
  np.testing.assert_allclose(params['bert']['embeddings']['position_embeddings'], positions)
  np.testing.assert_array_equal(params['predictions']['output_bias'],
                                state['cls.predictions.bias'].numpy())


@pytest.fixture(scope='module', name='teacher_workdir')
def fixture_teacher_workdir(tmp_path_factory):
  """A 2-layer BERT (MLM only) trained for 4 steps with the micro config."""
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  tmp = tmp_path_factory.mktemp('distill')
  config = micro_config(tmp, **{'objectives': 'mlm', 'train.num_steps': 4, 'train.warmup_steps': 1,
                                'train.checkpoint_every': 4, 'train.eval_every': 4})
  workdir = str(tmp / 'teacher')
  pretrain.train_and_evaluate(config, workdir)
  return tmp, workdir


def student_config(tmp, teacher, steps_=8):
  return micro_config(tmp, **{
      'objectives': 'distill', 'model.name': 'distilbert', 'model.num_layers': 1,
      'distill.teacher': teacher, 'distill.teacher_layers': '1', 'train.num_steps': steps_,
      'train.log_every': 1, 'train.checkpoint_every': steps_, 'train.eval_every': steps_,
      'train.learning_rate': 3e-3, 'train.warmup_steps': 1})


@pytest.mark.slow
def test_a_tiny_distillation_trains_resumes_and_exports_without_the_teacher(teacher_workdir):
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  tmp, teacher = teacher_workdir
  workdir = str(tmp / 'student')
  config = student_config(tmp, teacher)
  pretrain.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  train = [r for r in records if r['split'] == 'train']
  for key in ('distill_loss', 'distill_kl', 'distill_cos', 'distill_mlm_loss',
              'distill_mlm_accuracy'):
    assert all(np.isfinite(r[key]) for r in train), key
  assert np.mean([r['loss'] for r in train[-3:]]) < np.mean([r['loss'] for r in train[:3]])
  taught = init_from.workdir_params(teacher)
  student = init_from.workdir_params(workdir)
  for a, b in zip(jax.tree.leaves({k: taught[k] for k in ('bert', 'predictions')}['bert'][
      'encoder']), jax.tree.leaves(student['teacher']['bert']['encoder'])):
    np.testing.assert_array_equal(a, b)
  # Resume: two more steps; the teacher is the checkpoint's, still the trained one.
  config = student_config(tmp, teacher, steps_=10)
  pretrain.train_and_evaluate(config, workdir)
  resumed = init_from.workdir_params(workdir)
  for a, b in zip(jax.tree.leaves(student['teacher']), jax.tree.leaves(resumed['teacher'])):
    np.testing.assert_array_equal(a, b)
  assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(student['bert']),
                                                        jax.tree.leaves(resumed['bert'])))
  # The export is the student alone, as DistilBertForMaskedLM.
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    import ml_collections  # pylint: disable=g-import-not-at-top
    saved = ml_collections.ConfigDict(json.load(f))
  keys = hf.export_hf(resumed, saved, str(tmp / 'export'))
  assert keys and not any('teacher' in k for k in keys)
  assert all(k.startswith(('distilbert.', 'vocab_')) for k in keys)
  # Fill-mask reads the student alone.
  from bert_jax.tools import predict  # pylint: disable=g-import-not-at-top
  predictor = predict.load(workdir)
  assert predictor.config.objectives == 'mlm' and 'teacher' not in predictor.params
  assert predictor.config.model.name == 'distilbert' and predictor.step == 10
  top = predictor.fill_mask('the man went to the [MASK] .', top_k=3)
  assert len(top) == 1 and len(top[0]) == 3

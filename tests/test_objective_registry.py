"""The objectives and models registries: a new objective is one file (here, one test) plus a
config, and the loop, metrics, checkpoints and FLOPs pick it up."""

import dataclasses
import json
import os

import flax.linen as nn
import jax.numpy as jnp
import optax
import pytest

from bert_jax import config_lib
from bert_jax import models
from bert_jax import objectives
from bert_jax.models import layers
from bert_jax.train import metrics
from bert_jax.train import pretrain
from configs import base
from conftest import assert_refused, micro_config


def _segment_head(config, encoded, batch, deterministic):
  del batch, deterministic
  logits = layers.DenseGeneral(2, ('embed', 'classes'), dtype=config.dtype,
                               param_dtype=config.param_dtype, kernel_init=config.init,
                               name='segment_head')(encoded.sequence)
  return {'segment_logits': logits.astype(jnp.float32)}  # [batch, length, 2]


def _segment_losses(outputs, batch):
  weights = batch['input_mask'].astype(jnp.float32)
  logits, labels = outputs['segment_logits'], batch['segment_ids']
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return {'segment_loss_sum': jnp.sum(ce * weights), 'segment_count': jnp.sum(weights),
          'segment_correct': jnp.sum((jnp.argmax(logits, -1) == labels) * weights)}


# Which segment each token is in, from the encoder's states: reads only keys every batch has.
SEGMENT = objectives.Objective(
    name='segment', batch_spec=lambda shape: {}, head=_segment_head, losses=_segment_losses,
    loss=lambda s: s['segment_loss_sum'] / s['segment_count'],
    metrics=lambda s: {'segment_loss': s['segment_loss_sum'] / s['segment_count'],
                       'segment_accuracy': s['segment_correct'] / s['segment_count']},
    flops=lambda model, shape: shape.max_seq_length * 2 * model.hidden_size * 2)


@pytest.fixture
def segment_objective():
  objectives.register(SEGMENT)
  yield SEGMENT
  objectives.REGISTRY.unregister('segment')


def test_builtin_objectives_and_models_are_found_by_name():
  assert objectives.get('mlm').name == 'mlm' and objectives.get('nsp').instances == 'pairs'
  assert models.get('bert').scope == 'bert'
  assert objectives.parse(' mlm , nsp ') == ('mlm', 'nsp')


@pytest.mark.parametrize('text,match', [
    ('mlm,plm', "unknown objective 'plm'; valid objectives are clm, distill, mlm, nsp, rtd, sbo, "
     'sop'),
    ('', 'names no objective'), ('mlm,mlm', 'twice')])
def test_bad_objectives_are_refused_naming_the_valid_ones(text, match):
  config = base.get_config('corpus=builtin')
  config.objectives = text
  assert_refused(config, match)


def test_unknown_model_is_refused_naming_the_valid_ones():
  config = base.get_config('corpus=builtin')
  config.model.name = 'funnel'
  assert_refused(config, "model.name='funnel'.*valid models are albert, bert, deberta, distilbert, electra, modernbert, roberta, xlm")


def test_removed_nsp_key_points_to_objectives():
  config = base.get_config('corpus=builtin')
  config.data.nsp = False
  assert_refused(config, 'config.data.nsp .now config.objectives')


def test_flops_are_the_encoders_and_each_heads(segment_objective):
  config = micro_config(objectives='mlm,nsp')
  with_segment = micro_config(objectives='mlm,nsp,segment')
  m, d = config.model, config.data
  h, f, s, p, v = (m.hidden_size, m.intermediate_size, d.max_seq_length,
                   d.max_predictions_per_seq, m.vocab_size)
  design = 3 * (m.num_layers * (s * (8 * h * h + 4 * h * f) + 4 * s * s * h)
                + p * (2 * h * h + 2 * h * v) + 2 * h * h)  # DESIGN.md's formula.
  assert metrics.model_flops_per_sequence(config) == design
  assert metrics.model_flops_per_sequence(with_segment) == design + 3 * s * 2 * h * 2


def test_a_registered_objectives_check_runs_in_validation_named_or_not(segment_objective):
  """Objective.check sees every run: it checks its settings when named, and may refuse them
  when not (rtd's model.embedding_sharing); config_lib names no objective."""
  seen = []

  def check(config, names):
    seen.append(names)
    if 'segment' in names and config.data.max_seq_length < 16:
      raise config_lib.ConfigError(f'config.data.max_seq_length={config.data.max_seq_length}: '
                                   'segment needs at least 16.')

  objectives.register(dataclasses.replace(SEGMENT, check=check))
  config = base.get_config('corpus=builtin')
  config.objectives, config.data.max_seq_length = 'mlm', 8
  config_lib.validate(config)  # Not named: its rule does not apply.
  config.objectives = 'mlm,segment'
  assert_refused(config, r'max_seq_length=8: segment needs')
  assert seen == [('mlm',), ('mlm', 'segment')]


@pytest.mark.slow
def test_an_objective_registered_from_a_test_trains_end_to_end(tmp_path, segment_objective):
  workdir = str(tmp_path / 'run')
  config = micro_config(tmp_path, objectives='mlm,segment', **{
      'train.num_steps': 6, 'train.log_every': 3, 'train.eval_every': 6,
      'train.checkpoint_every': 6})
  last_eval = pretrain.train_and_evaluate(config, workdir)
  assert set(last_eval) >= {'loss', 'mlm_loss', 'segment_loss', 'segment_accuracy'}
  assert 'nsp_loss' not in last_eval  # 'mlm,segment' has no NSP: single segments.
  assert last_eval['loss'] == pytest.approx(last_eval['mlm_loss'] + last_eval['segment_loss'])
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  train = [r for r in records if r['split'] == 'train']
  assert train and all('segment_accuracy' in r and r['mfu'] > 0 for r in train)
  # The head's parameters are in the checkpoint, under the head's own name.
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  params = init_from.workdir_params(workdir)
  assert set(params) == {'bert', 'predictions', 'segment_head'}
  assert nn.meta.unbox(params['segment_head'])['kernel'].shape == (32, 2)

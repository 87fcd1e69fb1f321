"""The span boundary objective ('sbo'), its config checks and configs/spanbert.py: what the head
reads, its loss and counts, its FLOPs, and a tiny 'mlm,sbo' run."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import models
from bert_jax import objectives
from bert_jax.data import masking
from bert_jax.objectives import sbo
from bert_jax.train import metrics
from bert_jax.train import pretrain
from bert_jax.train import step as steps
from conftest import dot_flops, micro_config
from configs import spanbert

B, S, P, H, V = 3, 13, 5, 8, 11  # Odd sizes: a mixed-up axis cannot line up.


def span_config(tmp_path=None, **overrides):
  return micro_config(tmp_path, objectives='mlm,sbo', **{
      'masking.spans': 'geometric', 'masking.whole_word': True, **overrides})


class HeadOnly(nn.Module):
  """The sbo head on a given encoder output, with a tied-embedding stand-in."""
  config: object

  @nn.compact
  def __call__(self, sequence, batch):
    table = self.param('embeddings', nn.initializers.normal(1.0), (V, H))
    encoded = objectives.Encoded(sequence, sequence[:, 0], lambda x: x @ table.T)
    return sbo.head(self.config, encoded, batch, True)['sbo_logits']


def head_batch():
  positions = np.array([[2, 3, 4, 8, 0], [1, 5, 6, 0, 0], [9, 10, 11, 0, 0]])
  weights = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]], np.float32)
  return {'masked_lm_positions': positions, 'masked_lm_weights': weights,
          'masked_lm_ids': np.arange(B * P).reshape(B, P) % V,
          **masking.span_boundaries(positions, weights)}


def model_config():
  config = micro_config(**{'model.hidden_size': H, 'model.num_heads': 2, 'model.vocab_size': V})
  return models.get('bert').config_from(config)


def test_head_reads_the_boundary_states_and_the_offset_not_the_span():
  cfg, batch = model_config(), head_batch()
  head = HeadOnly(cfg)
  sequence = jax.random.normal(jax.random.key(0), (B, S, H))
  params = head.init(jax.random.key(1), sequence, batch)
  logits = head.apply(params, sequence, batch)
  assert logits.shape == (B, P, V) and logits.dtype == jnp.float32
  # The span's own states (row 0: tokens 2-4, whose boundaries are 1 and 5) change nothing.
  inside = sequence.at[0, 2:5].add(10.0)
  np.testing.assert_array_equal(head.apply(params, inside, batch), logits)
  # A boundary state changes its span's predictions and no other's.
  moved = head.apply(params, sequence.at[0, 5].add(1.0), batch)
  assert not np.allclose(moved[0, :3], logits[0, :3])
  np.testing.assert_array_equal(moved[0, 3:], logits[0, 3:])
  np.testing.assert_array_equal(moved[1:], logits[1:])
  # Tokens of one span with the same boundaries differ by their offsets alone.
  assert not np.allclose(logits[0, 0], logits[0, 1])


def test_loss_is_the_mean_over_real_predictions_within_the_offset_table():
  batch = head_batch()
  batch['span_offsets'][2, 2] = sbo.MAX_OFFSETS  # Beyond the table: not an SBO target.
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(B, P, V)), jnp.float32)
  stats = sbo.losses({'sbo_logits': logits}, batch)
  weights = batch['masked_lm_weights'].copy()
  weights[2, 2] = 0
  ce = -jax.nn.log_softmax(logits)[np.arange(B)[:, None], np.arange(P)[None],
                                   batch['masked_lm_ids']]
  assert float(stats['sbo_weight']) == weights.sum() == 9
  assert float(sbo.loss(stats)) == pytest.approx(float((ce * weights).sum() / weights.sum()),
                                                 rel=1e-5)
  assert {k: float(v) for k, v in sbo.counts(batch).items()} == {'sbo_weight': 9.0}
  fields = sbo.metrics({k: float(v) for k, v in stats.items()})
  assert set(fields) == {'sbo_loss', 'sbo_accuracy'} and 0 <= fields['sbo_accuracy'] <= 1


def test_flops_are_the_matmuls_the_heads_run():
  config = span_config(**{'model.scan_layers': False, 'data.max_seq_length': S,
                          'data.max_predictions_per_seq': P})
  model = steps.build_model(config)
  batch = {k: jnp.zeros(v.shape, v.dtype)
           for k, v in steps.dummy_batch(1, S, P, objectives=model.objectives).items()}
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))
  whole = dot_flops(jax.make_jaxpr(lambda q: model.apply(q, batch))(params).jaxpr)
  shape = steps.batch_shape(config)
  h, v = config.model.hidden_size, config.model.vocab_size
  encoder = models.get('bert').flops(config.model, S)
  mlm = objectives.get('mlm').flops(config.model, shape)
  ours = objectives.get('sbo').flops(config.model, shape)
  assert ours == P * (2 * (2 * h + sbo.OFFSET_WIDTH) * h + 2 * h * h + 2 * h * v)
  gathers = 3 * 2 * P * S * h  # gather_positions' one-hot products (MLM's, two boundaries).
  assert whole == encoder + mlm + ours + gathers  # No pair objective: no pooler runs.
  without = micro_config(**{'data.max_seq_length': S, 'data.max_predictions_per_seq': P},
                         objectives='mlm')
  assert (metrics.model_flops_per_sequence(config)
          == metrics.model_flops_per_sequence(without) + 3 * ours)


@pytest.mark.parametrize('overrides,match', [
    ({'masking.span_p': 0.0}, r'config\.masking\.span_p=0\.0.*\(0, 1\]'),
    ({'masking.span_p': 1.5}, r'config\.masking\.span_p=1\.5.*\(0, 1\]'),
    ({'masking.max_span': 0}, r'config\.masking\.max_span=0.*> 0'),
    ({'masking.spans': 'poisson'}, r"config\.masking\.spans='poisson'.*'geometric'"),
    ({'masking.spans': ''}, r"objectives='mlm,sbo'.*masking\.spans=''.*'geometric'"),
    ({'masking.max_ngram': 3}, r"spans='geometric' with config\.masking\.max_ngram=3"),
])
def test_bad_span_settings_are_refused_naming_value_and_valid_ones(overrides, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.validate(span_config(**overrides))


def test_spanbert_config_is_the_papers_recipe_and_validates():
  config = spanbert.get_config()
  assert config.objectives == 'mlm,sbo'
  assert (config.masking.spans, config.masking.span_p, config.masking.max_span,
          config.masking.whole_word, config.masking.rate) == ('geometric', 0.2, 10, True, 0.15)
  assert (config.data.max_seq_length, config.data.short_seq_prob) == (512, 0.0)
  train = config.train
  assert (train.optimizer, train.learning_rate, train.batch_size, train.num_steps,
          train.warmup_steps, train.adam_eps) == ('adamw', 1e-4, 256, 2_400_000, 10_000, 1e-8)
  large = spanbert.get_config('size=large,steps=24000')
  assert (large.model.num_layers, large.model.hidden_size, large.model.num_heads) == (24, 1024, 16)
  assert large.train.warmup_steps == 100  # The recipe's share of the steps.
  config.data.corpus = 'builtin'
  config_lib.validate(config)
  with pytest.raises(ValueError, match='size=.*huge.*base, large'):
    spanbert.get_config('size=huge')


def test_counts_are_those_its_losses_report():
  batch = {k: jnp.asarray(v) for k, v in head_batch().items()}
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(B, P, V)), jnp.float32)
  objs = [objectives.get('mlm'), objectives.get('sbo')]
  stats = objectives.losses(objs, {'mlm_logits': logits, 'sbo_logits': logits}, batch)
  for key, value in objectives.counts(objs, batch).items():
    assert float(value) == float(stats[key]), key


@pytest.mark.slow  # About 50 s on 2 CPU cores.
def test_mlm_sbo_trains_a_tiny_run_and_logs_sbo_metrics(tmp_path):
  workdir = str(tmp_path / 'run')
  config = span_config(tmp_path, **{
      'train.num_steps': 40, 'train.log_every': 5, 'train.eval_every': 40,
      'train.checkpoint_every': 40, 'train.grad_accum_steps': 2})
  last_eval = pretrain.train_and_evaluate(config, workdir)
  assert last_eval['loss'] == pytest.approx(last_eval['mlm_loss'] + last_eval['sbo_loss'])
  assert 'nsp_loss' not in last_eval
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    records = [json.loads(line) for line in f]
  train = [r for r in records if r['split'] == 'train']
  assert all(np.isfinite(r['sbo_loss']) and 0 <= r['sbo_accuracy'] <= 1 and r['mfu'] > 0
             for r in train)
  # Held out, at step 0 and at the end: both objectives learn (about 6.93 -> 6.69 each).
  first, last = [r for r in records if r['split'] == 'eval']
  assert last['sbo_loss'] < first['sbo_loss'] - 0.15
  assert last['mlm_loss'] < first['mlm_loss'] - 0.15
  assert train[-1]['loss'] < train[0]['loss']
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  params = init_from.workdir_params(workdir)
  assert set(params) == {'bert', 'predictions', 'span_boundary'}
  table = nn.meta.unbox(params['span_boundary'])['offset_embeddings']
  assert table.shape == (sbo.MAX_OFFSETS, sbo.OFFSET_WIDTH)

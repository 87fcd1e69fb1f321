"""RoBERTa ('roberta') beyond what every family owes (tests/conformance/): segment ids unread,
fairseq positions, RobertaModel's pooler, the recipe's counts and FLOPs, a pretraining step and
fine-tuning heads on the encoder."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hf_parity
import sharding_check
from conftest import random_pretraining_batch
from bert_jax import config_lib
from bert_jax import models
from bert_jax.interop import hf
from bert_jax.models import bert
from bert_jax.train import metrics
from bert_jax.train import step as steps
from configs import roberta, tiny
from hf_parity import imported, max_diff, torch, transformers

PAD = 1  # RoBERTa's <pad>: fairseq's padding_idx.
# Odd sizes (none of BERT's tests' sizes), so a transposed or mis-split axis cannot line up.
HF_SIZES = dict(num_hidden_layers=3, hidden_size=48, num_attention_heads=3, intermediate_size=80,
                vocab_size=97, max_position_embeddings=17, type_vocab_size=1,
                layer_norm_eps=1e-5, pad_token_id=PAD)


@pytest.fixture(scope='module')
def hf_model(tmp_path_factory):
  """(a random RobertaForMaskedLM in eval mode, the dir it was saved to)."""
  return hf_parity.saved_models(tmp_path_factory, {'roberta': transformers.RobertaConfig(
      **HF_SIZES)}, transformers.RobertaForMaskedLM)['roberta']


def our_config(hf_config=None, scan_layers=True):
  """configs/base.py shaped and named as `hf_config` (default: HF_SIZES'), MLM only."""
  return hf_parity.our_config(hf_config or transformers.RobertaConfig(**HF_SIZES).to_dict(),
                              scan_layers=scan_layers)


@pytest.fixture(scope='module')
def inputs():
  """3 x 13 ids with padding (<pad>) in two rows, segment ids RoBERTa must ignore, 4 prediction
  positions a row."""
  batch = hf_parity.batch(HF_SIZES)
  segments = (np.arange(13) >= 6).astype(np.int32)[None].repeat(3, 0) * batch['input_mask']
  return batch['input_ids'], segments, batch['input_mask'], batch['masked_lm_positions']


def test_segment_ids_are_read_by_neither(hf_model, inputs):
  """RobertaForMaskedLM in (conformance/), with segment ids in our batch: one row of the table,
  so our logits stay transformers'."""
  model, directory = hf_model
  config = our_config()
  assert config.model.name == 'roberta' and config.model.type_vocab_size == 1
  params, report = imported(directory, config)
  assert report.missing_heads == ['bert/pooler']  # RobertaForMaskedLM has none.
  ids, segments, mask, positions = inputs
  batch = {'input_ids': ids, 'segment_ids': segments, 'input_mask': mask,
           'masked_lm_positions': positions}
  assert max_diff(hf_parity.run_ours(params, config, batch),
                  hf_parity.run_hf(model, {**batch, 'segment_ids': 0 * segments})) < 1e-4


def position_rows(input_mask, position_ids=None):
  """The position-table row each token of RoBERTa's embeddings reads: the table is the identity,
  the other tables zero, so the row is the argmax after the LayerNorm."""
  cfg = models.get('roberta').config_from(our_config())
  module = bert.BertEmbeddings(cfg)
  ids = jnp.full(input_mask.shape, 5, jnp.int32)
  params = nn.meta.unbox(module.init(jax.random.PRNGKey(0), ids, ids, True, position_ids,
                                     input_mask)['params'])
  params = {**jax.tree.map(jnp.zeros_like, params), 'LayerNorm': params['LayerNorm'],
            'position_embeddings': jnp.eye(*params['position_embeddings'].shape)}
  out = module.apply({'params': params}, ids, ids, True, position_ids, input_mask)
  return np.asarray(jnp.argmax(out, axis=-1)).tolist()


def test_positions_count_real_tokens_from_two_and_padding_reads_row_one():
  mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], jnp.int32)
  assert position_rows(mask) == [[2, 3, 4, 1, 1], [2, 3, 4, 5, 6]]
  packed = jnp.array([[0, 1, 0, 1, 2]], jnp.int32)  # Two pairs in a row, each from 0.
  assert position_rows(jnp.array([[1, 1, 1, 1, 0]], jnp.int32), packed) == [[2, 3, 2, 3, 1]]


def tiny_roberta(**model):
  """configs/tiny.py as RoBERTa: one segment row, fairseq positions (2 beyond the rows), MLM."""
  config = tiny.get_config()
  config.objectives = 'mlm'
  config.model.update(name='roberta', type_vocab_size=1, layer_norm_eps=1e-5,
                      max_position_embeddings=config.data.max_seq_length + 2, **model)
  config_lib.validate(config)
  return config


@pytest.mark.slow
def test_a_pretraining_step_runs_on_cpu():
  config = tiny_roberta()
  config.train.update(learning_rate=1e-2, warmup_steps=1, num_steps=10, batch_size=4)
  losses, _, _ = sharding_check.train(config, [random_pretraining_batch(config)] * 3,
                                      jax.devices()[:1])
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_configs_have_the_papers_shapes_and_recipe():
  for size, (layers, hidden, heads_, lr) in {'base': (12, 768, 12, 6e-4),
                                             'large': (24, 1024, 16, 4e-4)}.items():
    config = roberta.get_config(f'size={size}')
    m, t = config.model, config.train
    assert (m.name, m.vocab_size, m.max_position_embeddings, m.type_vocab_size) == (
        'roberta', 50265, 514, 1)
    assert (m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size) == (
        layers, hidden, heads_, 4 * hidden)
    assert m.layer_norm_eps == 1e-5 and config.objectives == 'mlm'
    assert (t.learning_rate, t.adam_b2, t.adam_eps, t.warmup_steps, t.num_steps,
            t.batch_size) == (lr, 0.98, 1e-6, 24_000, 500_000, 8192)
    assert t.batch_size % t.grad_accum_steps == 0 and config.data.tokenizer == 'bpe'
    config.data.corpus = 'builtin'
    config_lib.validate(config)
  assert roberta.get_config('size=base,steps=1000').train.warmup_steps == 48
  with pytest.raises(ValueError, match="size='huge'.*base, large"):
    roberta.get_config('size=huge')


def test_parameter_count_equals_transformers_roberta_base():
  config = roberta.get_config()
  model = steps.build_model(config)
  shapes = jax.eval_shape(functools.partial(model.init, deterministic=True),
                          jax.random.PRNGKey(0), steps.dummy_batch(1, 8, 2, objectives=('mlm',)))
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))  # noqa: E731
  params = nn.meta.unbox(shapes['params'])
  hf_config = transformers.RobertaConfig(**{
      k: v for k, v in hf.model_to_hf_config(config).items() if k != 'architectures'})
  with torch.device('meta'):
    encoder = transformers.RobertaModel(hf_config)  # With its pooler, as ours.
    masked_lm = transformers.RobertaForMaskedLM(hf_config)  # Without; tied decoder.
  theirs = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
  assert count(params['bert']) == theirs(encoder) == 124_645_632
  pooler = config.model.hidden_size * (config.model.hidden_size + 1)
  assert count(params) == theirs(masked_lm) + pooler
  assert round(count(params) / 1e6) == 125  # The paper's 125M.


def test_flops_are_bert_s_formula():
  config = roberta.get_config()
  m, d = config.model, config.data
  h, f, s, p, v, n = (m.hidden_size, m.intermediate_size, d.max_seq_length,
                      d.max_predictions_per_seq, m.vocab_size, m.num_layers)
  design = 3 * (n * (s * (8 * h * h + 4 * h * f) + 4 * s * s * h)
                + p * (2 * h * h + 2 * h * v) + 2 * h * h)
  assert metrics.model_flops_per_sequence(config) == design

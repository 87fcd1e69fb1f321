"""RoBERTa ('roberta'): transformers' RobertaForMaskedLM in and out, fairseq positions, counts,
FLOPs, a pretraining step and fine-tuning heads on the encoder."""

import functools
import importlib
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import models
from bert_jax import sharding
from bert_jax.interop import hf
from bert_jax.interop import param_tree
from bert_jax.interop import init_from
from bert_jax.models import bert
from bert_jax.models import heads
from bert_jax.train import finetune
from bert_jax.train import metrics
from bert_jax.train import optim
from bert_jax.train import step as steps
from configs import base, roberta, tiny


def require(module: str):
  """pytest.importorskip, except that BERT_JAX_REQUIRE_DATA=1 makes a missing package fail."""
  if os.environ.get('BERT_JAX_REQUIRE_DATA') == '1':
    return importlib.import_module(module)
  return pytest.importorskip(module)


torch = require('torch')
transformers = require('transformers')

PAD = 1  # RoBERTa's <pad>: fairseq's padding_idx.
# Odd sizes (none of BERT's tests' sizes), so a transposed or mis-split axis cannot line up.
HF_SIZES = dict(num_hidden_layers=3, hidden_size=48, num_attention_heads=3, intermediate_size=80,
                vocab_size=97, max_position_embeddings=17, type_vocab_size=1,
                layer_norm_eps=1e-5, pad_token_id=PAD)
IMPORT_TOLERANCE, EXPORT_TOLERANCE = 1e-4, 1e-5


def randomise(model):
  """Every parameter random (HF's zero biases and unit LayerNorms would hide a swapped leaf)."""
  torch.manual_seed(0)
  with torch.no_grad():
    for name, param in model.named_parameters():
      norm = 'LayerNorm.weight' in name or 'layer_norm.weight' in name
      param.copy_(torch.randn_like(param) * 0.05 + (1.0 if norm else 0.0))
  return model.eval()


@pytest.fixture(scope='module')
def hf_model(tmp_path_factory):
  """(a random RobertaForMaskedLM in eval mode, the dir it was saved to)."""
  model = randomise(transformers.RobertaForMaskedLM(transformers.RobertaConfig(**HF_SIZES)))
  directory = str(tmp_path_factory.mktemp('roberta'))
  model.save_pretrained(directory)
  return model, directory


def our_config(hf_config=None, scan_layers=True):
  """configs/base.py shaped and named as `hf_config` (default: HF_SIZES'), MLM only."""
  config = base.get_config()
  config.model.update(hf.hf_config_to_model_overrides(
      hf_config or dict(transformers.RobertaConfig(**HF_SIZES).to_dict())))
  config.model.scan_layers = scan_layers
  config.objectives = 'mlm'
  return config


@pytest.fixture(scope='module')
def inputs():
  """3 x 13 ids with padding (<pad>) in two rows, segment ids RoBERTa must ignore, 4 prediction
  positions a row (one of them on padding)."""
  rng = np.random.default_rng(0)
  ids = rng.integers(PAD + 2, HF_SIZES['vocab_size'], (3, 13)).astype(np.int32)
  mask = np.ones((3, 13), np.int32)
  mask[1, 9:] = mask[2, 5:] = 0
  ids[mask == 0] = PAD
  segments = (np.arange(13) >= 6).astype(np.int32)[None].repeat(3, 0) * mask
  positions = np.array([[1, 4, 7, 12], [0, 2, 3, 8], [1, 2, 3, 9]], np.int32)
  return ids, segments, mask, positions


def run_hf(model, inputs):
  """(MLM logits at the positions, last hidden states) of a transformers RoBERTa; its position
  ids are fairseq's, from the <pad> ids, and it reads no segments."""
  ids, _, mask, positions = inputs
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long), output_hidden_states=True)
  mlm = np.take_along_axis(out.logits.numpy(), positions[..., None], axis=1)
  return mlm, out.hidden_states[-1].numpy()


def run_ours(params, config, inputs):
  """(MLM logits, sequence output) of our model."""
  model = steps.build_model(config)
  encoder = models.get('roberta').encoder(model.config)

  def forward(p, ids, segments, mask, positions):
    out = model.apply({'params': p}, {'input_ids': ids, 'segment_ids': segments,
                                      'input_mask': mask, 'masked_lm_positions': positions})
    return out['mlm_logits'], encoder.apply({'params': p['bert']}, ids, segments, mask)[0]
  return tuple(np.asarray(x) for x in jax.jit(forward)(params, *inputs))


def max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def imported(directory, config):
  """import_hf of a saved dir, its missing pooler filled from a fresh init."""
  state_dict, hf_config = hf.load_hf_state_dict(directory)
  params, report = hf.import_hf(state_dict, config, hf_config=hf_config)
  return hf.merge_missing(params, hf.init_params(config, seed=1), config), report


@pytest.mark.parametrize('scan_layers', [True, pytest.param(False, marks=pytest.mark.slow)])
def test_masked_lm_checkpoint_imports_and_matches_transformers(hf_model, inputs, scan_layers):
  config = our_config(scan_layers=scan_layers)
  assert config.model.name == 'roberta' and config.model.type_vocab_size == 1
  params, report = imported(hf_model[1], config)
  assert report.layout == 'RobertaForMaskedLM'
  assert report.missing_heads == ['bert/pooler']  # RobertaForMaskedLM has none.
  assert ('layer' in params['bert']['encoder']) == scan_layers
  ours, theirs = run_ours(params, config, inputs), run_hf(hf_model[0], inputs)
  diffs = {name: max_diff(a, b) for name, a, b in zip(('mlm', 'hidden'), ours, theirs)}
  assert max(diffs.values()) < IMPORT_TOLERANCE, diffs


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


def test_roberta_model_checkpoint_brings_its_pooler(hf_model, inputs, tmp_path):
  base_model = randomise(transformers.RobertaModel(transformers.RobertaConfig(**HF_SIZES)))
  base_model.save_pretrained(str(tmp_path))
  config = our_config()
  state_dict, hf_config = hf.load_hf_state_dict(str(tmp_path))
  params, report = hf.import_hf(state_dict, config, hf_config=hf_config)
  assert report.layout == 'RobertaModel' and report.missing_heads == ['predictions']
  ids, segments, mask, _ = inputs
  encoder = models.get('roberta').encoder(steps.build_model(config).config)
  pooled = encoder.apply({'params': params['bert']}, ids, segments, mask)[1]
  with torch.no_grad():
    theirs = base_model(input_ids=torch.tensor(ids, dtype=torch.long),
                        attention_mask=torch.tensor(mask, dtype=torch.long)).pooler_output
  assert max_diff(pooled, theirs.numpy()) < IMPORT_TOLERANCE


def test_export_from_a_random_init_loads_in_transformers_and_round_trips(inputs, tmp_path):
  config = our_config()
  params = hf.init_params(config, seed=3)
  keys = hf.export_hf(params, config, str(tmp_path))
  assert not any('pooler' in k for k in keys)  # RobertaForMaskedLM holds none.
  written = json.loads((tmp_path / 'config.json').read_text())
  assert written['model_type'] == 'roberta'
  assert written['architectures'] == ['RobertaForMaskedLM']
  loaded, info = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path),
                                                                   output_loading_info=True)
  assert type(loaded).__name__ == 'RobertaForMaskedLM'
  assert not info['missing_keys'] and not info['unexpected_keys'] and not info['mismatched_keys']
  ours, theirs = run_ours(params, config, inputs), run_hf(loaded.eval(), inputs)
  diffs = [max_diff(a, b) for a, b in zip(ours, theirs)]
  assert max(diffs) < EXPORT_TOLERANCE, diffs
  again, _ = imported(str(tmp_path), config)
  flat, flat_again = param_tree.flatten(params), param_tree.flatten(again)
  assert flat.keys() == flat_again.keys()
  assert all(np.array_equal(flat[k], flat_again[k]) for k in flat if '/pooler/' not in k)


@pytest.mark.slow
def test_init_from_adopts_the_family_and_shape_from_config_json(hf_model, tmp_path):
  config = base.get_config()  # A BERT config: the checkpoint's family wins.
  config.init_from = f'hf:{hf_model[1]}'
  config.data.vocab_file = str(tmp_path / 'vocab.json')
  init_from.adopt_source(config)
  m = config.model
  assert (m.name, m.num_layers, m.hidden_size, m.vocab_size, m.type_vocab_size,
          m.max_position_embeddings, m.layer_norm_eps) == ('roberta', 3, 48, 97, 1, 17, 1e-5)
  config.objectives = 'mlm'
  fresh = hf.init_params(config, seed=1)
  params = init_from.load_params(config, fresh)
  direct, _ = imported(hf_model[1], config)
  assert jax.tree.structure(params) == jax.tree.structure(direct)


@pytest.mark.slow
def test_fine_tuning_loads_the_encoder_and_each_head_builds(hf_model, inputs):
  config = our_config()
  config.init_from = f'hf:{hf_model[1]}'
  ids, segments, mask, _ = inputs
  cfg = models.get('roberta').config_from(config)
  for head, outputs, key in (('classification', 3, 'logits'), ('token', 5, 'logits'),
                             ('span', 2, 'start_logits')):
    model = heads.BertForFineTuning(cfg, head, outputs, model='roberta')
    variables = model.init(jax.random.PRNGKey(0), ids, segments, mask)
    out = model.apply(variables, ids, segments, mask)[key]
    assert np.all(np.isfinite(out)), head
  encoder = finetune.load_encoder_params(config, heads.BertForFineTuning(
      cfg, 'classification', 3, model='roberta'))
  direct, _ = imported(hf_model[1], config)
  assert all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(encoder['embeddings']), jax.tree.leaves(direct['bert']['embeddings'])))


def tiny_roberta(**model):
  """configs/tiny.py as RoBERTa: one segment row, fairseq positions (2 beyond the rows), MLM."""
  config = tiny.get_config()
  config.objectives = 'mlm'
  config.model.update(name='roberta', type_vocab_size=1, layer_norm_eps=1e-5,
                      max_position_embeddings=config.data.max_seq_length + 2, **model)
  config_lib.validate(config)
  return config


def random_batch(config, rows=4, seed=0):
  """A hand-made pretraining batch of the config's shapes: padded tails, segment ids (ignored by
  RoBERTa), masked positions."""
  rng = np.random.default_rng(seed)
  s, p, v = config.data.max_seq_length, config.data.max_predictions_per_seq, 200
  lengths = rng.integers(s // 2, s + 1, rows)
  mask = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
  return {
      'input_ids': rng.integers(5, v, (rows, s)).astype(np.int32) * mask,
      'input_mask': mask,
      'segment_ids': ((np.arange(s)[None] >= lengths[:, None] // 2) * mask).astype(np.int32),
      'masked_lm_positions': np.stack([rng.choice(np.arange(1, n), p, replace=False)
                                       for n in lengths]).astype(np.int32),
      'masked_lm_ids': rng.integers(5, v, (rows, p)).astype(np.int32),
      'masked_lm_weights': np.ones((rows, p), np.float32),
      'next_sentence_labels': rng.integers(0, 2, rows).astype(np.int32),
  }


def train_steps(config, batch, num_steps=2):
  """The real pretraining step (train.step.jit_pretraining_step) on one CPU device: the losses."""
  config.train.batch_size = len(batch['input_ids'])
  mesh = sharding.create_mesh(config.mesh, jax.devices()[:1])
  rules = sharding.logical_axis_rules(config.mesh.preset)
  model = steps.build_model(config)
  tx = optim.create_optimizer(config.train)
  batch = {k: v for k, v in batch.items() if k in steps.dummy_batch(
      1, config.data.max_seq_length, config.data.max_predictions_per_seq,
      objectives=model.objectives)}
  with sharding.activation_rules(mesh, rules):
    state, state_shardings = steps.create_train_state(config, model, tx, mesh, rules)
    batch_shardings = sharding.batch_sharding(mesh)
    step = steps.jit_pretraining_step(config, model, tx, state_shardings, batch_shardings)
    losses = []
    for _ in range(num_steps):
      state, stats = step(state, sharding.global_batch(batch, batch_shardings))
      losses.append(float(stats['loss']))
  return losses


@pytest.mark.slow
def test_a_pretraining_step_runs_on_cpu():
  config = tiny_roberta()
  config.train.update(learning_rate=1e-2, warmup_steps=1, num_steps=10)
  losses = train_steps(config, random_batch(config), num_steps=3)
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

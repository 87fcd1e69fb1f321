"""DeBERTa ('deberta'): transformers' DebertaV2ForMaskedLM in and out (v3's shared keys and
bucketed distances, v1-style separate position projections with absolute positions), the
relative index against transformers', FLOPs against the jaxpr, and the config checks."""

import functools

import flax
import jax
import numpy as np
import pytest

import hf_parity
from conftest import assert_refused, dot_flops
from bert_jax import config_lib
from bert_jax import models
from bert_jax.interop import hf
from bert_jax.models import deberta
from bert_jax.models import hf_layout
from bert_jax.models import layers
from bert_jax.train import step as steps
from configs import base
from hf_parity import imported, max_diff, torch, transformers

# Odd sizes, so a transposed or mis-split axis cannot line up; few buckets and a short span, so
# that rows of 13 tokens reach the logarithmic buckets and the clipping.
HF_SIZES = dict(num_hidden_layers=3, hidden_size=42, num_attention_heads=3, intermediate_size=50,
                vocab_size=97, max_position_embeddings=64, type_vocab_size=0,
                layer_norm_eps=1e-7, relative_attention=True, pad_token_id=0)
VARIANTS = {
    # DeBERTa-v3's settings: shared keys, 8 log buckets over 16 positions, normed table.
    'v3': dict(position_buckets=8, max_relative_positions=16, share_att_key=True,
               pos_att_type='p2c|c2p', norm_rel_ebd='layer_norm', position_biased_input=False),
    # DeBERTa-v1's: own position projections, a clipped span of 5, absolute positions too.
    'v1': dict(max_relative_positions=5, share_att_key=False, pos_att_type=['c2p', 'p2c'],
               norm_rel_ebd='none', position_biased_input=True),
}
BATCH = hf_parity.batch(HF_SIZES)


def hf_config(variant):
  return transformers.DebertaV2Config(**HF_SIZES, **VARIANTS[variant])


@pytest.fixture(scope='module', name='hf_models')
def fixture_hf_models(tmp_path_factory):
  """variant -> (a random DebertaV2ForMaskedLM, the directory it is saved in)."""
  return hf_parity.saved_models(tmp_path_factory, {v: hf_config(v) for v in VARIANTS},
                                transformers.DebertaV2ForMaskedLM, scale=0.1)


def our_config(variant='v3', scan_layers=True):
  return hf_parity.our_config(hf_config(variant).to_dict(), scan_layers=scan_layers)


run_ours = functools.partial(hf_parity.run_ours, inputs=BATCH)  # (params, config) -> logits
run_hf = functools.partial(hf_parity.run_hf, inputs=BATCH)  # (model) -> logits


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_the_relative_index_is_transformers(variant):
  from transformers.models.deberta_v2 import modeling_deberta_v2 as theirs  # pylint: disable=g-import-not-at-top
  config = hf_config(variant)
  cfg = models.get('deberta').config_from(our_config(variant))
  for length in (13, 64):
    states = torch.zeros(1, length, 4)
    max_position = (config.max_relative_positions if config.max_relative_positions > 0
                    else config.max_position_embeddings)
    relative = theirs.build_relative_position(
        states, states, bucket_size=getattr(config, 'position_buckets', -1),
        max_position=max_position)[0].numpy()
    k = deberta.span(cfg)
    np.testing.assert_array_equal(deberta.relative_index(cfg, length),
                                  np.clip(relative + k, 0, 2 * k - 1))


@pytest.mark.parametrize('variant', list(VARIANTS))
@pytest.mark.parametrize('from_key', [False, True])
def test_scores_by_distance_equal_the_gathered_table(variant, from_key):
  """The relative scores against a row per distance, shifted into place, are those against the
  whole table gathered by the relative index (transformers' way), for rows with fewer
  distances than table rows and rows that reach the log buckets and the clipping."""
  cfg = models.get('deberta').config_from(our_config(variant))
  rng = np.random.default_rng(1)
  rows = rng.normal(size=(2 * deberta.span(cfg), 3, 4)).astype(np.float32)
  for length in (1, 4, 13):
    content = rng.normal(size=(2, length, 3, 4)).astype(np.float32)
    index = deberta.relative_index(cfg, length)
    expected = np.einsum('bihd,ijhd->bhij', content, rows[index.T if from_key else index])
    np.testing.assert_allclose(deberta.relative_scores(cfg, content, rows, from_key), expected,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_import_gives_transformers_mlm_logits(hf_models, variant):
  """v3's and v1's relative attention (transformers' default class, without: conformance/)."""
  config = our_config(variant)
  config_lib.validate(config)
  _, report = hf_parity.assert_imports(*hf_models[variant], config, BATCH)
  assert report.layout == 'DebertaV2ForMaskedLM' and not report.missing_heads


def test_the_relative_terms_matter(hf_models):
  """Without c2p or p2c the logits move: the equality above sees both terms."""
  model, directory = hf_models['v3']
  params, _ = imported(directory, our_config())
  reference = run_hf(model)
  for kept in ('c2p', 'p2c'):
    config = our_config()
    config.model.relative_attention = kept
    assert max_diff(run_ours(params, config), reference) > 1e-2, kept


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_export_loads_in_transformers_and_round_trips(hf_models, variant, tmp_path):
  config = our_config(variant)
  params, _ = imported(hf_models[variant][1], config)
  hf_parity.assert_exports(params, config, tmp_path / 'hf', BATCH)


@pytest.mark.slow
def test_flops_are_the_matmuls_the_model_runs():
  config = our_config('v1', scan_layers=False)
  s = 13
  config.data.update(max_seq_length=s, max_predictions_per_seq=4)
  model = steps.build_model(config)
  params = hf.init_params(config)
  batch = {k: np.zeros(v.shape, v.dtype)
           for k, v in steps.dummy_batch(1, s, 4, objectives=model.objectives).items()}
  encoder = models.get('deberta').encoder(model.config)
  jaxpr = jax.make_jaxpr(lambda q: encoder.apply(
      {'params': q['bert']}, batch['input_ids'], batch['segment_ids'], batch['input_mask']))
  family = models.get('deberta').flops(config.model, s)
  h, f, n, k = 42, 50, 3, 5
  # transformers' count scores the 2 k table rows; ours scores 2 s - 1, one per distance.
  more_rows = n * 2 * 2 * s * (2 * s - 1 - 2 * k) * h
  # One sequence: the table's projection, once per batch, is beside the per-sequence count.
  assert (dot_flops(jaxpr(params).jaxpr)
          == family + more_rows + deberta.table_projection_flops(config.model))
  assert family == n * (s * (8 * h * h + 4 * h * f) + 4 * s * s * h + 2 * 2 * s * (2 * k) * h)
  assert deberta.table_projection_flops(config.model) == n * 2 * 2 * (2 * k) * h * h


@pytest.mark.parametrize('change, message', [
    ({'relative_attention': 'c2x'}, "relative_attention='c2x'"),
    ({'positions': 'rotary'}, "positions='rotary'"),
    ({'attention_impl': 'cudnn'}, "attention_impl='cudnn'"),
])
def test_bad_settings_are_refused_before_anything_is_built(change, message):
  config = our_config()
  config.model.update(change)
  assert_refused(config, message)


def mask_decoder_model(positions='none'):
  config = our_config('v3' if positions == 'none' else 'v1', scan_layers=False)
  config.model.enhanced_mask_decoder = True
  config_lib.validate(config)
  model = steps.build_model(config)
  batch = BATCH
  params = jax.tree.map(np.asarray, model.init(jax.random.PRNGKey(0), batch)['params'])
  return config, model, flax.linen.meta.unbox(params), batch


@pytest.mark.parametrize('positions', ['none', 'absolute'])
def test_the_mask_decoder_reruns_the_last_layer_with_absolute_positions(positions):
  config, model, params, batch = mask_decoder_model(positions)
  cfg = model.config
  ids, mask = batch['input_ids'], batch['input_mask']
  decoded = deberta.DebertaModel(cfg).apply({'params': params['bert']}, ids, ids * 0, mask)[0]
  # By hand: the layer below the last (return_all_layers runs no decoder), the processed
  # relative table, and the last layer twice with its queries and residual from
  # positions + the states below, then from its own output.
  states = deberta.DebertaModel(cfg, return_all_layers=True).apply(
      {'params': params['bert']}, ids, ids * 0, mask)[0]
  below = states[-2]
  encoder = params['bert']['encoder']
  relative = encoder['rel_embeddings']
  if cfg.relative_norm:
    relative = layers.layer_norm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype).apply(
        {'params': encoder['rel_LayerNorm']}, relative)
  bias = layers.row_attention_bias(mask, None, cfg.dtype)
  table = params['bert']['embeddings']['position_embeddings']
  query = table[np.arange(ids.shape[1])][None] + below
  last = {'params': encoder[f'layer_{cfg.num_layers - 1}']}
  for _ in range(2):
    query = deberta.DebertaLayer(cfg).apply(last, below, bias, relative, True, query)
  assert max_diff(decoded, query) < 1e-6
  assert max_diff(decoded, states[-1]) > 1e-2  # Not the last layer's output.
  # The MLM head reads the decoder: moving the position table moves the logits.
  logits = model.apply({'params': params}, batch)['mlm_logits']
  moved = jax.tree.map(lambda x: x, params)
  moved['bert']['embeddings']['position_embeddings'] = table + np.random.default_rng(0).normal(
      size=table.shape).astype(np.float32)
  assert max_diff(model.apply({'params': moved}, batch)['mlm_logits'], logits) > 1e-3


@pytest.mark.slow
def test_a_scanned_stack_runs_the_mask_decoder_as_the_unrolled_one():
  """Scanned layers: the decoder reads the stack's last input and reruns its last slice; MLM
  logits and every parameter's gradient equal the unrolled stack's, dropout off."""
  from bert_jax.interop import param_tree  # pylint: disable=g-import-not-at-top
  unrolled, model, params, batch = mask_decoder_model()
  scanned = our_config('v3', scan_layers=True)
  scanned.model.enhanced_mask_decoder = True
  config_lib.validate(scanned)
  stacked = param_tree.unflatten(param_tree.stack_layers(param_tree.flatten(params), 3))

  def loss(p, config):
    return steps.build_model(config).apply({'params': p}, batch)['mlm_logits'].sum()

  logits = model.apply({'params': params}, batch)['mlm_logits']
  logits_scanned = steps.build_model(scanned).apply({'params': stacked}, batch)['mlm_logits']
  assert max_diff(logits_scanned, logits) < 1e-5
  grads = param_tree.flatten(jax.grad(loss)(params, unrolled))
  grads_scanned = param_tree.unstack_layers(param_tree.flatten(jax.grad(loss)(stacked, scanned)))
  assert set(grads_scanned) == set(grads)
  for key, grad in grads.items():
    np.testing.assert_allclose(grads_scanned[key], grad, rtol=1e-4, atol=1e-5, err_msg=key)
  # The scanned model initialises the same tree, stacked.
  init = steps.build_model(scanned).init(jax.random.PRNGKey(0), batch)['params']
  assert (jax.tree.map(np.shape, flax.linen.meta.unbox(init))
          == jax.tree.map(np.shape, stacked))


def test_the_mask_decoder_is_deberta_s_and_feeds_mlm_only():
  config = base.get_config('corpus=builtin')
  config.model.enhanced_mask_decoder = True
  with pytest.raises(config_lib.ConfigError, match=r"enhanced_mask_decoder=True with "
                     r"config.model.name='bert'.*set it False"):
    config_lib.validate(config)
  config = our_config(scan_layers=False)
  config.model.update(enhanced_mask_decoder=True, generator_fraction=1.0)
  config.objectives = 'rtd'
  with pytest.raises(config_lib.ConfigError, match=r"enhanced_mask_decoder=True with "
                     r"objectives='rtd'.*use 'mlm'"):
    config_lib.validate(config)


def test_relative_attention_on_bert_is_refused():
  config = base.get_config('corpus=builtin')
  config.model.relative_attention = 'c2p|p2c'
  assert_refused(config, "model.name='deberta'")


def test_an_hf_config_with_what_we_lack_is_refused():
  config = hf_config('v3').to_dict()
  config.update(conv_kernel_size=3, type_vocab_size=2)
  with pytest.raises(hf_layout.UnsupportedConfigError, match='conv_kernel_size=3.*type_vocab'):
    hf.hf_config_to_model_overrides(config)


@pytest.mark.parametrize('size, millions', [
    ('base', 184), pytest.param('large', 434, marks=pytest.mark.slow)])
def test_the_recipe_validates_and_counts_transformers_parameters(size, millions):
  """configs/deberta.py: DeBERTa-v3's shapes, the parameters transformers' DebertaV2ForMaskedLM
  of the exported config has (deberta-v3-base: 86M backbone + 98M embedding; -large: 304M +
  131M, rounded apart)."""
  from configs import deberta as deberta_config  # pylint: disable=g-import-not-at-top
  config = deberta_config.get_config(f'size={size},corpus=builtin')
  config_lib.validate(config)
  ours = sum(int(np.prod(s)) for s in hf.leaf_shapes(config).values())
  exported = {k: v for k, v in hf.model_to_hf_config(config).items() if k != 'architectures'}
  with torch.device('meta'):
    theirs = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**exported))
  assert ours == sum(p.numel() for p in theirs.parameters())
  backbone = sum(int(np.prod(s)) for k, s in hf.leaf_shapes(config).items()
                 if k.startswith('bert/'))
  assert round(backbone / 1e6) == millions  # The model cards' backbone + embedding.


@pytest.mark.slow
def test_a_run_with_the_mask_decoder_fine_tunes_and_exports_without_it(tmp_path):
  """Two pretraining steps of the DeBERTa-v3 encoder with its enhanced mask decoder (scanned
  layers), SST-2 fine-tuning from the workdir, and the export loading in transformers'
  AutoModelForMaskedLM: the decoder's position table trains and is left behind after."""
  from conftest import micro_config  # pylint: disable=g-import-not-at-top
  from test_family_finetune import run_sst2, wiki  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  from bert_jax.tools import convert  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  pretraining = micro_config(tmp_path, **{
      'model.name': 'deberta', 'data.corpus': wiki(), 'data.max_documents': 12,
      'objectives': 'mlm', 'model.positions': 'none', 'model.relative_attention': 'c2p|p2c',
      'model.relative_buckets': 8, 'model.share_relative_key': True,
      'model.relative_norm': True, 'model.enhanced_mask_decoder': True,
      'model.scan_layers': True, 'train.num_steps': 2, 'train.warmup_steps': 1,
      'train.log_every': 1, 'train.eval_every': 2, 'train.checkpoint_every': 2})
  source = tmp_path / 'pretrain'
  pretrain.train_and_evaluate(pretraining, str(source))
  # The decoder's own position table is in the run, and nowhere after it.
  assert 'position_embeddings' in init_from.workdir_params(str(source))['bert']['embeddings']
  results, saved = run_sst2(tmp_path, str(source))
  assert not saved['model']['enhanced_mask_decoder']
  assert saved['model']['name'] == 'deberta' and saved['model']['relative_buckets'] == 8
  assert np.isfinite(results['median']['dev']['accuracy'])
  out = tmp_path / 'hf'
  convert.main(['export', f'--workdir={source}', f'--out={out}'])
  model, info = transformers.AutoModelForMaskedLM.from_pretrained(str(out),
                                                                  output_loading_info=True)
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  assert type(model).__name__ == 'DebertaV2ForMaskedLM'
  with torch.no_grad():
    logits = model.eval()(input_ids=torch.tensor([[2, 7, 9, 3]])).logits
  assert logits.shape[-1] == pretraining.model.vocab_size and torch.isfinite(logits).all()


def test_the_fused_feed_forward_computes_the_same_layers(hf_models):
  """With ffn_impl='pallas' (the recipe's GPU setting; its kernel's CPU path here) the layers
  keep BERT's feed-forward parameters and compute the same logits."""
  config = our_config('v3', scan_layers=False)
  config.model.gelu = 'tanh'  # The fused kernel's GELU.
  params, _ = imported(hf_models['v3'][1], config)
  reference = run_ours(params, config)
  config.model.ffn_impl = 'pallas'
  np.testing.assert_allclose(run_ours(params, config), reference, rtol=1e-5, atol=1e-5)

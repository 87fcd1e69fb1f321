"""The modern encoder ('modernbert') beyond what every family owes (tests/conformance/):
transformers' ModernBertForMaskedLM in and out with GeGLU and SwiGLU, with and without biases,
and a window the rows reach; packed rows; the config checks of its switches."""

import math

import flax.linen as nn
import jax
import numpy as np
import pytest

import hf_parity
from conftest import assert_refused, dot_flops
from bert_jax import config_lib
from bert_jax import models
from bert_jax.interop import hf
from bert_jax.models import hf_layout
from bert_jax.train import step as steps
from configs import base
from hf_parity import IMPORT_TOLERANCE, imported, max_diff, torch, transformers

# Odd sizes, so a transposed or mis-split axis cannot line up; a window of 6 (3 tokens each side)
# and small thetas, so that rows of 13 tokens see both the window and the rotation.
HF_SIZES = dict(num_hidden_layers=4, hidden_size=42, num_attention_heads=3, intermediate_size=50,
                vocab_size=97, max_position_embeddings=128, local_attention=6,
                global_attn_every_n_layers=3, global_rope_theta=1000.0, local_rope_theta=50.0,
                pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2)
VARIANTS = {
    'geglu_no_bias': {},
    'swiglu_biases': dict(hidden_activation='silu', attention_bias=True, mlp_bias=True,
                          norm_bias=True, classifier_bias=True),
}
BATCH = hf_parity.batch(HF_SIZES)  # <pad> is 1.


def hf_config(variant):
  return transformers.ModernBertConfig(**HF_SIZES, **VARIANTS[variant])


@pytest.fixture(scope='module', name='hf_models')
def fixture_hf_models(tmp_path_factory):
  """variant -> (a random ModernBertForMaskedLM, the directory it is saved in)."""
  return hf_parity.saved_models(tmp_path_factory, {v: hf_config(v) for v in VARIANTS},
                                transformers.ModernBertForMaskedLM, scale=0.1)


def our_config(variant='geglu_no_bias', scan_layers=False):
  return hf_parity.our_config(hf_config(variant).to_dict(), scan_layers=scan_layers)


def run_ours(params, config, batch=None):
  return hf_parity.run_ours(params, config, BATCH if batch is None else batch)


def test_the_config_reads_the_layer_pattern_thetas_and_switches():
  overrides = hf.hf_config_to_model_overrides(hf_config('swiglu_biases').to_dict())
  assert overrides['name'] == 'modernbert'
  assert (overrides['feed_forward'], overrides['use_bias'], overrides['positions']) == (
      'swiglu', True, 'rotary')
  assert (overrides['local_window'], overrides['global_every']) == (6, 3)
  assert (overrides['rope_theta'], overrides['local_rope_theta']) == (1000.0, 50.0)
  cfg = models.get('modernbert').config_from(our_config())
  from bert_jax.models import modernbert  # pylint: disable=g-import-not-at-top
  assert [modernbert.is_global(cfg, i) for i in range(4)] == [True, False, False, True]


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_import_gives_transformers_mlm_logits(hf_models, variant):
  """GeGLU and SwiGLU, with and without biases, a window the rows reach (transformers' default
  class: conformance/)."""
  config = our_config(variant)
  config_lib.validate(config)
  params, report = hf_parity.assert_imports(*hf_models[variant], config, BATCH)
  assert report.layout == 'ModernBertForMaskedLM' and not report.missing_heads
  assert 'attn_norm' not in params['bert']['encoder']['layer_0']


def test_the_window_and_the_rotation_matter(hf_models):
  """Turning off the local window or the rotation changes the logits: the test above would
  notice either one wrong."""
  model, directory = hf_models['geglu_no_bias']
  params, _ = imported(directory, our_config())
  reference = hf_parity.run_hf(model, BATCH)
  for key, value in (('local_window', 0), ('local_rope_theta', 1000.0)):
    config = our_config()
    config.model[key] = value
    assert max_diff(run_ours(params, config), reference) > 1e-2, key


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_export_loads_in_transformers_and_round_trips(hf_models, variant, tmp_path):
  config = our_config(variant)
  params, _ = imported(hf_models[variant][1], config)
  hf_parity.assert_exports(params, config, tmp_path / 'hf', BATCH)


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_a_scanned_stack_imports_and_exports_as_transformers(hf_models, variant, tmp_path):
  """model.scan_layers: one traced layer selects each layer's mask, rotation and first-layer
  norm; transformers' logits both ways, the first layer's unread norm filled and dropped."""
  model, directory = hf_models[variant]
  config = our_config(variant, scan_layers=True)
  config_lib.validate(config)
  params, _ = imported(directory, config)
  stacked = params['bert']['encoder']['layer']
  assert stacked['attn_norm']['scale'].shape == (4, 42)
  np.testing.assert_array_equal(stacked['attn_norm']['scale'][0], 1.0)  # Never read.
  difference = max_diff(run_ours(params, config), hf_parity.run_hf(model, BATCH))
  print(f'ModernBertForMaskedLM ({variant}) import into scanned layers, MLM logits max diff: '
        f'{difference:.2e}')
  assert difference < IMPORT_TOLERANCE
  hf.export_hf(params, config, str(tmp_path))
  reloaded, info = transformers.ModernBertForMaskedLM.from_pretrained(
      str(tmp_path), output_loading_info=True)
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys'))
  assert max_diff(hf_parity.run_hf(reloaded.eval(), BATCH), hf_parity.run_hf(model, BATCH)) == 0.0


@pytest.mark.slow
def test_scanned_and_unrolled_stacks_agree_in_outputs_and_gradients(hf_models):
  """With the window the rows reach; the first layer's norm, stacked but never read, has a zero
  gradient and is dropped unstacked."""
  unrolled = our_config()
  params, _ = imported(hf_models['geglu_no_bias'][1], unrolled)
  grads = hf_parity.assert_scanned_equals_unrolled(params, unrolled,
                                                   our_config(scan_layers=True), BATCH)
  np.testing.assert_array_equal(grads['bert/encoder/layer/attn_norm/scale'][0], 0.0)


@pytest.mark.slow
def test_a_packed_row_equals_its_sequences_alone(hf_models):
  """Unpadded batches: two sequences packed in one row (positions from 0 in each, attention
  within each) give the logits each gives alone."""
  _, directory = hf_models['geglu_no_bias']
  config = our_config()
  params, _ = imported(directory, config)
  rng = np.random.default_rng(1)
  a, b = rng.integers(3, 97, 7).astype(np.int32), rng.integers(3, 97, 6).astype(np.int32)
  alone = []
  for seq, picks in ((a, [1, 5]), (b, [0, 4])):
    alone.append(run_ours(params, config, {
        'input_ids': seq[None], 'input_mask': np.ones((1, len(seq)), np.int32),
        'segment_ids': np.zeros((1, len(seq)), np.int32),
        'masked_lm_positions': np.array([picks], np.int32)}))
  packed = run_ours(params, config, {
      'input_ids': np.concatenate([a, b])[None], 'input_mask': np.ones((1, 13), np.int32),
      'segment_ids': np.zeros((1, 13), np.int32),
      'position_ids': np.concatenate([np.arange(7), np.arange(6)])[None].astype(np.int32),
      'pair_ids': np.array([[1] * 7 + [2] * 6], np.int32),
      'masked_lm_positions': np.array([[1, 5, 7, 11]], np.int32)})
  assert max_diff(packed, np.concatenate(alone, axis=1)) < 1e-5


def test_an_unsupported_layer_pattern_is_refused():
  config = hf_config('geglu_no_bias').to_dict()
  config['layer_types'] = ['sliding_attention', 'full_attention', 'full_attention',
                           'sliding_attention']
  with pytest.raises(hf_layout.UnsupportedConfigError, match='layer_types'):
    hf.hf_config_to_model_overrides(config)


def test_export_refuses_what_transformers_cannot_hold(hf_models):
  config = our_config()
  config.model.norm = 'rms_norm'
  with pytest.raises(hf_layout.UnsupportedConfigError, match="norm='rms_norm'"):
    hf.model_to_hf_config(config)


@pytest.mark.parametrize('change, message', [
    ({'attention_impl': 'cudnn'}, "attention_impl='cudnn'"),
    ({'local_window': 5}, 'local_window=5'),
    ({'global_every': 0}, 'global_every=0'),
    ({'num_heads': 6}, 'head size 7'),
])
def test_bad_switches_are_refused_before_anything_is_built(change, message):
  config = our_config()
  config.model.update(change)
  assert_refused(config, message.replace('(', r'\('))


def test_a_modern_switch_on_bert_is_refused():
  config = base.get_config('corpus=builtin')
  config.model.positions = 'rotary'
  with pytest.raises(config_lib.ConfigError,
                     match="positions='rotary' with config.model.name='bert'"):
    config_lib.validate(config)


@pytest.mark.parametrize('family', ['bert', 'roberta', 'deberta'])
@pytest.mark.parametrize('key, value', [('local_window', 128), ('rope_theta', 160_000.0),
                                        ('local_rope_theta', 1_000.0), ('global_every', 3)])
def test_modernberts_own_keys_on_another_family_are_refused_by_name(family, key, value):
  """Each would change nothing in another family's encoder: a setting that silently does
  nothing is refused, naming it (models/modernbert/config.py's check)."""
  config = base.get_config('corpus=builtin')
  config.model.name = family
  config.model[key] = value
  with pytest.raises(config_lib.ConfigError,
                     match=rf'config.model.{key}={value!r} with config.model.name={family!r}'):
    config_lib.validate(config)


def test_sentence_objectives_are_refused():
  config = our_config()
  config.objectives = 'mlm,nsp'
  assert_refused(config, 'no segment embeddings')


@pytest.mark.slow
def test_rms_norm_trains_a_step():
  """The switches HF cannot hold still train: RMSNorm, learned positions, BERT's feed-forward."""
  config = our_config()
  config.model.update(norm='rms_norm', positions='absolute', feed_forward='gelu')
  config_lib.validate(config)
  model = steps.build_model(config)
  batch = {k: np.zeros(v.shape, v.dtype)
           for k, v in steps.dummy_batch(2, 13, 4, objectives=model.objectives).items()}
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch)['params'])
  assert 'position_embeddings' in params['bert']['embeddings']
  assert set(params['bert']['embeddings']['norm']) == {'scale'}
  loss = lambda p: model.apply({'params': p}, batch)['mlm_logits'].sum()  # noqa: E731
  grads = jax.grad(loss)(params)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize('size, millions', [
    ('base', 149), pytest.param('large', 395, marks=pytest.mark.slow)])
def test_the_recipe_validates_and_counts_the_paper_s_parameters(size, millions):
  """configs/modernbert.py: the released shapes, ModernBERT-base 149M and -large 395M, equal to
  transformers' ModernBertForMaskedLM of the exported config."""
  from configs import modernbert as modernbert_config  # pylint: disable=g-import-not-at-top
  config = modernbert_config.get_config(f'size={size},corpus=builtin')
  config_lib.validate(config)
  assert (config.masking.rate, config.objectives, config.data.rows) == (
      0.3, 'mlm', 'full_sentences')
  assert config.train.batch_size % config.train.grad_accum_steps == 0
  ours = sum(int(np.prod(s)) for s in hf.leaf_shapes(config).values())
  exported = {k: v for k, v in hf.model_to_hf_config(config).items() if k != 'architectures'}
  with torch.device('meta'):
    theirs = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**exported))
  assert ours == sum(p.numel() for p in theirs.parameters())
  assert round(ours / 1e6) in (millions, millions + 1)


def test_the_recipe_is_the_releases_pretraining_in_steps():
  from configs import modernbert as modernbert_config  # pylint: disable=g-import-not-at-top
  from bert_jax.data import batch_warmup  # pylint: disable=g-import-not-at-top
  config = modernbert_config.get_config('size=base,corpus=builtin')
  config_lib.validate(config)
  train = config.train
  assert (train.optimizer, train.schedule, train.decay_steps, train.adam_b2, train.adam_eps) == (
      'stableadamw', 'wsd', 0, 0.98, 1e-6)
  # The release's decay (1e-5) is not scaled by the learning rate; optax's is.
  assert train.weight_decay * train.learning_rate == pytest.approx(1e-5)
  # Its 3B-token warmup ends inside the first size (768 rows of 1,024): ceil(3e9 / 786,432).
  assert train.warmup_steps == 3815
  # The warmup's 21,195 steps train 50,005,278,720 tokens, the rest of 1,719B 4,608 x 1,024 a step.
  assert train.num_steps == 21195 + math.ceil((1_719_000_000_000 - 50_005_278_720) / (4608 * 1024))
  assert config.model.rope_theta == config.model.local_rope_theta == 10_000.0
  assert (config.masking.rate, config.masking.eval) == (0.3, 'reference')
  # steps=N keeps the batch warmup's share of the run, as the learning-rate warmup's.
  short = modernbert_config.get_config('size=base,corpus=builtin,steps=10000')
  config_lib.validate(short)
  end = batch_warmup.stages(short.train, 1024)[-1].last_step
  assert abs(end - 10000 * 21195 / train.num_steps) <= 10
  tiny = modernbert_config.get_config('size=tiny')  # Batches of 32 from the first step.
  config_lib.validate(tiny)
  assert (tiny.train.batch_warmup_rows, tiny.train.optimizer) == (0, 'stableadamw')


@pytest.mark.parametrize('feed_forward', ['geglu', 'gelu'])
def test_flops_are_the_matmuls_the_model_runs(feed_forward):
  """The family's FLOPs (projections, the gated or plain feed-forward, attention over the whole
  row) equal the dot products XLA is given; the MLM head's are MLM's."""
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  config = our_config()
  config.model.feed_forward = feed_forward
  s, p = 13, 4
  config.data.update(max_seq_length=s, max_predictions_per_seq=p)
  model = steps.build_model(config)
  params = hf.init_params(config)
  batch = {k: np.zeros(v.shape, v.dtype)
           for k, v in steps.dummy_batch(1, s, p, objectives=model.objectives).items()}
  encoder = models.get('modernbert').encoder(model.config)
  encoder_jaxpr = jax.make_jaxpr(lambda q: encoder.apply(
      {'params': q['bert']}, batch['input_ids'], batch['segment_ids'], batch['input_mask']))
  family = models.get('modernbert').flops(config.model, s)
  assert dot_flops(encoder_jaxpr(params).jaxpr) == family
  h, f, n = 42, 50, 4
  assert family == n * (s * (8 * h * h + (6 if feed_forward == 'geglu' else 4) * h * f)
                        + 4 * s * s * h)
  whole_jaxpr = jax.make_jaxpr(lambda q: model.apply({'params': q}, batch))
  heads_ = objectives.get('mlm').flops(config.model, steps.batch_shape(config))
  gather = 2 * p * s * h  # gather_positions' one-hot product, uncounted.
  assert dot_flops(whole_jaxpr(params).jaxpr) == family + heads_ + gather


@pytest.mark.slow
def test_a_pretraining_run_fine_tunes_and_exports(tmp_path):
  """End to end on real text: two pretraining steps of the modern encoder with its own byte-level
  BPE, SST-2 fine-tuning from the workdir (the tokenizer and the encoder adopted from it), and
  the workdir's export loading in transformers' AutoModelForMaskedLM with its tokenizer."""
  from conftest import micro_config  # pylint: disable=g-import-not-at-top
  from test_family_finetune import run_sst2, wiki  # pylint: disable=g-import-not-at-top
  from bert_jax.tools import convert  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  pretraining = micro_config(tmp_path, **{
      'model.name': 'modernbert', 'data.tokenizer': 'bpe', 'data.lowercase': False,
      'data.corpus': wiki(), 'data.max_documents': 12, 'objectives': 'mlm',
      'model.type_vocab_size': 1, 'model.scan_layers': False, 'model.use_bias': False,
      'model.feed_forward': 'geglu', 'model.positions': 'rotary', 'model.local_window': 8,
      'model.global_every': 2, 'model.max_position_embeddings': 64,
      'train.num_steps': 2, 'train.warmup_steps': 1, 'train.log_every': 1,
      'train.eval_every': 2, 'train.checkpoint_every': 2})
  source = tmp_path / 'pretrain'
  pretrain.train_and_evaluate(pretraining, str(source))
  results, saved = run_sst2(tmp_path, str(source))
  assert saved['model']['name'] == 'modernbert' and saved['data']['tokenizer'] == 'bpe'
  assert np.isfinite(results['median']['dev']['accuracy'])
  out = tmp_path / 'hf'
  convert.main(['export', f'--workdir={source}', f'--out={out}'])
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
  model = transformers.AutoModelForMaskedLM.from_pretrained(str(out)).eval()
  assert type(model).__name__ == 'ModernBertForMaskedLM'
  encoded = tokenizer('The river runs to the sea.', return_tensors='pt')
  with torch.no_grad():
    logits = model(**encoded).logits
  assert logits.shape[-1] == pretraining.model.vocab_size and torch.isfinite(logits).all()

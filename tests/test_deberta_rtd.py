"""DeBERTa-v3's pretraining: replaced-token detection (objectives/rtd.py) on the DeBERTa encoder,
a generator as wide and half as deep, gradient-disentangled embedding sharing; its config, its
FLOPs, its export to transformers, and a run that fine-tunes from its discriminator."""

import dataclasses

import flax
import jax
import numpy as np
import pytest

from conftest import assert_refused

from bert_jax import config_lib
from bert_jax.interop import hf
from bert_jax.interop import param_tree
from bert_jax.models import deberta
from bert_jax.models import sharing
from bert_jax.train import metrics as metrics_lib
from bert_jax.train import step as steps
from configs import deberta as deberta_configs

# Odd sizes: 4 layers (a generator of 2), hidden 42 with 3 heads, vocab 97, 8 buckets.
SEQ, PREDICTIONS = 13, 4


def tiny_config():
  config = deberta_configs.get_config('objective=rtd')
  config.data.update(corpus='builtin', max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS)
  config.model.update(num_layers=4, hidden_size=42, num_heads=3, intermediate_size=50,
                      vocab_size=97, max_position_embeddings=64, relative_buckets=8,
                      hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  return config


def make_batch():
  rng = np.random.default_rng(0)
  mask = np.ones((3, SEQ), np.int32)
  mask[1, 9:] = mask[2, 5:] = 0
  original = rng.integers(5, 97, (3, SEQ)).astype(np.int32) * mask
  positions = np.array([[1, 4, 7, 12], [0, 2, 3, 8], [1, 2, 3, 4]], np.int32)
  weights = np.ones(positions.shape, np.float32)
  ids = original.copy()
  np.put_along_axis(ids, positions, 4, axis=1)
  return {'input_ids': ids, 'input_mask': mask, 'segment_ids': np.zeros_like(ids),
          'masked_lm_positions': positions,
          'masked_lm_ids': np.take_along_axis(original, positions, axis=1),
          'masked_lm_weights': weights}


@pytest.fixture(scope='module', name='built')
def fixture_built():
  config = tiny_config()
  config_lib.validate(config)
  model = steps.build_model(config)
  batch = make_batch()
  params = flax.linen.meta.unbox(model.init(jax.random.PRNGKey(0), batch)['params'])
  # Random values everywhere: zero deltas or unit LayerNorms would hide a swapped leaf.
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(1)
  params = jax.tree.unflatten(tree, [x + rng.normal(size=x.shape).astype(np.float32) * 0.05
                                     for x in leaves])
  return config, model, params, batch


def test_the_v3_recipe_is_rtd_with_a_half_depth_generator_and_gdes():
  config = deberta_configs.get_config('size=large,objective=rtd')
  model = config.model
  assert config.objectives == 'rtd' and model.name == 'deberta'
  assert (model.generator_fraction, model.generator_layer_fraction, model.disc_weight,
          model.embedding_sharing) == (1.0, 0.5, 50.0, 'gdes')
  assert (config.masking.mask_token_fraction, config.masking.random_token_fraction,
          config.masking.keep_fraction) == (1.0, 0.0, 0.0)
  config.data.corpus = 'builtin'
  config_lib.validate(config)
  assert deberta_configs.get_config().objectives == 'mlm'
  with pytest.raises(ValueError, match=r"objective='electra': expected one of mlm, rtd"):
    deberta_configs.get_config('objective=electra')


@pytest.mark.parametrize('change, message', [
    ({'generator_fraction': 0.5}, r"generator_fraction=0.5 with config.model.name='deberta'.*"
                                  r'set generator_fraction=1.0'),
    ({'generator_layer_fraction': 1.5}, r'generator_layer_fraction=1.5: .*\(0, 1\]'),
])
def test_bad_generator_shapes_are_refused(change, message):
  config = tiny_config()
  config.model.update(change)
  assert_refused(config, message)


def test_the_generator_is_deberta_half_as_deep_and_as_wide(built):
  _, _, params, _ = built
  flat = param_tree.flatten(params)
  ffn = 'encoder/layer/intermediate/dense/kernel'
  assert flat['bert/' + ffn].shape == (4, 42, 50)
  # ELECTRA's get_generator_config: feed-forward 4 H_g (the recipe's 4 H), a head per 64 units.
  assert flat['generator/' + ffn].shape == (2, 42, 168)
  # Its own relative table; no projection, no tables of its own.
  assert flat['generator/encoder/rel_embeddings'].shape == flat['bert/encoder/rel_embeddings'].shape
  assert not [k for k in flat if k.startswith('generator/') and 'embeddings_project' in k]
  assert 'bert/embeddings/word_embeddings_delta' in flat


@pytest.mark.slow  # test_electra.py's gdes test keeps the rule in the fast tier.
def test_each_loss_stays_off_the_other_models_embeddings(built):
  from test_electra import loss_term_grads  # pylint: disable=g-import-not-at-top
  _, model, params, batch = built
  generator, discriminator = (loss_term_grads(model, params, batch, which, 2)
                              for which in ('generator', 'discriminator'))
  tables = ['bert/embeddings/word_embeddings', 'bert/embeddings/LayerNorm/scale']
  own = ['bert/embeddings/word_embeddings_delta', 'bert/embeddings/discriminator_LayerNorm/scale']
  assert all(not np.any(discriminator[k]) for k in tables)
  assert all(np.any(discriminator[k]) for k in own + ['bert/encoder/rel_embeddings'])
  assert all(np.any(generator[k]) for k in tables + ['generator/encoder/rel_embeddings'])
  assert all(not np.any(generator[k]) for k in own + ['bert/encoder/rel_embeddings'])


def test_flops_count_both_deberta_encoders_and_the_heads():
  config = tiny_config()
  m, s, p = config.model, SEQ, PREDICTIONS
  generator = m.copy_and_resolve_references()
  generator.update(num_layers=2, intermediate_size=168, num_heads=1)
  expected = (deberta.encoder_flops(m, s) + deberta.encoder_flops(generator, s)
              + p * (2 * 42 * 42 + 2 * 42 * 97) + s * (2 * 42 * 42 + 2 * 42))
  assert metrics_lib.model_flops_per_sequence(config) == pytest.approx(3 * expected)


def test_the_export_reproduces_both_models_in_transformers(built, tmp_path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  config, model, params, batch = built
  out = str(tmp_path / 'export')
  hf.export_hf(params, config, out)
  disc_dir, gen_dir = hf.export_dirs(config, out)
  loaded = {}
  for directory, cls in ((disc_dir, transformers.DebertaV2Model),
                         (gen_dir, transformers.DebertaV2ForMaskedLM)):
    loaded[directory], info = cls.from_pretrained(directory, output_loading_info=True)
    assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
  ids, mask = batch['input_ids'], batch['input_mask']
  with torch.no_grad():
    theirs = loaded[disc_dir].eval()(input_ids=as_long(ids), attention_mask=as_long(mask))
    their_gen = loaded[gen_dir].eval()(input_ids=as_long(ids), attention_mask=as_long(mask))
  # Ours: the discriminator's states with its materialised tables (table + delta), and the
  # generator's logits at the masked positions in the run.
  materialised = dataclasses.replace(model.config, embedding_sharing='shared')
  ours = deberta.DebertaModel(materialised).apply(
      {'params': sharing.discriminator_tree(params)['bert']}, ids, batch['segment_ids'], mask)[0]
  real = mask > 0
  hidden = float(np.max(np.abs(np.asarray(ours)[real] - theirs.last_hidden_state.numpy()[real])))
  ours_gen = np.asarray(model.apply({'params': params}, batch)['rtd_gen_logits'])
  positions = batch['masked_lm_positions']
  gen = float(np.max(np.abs(ours_gen - np.take_along_axis(
      their_gen.logits.numpy(), positions[..., None], axis=1))))
  print(f'DeBERTa-v3 RTD export -> transformers: discriminator hidden {hidden:.1e}, '
        f'generator logits {gen:.1e}')
  assert hidden < 1e-5 and gen < 1e-5


@pytest.mark.slow
def test_a_v3_run_trains_and_fine_tunes_from_its_discriminator(tmp_path):
  from conftest import micro_config  # pylint: disable=g-import-not-at-top
  from test_family_finetune import run_sst2, wiki  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  pretraining = micro_config(tmp_path, objectives='rtd', **{
      'model.name': 'deberta', 'data.corpus': wiki(), 'data.max_documents': 12,
      'model.positions': 'none', 'model.relative_attention': 'c2p|p2c',
      'model.relative_buckets': 8, 'model.share_relative_key': True, 'model.relative_norm': True,
      'model.generator_fraction': 1.0, 'model.generator_layer_fraction': 0.5,
      'model.embedding_sharing': 'gdes', 'masking.mask_token_fraction': 1.0,
      'masking.random_token_fraction': 0.0, 'masking.keep_fraction': 0.0,
      'train.num_steps': 4, 'train.warmup_steps': 1, 'train.log_every': 2,
      'train.eval_every': 4, 'train.checkpoint_every': 4})
  source = tmp_path / 'pretrain'
  pretrain.train_and_evaluate(pretraining, str(source))
  embeddings = init_from.workdir_params(str(source))['bert']['embeddings']
  assert np.any(embeddings['word_embeddings_delta'])
  results, saved = run_sst2(tmp_path, str(source))
  assert saved['model']['name'] == 'deberta'
  assert np.isfinite(results['median']['dev']['accuracy'])

"""The left-to-right LM objective ('clm') and causal attention (config.model.causal): equal to
transformers' BertLMHeadModel, causal, unmasked data, validated, trained end to end."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax.data import batching
from bert_jax.data import pipeline
from bert_jax.data import pretraining as data_lib
from bert_jax.interop import hf
from bert_jax.interop import init_from
from bert_jax.models import bert as model_lib
from bert_jax.models.encoder import EncoderConfig
from bert_jax.objectives import clm
from bert_jax.train import metrics
from bert_jax.train import step as steps
from configs import base
from configs import finetune
from configs import glue
from conftest import assert_refused, micro_config, micro_run, run_records

SPECIAL = data_lib.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
# Odd sizes, so that a transposed or mis-split axis cannot line up by accident.
HF_SIZES = dict(num_hidden_layers=2, hidden_size=48, num_attention_heads=3, intermediate_size=80,
                vocab_size=101, max_position_embeddings=24, type_vocab_size=2)


def clm_config(**model):
  """configs/base.py as a clm run, the model shaped like HF_SIZES (and `model`)."""
  config = base.get_config('corpus=builtin')
  config.objectives = 'clm'
  config.data.max_seq_length = 16
  config.model.update(vocab_size=101, hidden_size=48, num_layers=2, num_heads=3,
                      intermediate_size=80, max_position_embeddings=24,
                      **{'causal': True, **model})
  return config


def padded_batch(batch=3, length=11, seed=0):
  """Random ids with real lengths 11, 7 and 4 (right padding), two segments."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 101, (batch, length)).astype(np.int32)
  mask = (np.arange(length)[None] < np.array([[11], [7], [4]])[:batch]).astype(np.int32)
  segments = ((np.arange(length)[None] >= 3) & (mask > 0)).astype(np.int32)
  return {'input_ids': ids * mask, 'input_mask': mask, 'segment_ids': segments}


@pytest.fixture(scope='module')
def lm_head_model():
  """(a random transformers BertLMHeadModel in eval mode, its state dict + a pooler as numpy)."""
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  torch.manual_seed(0)
  reference = transformers.BertLMHeadModel(transformers.BertConfig(
      is_decoder=True, attn_implementation='eager', **HF_SIZES)).eval()
  with torch.no_grad():  # HF's zero biases and unit LayerNorms would hide a swapped leaf.
    for name, param in reference.named_parameters():
      param.copy_(torch.randn_like(param) * 0.05 + (1.0 if 'LayerNorm.weight' in name else 0.0))
  state = {k: v.numpy() for k, v in reference.state_dict().items()}
  rng = np.random.default_rng(1)  # BertLMHeadModel has no pooler; ours needs one to load.
  state['bert.pooler.dense.weight'] = rng.normal(size=(48, 48)).astype(np.float32)
  state['bert.pooler.dense.bias'] = rng.normal(size=(48,)).astype(np.float32)
  return reference, state


def hf_logits(model, batch):
  """[batch, length, vocab] logits of a transformers model on `batch`."""
  import torch  # pylint: disable=g-import-not-at-top
  as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
  with torch.no_grad():
    return model(input_ids=as_long(batch['input_ids']),
                 token_type_ids=as_long(batch['segment_ids']),
                 attention_mask=as_long(batch['input_mask'])).logits.numpy()


@pytest.mark.slow
@pytest.mark.parametrize('scan_layers', [True, False])
def test_logits_match_transformers_lm_head_model(lm_head_model, scan_layers):
  reference, state = lm_head_model
  config = clm_config(scan_layers=scan_layers)
  params, _ = hf.import_hf(state, config)
  batch = padded_batch()
  model = steps.build_model(config)
  ours = jax.jit(model.apply)({'params': params}, batch)['clm_logits']
  assert ours.shape == (3, 11, 101)
  np.testing.assert_allclose(np.asarray(ours), hf_logits(reference, batch), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_export_loads_in_transformers_as_a_causal_lm(lm_head_model, tmp_path):
  transformers = pytest.importorskip('transformers')
  reference, state = lm_head_model
  config = clm_config()
  params, _ = hf.import_hf(state, config)
  hf.export_hf(params, config, str(tmp_path))
  loaded, info = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path),
                                                                   output_loading_info=True)
  assert type(loaded).__name__ == 'BertLMHeadModel' and loaded.config.is_decoder
  assert not info['missing_keys']
  batch = padded_batch()
  np.testing.assert_allclose(hf_logits(loaded.eval(), batch), hf_logits(reference, batch),
                             atol=1e-6)
  # And back: a decoder's config maps to causal attention.
  assert hf.hf_config_to_model_overrides(hf.model_to_hf_config(config))['causal'] is True


def encoder_of(config, batch):
  """(apply(params, batch) -> (sequence, pooled), params) of the config's encoder, jitted."""
  encoder = model_lib.BertModel(EncoderConfig.from_config(config))
  args = lambda b: (b['input_ids'], b['segment_ids'], b['input_mask'])  # noqa: E731
  params = jax.jit(encoder.init)(jax.random.key(0), *args(batch))
  return jax.jit(lambda p, b: encoder.apply(p, *args(b))), params


def test_a_later_token_does_not_change_earlier_outputs():
  batch = padded_batch()
  apply, params = encoder_of(clm_config(), batch)
  changed = dict(batch, input_ids=batch['input_ids'].copy())
  changed['input_ids'][:, 5] = 100  # Position 5 of every row (padding in the last row).
  a, b = (np.asarray(apply(params, x)[0]) for x in (batch, changed))
  np.testing.assert_array_equal(a[:, :5], b[:, :5])
  assert np.abs(a[:2, 5:] - b[:2, 5:]).max() > 1e-3  # Rows where 5 is real see the change.


def test_causal_pooler_reads_the_last_real_token():
  config = clm_config()
  batch = padded_batch()
  apply, params = encoder_of(config, batch)
  sequence, pooled = apply(params, batch)
  last = sequence[np.arange(3), np.array([10, 6, 3])]  # [batch, embed]
  pooler = model_lib.BertPooler(EncoderConfig.from_config(config))
  expected = pooler.apply({'params': params['params']['pooler']}, last)
  np.testing.assert_allclose(pooled, expected, atol=1e-6)


@pytest.mark.slow
def test_scan_and_remat_give_the_same_causal_loss_and_gradients():
  batch = padded_batch()
  model = steps.build_model(clm_config())
  params = jax.jit(model.init)(jax.random.key(0), batch)['params']

  def loss_and_grads(config, params):
    """The clm loss and its gradient, through the config's scan/remat settings."""
    model = steps.build_model(config)

    def loss(p):
      outputs = model.apply({'params': p}, batch)
      return objectives.total_loss([clm.OBJECTIVE], clm.losses(outputs, batch))
    return jax.jit(jax.value_and_grad(loss))(params)

  reference, grads = loss_and_grads(clm_config(), params)
  for remat in ('full', 'dots'):
    value, other = loss_and_grads(clm_config(remat_policy=remat), params)
    assert float(value) == pytest.approx(float(reference), abs=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), other, grads)
  stacked = params['bert']['encoder']['layer']
  unrolled = dict(params, bert=dict(params['bert'], encoder={
      f'layer_{i}': jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(2)}))
  value, _ = loss_and_grads(clm_config(scan_layers=False), unrolled)
  assert float(value) == pytest.approx(float(reference), abs=1e-5)


def test_targets_are_the_next_real_tokens():
  batch = {'input_ids': jnp.array([[2, 10, 11, 3, 0], [2, 12, 3, 0, 0]]),
           'input_mask': jnp.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])}
  labels, weights = clm.targets(batch)
  np.testing.assert_array_equal(labels, [[10, 11, 3, 0, 0], [12, 3, 0, 0, 0]])
  # The last real token ([SEP]) and the padding predict nothing.
  np.testing.assert_array_equal(weights, [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])


def test_losses_count_the_weighted_positions_only():
  batch = {'input_ids': jnp.array([[2, 7, 3, 0]]), 'input_mask': jnp.array([[1, 1, 1, 0]])}
  # Confident and right at position 0 (-> 7), wrong at 1 (-> 3), anything at 2 and 3.
  logits = jnp.full((1, 4, 9), -10.0).at[0, 0, 7].set(10.0).at[0, 1, 5].set(10.0)
  stats = clm.losses({'clm_logits': logits}, batch)
  assert float(stats['clm_weight']) == 2 and float(stats['clm_correct']) == 1
  fields = objectives.summarize([clm.OBJECTIVE], stats)
  assert fields['clm_accuracy'] == 0.5
  assert fields['clm_loss'] == pytest.approx(20.0 / 2, rel=1e-4)  # ~0 and ~20 nats.
  assert fields['loss'] == fields['clm_loss']


def test_flops_predict_at_every_position():
  config = micro_config(objectives='clm', **{'model.causal': True})
  m, s = config.model, config.data.max_seq_length
  h, f, v = m.hidden_size, m.intermediate_size, m.vocab_size
  design = 3 * (m.num_layers * (s * (8 * h * h + 4 * h * f) + 4 * s * s * h)
                + s * (2 * h * h + 2 * h * v) + 2 * h * h)
  assert metrics.model_flops_per_sequence(config) == design


DOCUMENTS = [[np.arange(10, 10 + n, dtype=np.int32) for n in (5, 7, 4, 6)] for _ in range(6)]


def settings_of(config, **more):
  cls = batching.StreamSettings if more else data_lib.MaskingSettings
  return cls.from_config(config, SPECIAL, 64, np.zeros(64, bool), objectives.resolve(config),
                         **more)


def test_in_memory_rows_of_a_clm_run_are_unmasked():
  config = micro_config(objectives='clm', **{'model.causal': True, 'masking.whole_word': True})
  settings = settings_of(config)
  assert settings.mask_rate == 0 and settings.is_continuation is None and not settings.nsp
  examples = pipeline.build_examples(DOCUMENTS, np.random.default_rng(0), settings)
  ids, mask = examples['input_ids'], examples['input_mask']
  assert not np.isin(ids, [SPECIAL.mask]).any() and not examples['masked_lm_weights'].any()
  text = ids[(mask > 0) & ~np.isin(ids, [SPECIAL.cls, SPECIAL.sep])]
  assert text.min() >= 10 and text.max() < 17  # The corpus' own tokens: nothing replaced.
  assert pipeline.most_frequent_label(examples) == 0  # No masked token to count.
  assert settings_of(micro_config(objectives='mlm')).mask_rate == 0.15  # MLM still masks.


@pytest.mark.parametrize('dupe_factor', [0, 2])
def test_streamed_rows_of_a_clm_run_are_unmasked(dupe_factor):
  config = micro_config(objectives='clm', **{'model.causal': True})
  settings = settings_of(config, batch_size=4, dupe_factor=dupe_factor)
  instances = data_lib.create_instances(DOCUMENTS, np.random.default_rng(0), max_seq_length=32,
                                        short_seq_prob=0.0, nsp=False)
  rows = [[(instance, (0, k), 0)] for k, instance in enumerate(instances[:4])]
  batch = batching.make_batch(rows, np.random.default_rng(1), settings)
  for r, row in enumerate(rows):
    ids, _ = data_lib.assemble(row[0][0], SPECIAL)
    np.testing.assert_array_equal(batch['input_ids'][r, :len(ids)], ids)
  assert not batch['masked_lm_weights'].any()


def test_validation_accepts_a_clm_run_with_unused_masking_values():
  config = clm_config()
  config.masking.update(rate=0.0, mask_token_fraction=0.5)  # Would not do for an MLM.
  config.data.max_predictions_per_seq = 1
  config_lib.validate(config)


@pytest.mark.parametrize('objective_names,model,match', [
    ('clm', {'causal': False}, r"objectives='clm' needs causal attention .*"
                               r"set config\.model\.causal=True \(got False\)"),
    ('mlm', {}, r"objectives='mlm' needs bidirectional attention, but config\.model\.causal=True"),
    ('mlm,nsp', {}, r"needs bidirectional attention.*objectives='clm'"),
    ('mlm,clm', {}, r"mixes objectives of causal attention \(clm\) and of bidirectional "
                    r"attention \(mlm\)"),
    ('clm', {'attention_impl': 'cudnn'},
     r"causal=True needs config\.model\.attention_impl='xla' \(got 'cudnn'\)"),
    ('clm', {'attention_impl': 'pallas'},
     r"causal=True needs config\.model\.attention_impl='xla' \(got 'pallas'\)"),
])
def test_attention_that_does_not_fit_the_objectives_is_refused(objective_names, model, match):
  config = clm_config(**model)
  config.objectives = objective_names
  assert_refused(config, match)


def test_causal_packing_is_refused():
  config = clm_config()
  config.data.packing = True
  assert_refused(config, r'packing=True with config\.model\.causal')


def test_causal_fine_tuning_refuses_fused_attention():
  config = glue.get_config()
  config.model.update(causal=True, attention_impl='cudnn')
  with pytest.raises(config_lib.ConfigError, match=r"attention_impl='xla' \(got 'cudnn'\)"):
    config_lib.validate_finetune(config)


def test_mlm_with_a_zero_mask_rate_is_refused():
  config = base.get_config('corpus=builtin')
  config.masking.rate = 0.0
  assert_refused(config, r'masking\.rate=0 masks no token')


@pytest.fixture(scope='module')
def clm_workdir(tmp_path_factory):
  return micro_run(tmp_path_factory.mktemp('clm'), objectives='clm', **{
      'model.causal': True, 'train.num_steps': 30, 'train.log_every': 10,
      'train.eval_every': 30, 'train.checkpoint_every': 30})


@pytest.mark.slow
def test_clm_pretraining_logs_a_falling_clm_loss(clm_workdir):
  records = run_records(clm_workdir)
  evals, train = records['eval'], records['train']
  assert [r['step'] for r in evals] == [0, 30] and len(train) == 3
  assert all('clm_loss' in r and 'mlm_loss' not in r for r in evals + train)
  assert evals[-1]['clm_loss'] < evals[0]['clm_loss'] - 0.1  # 6.93 (ln 1024) -> 6.68.
  assert train[-1]['clm_loss'] < train[0]['clm_loss']
  assert set(init_from.workdir_params(clm_workdir)) == {'bert', 'predictions'}


@pytest.mark.slow
def test_fine_tuning_from_a_clm_workdir_adopts_causal_attention(clm_workdir):
  config = finetune.get_config()
  config.init_from = clm_workdir
  assert not config.model.causal
  init_from.adopt_source(config)
  assert config.model.causal is True and config.model.hidden_size == 32

"""ALBERT ('albert') and SOP beyond what every family owes (tests/conformance/): transformers'
AlbertForPreTraining in and out, one shared layer under scan or not, remat and every sharding
preset, the recipe's counts, FLOPs with SOP, and a pretraining step."""

import functools
import json
import os
import subprocess
import sys

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hf_parity
import sharding_check
from conftest import dot_flops, random_pretraining_batch
from bert_jax import config_lib
from bert_jax import models
from bert_jax import objectives
from bert_jax.interop import hf
from bert_jax.interop import init_from
from bert_jax.train import metrics
from bert_jax.train import step as steps
from configs import albert, base, tiny
from hf_parity import max_diff, torch, transformers


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Odd sizes (none of BERT's tests' sizes), E apart from H so a missing projection cannot pass.
HF_SIZES = dict(num_hidden_layers=3, hidden_size=48, num_attention_heads=3, intermediate_size=80,
                vocab_size=97, embedding_size=24, max_position_embeddings=16, type_vocab_size=2,
                hidden_act='gelu_new')
IMPORT_TOLERANCE, EXPORT_TOLERANCE = 1e-4, 1e-5


@pytest.fixture(scope='module')
def hf_model(tmp_path_factory):
  """(a random AlbertForPreTraining in eval mode, the dir it was saved to)."""
  return hf_parity.saved_models(tmp_path_factory, {'albert': transformers.AlbertConfig(
      **HF_SIZES)}, transformers.AlbertForPreTraining)['albert']


def our_config(scan_layers=True, objective_names='mlm,sop', **model):
  """configs/base.py shaped and named as HF_SIZES' ALBERT."""
  return hf_parity.our_config(transformers.AlbertConfig(**HF_SIZES).to_dict(), objective_names,
                              scan_layers, **model)


@pytest.fixture(scope='module', name='inputs')
def fixture_inputs():
  """(ids, segments, mask, positions): 3 x 13 ids, padding in two rows, 4 predictions a row."""
  return hf_parity.as_tuple(hf_parity.batch(HF_SIZES))


# (MLM logits, SOP logits or None, last hidden states) of transformers' ALBERT and ours.
run_hf, run_ours = hf_parity.hf_pretraining_outputs, hf_parity.our_pretraining_outputs


def diffs(ours, theirs):
  return {name: max_diff(a, b) for name, a, b in zip(('mlm', 'sop', 'hidden'), ours, theirs)
          if a is not None or b is not None}


@pytest.mark.parametrize('scan_layers', [True, pytest.param(False, marks=pytest.mark.slow)])
def test_pretraining_checkpoint_imports_and_matches_transformers(hf_model, inputs, scan_layers):
  config = our_config(scan_layers)
  assert (config.model.name, config.model.embedding_size, config.model.gelu) == (
      'albert', 24, 'tanh')
  state_dict, hf_config = hf.load_hf_state_dict(hf_model[1])
  params, report = hf.import_hf(state_dict, config, hf_config=hf_config)
  assert report.layout == 'AlbertForPreTraining' and not report.missing_heads
  found = diffs(run_ours(params, config, inputs), run_hf(hf_model[0], inputs))
  assert max(found.values()) < IMPORT_TOLERANCE, found


def test_a_masked_lm_checkpoint_into_an_sop_run_names_what_it_lacks(hf_model, tmp_path):
  """AlbertForMaskedLM (no pooler, no SOP; its import and AlbertModel's: conformance/) into an
  'mlm,sop' run: the missing SOP head is named, with the way out."""
  masked_lm = transformers.AlbertForMaskedLM(transformers.AlbertConfig(**HF_SIZES)).eval()
  masked_lm.load_state_dict(hf_model[0].state_dict(), strict=False)
  masked_lm.save_pretrained(str(tmp_path / 'mlm'))
  state_dict, hf_config = hf.load_hf_state_dict(str(tmp_path / 'mlm'))
  with pytest.raises(hf.CheckpointMismatchError, match=r'missing key sop_classifier.*MLM-only'):
    hf.import_hf(state_dict, our_config(), hf_config=hf_config)


def test_export_with_sop_loads_in_transformers_and_round_trips(inputs, tmp_path):
  """AlbertForPreTraining, SOP's head and the pooler it reads included (AlbertForMaskedLM:
  conformance/)."""
  config = our_config()
  params = hf.init_params(config, seed=3)
  hf.export_hf(params, config, str(tmp_path))
  written = json.loads((tmp_path / 'config.json').read_text())
  assert written['model_type'] == 'albert' and written['architectures'] == ['AlbertForPreTraining']
  assert written['embedding_size'] == 24 and written['hidden_act'] == 'gelu_new'
  loaded, info = transformers.AlbertForPreTraining.from_pretrained(str(tmp_path),
                                                                   output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'] and not info['mismatched_keys']
  found = diffs(run_ours(params, config, inputs), run_hf(loaded.eval(), inputs))
  assert max(found.values()) < EXPORT_TOLERANCE, found
  state_dict, hf_config = hf.load_hf_state_dict(str(tmp_path))
  again, _ = hf.import_hf(state_dict, config, hf_config=hf_config)
  assert jax.tree.structure(again) == jax.tree.structure(params)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                  jax.tree.leaves(again)))


def abstract_params(config, boxed=False):
  model = steps.build_model(config)
  variables = jax.eval_shape(functools.partial(model.init, deterministic=True),
                             {'params': jax.random.key(0)},
                             steps.dummy_batch(1, 8, 2, objectives=model.objectives))
  return variables['params'] if boxed else nn.meta.unbox(variables['params'])


def num_params(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def test_one_layer_of_parameters_whatever_the_depth_or_scan():
  trees = {(layers_, scan): abstract_params(our_config(scan, num_layers=layers_))
           for layers_ in (2, 5) for scan in (True, False)}
  shapes = {k: jax.tree.map(lambda x: x.shape, v) for k, v in trees.items()}
  assert len({jax.tree.structure(t) for t in shapes.values()}) == 1
  assert len({str(t) for t in shapes.values()}) == 1  # The same shapes too.
  encoder = trees[(5, True)]['bert']['encoder']
  assert set(encoder) == {'embedding_hidden_mapping_in', 'shared_layer'}
  assert encoder['shared_layer']['intermediate']['dense']['kernel'].shape == (48, 80)


def test_shared_layer_params_carry_bert_s_logical_axes_without_layers():
  albert_axes = flax.traverse_util.flatten_dict(abstract_params(our_config(), boxed=True))
  bert = base.get_config('layers=2')
  bert_axes = flax.traverse_util.flatten_dict(abstract_params(bert, boxed=True))
  layer = {k[3:]: v.names for k, v in bert_axes.items() if k[:3] == ('bert', 'encoder', 'layer')}
  shared = {k[3:]: v.names for k, v in albert_axes.items()
            if k[:3] == ('bert', 'encoder', 'shared_layer')}
  assert layer and shared == {k: names[1:] for k, names in layer.items()}
  assert all(names[0] == 'layers' for names in layer.values())
  for path, leaf in albert_axes.items():
    assert isinstance(leaf, nn.LogicallyPartitioned) and len(leaf.names) == leaf.value.ndim, path


@pytest.mark.slow
def test_scan_remat_and_unrolled_layers_compute_the_same_function(inputs):
  params = hf.init_params(our_config(), seed=2)
  reference = run_ours(params, our_config(), inputs)
  for scan, remat in ((False, 'none'), (True, 'full'), (False, 'dots'), (True, 'dots')):
    found = diffs(run_ours(params, our_config(scan, remat_policy=remat), inputs), reference)
    assert max(found.values()) < 1e-5, (scan, remat, found)


def grads(config, params, batch):
  model = steps.build_model(config)
  loss = steps.pretraining_loss_fn(model)
  rngs = {'dropout': jax.random.PRNGKey(0)}
  return jax.jit(jax.grad(lambda p: loss(p, batch, rngs)[0]))(params)


@pytest.mark.slow
def test_gradients_agree_under_scan_remat_and_unrolled_layers():
  """The shared layer's gradient is the sum over its applications however it is computed."""
  config = our_config()
  params = hf.init_params(config, seed=2)
  batch = random_pretraining_batch(config, seq=12, predictions=3, vocab=97)
  reference = grads(config, params, batch)
  for scan, remat in ((False, 'none'), (True, 'full')):
    found = grads(our_config(scan, remat_policy=remat), params, batch)
    assert max(max_diff(a, b) for a, b in zip(jax.tree.leaves(found),
                                              jax.tree.leaves(reference))) < 1e-5


def test_sop_objective_is_nsp_s_contract_with_its_own_head():
  sop = objectives.get('sop')
  assert sop.instances == 'pairs' and not sop.masks_inputs
  shape = objectives.BatchShape(16, 3)
  assert sop.batch_spec(shape) == objectives.get('nsp').batch_spec(shape)
  packed = objectives.BatchShape(16, 3, max_pairs_per_row=2)
  assert set(sop.batch_spec(packed)) == {'next_sentence_labels', 'nsp_positions', 'nsp_weights'}
  config = tiny.get_config()
  config.objectives = 'mlm,sop'
  assert objectives.resolve(config).sentence_pairs
  with pytest.raises(ValueError, match='nsp and sop, each a label of the same sentence pair'):
    objectives.parse('mlm,nsp,sop')
  logits = jnp.array([[2.0, 0.0], [0.0, 1.0], [1.0, 3.0]])
  stats = sop.losses({'sop_logits': logits}, {'next_sentence_labels': jnp.array([0, 0, 1])})
  fields = sop.metrics({k: float(v) for k, v in stats.items()})
  expected = np.mean([np.log1p(np.exp(-2.0)), np.log1p(np.exp(1.0)), np.log1p(np.exp(-2.0))])
  assert fields['sop_accuracy'] == pytest.approx(2 / 3)
  assert fields['sop_loss'] == pytest.approx(expected, rel=1e-5)
  assert sop.counts({'next_sentence_labels': jnp.array([0, 0, 1])})['sop_count'] == 3


def test_init_from_adopts_albert_and_loads(hf_model, tmp_path):
  config = base.get_config()
  config.objectives = 'mlm,sop'
  config.init_from = f'hf:{hf_model[1]}'
  config.data.vocab_file = str(tmp_path / 'spiece.model')
  init_from.adopt_source(config)
  m = config.model
  assert (m.name, m.embedding_size, m.hidden_size, m.num_layers, m.vocab_size) == (
      'albert', 24, 48, 3, 97)
  fresh = hf.init_params(config, seed=1)
  params = init_from.load_params(config, fresh)
  state_dict, hf_config = hf.load_hf_state_dict(hf_model[1])
  direct, _ = hf.import_hf(state_dict, config, hf_config=hf_config)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params),
                                                  jax.tree.leaves(direct)))


@pytest.mark.slow
def test_a_pretraining_step_runs_on_cpu_with_mlm_and_sop():
  config = tiny.get_config()
  config.objectives = 'mlm,sop'
  config.model.update(name='albert', embedding_size=32, gelu='tanh')
  config.train.update(learning_rate=1e-2, warmup_steps=1, num_steps=10, batch_size=4)
  config_lib.validate(config)
  losses, _, stats = sharding_check.train(config, [random_pretraining_batch(config, vocab=97)] * 3,
                                          jax.devices()[:1])
  fields = steps.summarize(steps.build_model(config),
                           {k: v for k, v in stats.items() if k.startswith(('mlm_', 'sop_'))})
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  assert {'mlm_loss', 'mlm_accuracy', 'sop_loss', 'sop_accuracy', 'loss'} <= set(fields)


# On 8 fake CPU devices: each preset on a (data 2, fsdp 2, tensor 2) mesh against one device, the
# layer scanned under full remat; and unrolled under the preset that splits the most.
SHARDING_CASES = [(preset, True, 'full') for preset in ('data', 'fsdp', 'fsdp_tensor')] + [
    ('fsdp_tensor', False, 'none')]
SHARDING_SCRIPT = """
import json, sys
import jax
import sharding_check

def albert(preset, mesh, scan, remat):
  config = sharding_check.micro_config(preset, mesh)
  config.objectives = 'mlm,sop'
  config.model.update(name='albert', embedding_size=16, scan_layers=scan, remat_policy=remat)
  return config

batches = sharding_check.random_batches(sharding_check.NUM_STEPS)
out = []
for preset, scan, remat in json.loads(sys.argv[1]):
  ref_losses, ref_state, _ = sharding_check.train(albert(preset, (1, 1, 1), scan, remat),
                                                  batches, jax.devices()[:1])
  losses, state, _ = sharding_check.train(albert(preset, (2, 2, 2), scan, remat), batches,
                                          jax.devices())
  reference = (ref_losses, jax.tree.leaves(jax.device_get(ref_state.params)))
  kernel = state.params['bert']['encoder']['shared_layer']['intermediate']['dense']['kernel']
  out.append({'diff': sharding_check.max_diffs(reference, losses, state),
              'spec': sharding_check.describe(kernel)['spec']})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_every_sharding_preset_trains_as_one_device():
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join([REPO, os.path.join(REPO, 'tests')]),
         'XLA_FLAGS': ' '.join([os.environ.get('XLA_FLAGS', ''),  # conftest's fast codegen
                                '--xla_force_host_platform_device_count=8']),
         'JAX_PLATFORMS': 'cpu'}
  result = subprocess.run([sys.executable, '-c', SHARDING_SCRIPT, json.dumps(SHARDING_CASES)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
                          check=False)
  assert result.returncode == 0, result.stderr[-4000:]
  found = json.loads(result.stdout.strip().splitlines()[-1])
  for case, outcome in zip(SHARDING_CASES, found):
    assert outcome['diff']['loss'] < 1e-5 and outcome['diff']['params'] < 1e-5, (case, outcome)
  # The shared layer's [embed, mlp] kernel: replicated, embed over fsdp, and mlp over tensor.
  assert [o['spec'] for o in found] == [[None, None], ['fsdp', None], ['fsdp', 'tensor'],
                                        ['fsdp', 'tensor']]


def test_configs_have_the_papers_shapes_and_recipe():
  for size, (layers, hidden, heads_) in {'base': (12, 768, 12), 'large': (24, 1024, 16),
                                         'xlarge': (24, 2048, 16)}.items():
    config = albert.get_config(f'size={size}')
    m, t, d = config.model, config.train, config.data
    assert (m.name, m.vocab_size, m.embedding_size, m.num_layers, m.hidden_size, m.num_heads,
            m.intermediate_size) == ('albert', 30000, 128, layers, hidden, heads_, 4 * hidden)
    assert config.objectives == 'mlm,sop'
    assert (t.optimizer, t.learning_rate, t.batch_size, t.num_steps, t.warmup_steps) == (
        'lamb', 0.00176, 4096, 125_000, 3125)
    assert t.batch_size % t.grad_accum_steps == 0
    assert (d.tokenizer, d.lowercase) == ('sentencepiece', True)
    d.corpus = 'builtin'
    config_lib.validate(config)


@pytest.mark.parametrize('size,millions', [('base', 12), ('large', 18)])
def test_parameter_counts_equal_transformers(size, millions):
  config = albert.get_config(f'size={size}')
  params = abstract_params(config)
  hf_config = transformers.AlbertConfig(**{
      k: v for k, v in hf.model_to_hf_config(config).items() if k != 'architectures'})
  with torch.device('meta'):
    theirs = transformers.AlbertForPreTraining(hf_config)
  count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
  assert num_params(params['bert']) == count(theirs.albert)  # The pooler in both.
  assert num_params(params['sop_classifier']) == count(theirs.sop_classifier)
  assert num_params(params) == count(theirs)  # The decoder tied to the embeddings in both.
  assert round(num_params(params) / 1e6) == millions  # The paper's Table 1.


@pytest.mark.parametrize('scan', [True, pytest.param(False, marks=pytest.mark.slow)])
def test_flops_are_the_matmuls_the_model_runs(scan):
  """The family's FLOPs (the encoder: every application of the shared layer, and the E -> H
  projection) and MLM's (H -> E, E-wide logits) equal the dot products XLA is given."""
  config = our_config(scan, objective_names='mlm,sop')
  s, p = 13, 4
  config.data.update(max_seq_length=s, max_predictions_per_seq=p)
  model = steps.build_model(config)
  params = hf.init_params(config)
  batch = {k: jnp.zeros(v.shape, v.dtype)  # One sequence: the formulas are per sequence.
           for k, v in steps.dummy_batch(1, s, p, objectives=model.objectives).items()}
  encoder = models.get('albert').encoder(model.config)
  encoder_jaxpr = jax.make_jaxpr(lambda q: encoder.apply(
      {'params': q['bert']}, batch['input_ids'], batch['segment_ids'], batch['input_mask']))
  whole_jaxpr = jax.make_jaxpr(lambda q: model.apply({'params': q}, batch))
  family = models.get('albert').flops(config.model, s)
  assert dot_flops(encoder_jaxpr(params).jaxpr) == family
  heads_ = objectives.get('mlm').flops(config.model, steps.batch_shape(config))
  gather = 2 * p * s * config.model.hidden_size  # gather_positions' one-hot product, uncounted.
  sop = 2 * 2 * config.model.hidden_size  # Two logits, uncounted as NSP's.
  assert dot_flops(whole_jaxpr(params).jaxpr) == family + heads_ + gather + sop
  h, e, f, n, v = 48, 24, 80, 3, 97
  assert metrics.model_flops_per_sequence(config) == 3 * (
      n * (s * (8 * h * h + 4 * h * f) + 4 * s * s * h) + 2 * h * h + s * 2 * e * h
      + p * (2 * h * e + 2 * e * v))

"""What every registered family owes, checked over models.available(): a family registered before
collection (a built-in one, or one a plugin registers: test_conformance_proof.py) is checked
here with no edit to this file.

With a Hugging Face layout: a random odd-sized transformers model of the family's masked-LM class
(transformers' default settings otherwise) imports with its logits, our random model exports and
loads in transformers with its logits and re-imports bit-identical, and the parameter counts are
equal. Every family: its FLOPs are the dot products its encoder's jaxpr runs, scanned or not, and
its scanned stack computes the unrolled one's logits and gradients.
"""

import flax.linen as nn
import jax
from jax._src.interpreters import partial_eval as pe  # dce_jaxpr: no public form.
import numpy as np
import pytest

import hf_parity
from conftest import dot_flops
from bert_jax import models
from bert_jax.interop import hf
from bert_jax.interop import init_from
from bert_jax.interop import param_tree
from bert_jax.models import architecture
from bert_jax.models import heads
from bert_jax.models import hf_layout
from bert_jax.train import finetune
from bert_jax.train import step as steps
from configs import base

torch, transformers = hf_parity.torch, hf_parity.transformers

FAMILIES = models.available()


def owns_its_model_type(name: str) -> bool:
  """Whether the family's HF layout is the one its config.json's model_type leads to (a family
  that borrows another's model_type cannot import that type's checkpoints as its own)."""
  if not hf_parity.has_layout(name):
    return False
  model_type = hf_layout.for_family(name).model_type
  return hf_layout.for_hf_config({'model_type': model_type}).family == name


HF_FAMILIES = [name for name in FAMILIES if owns_its_model_type(name)]


@pytest.fixture(scope='module', name='saved')
def fixture_saved(tmp_path_factory):
  """family name -> (its random transformers model, the directory it is saved in, config.json),
  each built once."""
  cache = {}

  def saved(name):
    if name not in cache:
      hf_config = hf_parity.family_hf_config(name)
      directory = str(tmp_path_factory.mktemp(name))
      cache[name] = hf_parity.random_model(hf_config, directory), directory, hf_config
    return cache[name]
  return saved


@pytest.mark.parametrize('name', HF_FAMILIES)
def test_import_gives_transformers_mlm_logits(saved, name):
  model, directory, hf_config = saved(name)
  _, report = hf_parity.assert_imports(model, directory, hf_parity.family_config(name))
  assert report.layout == hf_config['architectures'][0], report.layout
  assert set(report.missing_heads) <= {'bert/pooler'}, report.missing_heads


@pytest.mark.parametrize('name', HF_FAMILIES)
def test_export_loads_in_transformers_and_round_trips(name, tmp_path):
  config = hf_parity.family_config(name)
  hf_parity.assert_exports(hf_parity.random_params(config), config, tmp_path / 'hf')


@pytest.mark.parametrize('name', HF_FAMILIES)
def test_parameter_count_equals_transformers(name):
  config = hf_parity.family_config(name)
  hf_config = hf.model_to_hf_config(config)
  with torch.device('meta'):
    theirs = hf_parity.hf_class(hf_config)(hf_parity.hf_config_object(hf_config))
  assert hf_parity.exported_count(config) == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize('scan_layers', [True, False])
@pytest.mark.parametrize('name', FAMILIES)
def test_flops_are_the_dot_products_the_encoder_runs(name, scan_layers):
  """Family.flops of one sequence equals 2 x the multiply-adds of every dot_general the
  encoder's jaxpr runs for its sequence output (a scanned body times its layers), with its pooler
  or without (a pooler runs in pretraining only under a sentence objective)."""
  config = hf_parity.family_config(name, scan_layers)
  length = hf_parity.LENGTH
  config.data.max_seq_length = length
  model = steps.build_model(config)
  family = models.get(name)
  inputs = {k: v[:1] for k, v in hf_parity.batch({'vocab_size': 97}).items()}
  params = nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), inputs)['params'])
  encoder = family.encoder(model.config)
  both = jax.make_jaxpr(lambda p: encoder.apply(
      {'params': p[family.scope]}, inputs['input_ids'], inputs['segment_ids'],
      inputs['input_mask']))(params).jaxpr
  sequence, _ = pe.dce_jaxpr(both, [True, False])
  counted = family.flops(config.model, length)
  assert counted in (dot_flops(sequence), dot_flops(both)), (
      counted, dot_flops(sequence), dot_flops(both))


@pytest.mark.slow
@pytest.mark.parametrize('name', FAMILIES)
def test_a_scanned_stack_computes_the_unrolled_one(name):
  """The same parameters, stacked for scan: MLM logits and every parameter's gradient equal the
  unrolled stack's (dropout off)."""
  unrolled, scanned = hf_parity.family_config(name, scan_layers=False), hf_parity.family_config(name)
  inputs = hf_parity.batch({'vocab_size': 97, 'type_vocab_size': unrolled.model.get(
      'type_vocab_size', 0)})
  hf_parity.assert_scanned_equals_unrolled(hf_parity.random_params(unrolled), unrolled, scanned,
                                           inputs)


@pytest.mark.slow
@pytest.mark.parametrize('name', HF_FAMILIES)
def test_the_backbone_class_imports_without_heads(name, tmp_path):
  """The family's base class (BertModel, ...): the heads named missing, the encoder's sequence
  output transformers' last hidden state on the real tokens, and its pooler's output where the
  class has a pooler."""
  layout = hf_layout.for_family(name)
  hf_config = hf_parity.family_hf_config(name)
  model = hf_parity.random_model(hf_config, str(tmp_path),
                                 cls=getattr(transformers, layout.base_class))
  config = hf_parity.family_config(name)
  params, report = hf_parity.imported(str(tmp_path), config)
  assert report.layout == layout.base_class
  family = models.get(name)
  heads_ = {path.split('/')[0] for path in hf.leaf_shapes(config)} - {family.scope}
  assert set(report.missing_heads) - {'bert/pooler'} == heads_, report.missing_heads
  inputs = hf_parity.batch(hf_config)
  sequence, pooled = family.encoder(steps.build_model(config).config).apply(
      {'params': params[family.scope]}, inputs['input_ids'], inputs['segment_ids'],
      inputs['input_mask'])
  theirs = hf_parity.hf_outputs(model, hf_parity.as_tuple(inputs))
  real = inputs['input_mask'] > 0
  assert hf_parity.max_diff(np.asarray(sequence)[real],
                            theirs.last_hidden_state.numpy()[real]) < hf_parity.IMPORT_TOLERANCE
  if getattr(theirs, 'pooler_output', None) is not None:
    assert 'bert/pooler' not in report.missing_heads
    assert hf_parity.max_diff(pooled, theirs.pooler_output.numpy()) < hf_parity.IMPORT_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize('name', HF_FAMILIES)
def test_init_from_an_hf_directory_adopts_the_family_and_loads_its_weights(saved, name, tmp_path):
  """init_from='hf:DIR' on BERT's config: the family, its architecture keys and its vocab's
  tokenizer kind come from config.json; the weights loaded are the import's."""
  _, directory, _ = saved(name)
  config = base.get_config('corpus=builtin')
  config.objectives = 'mlm'
  config.init_from = f'hf:{directory}'
  config.data.vocab_file = str(tmp_path / 'vocab')  # The tokenizer's files are not the test's.
  init_from.adopt_source(config)
  expected = hf_parity.family_config(name)
  assert {k: config.model[k] for k in architecture.ARCHITECTURE_KEYS} == {
      k: expected.model[k] for k in architecture.ARCHITECTURE_KEYS}
  layout = hf_layout.for_family(name)
  assert init_from.source_tokenizer(config.init_from)[0] == layout.tokenizer
  params = init_from.load_params(config, hf.init_params(config, seed=1))
  direct, _ = hf_parity.imported(directory, config)
  flat, expected_flat = param_tree.flatten(params), param_tree.flatten(direct)
  assert flat.keys() == expected_flat.keys()
  for key, value in expected_flat.items():
    if not key.startswith('bert/pooler/'):  # A masked-LM class has none: a fresh one.
      np.testing.assert_array_equal(flat[key], value, err_msg=key)


@pytest.mark.slow
@pytest.mark.parametrize('name', HF_FAMILIES)
def test_each_fine_tuning_head_runs_on_the_encoder_of_an_hf_directory(saved, name):
  """init_from='hf:DIR': the encoder fine-tuning loads is the import's, and the heads that read
  the family's pooled state (classification, multiple choice) run on it; the token and span
  heads read the sequence output, which the imports above compare."""
  _, directory, hf_config = saved(name)
  config = hf_parity.family_config(name)
  config.init_from = f'hf:{directory}'
  inputs = hf_parity.batch(hf_config)
  ids, segments, mask = inputs['input_ids'], inputs['segment_ids'], inputs['input_mask']
  cfg = models.get(name).config_from(config)
  for head, outputs, key, shape in (('classification', 3, 'logits', (3, 3)),
                                    ('multiple_choice', 1, 'logits', (1, 3))):
    rows = [x[None] if head == 'multiple_choice' else x for x in (ids, segments, mask)]
    model = heads.BertForFineTuning(cfg, head, outputs, model=name)
    variables = model.init(jax.random.PRNGKey(0), *rows)
    out = np.asarray(model.apply(variables, *rows)[key])
    assert out.shape == shape and np.all(np.isfinite(out)), (head, out.shape)
  encoder = finetune.load_encoder_params(config, heads.BertForFineTuning(
      cfg, 'classification', 3, model=name))
  direct, _ = hf_parity.imported(directory, config)
  loaded, expected = param_tree.flatten(encoder), param_tree.flatten(direct[models.get(name).scope])
  # A masked-LM class without a pooler leaves it to the fine-tuning model's fresh init.
  assert set(loaded) <= set(expected) and all(
      k.startswith('pooler/') for k in set(expected) - set(loaded)), set(expected) ^ set(loaded)
  for key, value in loaded.items():
    np.testing.assert_array_equal(value, expected[key], err_msg=key)

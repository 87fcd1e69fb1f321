"""ELECTRA and transformers beyond what every family owes (tests/conformance/):
ElectraForPreTraining (discriminator) and ElectraForMaskedLM (generator) in; an ELECTRA run out
as both; fine-tuning from an HF discriminator equal to ElectraForSequenceClassification."""

import os

import jax
import numpy as np
import pytest

import hf_parity
from bert_jax import sharding
from bert_jax.interop import hf
from bert_jax.interop import param_tree
from bert_jax.models import electra
from bert_jax.models import sharing
from bert_jax.train import finetune
from bert_jax.train import step as steps
from configs import glue as glue_config
from hf_parity import max_diff, randomise, torch, transformers


# Odd sizes: vocab 103, E 24 apart from H 40 (5 heads) so a missing projection cannot pass.
HF_SIZES = dict(num_hidden_layers=2, hidden_size=40, num_attention_heads=5, intermediate_size=72,
                vocab_size=103, embedding_size=24, max_position_embeddings=16, type_vocab_size=2)
# A generator of the same E: H_g 10 (one head, feed-forward 40), as generator_fraction 0.25.
GEN_SIZES = dict(HF_SIZES, hidden_size=10, num_attention_heads=1, intermediate_size=40)
IMPORT_TOLERANCE, EXPORT_TOLERANCE = 1e-4, 1e-5


def save(model, tmp_path_factory, name):
  directory = str(tmp_path_factory.mktemp(name))
  model.save_pretrained(directory)
  return model, directory


@pytest.fixture(scope='module')
def discriminator(tmp_path_factory):
  return save(randomise(transformers.ElectraForPreTraining(
      transformers.ElectraConfig(**HF_SIZES))), tmp_path_factory, 'disc')


@pytest.fixture(scope='module')
def generator(tmp_path_factory):
  return save(randomise(transformers.ElectraForMaskedLM(
      transformers.ElectraConfig(**GEN_SIZES))), tmp_path_factory, 'gen')


def our_config(hf_sizes, objective_names, **model):
  return hf_parity.our_config(transformers.ElectraConfig(**hf_sizes).to_dict(), objective_names,
                              **model)


@pytest.fixture(scope='module')
def inputs():
  """3 x 13 ids with padding in two rows, two segments, 4 prediction positions a row."""
  return hf_parity.as_tuple(hf_parity.batch(HF_SIZES))


def run_hf(model, inputs):
  out = hf_parity.hf_outputs(model, inputs)
  return out.logits.numpy(), out.hidden_states[-1].numpy()


def run_ours(params, config, inputs):
  """(the head's logits: the discriminator's per token, or the MLM's at the positions; the
  encoder's output). No masked predictions: the generator replaces nothing."""
  ids, segments, mask, positions = inputs
  model = steps.build_model(config)
  batch = {'input_ids': ids, 'segment_ids': segments, 'input_mask': mask,
           'masked_lm_positions': positions, 'masked_lm_ids': np.zeros_like(positions),
           'masked_lm_weights': np.zeros(positions.shape, np.float32)}
  out = model.apply({'params': params}, batch)
  sequence = electra.ElectraModel(model.config).apply({'params': params['bert']}, ids, segments,
                                                      mask)[0]
  logits = out['rtd_disc_logits'] if 'rtd_disc_logits' in out else out['mlm_logits']
  return np.asarray(logits), np.asarray(sequence)


def import_dir(directory, config):
  state_dict, hf_config = hf.load_hf_state_dict(directory)
  params, report = hf.import_hf(state_dict, config, hf_config=hf_config)
  return hf.merge_missing(params, hf.init_params(config), config), report


def test_electra_for_pretraining_imports_and_matches_transformers(discriminator, inputs):
  model, directory = discriminator
  config = our_config(HF_SIZES, 'rtd')
  params, report = import_dir(directory, config)
  assert report.layout == 'ElectraForPreTraining'
  assert set(report.missing_heads) == {'generator', 'generator_predictions', 'bert/pooler'}
  logits, hidden = run_ours(params, config, inputs)
  theirs, their_hidden = run_hf(model, inputs)
  mask = inputs[2] > 0
  differences = (max_diff(logits[mask], theirs[mask]), max_diff(hidden[mask], their_hidden[mask]))
  print(f'ElectraForPreTraining import: logits {differences[0]:.1e}, hidden {differences[1]:.1e}')
  assert max(differences) < IMPORT_TOLERANCE
  assert np.std(theirs[mask]) > 1e-2


def test_electra_for_masked_lm_imports_as_a_generator_and_matches(generator, inputs):
  model, directory = generator
  config = our_config(GEN_SIZES, 'mlm')
  params, report = import_dir(directory, config)
  assert report.layout == 'ElectraForMaskedLM'
  logits, hidden = run_ours(params, config, inputs)
  theirs, their_hidden = run_hf(model, inputs)
  theirs = np.take_along_axis(theirs, inputs[3][..., None], axis=1)
  mask = inputs[2] > 0
  differences = (max_diff(logits, theirs), max_diff(hidden[mask], their_hidden[mask]))
  print(f'ElectraForMaskedLM import: logits {differences[0]:.1e}, hidden {differences[1]:.1e}')
  assert max(differences) < IMPORT_TOLERANCE


@pytest.mark.parametrize('embedding_sharing', ['shared', 'gdes'])
def test_an_electra_run_exports_its_discriminator_and_generator(tmp_path, inputs,
                                                                embedding_sharing):
  # Under 'gdes' the random deltas and the discriminator's own LayerNorm must reach the
  # exported discriminator, and not the generator.
  config = our_config(HF_SIZES, 'rtd', generator_fraction=0.25,
                      embedding_sharing=embedding_sharing)
  params = hf.init_params(config, seed=3)
  # Random values everywhere (zero biases would hide a swapped leaf).
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(1)
  params = jax.tree.unflatten(tree, [rng.normal(size=x.shape).astype(np.float32) * 0.05 + x
                                     for x in leaves])
  out = str(tmp_path / 'export')
  hf.export_hf(params, config, out)
  disc_dir, gen_dir = hf.export_dirs(config, out)
  # transformers loads both without a missing, unexpected or misshapen key.
  for cls, directory in ((transformers.ElectraForPreTraining, disc_dir),
                         (transformers.ElectraForMaskedLM, gen_dir)):
    loaded, info = cls.from_pretrained(directory, output_loading_info=True)
    assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys')), info
  disc = transformers.ElectraForPreTraining.from_pretrained(disc_dir).eval()
  gen = transformers.ElectraForMaskedLM.from_pretrained(gen_dir).eval()
  assert gen.config.hidden_size == 10 and gen.config.embedding_size == 24
  mask = inputs[2] > 0
  # The discriminator: ours (no replacements) against transformers.
  logits, hidden = run_ours(params, config, inputs)
  theirs, their_hidden = run_hf(disc, inputs)
  differences = [max_diff(logits[mask], theirs[mask]), max_diff(hidden[mask], their_hidden[mask])]
  # The generator: our MLM head's logits in the run against ElectraForMaskedLM's.
  model = steps.build_model(config)
  ids, segments, input_mask, positions = inputs
  batch = {'input_ids': ids, 'segment_ids': segments, 'input_mask': input_mask,
           'masked_lm_positions': positions, 'masked_lm_ids': np.zeros_like(positions),
           'masked_lm_weights': np.ones(positions.shape, np.float32)}
  ours_gen = np.asarray(model.apply({'params': params}, batch)['rtd_gen_logits'])
  their_gen = np.take_along_axis(run_hf(gen, inputs)[0], positions[..., None], axis=1)
  differences.append(max_diff(ours_gen, their_gen))
  print('ELECTRA export -> transformers: discriminator logits %.1e, hidden %.1e, generator '
        'logits %.1e' % tuple(differences))
  assert max(differences) < EXPORT_TOLERANCE
  # Both re-import bit for bit (the discriminator as it reads its tables).
  again, _ = import_dir(disc_dir, our_config(HF_SIZES, 'rtd', generator_fraction=0.25))
  disc_params = sharing.discriminator_params(param_tree.flatten(params))
  for path in ('bert/embeddings/word_embeddings', 'bert/embeddings/LayerNorm/scale',
               'bert/embeddings_project/kernel',
               'discriminator_predictions/dense_prediction/kernel'):
    np.testing.assert_array_equal(param_tree.flatten(again)[path], disc_params[path])
  gen_config = electra.generator_run_config(config)
  gen_params, _ = import_dir(gen_dir, gen_config)
  flat = param_tree.flatten(params)
  for ours, theirs in (('generator/encoder/layer/intermediate/dense/kernel',
                        'bert/encoder/layer/intermediate/dense/kernel'),
                       ('generator_predictions/output_bias', 'predictions/output_bias'),
                       ('bert/embeddings/LayerNorm/scale', 'bert/embeddings/LayerNorm/scale')):
    np.testing.assert_array_equal(param_tree.flatten(gen_params)[theirs],
                                  flat[ours])


def test_fine_tuning_from_an_hf_discriminator_equals_electra_for_sequence_classification(
    tmp_path, inputs):
  model = randomise(transformers.ElectraForSequenceClassification(
      transformers.ElectraConfig(**HF_SIZES, num_labels=2)))
  directory = str(tmp_path / 'hf')
  model.save_pretrained(directory)
  with open(os.path.join(directory, 'vocab.txt'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
                      + [f'w{i}' for i in range(98)]) + '\n')
  config = glue_config.get_config(f'task=mrpc,init=hf:{directory}')
  config.data.max_seq_length = 13
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  config_lib.validate_and_adopt_source(config, config_lib.validate_finetune)
  assert config.model.name == 'electra'
  task = type('Task', (), {'head': 'classification', 'num_outputs': 2})()
  ft_model = finetune.build_model(config, task)
  encoder, heads = finetune.load_source_params(config, ft_model)
  assert set(heads) == {'classifier'}
  mesh = sharding.create_mesh(config.mesh)
  rules = sharding.logical_axis_rules(config.mesh.preset)
  tx, _ = finetune.create_optimizer(config.train, 10, False)
  runner = finetune.SeedRun(config, task, ft_model, tx, mesh, rules, encoder, heads)
  with sharding.activation_rules(mesh, rules):
    state = runner.fresh_state(config.seed)
  ids, segments, mask, _ = inputs
  ours = np.asarray(ft_model.apply({'params': jax.device_get(state.params)}, ids, segments,
                                   mask)['logits'])
  as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
  with torch.no_grad():
    theirs = model(input_ids=as_long(ids), token_type_ids=as_long(segments),
                   attention_mask=as_long(mask)).logits.numpy()
  difference = max_diff(ours, theirs)
  print(f'ElectraForSequenceClassification logits, max |ours - transformers|: {difference:.1e}')
  assert difference < IMPORT_TOLERANCE
  assert np.std(theirs) > 1e-3

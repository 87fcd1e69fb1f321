"""DistilBERT ('distilbert'): transformers' DistilBertForMaskedLM in and out, DistilBertModel, the
tree, and DistilBertForSequenceClassification's and DistilBertForMultipleChoice's heads in
fine-tuning."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.interop import hf
from bert_jax.models import heads
from bert_jax.models import hf_layout
from bert_jax.train import finetune
from bert_jax.train import step as steps
from configs import base

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

# Odd sizes, so a transposed or mis-split axis cannot line up.
HF_SIZES = dict(n_layers=3, dim=48, n_heads=3, hidden_dim=80, vocab_size=97,
                max_position_embeddings=17)
IMPORT_TOLERANCE, EXPORT_TOLERANCE = 1e-4, 1e-5


def randomise(model):
  """Every parameter random (zero biases and unit LayerNorms would hide a swapped leaf)."""
  torch.manual_seed(0)
  with torch.no_grad():
    for name, param in model.named_parameters():
      norm = 'layer_norm.weight' in name or 'LayerNorm.weight' in name
      param.copy_(torch.randn_like(param) * 0.05 + (1.0 if norm else 0.0))
  return model.eval()


@pytest.fixture(scope='module', name='hf_model')
def fixture_hf_model(tmp_path_factory):
  model = randomise(transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(**HF_SIZES)))
  directory = str(tmp_path_factory.mktemp('distilbert'))
  model.save_pretrained(directory)
  return model, directory


def our_config(scan_layers=True):
  config = base.get_config()
  config.model.update(hf.hf_config_to_model_overrides(
      transformers.DistilBertConfig(**HF_SIZES).to_dict()))
  config.model.scan_layers = scan_layers
  config.objectives = 'mlm'
  return config


def inputs():
  rng = np.random.default_rng(0)
  mask = np.ones((3, 13), np.int32)
  mask[1, 9:] = mask[2, 5:] = 0
  ids = rng.integers(1, 97, (3, 13)).astype(np.int32) * mask
  positions = np.array([[1, 4, 7, 12], [0, 2, 3, 8], [1, 2, 3, 4]], np.int32)
  return ids, mask, positions


def run_ours(params, config):
  ids, mask, positions = inputs()
  model = steps.build_model(config)
  out = model.apply({'params': params}, {'input_ids': ids, 'input_mask': mask,
                                         'segment_ids': np.zeros_like(ids),
                                         'masked_lm_positions': positions})
  return np.asarray(out['mlm_logits'])


def run_hf(model):
  ids, mask, positions = inputs()
  with torch.no_grad():
    logits = model(input_ids=torch.tensor(ids, dtype=torch.long),
                   attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
  return np.take_along_axis(logits, positions[..., None], axis=1)


def imported(directory, config):
  state_dict, hf_config = hf.load_hf_state_dict(directory)
  return hf.import_hf(state_dict, config, hf_config=hf_config)


def max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


@pytest.mark.parametrize('scan_layers', [True, False])
def test_import_gives_transformers_mlm_logits(hf_model, scan_layers):
  model, directory = hf_model
  config = our_config(scan_layers)
  params, report = imported(directory, config)
  assert report.layout == 'DistilBertForMaskedLM' and not report.missing_heads
  difference = max_diff(run_ours(params, config), run_hf(model))
  print(f'DistilBertForMaskedLM import, MLM logits max |ours - transformers|: {difference:.2e}')
  assert difference < IMPORT_TOLERANCE


def test_the_tree_has_no_segment_table_and_no_pooler(hf_model):
  params, _ = imported(hf_model[1], our_config())
  assert set(params['bert']) == {'embeddings', 'encoder'}
  assert set(params['bert']['embeddings']) == {'word_embeddings', 'position_embeddings',
                                               'LayerNorm'}


def test_export_loads_in_transformers_and_round_trips(hf_model, tmp_path):
  model, directory = hf_model
  config = our_config()
  params, _ = imported(directory, config)
  hf.export_hf(params, config, str(tmp_path))
  reloaded, info = transformers.DistilBertForMaskedLM.from_pretrained(
      str(tmp_path), output_loading_info=True)
  assert not any(info[k] for k in ('missing_keys', 'unexpected_keys', 'mismatched_keys'))
  difference = max_diff(run_hf(reloaded.eval()), run_ours(params, config))
  print(f'DistilBertForMaskedLM export -> transformers, MLM logits max diff: {difference:.2e}')
  assert difference < EXPORT_TOLERANCE
  again, _ = imported(str(tmp_path), config)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
    np.testing.assert_array_equal(a, b)


def test_a_distilbert_model_checkpoint_imports_without_heads(tmp_path):
  base_model = randomise(transformers.DistilBertModel(transformers.DistilBertConfig(**HF_SIZES)))
  base_model.save_pretrained(str(tmp_path))
  params, report = imported(str(tmp_path), our_config())
  assert report.layout == 'DistilBertModel' and report.missing_heads == ['predictions']
  ids, mask, _ = inputs()
  config = our_config()
  cfg = steps.build_model(config).config
  from bert_jax import models  # pylint: disable=g-import-not-at-top
  ours = models.get('distilbert').encoder(cfg).apply({'params': params['bert']}, ids,
                                                     np.zeros_like(ids), mask)[0]
  with torch.no_grad():
    theirs = base_model(input_ids=torch.tensor(ids, dtype=torch.long),
                        attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state
  assert max_diff(ours, theirs.numpy()) < IMPORT_TOLERANCE


def test_fine_tuning_gives_transformers_sequence_classification_logits(tmp_path):
  classifier = randomise(transformers.DistilBertForSequenceClassification(
      transformers.DistilBertConfig(**HF_SIZES, num_labels=2)))
  classifier.save_pretrained(str(tmp_path))
  from configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  config = finetune_config.get_config()
  config.init_from = f'hf:{tmp_path}'
  config.model.update(hf.hf_config_to_model_overrides(classifier.config.to_dict()))
  task = type('Task', (), {'head': 'classification', 'num_outputs': 2})()
  model = finetune.build_model(config, task)
  assert isinstance(model, heads.BertForFineTuning) and model.model == 'distilbert'
  encoder, head = finetune.load_source_params(config, model)
  assert set(head) == {'pre_classifier', 'classifier'}
  params = {'bert': encoder, **head}
  ids, mask, _ = inputs()
  ours = model.apply({'params': params}, ids, np.zeros_like(ids), mask)['logits']
  with torch.no_grad():
    theirs = classifier(input_ids=torch.tensor(ids, dtype=torch.long),
                        attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
  difference = max_diff(ours, theirs)
  print(f'DistilBertForSequenceClassification logits, max |ours - transformers|: '
        f'{difference:.2e}')
  assert difference < IMPORT_TOLERANCE and np.std(theirs) > 1e-2


def test_fine_tuning_gives_transformers_multiple_choice_logits(tmp_path):
  chooser = randomise(transformers.DistilBertForMultipleChoice(
      transformers.DistilBertConfig(**HF_SIZES)))
  chooser.save_pretrained(str(tmp_path))
  from configs import swag as swag_config  # pylint: disable=g-import-not-at-top
  config = swag_config.get_config()
  config.init_from = f'hf:{tmp_path}'
  config.model.update(hf.hf_config_to_model_overrides(chooser.config.to_dict()))
  model = finetune.build_model(config, type('Task', (), {'head': 'multiple_choice',
                                                         'num_outputs': 4})())
  encoder, head = finetune.load_source_params(config, model)
  assert set(head) == {'pre_classifier', 'classifier'}  # DistilBertForMultipleChoice's own.
  ids, mask, _ = inputs()  # [3, 13]: three questions of four choices, the rows rolled.
  ids, mask = (np.stack([np.roll(x, c, axis=0) for c in range(4)], axis=1) for x in (ids, mask))
  ours = model.apply({'params': {'bert': encoder, **head}}, ids, np.zeros_like(ids),
                     mask)['logits']  # [3, 4]
  with torch.no_grad():
    theirs = chooser(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
  difference = max_diff(ours, theirs)
  print(f'DistilBertForMultipleChoice logits, max |ours - transformers|: {difference:.2e}')
  assert ours.shape == (3, 4) and difference < IMPORT_TOLERANCE and np.std(theirs) > 1e-2


def test_the_layout_is_found_by_model_type():
  assert hf_layout.for_hf_config({'model_type': 'distilbert'}).family == 'distilbert'



def test_the_recipe_student_has_transformers_distilbert_parameter_count(tmp_path):
  # A BERT-base teacher's config.json is all the student's shape needs.
  teacher = tmp_path / 'teacher'
  teacher.mkdir()
  (teacher / 'config.json').write_text(json.dumps(
      {**transformers.BertConfig().to_dict(), 'architectures': ['BertForMaskedLM']}))
  (teacher / 'vocab.txt').write_text('\n'.join(f'[unused{i}]' for i in range(30522)))
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.train import optim  # pylint: disable=g-import-not-at-top
  from configs import distilbert  # pylint: disable=g-import-not-at-top
  config = distilbert.get_config()
  config.distill.teacher, config.data.corpus = f'hf:{teacher}', 'builtin'
  config_lib.validate_and_adopt_source(config, config_lib.validate)
  model = steps.build_model(config)
  params = nn.meta.unbox(steps.abstract_train_state(config, model,
                                                    optim.for_pretraining(config)).params)
  count = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))  # noqa: E731
  student = {k: v for k, v in params.items() if k != 'teacher'}
  with torch.device('meta'):
    theirs = transformers.DistilBertForMaskedLM(transformers.DistilBertConfig())
  assert count(student) == sum(p.numel() for p in theirs.parameters()) == 66_985_530
  with torch.device('meta'):
    bert = transformers.BertForMaskedLM(transformers.BertConfig())
  # The teacher: BERT-base's encoder without its pooler, and its MLM head.
  assert count(params['teacher']) == sum(p.numel() for p in bert.parameters())

"""DistilBERT ('distilbert') beyond what every family owes (tests/conformance/): DistilBertModel,
the tree, DistilBertForSequenceClassification's and DistilBertForMultipleChoice's heads in
fine-tuning, and the recipe student's count."""

import json

import flax.linen as nn
import jax
import numpy as np

import hf_parity
from bert_jax.interop import hf
from bert_jax.models import heads
from bert_jax.models import hf_layout
from bert_jax.train import finetune
from bert_jax.train import step as steps
from hf_parity import IMPORT_TOLERANCE, max_diff, randomise, torch, transformers

# Odd sizes in DistilBertConfig's names (the masked LM in and out: tests/conformance/).
HF_SIZES = dict(n_layers=3, dim=48, n_heads=3, hidden_dim=80, vocab_size=97,
                max_position_embeddings=17)


def our_config():
  return hf_parity.our_config(transformers.DistilBertConfig(**HF_SIZES).to_dict())


def inputs():
  batch = hf_parity.batch({'vocab_size': HF_SIZES['vocab_size']})
  return batch['input_ids'], batch['input_mask'], batch['masked_lm_positions']


def test_the_tree_has_no_segment_table_and_no_pooler(tmp_path):
  hf_parity.random_model(hf.model_to_hf_config(our_config()), str(tmp_path))
  params, _ = hf_parity.imported(str(tmp_path), our_config())
  assert set(params['bert']) == {'embeddings', 'encoder'}
  assert set(params['bert']['embeddings']) == {'word_embeddings', 'position_embeddings',
                                               'LayerNorm'}


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

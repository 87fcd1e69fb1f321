"""A pytest plugin (`-p registered_families`) that registers three families from outside
bert_jax before collection, as a user's package would, for tests/test_conformance_proof.py:

- 'camembert': CamemBERT, RoBERTa's encoder under its own transformers classes
  (CamembertForMaskedLM, CamembertModel), the whole family in the lines below;
- the scaled BERT of test_family_unit.py: its own config key, BERT's model_type;
- 'miscounted_bert': BERT whose Family.flops counts one multiply-add too many.
"""

import dataclasses

from bert_jax import models
from bert_jax.models import bert
from bert_jax.models.encoder import EncoderConfig
from bert_jax.models.roberta import hf as roberta_hf

CAMEMBERT = 'camembert'
MISCOUNTED = 'miscounted_bert'


def register_camembert() -> models.Family:
  """RoBERTa's family and layout under CamemBERT's names and model_type."""
  layout = dataclasses.replace(
      roberta_hf.LAYOUT, family=CAMEMBERT, model_type='camembert', display='CamemBERT',
      base_class='CamembertModel', head_classes=(('CamembertForMaskedLM', 'lm_head.'),),
      to_overrides=lambda hf_config: roberta_hf.roberta_overrides(hf_config, CAMEMBERT,
                                                                  'CamemBERT'),
      to_hf_config=lambda config: roberta_hf.roberta_hf_config(config, 'CamembertForMaskedLM',
                                                               'camembert'),
      tokenizer='sentencepiece_fairseq')
  return models.register(dataclasses.replace(models.get('roberta'), name=CAMEMBERT, hf=layout))


def pytest_configure(config):
  del config
  import test_family_unit  # pylint: disable=g-import-not-at-top  # Its conftest is loaded now.
  register_camembert()
  test_family_unit.register()
  models.register(models.Family(
      name=MISCOUNTED, config_from=EncoderConfig.from_config, encoder=bert.BertModel,
      flops=lambda model, length: bert.encoder_flops(model, length) + 2))

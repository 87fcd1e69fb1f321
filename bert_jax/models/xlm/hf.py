"""XLM-R's Hugging Face layout (XLMRobertaForMaskedLM): RoBERTa's (models/roberta/hf.py) under
XLMRoberta* names, with XLM-R's config.json; beside the encoder (model.py). No jax here.
"""

import dataclasses

from bert_jax.models.hf_layout import UnsupportedConfigError
from bert_jax.models.roberta import hf as roberta_hf


def xlm_roberta_overrides(hf_config: dict) -> dict:
  """HF XLMRobertaConfig dict -> our config.model values (model.name 'xlm', no language
  embeddings: XLM-R has none)."""
  return {**roberta_hf.roberta_overrides(hf_config, 'xlm', 'XLM-R'), 'num_languages': 0}


def xlm_roberta_hf_config(config) -> dict:
  """Our full config -> an HF XLMRobertaConfig dict for XLMRobertaForMaskedLM; refused for a
  model with language embeddings (XLM's), which XLM-R does not have."""
  count = config.model.get('num_languages', 0)
  if count:
    raise UnsupportedConfigError(
        f'model.num_languages={count}: XLMRobertaForMaskedLM has no language embeddings (XLM-R '
        'reads no language ids); only a model with num_languages=0 exports to it.')
  return roberta_hf.roberta_hf_config(config, 'XLMRobertaForMaskedLM', 'xlm-roberta')


LAYOUT = dataclasses.replace(
    roberta_hf.LAYOUT, family='xlm', model_type='xlm-roberta', display='XLM-R',
    base_class='XLMRobertaModel', head_classes=(('XLMRobertaForMaskedLM', 'lm_head.'),),
    to_overrides=xlm_roberta_overrides, to_hf_config=xlm_roberta_hf_config,
    tokenizer='sentencepiece_fairseq')

"""ELECTRA's Hugging Face layout (ElectraForPreTraining, ElectraForMaskedLM, ElectraModel): its
key table and config.json conversion, beside its encoders (model.py). No jax here.
"""

from bert_jax.models import hf_layout
from bert_jax.models.bert import hf as bert_hf
from bert_jax.models.hf_layout import Layout, UnsupportedConfigError
from bert_jax.models.roberta import hf as roberta_hf

# ELECTRA's backbone is BERT's under `electra.` without a pooler, with `embeddings_project` (E -> H)
# when E != H; ElectraForPreTraining's head scores tokens (the rtd objective's), and
# ElectraForMaskedLM is a generator: its backbone and MLM head load as an 'electra' model with
# config.objectives='mlm'.
TABLE = tuple(
    (path, 'electra.' + key[len('bert.'):], transform)
    for path, key, transform in bert_hf.TABLE if path.startswith('bert/')
    and not path.startswith('bert/pooler/') and transform != 'tied'
) + (
    ('bert/embeddings_project/kernel', 'electra.embeddings_project.weight', 'transpose'),
    ('bert/embeddings_project/bias', 'electra.embeddings_project.bias', 'none'),
    ('discriminator_predictions/dense/kernel', 'discriminator_predictions.dense.weight',
     'transpose'),
    ('discriminator_predictions/dense/bias', 'discriminator_predictions.dense.bias', 'none'),
    ('discriminator_predictions/dense_prediction/kernel',
     'discriminator_predictions.dense_prediction.weight', 'transpose'),
    ('discriminator_predictions/dense_prediction/bias',
     'discriminator_predictions.dense_prediction.bias', 'none'),
    ('predictions/transform_dense/kernel', 'generator_predictions.dense.weight', 'transpose'),
    ('predictions/transform_dense/bias', 'generator_predictions.dense.bias', 'none'),
    ('predictions/transform_LayerNorm/scale', 'generator_predictions.LayerNorm.weight', 'none'),
    ('predictions/transform_LayerNorm/bias', 'generator_predictions.LayerNorm.bias', 'none'),
    ('predictions/output_bias', 'generator_lm_head.bias', 'none'),
    ('bert/embeddings/word_embeddings', 'generator_lm_head.weight', 'tied'),
)


def electra_overrides(hf_config: dict) -> dict:
  """HF ElectraConfig dict -> our config.model values (model.name 'electra')."""
  # ElectraGeneratorPredictions and ElectraClassificationHead apply the exact GELU whatever
  # hidden_act says; ours follow model.gelu.
  problems = (hf_layout.common_problems(hf_config, {'gelu': 'erf'})
              + hf_layout.not_causal(hf_config, 'ELECTRA'))
  if problems:
    raise UnsupportedConfigError('Unsupported HF ELECTRA config: ' + '; '.join(problems) + '.')
  overrides = hf_layout.shape_overrides(hf_config)
  embed = hf_config.get('embedding_size', 128)
  return {'name': 'electra', **overrides, 'gelu': 'erf',
          'embedding_size': 0 if embed == overrides.get('hidden_size', 256) else embed}


def electra_hf_config(config) -> dict:
  """Our full config -> an HF ElectraConfig dict: ElectraForPreTraining (the discriminator) with
  'rtd', else ElectraForMaskedLM (a generator: config.objectives='mlm')."""
  m = config.model
  if m.gelu != 'erf':
    raise UnsupportedConfigError(
        f"model.gelu={m.gelu!r}: ElectraForMaskedLM's head and ElectraForSequenceClassification's "
        "apply the exact GELU; export needs model.gelu='erf'.")
  rtd = 'rtd' in hf_layout.objective_names(config)
  return {
      'architectures': ['ElectraForPreTraining' if rtd else 'ElectraForMaskedLM'],
      'model_type': 'electra', **hf_layout.shape_fields(m),
      'embedding_size': m.get('embedding_size', 0) or m.hidden_size,
      'hidden_act': 'gelu', 'pad_token_id': 0, 'position_embedding_type': 'absolute',
      'is_decoder': False,
  }


LAYOUT = Layout(
    family='electra', model_type='electra', display='ELECTRA', prefix='electra.',
    base_class='ElectraModel',
    head_classes=(('ElectraForPreTraining', 'discriminator_predictions.'),
                  ('ElectraForMaskedLM', 'generator_predictions.')),
    table=TABLE, heads={'predictions': 'mlm', 'discriminator_predictions': 'rtd'},
    ignored=hf_layout.buffers('electra.'), optional_pooler=True, to_overrides=electra_overrides,
    to_hf_config=electra_hf_config,
    exports_pooler=lambda config: False,  # ElectraModel has no pooler.
    # ElectraClassificationHead: dense, GELU, out_proj on [CLS]: our pooler (dense, GELU) and
    # classifier, as RoBERTa's.
    tokenizer='wordpiece', classifier=roberta_hf.CLASSIFIER,
    # A tied copy read on import (checked equal) but not written: transformers 5 loads
    # ElectraForMaskedLM's decoder from the embeddings and reports a saved copy as unexpected.
    not_exported=frozenset({'generator_lm_head.weight'}))

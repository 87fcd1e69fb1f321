"""BERT's Hugging Face layout (BertForPreTraining, BertModel, BertLMHeadModel): its key table,
classifier rows and config.json conversion, beside its encoder (model.py). No jax here.

A row is (our unscanned path, HF key, transform); backbone keys are written with the head models'
prefix (`bert.`), which BertModel saves without. `{n}` is a layer. The other families' tables
start from BERT's (TABLE).
"""

from bert_jax.models import hf_layout
from bert_jax.models.hf_layout import HF_GELU, Layout, UnsupportedConfigError

TABLE = (
    ('bert/embeddings/word_embeddings', 'bert.embeddings.word_embeddings.weight', 'none'),
    ('bert/embeddings/position_embeddings', 'bert.embeddings.position_embeddings.weight', 'none'),
    ('bert/embeddings/token_type_embeddings', 'bert.embeddings.token_type_embeddings.weight',
     'none'),
    ('bert/embeddings/LayerNorm/scale', 'bert.embeddings.LayerNorm.weight', 'none'),
    ('bert/embeddings/LayerNorm/bias', 'bert.embeddings.LayerNorm.bias', 'none'),
    ('bert/encoder/layer_{n}/attention/self/query/kernel',
     'bert.encoder.layer.{n}.attention.self.query.weight', 'transpose_split_out'),
    ('bert/encoder/layer_{n}/attention/self/query/bias',
     'bert.encoder.layer.{n}.attention.self.query.bias', 'split'),
    ('bert/encoder/layer_{n}/attention/self/key/kernel',
     'bert.encoder.layer.{n}.attention.self.key.weight', 'transpose_split_out'),
    ('bert/encoder/layer_{n}/attention/self/key/bias',
     'bert.encoder.layer.{n}.attention.self.key.bias', 'split'),
    ('bert/encoder/layer_{n}/attention/self/value/kernel',
     'bert.encoder.layer.{n}.attention.self.value.weight', 'transpose_split_out'),
    ('bert/encoder/layer_{n}/attention/self/value/bias',
     'bert.encoder.layer.{n}.attention.self.value.bias', 'split'),
    ('bert/encoder/layer_{n}/attention/output/dense/kernel',
     'bert.encoder.layer.{n}.attention.output.dense.weight', 'transpose_split_in'),
    ('bert/encoder/layer_{n}/attention/output/dense/bias',
     'bert.encoder.layer.{n}.attention.output.dense.bias', 'none'),
    ('bert/encoder/layer_{n}/attention/output/LayerNorm/scale',
     'bert.encoder.layer.{n}.attention.output.LayerNorm.weight', 'none'),
    ('bert/encoder/layer_{n}/attention/output/LayerNorm/bias',
     'bert.encoder.layer.{n}.attention.output.LayerNorm.bias', 'none'),
    ('bert/encoder/layer_{n}/intermediate/dense/kernel',
     'bert.encoder.layer.{n}.intermediate.dense.weight', 'transpose'),
    ('bert/encoder/layer_{n}/intermediate/dense/bias',
     'bert.encoder.layer.{n}.intermediate.dense.bias', 'none'),
    ('bert/encoder/layer_{n}/output/dense/kernel', 'bert.encoder.layer.{n}.output.dense.weight',
     'transpose'),
    ('bert/encoder/layer_{n}/output/dense/bias', 'bert.encoder.layer.{n}.output.dense.bias',
     'none'),
    ('bert/encoder/layer_{n}/output/LayerNorm/scale',
     'bert.encoder.layer.{n}.output.LayerNorm.weight', 'none'),
    ('bert/encoder/layer_{n}/output/LayerNorm/bias', 'bert.encoder.layer.{n}.output.LayerNorm.bias',
     'none'),
    ('bert/pooler/dense/kernel', 'bert.pooler.dense.weight', 'transpose'),
    ('bert/pooler/dense/bias', 'bert.pooler.dense.bias', 'none'),
    ('predictions/transform_dense/kernel', 'cls.predictions.transform.dense.weight', 'transpose'),
    ('predictions/transform_dense/bias', 'cls.predictions.transform.dense.bias', 'none'),
    ('predictions/transform_LayerNorm/scale', 'cls.predictions.transform.LayerNorm.weight', 'none'),
    ('predictions/transform_LayerNorm/bias', 'cls.predictions.transform.LayerNorm.bias', 'none'),
    ('predictions/output_bias', 'cls.predictions.bias', 'none'),
    # HF's decoder is tied to these two: optional on import (checked equal), written on export.
    ('bert/embeddings/word_embeddings', 'cls.predictions.decoder.weight', 'tied'),
    ('predictions/output_bias', 'cls.predictions.decoder.bias', 'tied'),
    ('seq_relationship/kernel', 'cls.seq_relationship.weight', 'transpose'),
    ('seq_relationship/bias', 'cls.seq_relationship.bias', 'none'),
)

# BertForSequenceClassification and AlbertForSequenceClassification: a Linear on the pooled
# [CLS], as our classification head; their *ForMultipleChoice, the same Linear to one score.
LINEAR_CLASSIFIER = (('classifier/kernel', 'classifier.weight', 'transpose'),
                      ('classifier/bias', 'classifier.bias', 'none'))


def bert_overrides(hf_config: dict) -> dict:
  """HF BertConfig dict -> our config.model values; UnsupportedConfigError on what we lack."""
  problems = hf_layout.common_problems(hf_config, HF_GELU)
  if problems:
    raise UnsupportedConfigError('Unsupported HF BERT config: ' + '; '.join(problems) + '.')
  overrides = hf_layout.shape_overrides(hf_config)
  overrides['gelu'] = HF_GELU[hf_config.get('hidden_act', 'gelu')]
  if hf_config.get('is_decoder'):  # A left-to-right LM (BertLMHeadModel): causal attention.
    overrides['causal'] = True
  return overrides


def bert_hf_config(config) -> dict:
  """Our full config -> an HF BertConfig dict (BertForMaskedLM when there is no NSP head,
  BertLMHeadModel, a decoder, with causal attention)."""
  m = config.model
  causal = bool(m.get('causal', False))
  return {
      'architectures': ['BertLMHeadModel' if causal else
                        'BertForPreTraining' if 'nsp' in hf_layout.objective_names(config)
                        else 'BertForMaskedLM'],
      'model_type': 'bert', **hf_layout.shape_fields(m),
      'hidden_act': 'gelu' if m.gelu == 'erf' else 'gelu_new', 'pad_token_id': 0,
      'position_embedding_type': 'absolute', 'is_decoder': causal,
  }


LAYOUT = Layout(
    family='bert', model_type='bert', display='BERT', prefix='bert.', base_class='BertModel',
    head_classes=(('BertForPreTraining', 'cls.seq_relationship.'),
                  ('BertForMaskedLM', 'cls.predictions.')), table=TABLE,
    heads={'predictions': 'mlm', 'seq_relationship': 'nsp'}, ignored=hf_layout.buffers('bert.'),
    # BertForMaskedLM and BertLMHeadModel hold no pooler: only NSP trains and reads it.
    optional_pooler=True, to_overrides=bert_overrides, to_hf_config=bert_hf_config,
    exports_pooler=lambda config: 'nsp' in hf_layout.objective_names(config),
    tokenizer='wordpiece', classifier=LINEAR_CLASSIFIER)

"""ALBERT's Hugging Face layout (AlbertForPreTraining, AlbertForMaskedLM, AlbertModel): its key
table and config.json conversion, beside its encoder (model.py). Its rows have no `{n}`: the one
shared layer is one set of parameters in both trees. No jax here.
"""

from bert_jax.models import hf_layout
from bert_jax.models.bert import hf as bert_hf
from bert_jax.models.hf_layout import HF_GELU, Layout, UnsupportedConfigError

_ALBERT_LAYER = 'albert.encoder.albert_layer_groups.0.albert_layers.0.'
_SHARED = 'bert/encoder/shared_layer/'
TABLE = tuple(
    (path, 'albert.' + key[len('bert.'):], transform)
    for path, key, transform in bert_hf.TABLE if path.startswith('bert/embeddings/')
    and transform != 'tied'
) + (
    ('bert/encoder/embedding_hidden_mapping_in/kernel',
     'albert.encoder.embedding_hidden_mapping_in.weight', 'transpose'),
    ('bert/encoder/embedding_hidden_mapping_in/bias',
     'albert.encoder.embedding_hidden_mapping_in.bias', 'none'),
    (_SHARED + 'attention/self/query/kernel', _ALBERT_LAYER + 'attention.query.weight',
     'transpose_split_out'),
    (_SHARED + 'attention/self/query/bias', _ALBERT_LAYER + 'attention.query.bias', 'split'),
    (_SHARED + 'attention/self/key/kernel', _ALBERT_LAYER + 'attention.key.weight',
     'transpose_split_out'),
    (_SHARED + 'attention/self/key/bias', _ALBERT_LAYER + 'attention.key.bias', 'split'),
    (_SHARED + 'attention/self/value/kernel', _ALBERT_LAYER + 'attention.value.weight',
     'transpose_split_out'),
    (_SHARED + 'attention/self/value/bias', _ALBERT_LAYER + 'attention.value.bias', 'split'),
    (_SHARED + 'attention/output/dense/kernel', _ALBERT_LAYER + 'attention.dense.weight',
     'transpose_split_in'),
    (_SHARED + 'attention/output/dense/bias', _ALBERT_LAYER + 'attention.dense.bias', 'none'),
    (_SHARED + 'attention/output/LayerNorm/scale', _ALBERT_LAYER + 'attention.LayerNorm.weight',
     'none'),
    (_SHARED + 'attention/output/LayerNorm/bias', _ALBERT_LAYER + 'attention.LayerNorm.bias',
     'none'),
    (_SHARED + 'intermediate/dense/kernel', _ALBERT_LAYER + 'ffn.weight', 'transpose'),
    (_SHARED + 'intermediate/dense/bias', _ALBERT_LAYER + 'ffn.bias', 'none'),
    (_SHARED + 'output/dense/kernel', _ALBERT_LAYER + 'ffn_output.weight', 'transpose'),
    (_SHARED + 'output/dense/bias', _ALBERT_LAYER + 'ffn_output.bias', 'none'),
    (_SHARED + 'output/LayerNorm/scale', _ALBERT_LAYER + 'full_layer_layer_norm.weight', 'none'),
    (_SHARED + 'output/LayerNorm/bias', _ALBERT_LAYER + 'full_layer_layer_norm.bias', 'none'),
    ('bert/pooler/dense/kernel', 'albert.pooler.weight', 'transpose'),
    ('bert/pooler/dense/bias', 'albert.pooler.bias', 'none'),
    ('predictions/transform_dense/kernel', 'predictions.dense.weight', 'transpose'),
    ('predictions/transform_dense/bias', 'predictions.dense.bias', 'none'),
    ('predictions/transform_LayerNorm/scale', 'predictions.LayerNorm.weight', 'none'),
    ('predictions/transform_LayerNorm/bias', 'predictions.LayerNorm.bias', 'none'),
    ('predictions/output_bias', 'predictions.bias', 'none'),
    ('bert/embeddings/word_embeddings', 'predictions.decoder.weight', 'tied'),
    ('predictions/output_bias', 'predictions.decoder.bias', 'tied'),
    ('sop_classifier/kernel', 'sop_classifier.classifier.weight', 'transpose'),
    ('sop_classifier/bias', 'sop_classifier.classifier.bias', 'none'),
)


def albert_overrides(hf_config: dict) -> dict:
  """HF AlbertConfig dict -> our config.model values (model.name 'albert')."""
  problems = (hf_layout.common_problems(hf_config, HF_GELU)
              + hf_layout.not_causal(hf_config, 'ALBERT'))
  for key in ('num_hidden_groups', 'inner_group_num'):
    if hf_config.get(key, 1) != 1:
      problems.append(f'{key}={hf_config[key]}; our ALBERT shares one layer across all layers '
                      '(num_hidden_groups=1, inner_group_num=1)')
  if problems:
    raise UnsupportedConfigError('Unsupported HF ALBERT config: ' + '; '.join(problems) + '.')
  return {'name': 'albert', **hf_layout.shape_overrides(hf_config),
          'embedding_size': hf_config.get('embedding_size', 128),
          'gelu': HF_GELU[hf_config.get('hidden_act', 'gelu_new')]}


def albert_hf_config(config) -> dict:
  """Our full config -> an HF AlbertConfig dict (AlbertForPreTraining with SOP, else
  AlbertForMaskedLM)."""
  m = config.model
  if m.get('causal', False):
    raise UnsupportedConfigError('model.causal=True: transformers has no causal ALBERT.')
  sop = 'sop' in hf_layout.objective_names(config)
  return {
      'architectures': ['AlbertForPreTraining' if sop else 'AlbertForMaskedLM'],
      'model_type': 'albert', **hf_layout.shape_fields(m),
      'embedding_size': m.get('embedding_size', 0) or m.hidden_size,
      'num_hidden_groups': 1, 'inner_group_num': 1,
      'hidden_act': 'gelu' if m.gelu == 'erf' else 'gelu_new',
      'pad_token_id': 0, 'bos_token_id': 2, 'eos_token_id': 3,
  }


LAYOUT = Layout(
    family='albert', model_type='albert', display='ALBERT', prefix='albert.',
    base_class='AlbertModel',
    head_classes=(('AlbertForPreTraining', 'sop_classifier.'),
                  ('AlbertForMaskedLM', 'predictions.')),
    table=TABLE, heads={'predictions': 'mlm', 'sop_classifier': 'sop'},
    ignored=hf_layout.buffers('albert.'), optional_pooler=True, to_overrides=albert_overrides,
    to_hf_config=albert_hf_config,
    # AlbertForMaskedLM drops the pooler; AlbertForPreTraining's SOP head reads it.
    exports_pooler=lambda config: 'sop' in hf_layout.objective_names(config),
    tokenizer='sentencepiece', classifier=bert_hf.LINEAR_CLASSIFIER)

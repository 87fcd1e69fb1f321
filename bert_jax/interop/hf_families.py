"""Each family's Hugging Face layout: its key table, head classes and config conversion.

hf.py's import and export are one engine over these layouts; config.model.name picks ours and an
HF config.json's model_type picks the one to read. A row is (our unscanned path, HF key,
transform); backbone keys are written with the head models' prefix (`bert.`, `roberta.`,
`albert.`), which the backbone classes (BertModel, ...) save without. `{n}` is a layer; ALBERT's
rows have none, as its one shared layer is one set of parameters in both trees.
"""

import dataclasses

from bert_jax import models
from bert_jax.models import hf_layout
from bert_jax.models.deberta import hf as deberta_hf
# Re-exported: the shared half of the layouts (models/hf_layout.py).
from bert_jax.models.hf_layout import (  # noqa: F401  pylint: disable=unused-import
    HF_GELU, Layout, UnsupportedConfigError)

DEBERTA = deberta_hf.LAYOUT


BERT_TABLE = (
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

# RoBERTa's backbone is BERT's under `roberta.`; its MLM head is lm_head (no transform.*).
ROBERTA_TABLE = tuple(
    (path, 'roberta.' + key[len('bert.'):], transform)
    for path, key, transform in BERT_TABLE if path.startswith('bert/') and transform != 'tied'
) + (
    ('predictions/transform_dense/kernel', 'lm_head.dense.weight', 'transpose'),
    ('predictions/transform_dense/bias', 'lm_head.dense.bias', 'none'),
    ('predictions/transform_LayerNorm/scale', 'lm_head.layer_norm.weight', 'none'),
    ('predictions/transform_LayerNorm/bias', 'lm_head.layer_norm.bias', 'none'),
    ('predictions/output_bias', 'lm_head.bias', 'none'),
    ('bert/embeddings/word_embeddings', 'lm_head.decoder.weight', 'tied'),
    ('predictions/output_bias', 'lm_head.decoder.bias', 'tied'),
)

_ALBERT_LAYER = 'albert.encoder.albert_layer_groups.0.albert_layers.0.'
_SHARED = 'bert/encoder/shared_layer/'
ALBERT_TABLE = tuple(
    (path, 'albert.' + key[len('bert.'):], transform)
    for path, key, transform in BERT_TABLE if path.startswith('bert/embeddings/')
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


# DistilBERT: BERT's layer under other names (q_lin, sa_layer_norm, ffn.lin1, ...), no segment
# table, no pooler; the MLM head is vocab_transform, vocab_layer_norm and vocab_projector (tied to
# the word embeddings, with the output bias).
_DISTIL_LAYER = 'distilbert.transformer.layer.{n}.'


DISTILBERT_TABLE = (
    ('bert/embeddings/word_embeddings', 'distilbert.embeddings.word_embeddings.weight', 'none'),
    ('bert/embeddings/position_embeddings', 'distilbert.embeddings.position_embeddings.weight',
     'none'),
    ('bert/embeddings/LayerNorm/scale', 'distilbert.embeddings.LayerNorm.weight', 'none'),
    ('bert/embeddings/LayerNorm/bias', 'distilbert.embeddings.LayerNorm.bias', 'none'),
) + hf_layout.layer_rows(_DISTIL_LAYER, (
        ('attention/self/query/', 'attention.q_lin.', 'transpose_split_out', 'split'),
        ('attention/self/key/', 'attention.k_lin.', 'transpose_split_out', 'split'),
        ('attention/self/value/', 'attention.v_lin.', 'transpose_split_out', 'split'),
        ('attention/output/dense/', 'attention.out_lin.', 'transpose_split_in', 'none'),
        ('attention/output/LayerNorm/', 'sa_layer_norm.', 'none', 'none'),
        ('intermediate/dense/', 'ffn.lin1.', 'transpose', 'none'),
        ('output/dense/', 'ffn.lin2.', 'transpose', 'none'),
        ('output/LayerNorm/', 'output_layer_norm.', 'none', 'none'))
) + (
    ('predictions/transform_dense/kernel', 'vocab_transform.weight', 'transpose'),
    ('predictions/transform_dense/bias', 'vocab_transform.bias', 'none'),
    ('predictions/transform_LayerNorm/scale', 'vocab_layer_norm.weight', 'none'),
    ('predictions/transform_LayerNorm/bias', 'vocab_layer_norm.bias', 'none'),
    ('predictions/output_bias', 'vocab_projector.bias', 'none'),
    ('bert/embeddings/word_embeddings', 'vocab_projector.weight', 'tied'),
)

# ELECTRA's backbone is BERT's under `electra.` without a pooler, with `embeddings_project` (E -> H)
# when E != H; ElectraForPreTraining's head scores tokens (the rtd objective's), and
# ElectraForMaskedLM is a generator: its backbone and MLM head load as an 'electra' model with
# config.objectives='mlm'.
ELECTRA_TABLE = tuple(
    (path, 'electra.' + key[len('bert.'):], transform)
    for path, key, transform in BERT_TABLE if path.startswith('bert/')
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

# ModernBERT (ModernBertForMaskedLM): `model.` backbone, pre-norm layers (layer 0 has no
# attn_norm, in both trees), one Wqkv [3 * heads * kv, H] (ours [H, 3, heads, kv]) and one Wi
# [2F, H] whose first half is the activated input, second the gate (ours [H, 2, F]); `head.` is
# our predictions transform, `decoder.` the tied output with its bias. Bias rows apply when
# model.use_bias is True (attention_bias = mlp_bias = norm_bias = classifier_bias).
_MODERN_LAYER = 'model.layers.{n}.'
_OUR_MODERN_LAYER = 'bert/encoder/layer_{n}/'
MODERNBERT_TABLE = (
    ('bert/embeddings/word_embeddings', 'model.embeddings.tok_embeddings.weight', 'none'),
    ('bert/embeddings/norm/scale', 'model.embeddings.norm.weight', 'none'),
    ('bert/embeddings/norm/bias', 'model.embeddings.norm.bias', 'none'),
) + tuple(
    (_OUR_MODERN_LAYER + ours, _MODERN_LAYER + theirs, transform)
    for ours, theirs, transform in (
        ('attn_norm/scale', 'attn_norm.weight', 'none'),
        ('attn_norm/bias', 'attn_norm.bias', 'none'),
        ('attention/qkv/kernel', 'attn.Wqkv.weight', 'transpose_split_out'),
        ('attention/qkv/bias', 'attn.Wqkv.bias', 'split'),
        ('attention/output/kernel', 'attn.Wo.weight', 'transpose_split_in'),
        ('attention/output/bias', 'attn.Wo.bias', 'none'),
        ('mlp_norm/scale', 'mlp_norm.weight', 'none'),
        ('mlp_norm/bias', 'mlp_norm.bias', 'none'),
        ('mlp/wi/kernel', 'mlp.Wi.weight', 'transpose_split_out'),
        ('mlp/wi/bias', 'mlp.Wi.bias', 'split'),
        ('mlp/wo/kernel', 'mlp.Wo.weight', 'transpose'),
        ('mlp/wo/bias', 'mlp.Wo.bias', 'none'))
) + (
    ('bert/encoder/final_norm/scale', 'model.final_norm.weight', 'none'),
    ('bert/encoder/final_norm/bias', 'model.final_norm.bias', 'none'),
    ('predictions/transform_dense/kernel', 'head.dense.weight', 'transpose'),
    ('predictions/transform_dense/bias', 'head.dense.bias', 'none'),
    ('predictions/transform_LayerNorm/scale', 'head.norm.weight', 'none'),
    ('predictions/transform_LayerNorm/bias', 'head.norm.bias', 'none'),
    ('predictions/output_bias', 'decoder.bias', 'none'),
    ('bert/embeddings/word_embeddings', 'decoder.weight', 'tied'),
)

# Tied copies read on import (checked equal) but not written: transformers 5 loads
# ElectraForMaskedLM's decoder from the embeddings and reports a saved copy as unexpected.
NOT_EXPORTED = frozenset({'generator_lm_head.weight'})


def _objective_names(config) -> tuple[str, ...]:
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  return objectives.parse(config.objectives)


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
                        'BertForPreTraining' if 'nsp' in _objective_names(config)
                        else 'BertForMaskedLM'],
      'model_type': 'bert', **hf_layout.shape_fields(m),
      'hidden_act': 'gelu' if m.gelu == 'erf' else 'gelu_new', 'pad_token_id': 0,
      'position_embedding_type': 'absolute', 'is_decoder': causal,
  }


def _not_causal(hf_config: dict, display: str) -> list[str]:
  if hf_config.get('is_decoder'):
    return [f'is_decoder=true; our {display} is bidirectional (causal LMs: model.name=\'bert\')']
  return []


def roberta_overrides(hf_config: dict, name: str = 'roberta', display: str = 'RoBERTa') -> dict:
  """HF RobertaConfig dict -> our config.model values (model.name 'roberta'; XLM-R's config, of
  the same fields, for 'xlm')."""
  # RobertaLMHead applies the exact GELU whatever hidden_act says; ours follows model.gelu.
  problems = hf_layout.common_problems(hf_config, {'gelu': 'erf'}) + _not_causal(hf_config, display)
  if hf_config.get('pad_token_id', 1) != 1:
    problems.append(f'pad_token_id={hf_config["pad_token_id"]}; our {display} numbers positions '
                    'as fairseq with padding_idx 1 (real tokens from row 2)')
  if problems:
    raise UnsupportedConfigError(f'Unsupported HF {display} config: ' + '; '.join(problems) + '.')
  return {'name': name, **hf_layout.shape_overrides(hf_config), 'gelu': 'erf'}


def roberta_hf_config(config, architecture: str = 'RobertaForMaskedLM',
                      model_type: str = 'roberta') -> dict:
  """Our full config -> an HF RobertaConfig dict for RobertaForMaskedLM (XLMRobertaForMaskedLM's
  has the same fields)."""
  m = config.model
  if m.gelu != 'erf' or m.get('causal', False):
    raise UnsupportedConfigError(
        f"model.gelu={m.gelu!r}, model.causal={m.get('causal', False)}: {architecture} is "
        "bidirectional and its lm_head applies the exact GELU; export needs gelu='erf', "
        'causal=False.')
  return {
      'architectures': [architecture], 'model_type': model_type, **hf_layout.shape_fields(m),
      'hidden_act': 'gelu', 'pad_token_id': 1, 'bos_token_id': 0, 'eos_token_id': 2,
      'position_embedding_type': 'absolute', 'is_decoder': False,
  }


def xlm_roberta_overrides(hf_config: dict) -> dict:
  """HF XLMRobertaConfig dict -> our config.model values (model.name 'xlm', no language
  embeddings: XLM-R has none)."""
  return {**roberta_overrides(hf_config, 'xlm', 'XLM-R'), 'num_languages': 0}


def xlm_roberta_hf_config(config) -> dict:
  """Our full config -> an HF XLMRobertaConfig dict for XLMRobertaForMaskedLM; refused for a
  model with language embeddings (XLM's), which XLM-R does not have."""
  count = config.model.get('num_languages', 0)
  if count:
    raise UnsupportedConfigError(
        f'model.num_languages={count}: XLMRobertaForMaskedLM has no language embeddings (XLM-R '
        'reads no language ids); only a model with num_languages=0 exports to it.')
  return roberta_hf_config(config, 'XLMRobertaForMaskedLM', 'xlm-roberta')


def albert_overrides(hf_config: dict) -> dict:
  """HF AlbertConfig dict -> our config.model values (model.name 'albert')."""
  problems = hf_layout.common_problems(hf_config, HF_GELU) + _not_causal(hf_config, 'ALBERT')
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
  sop = 'sop' in _objective_names(config)
  return {
      'architectures': ['AlbertForPreTraining' if sop else 'AlbertForMaskedLM'],
      'model_type': 'albert', **hf_layout.shape_fields(m),
      'embedding_size': m.get('embedding_size', 0) or m.hidden_size,
      'num_hidden_groups': 1, 'inner_group_num': 1,
      'hidden_act': 'gelu' if m.gelu == 'erf' else 'gelu_new',
      'pad_token_id': 0, 'bos_token_id': 2, 'eos_token_id': 3,
  }


# DistilBertConfig's names of config.model's keys; its LayerNorms' eps is 1e-12, fixed.
_DISTIL_NAMES = {'vocab_size': 'vocab_size', 'dim': 'hidden_size', 'n_layers': 'num_layers',
                 'n_heads': 'num_heads', 'hidden_dim': 'intermediate_size',
                 'max_position_embeddings': 'max_position_embeddings',
                 'initializer_range': 'initializer_range', 'dropout': 'hidden_dropout_rate',
                 'attention_dropout': 'attention_dropout_rate'}


def distilbert_overrides(hf_config: dict) -> dict:
  """HF DistilBertConfig dict -> our config.model values (model.name 'distilbert')."""
  problems = []
  act = hf_config.get('activation', 'gelu')
  if act not in HF_GELU:
    problems.append(f'activation={act!r}; our model implements {sorted(HF_GELU)}')
  if hf_config.get('sinusoidal_pos_embds'):
    problems.append('sinusoidal_pos_embds=true; our model has learned positions only')
  if hf_config.get('dim', 768) % hf_config.get('n_heads', 12):
    problems.append('dim is not a multiple of n_heads')
  if problems:
    raise UnsupportedConfigError('Unsupported HF DistilBERT config: ' + '; '.join(problems) + '.')
  overrides = {ours: hf_config[hf] for hf, ours in _DISTIL_NAMES.items() if hf in hf_config}
  return {'name': 'distilbert', **overrides, 'layer_norm_eps': 1e-12, 'gelu': HF_GELU[act]}


def distilbert_hf_config(config) -> dict:
  """Our full config -> an HF DistilBertConfig dict for DistilBertForMaskedLM."""
  m = config.model
  if m.get('causal', False) or m.layer_norm_eps != 1e-12:
    raise UnsupportedConfigError(
        f"model.causal={m.get('causal', False)}, model.layer_norm_eps={m.layer_norm_eps}: "
        'DistilBertForMaskedLM is bidirectional with LayerNorm eps 1e-12; export needs '
        'causal=False, layer_norm_eps=1e-12.')
  return {
      'architectures': ['DistilBertForMaskedLM'], 'model_type': 'distilbert',
      'vocab_size': m.vocab_size, 'dim': m.hidden_size, 'n_layers': m.num_layers,
      'n_heads': m.num_heads, 'hidden_dim': m.intermediate_size,
      'max_position_embeddings': m.max_position_embeddings, 'dropout': m.hidden_dropout_rate,
      'attention_dropout': m.attention_dropout_rate, 'initializer_range': m.initializer_range,
      'activation': 'gelu' if m.gelu == 'erf' else 'gelu_new', 'sinusoidal_pos_embds': False,
      'pad_token_id': 0, 'qa_dropout': 0.1, 'seq_classif_dropout': 0.2,
      'tie_word_embeddings': True,
  }

def electra_overrides(hf_config: dict) -> dict:
  """HF ElectraConfig dict -> our config.model values (model.name 'electra')."""
  # ElectraGeneratorPredictions and ElectraClassificationHead apply the exact GELU whatever
  # hidden_act says; ours follow model.gelu.
  problems = hf_layout.common_problems(hf_config, {'gelu': 'erf'}) + _not_causal(hf_config, 'ELECTRA')
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
  rtd = 'rtd' in _objective_names(config)
  return {
      'architectures': ['ElectraForPreTraining' if rtd else 'ElectraForMaskedLM'],
      'model_type': 'electra', **hf_layout.shape_fields(m),
      'embedding_size': m.get('embedding_size', 0) or m.hidden_size,
      'hidden_act': 'gelu', 'pad_token_id': 0, 'position_embedding_type': 'absolute',
      'is_decoder': False,
  }


_MODERN_BIASES = ('attention_bias', 'mlp_bias', 'norm_bias', 'classifier_bias')
# ModernBERT's hidden_activation -> our model.feed_forward (the gated unit's activation).
_MODERN_GLU = {'gelu': 'geglu', 'silu': 'swiglu'}


def _modern_layer_pattern(hf_config: dict) -> tuple[int, bool]:
  """(global_every, any local layer) of a ModernBERT config's layer_types (or its older
  global_attn_every_n_layers); UnsupportedConfigError for a pattern ours cannot express."""
  layers_ = hf_config.get('num_hidden_layers', 22)
  every = hf_config.get('global_attn_every_n_layers', 3)
  types = hf_config.get('layer_types') or [
      'full_attention' if i % every == 0 else 'sliding_attention' for i in range(layers_)]
  if all(t == 'full_attention' for t in types):
    return 1, False
  for n in range(1, len(types) + 1):
    if types == ['full_attention' if i % n == 0 else 'sliding_attention'
                 for i in range(len(types))]:
      return n, True
  raise UnsupportedConfigError(
      f'Unsupported HF ModernBERT config: layer_types={types}; our model makes every n-th layer '
      'from the first global (full_attention) and the others local (sliding_attention).')


def _rope_thetas(hf_config: dict) -> tuple[float, float]:
  """(global, local) rotary theta of a ModernBERT config (rope_parameters, or the older
  global_rope_theta / local_rope_theta)."""
  params = hf_config.get('rope_parameters') or {}
  problems = [f'rope_parameters[{k!r}].rope_type={v.get("rope_type")!r}'
              for k, v in params.items() if v and v.get('rope_type', 'default') != 'default']
  if problems:
    raise UnsupportedConfigError('Unsupported HF ModernBERT config: ' + '; '.join(problems)
                                 + "; our rotary embeddings are the 'default' kind.")
  full = (params.get('full_attention') or {}).get('rope_theta',
                                                  hf_config.get('global_rope_theta', 160_000.0))
  local = (params.get('sliding_attention') or {}).get('rope_theta',
                                                      hf_config.get('local_rope_theta', 10_000.0))
  return float(full), float(local)


def modernbert_overrides(hf_config: dict) -> dict:
  """HF ModernBertConfig dict -> our config.model values (model.name 'modernbert')."""
  problems = []
  act = hf_config.get('hidden_activation', 'gelu')
  if act not in _MODERN_GLU:
    problems.append(f'hidden_activation={act!r}; our gated feed-forward takes '
                    f'{sorted(_MODERN_GLU)}')
  biases = {k: bool(hf_config.get(k, False)) for k in _MODERN_BIASES}
  if len(set(biases.values())) > 1:
    problems.append(f'{biases}: our model.use_bias is one switch for all of them')
  if not hf_config.get('decoder_bias', True):
    problems.append('decoder_bias=false; our MLM head has an output bias')
  if hf_config.get('classifier_activation', 'gelu') != 'gelu':
    problems.append(f'classifier_activation={hf_config["classifier_activation"]!r}; our MLM '
                    "head's is 'gelu'")
  if hf_config.get('hidden_size', 768) % hf_config.get('num_attention_heads', 12):
    problems.append('hidden_size is not a multiple of num_attention_heads')
  if problems:
    raise UnsupportedConfigError('Unsupported HF ModernBERT config: ' + '; '.join(problems) + '.')
  global_every, local = _modern_layer_pattern(hf_config)
  rope_theta, local_rope_theta = _rope_thetas(hf_config)
  names = {'vocab_size': 'vocab_size', 'hidden_size': 'hidden_size',
           'num_hidden_layers': 'num_layers', 'num_attention_heads': 'num_heads',
           'intermediate_size': 'intermediate_size',
           'max_position_embeddings': 'max_position_embeddings', 'norm_eps': 'layer_norm_eps',
           'initializer_range': 'initializer_range',
           'embedding_dropout': 'hidden_dropout_rate',
           'attention_dropout': 'attention_dropout_rate'}
  return {'name': 'modernbert', **{ours: hf_config[hf] for hf, ours in names.items()
                                   if hf in hf_config},
          'norm': 'layer_norm', 'use_bias': biases['attention_bias'],
          'feed_forward': _MODERN_GLU[act], 'positions': 'rotary', 'rope_theta': rope_theta,
          'local_rope_theta': local_rope_theta,
          'local_window': hf_config.get('local_attention', 128) if local else 0,
          'global_every': global_every, 'gelu': 'erf',
          'scan_layers': False}


def modernbert_hf_config(config) -> dict:
  """Our full config -> an HF ModernBertConfig dict for ModernBertForMaskedLM."""
  from bert_jax.models import modernbert  # pylint: disable=g-import-not-at-top
  m = config.model
  problems = []
  if m.norm != 'layer_norm':
    problems.append(f"norm={m.norm!r} (ModernBERT's is 'layer_norm')")
  if m.positions != 'rotary':
    problems.append(f"positions={m.positions!r} (ModernBERT's are 'rotary')")
  if m.feed_forward not in _MODERN_GLU.values():
    problems.append(f"feed_forward={m.feed_forward!r} (ModernBERT's is 'geglu' or 'swiglu')")
  if m.gelu != 'erf':
    problems.append(f"gelu={m.gelu!r} (ModernBERT's is 'erf')")
  if problems:
    raise UnsupportedConfigError('ModernBertForMaskedLM cannot hold config.model: '
                                 + '; '.join(problems) + '.')
  glu = {v: k for k, v in _MODERN_GLU.items()}
  types = ['full_attention' if modernbert.is_global(m, i) else 'sliding_attention'
           for i in range(m.num_layers)]
  window = m.local_window or 128  # Unused when every layer is global.
  return {
      'architectures': ['ModernBertForMaskedLM'], 'model_type': 'modernbert',
      'vocab_size': m.vocab_size, 'hidden_size': m.hidden_size,
      'num_hidden_layers': m.num_layers, 'num_attention_heads': m.num_heads,
      'intermediate_size': m.intermediate_size, 'hidden_activation': glu[m.feed_forward],
      'max_position_embeddings': m.max_position_embeddings,
      'initializer_range': m.initializer_range, 'norm_eps': m.layer_norm_eps,
      **{k: bool(m.use_bias) for k in _MODERN_BIASES}, 'decoder_bias': True,
      'embedding_dropout': m.hidden_dropout_rate, 'mlp_dropout': 0.0,
      'attention_dropout': m.attention_dropout_rate, 'layer_types': types,
      'global_attn_every_n_layers': m.global_every if m.local_window else 1,
      'local_attention': window,
      'rope_parameters': {'full_attention': {'rope_type': 'default', 'rope_theta': m.rope_theta},
                          'sliding_attention': {'rope_type': 'default',
                                                'rope_theta': m.local_rope_theta}},
      'global_rope_theta': m.rope_theta, 'local_rope_theta': m.local_rope_theta,
      'classifier_activation': 'gelu', 'classifier_pooling': 'cls', 'classifier_bias':
      bool(m.use_bias), 'tie_word_embeddings': True,
      # Our byte-level BPE's ids (RoBERTa's layout: <s> 0, <pad> 1, </s> 2).
      'pad_token_id': 1, 'bos_token_id': 0, 'eos_token_id': 2, 'cls_token_id': 0,
      'sep_token_id': 2,
  }


# BertForSequenceClassification and AlbertForSequenceClassification: a Linear on the pooled
# [CLS], as our classification head; their *ForMultipleChoice, the same Linear to one score.
_LINEAR_CLASSIFIER = (('classifier/kernel', 'classifier.weight', 'transpose'),
                      ('classifier/bias', 'classifier.bias', 'none'))
# RobertaClassificationHead: dense, tanh, out_proj on <s>'s state, which is our pooler (dense,
# tanh on the first token) and classifier; RobertaForSequenceClassification has no pooler of its
# own. Only the dropout differs (HF's also before the dense): none in evaluation.
_ROBERTA_CLASSIFIER = (('bert/pooler/dense/kernel', 'classifier.dense.weight', 'transpose'),
                       ('bert/pooler/dense/bias', 'classifier.dense.bias', 'none'),
                       ('classifier/kernel', 'classifier.out_proj.weight', 'transpose'),
                       ('classifier/bias', 'classifier.out_proj.bias', 'none'))
# RobertaForMultipleChoice keeps RobertaModel's pooler and scores with a Linear on it, as BERT's.
_ROBERTA_HEADS = _ROBERTA_CLASSIFIER + _LINEAR_CLASSIFIER
# DistilBertForSequenceClassification: pre_classifier (dense, ReLU) on [CLS], dropout,
# classifier; ours is the same (models/heads.py, Family.pre_classifier).
_DISTIL_CLASSIFIER = (('pre_classifier/kernel', 'pre_classifier.weight', 'transpose'),
                      ('pre_classifier/bias', 'pre_classifier.bias', 'none'),
                      ('classifier/kernel', 'classifier.weight', 'transpose'),
                      ('classifier/bias', 'classifier.bias', 'none'))


BERT = Layout(
    family='bert', model_type='bert', display='BERT', prefix='bert.', base_class='BertModel',
    head_classes=(('BertForPreTraining', 'cls.'),), table=BERT_TABLE,
    heads={'predictions': 'mlm', 'seq_relationship': 'nsp'}, ignored=hf_layout.buffers('bert.'),
    optional_pooler=False, to_overrides=bert_overrides, to_hf_config=bert_hf_config,
    exports_pooler=lambda config: True, tokenizer='wordpiece', classifier=_LINEAR_CLASSIFIER)
ROBERTA = Layout(
    family='roberta', model_type='roberta', display='RoBERTa', prefix='roberta.',
    base_class='RobertaModel', head_classes=(('RobertaForMaskedLM', 'lm_head.'),),
    table=ROBERTA_TABLE, heads={'predictions': 'mlm'}, ignored=hf_layout.buffers('roberta.'),
    optional_pooler=True, to_overrides=roberta_overrides, to_hf_config=roberta_hf_config,
    exports_pooler=lambda config: False,  # RobertaForMaskedLM has no pooler.
    tokenizer='bpe', classifier=_ROBERTA_HEADS)
# XLM-R's classes hold RoBERTa's parameters under the same keys (`roberta.`, `lm_head.`).
XLM_ROBERTA = dataclasses.replace(
    ROBERTA, family='xlm', model_type='xlm-roberta', display='XLM-R',
    base_class='XLMRobertaModel', head_classes=(('XLMRobertaForMaskedLM', 'lm_head.'),),
    to_overrides=xlm_roberta_overrides, to_hf_config=xlm_roberta_hf_config,
    tokenizer='sentencepiece_fairseq')
ALBERT = Layout(
    family='albert', model_type='albert', display='ALBERT', prefix='albert.',
    base_class='AlbertModel',
    head_classes=(('AlbertForPreTraining', 'sop_classifier.'),
                  ('AlbertForMaskedLM', 'predictions.')),
    table=ALBERT_TABLE, heads={'predictions': 'mlm', 'sop_classifier': 'sop'},
    ignored=hf_layout.buffers('albert.'), optional_pooler=True, to_overrides=albert_overrides,
    to_hf_config=albert_hf_config,
    # AlbertForMaskedLM drops the pooler; AlbertForPreTraining's SOP head reads it.
    exports_pooler=lambda config: 'sop' in _objective_names(config), tokenizer='sentencepiece',
    classifier=_LINEAR_CLASSIFIER)

DISTILBERT = Layout(
    family='distilbert', model_type='distilbert', display='DistilBERT', prefix='distilbert.',
    base_class='DistilBertModel', head_classes=(('DistilBertForMaskedLM', 'vocab_'),),
    table=DISTILBERT_TABLE, heads={'predictions': 'mlm'}, ignored=hf_layout.buffers('distilbert.'),
    optional_pooler=False, to_overrides=distilbert_overrides, to_hf_config=distilbert_hf_config,
    exports_pooler=lambda config: False, tokenizer='wordpiece', classifier=_DISTIL_CLASSIFIER)


ELECTRA = Layout(
    family='electra', model_type='electra', display='ELECTRA', prefix='electra.',
    base_class='ElectraModel',
    head_classes=(('ElectraForPreTraining', 'discriminator_predictions.'),
                  ('ElectraForMaskedLM', 'generator_predictions.')),
    table=ELECTRA_TABLE, heads={'predictions': 'mlm', 'discriminator_predictions': 'rtd'},
    ignored=hf_layout.buffers('electra.'), optional_pooler=True, to_overrides=electra_overrides,
    to_hf_config=electra_hf_config,
    exports_pooler=lambda config: False,  # ElectraModel has no pooler.
    # ElectraClassificationHead: dense, GELU, out_proj on [CLS]: our pooler (dense, GELU) and
    # classifier, as RoBERTa's.
    tokenizer='wordpiece', classifier=_ROBERTA_CLASSIFIER)

MODERNBERT = Layout(
    family='modernbert', model_type='modernbert', display='ModernBERT', prefix='model.',
    base_class='ModernBertModel', head_classes=(('ModernBertForMaskedLM', 'head.'),),
    table=MODERNBERT_TABLE, heads={'predictions': 'mlm'}, ignored=hf_layout.buffers('model.'),
    optional_pooler=False, to_overrides=modernbert_overrides,
    to_hf_config=modernbert_hf_config, exports_pooler=lambda config: False, tokenizer='bpe')

LAYOUTS = {layout.family: layout
           for layout in (BERT, ROBERTA, ALBERT, DISTILBERT, ELECTRA, MODERNBERT, DEBERTA,
                          XLM_ROBERTA)}


def for_family(name: str) -> Layout:
  """The layout of our family `name` (LAYOUTS', else its registration's Family.hf);
  UnsupportedConfigError for a family without one."""
  if name not in LAYOUTS and name in models.available() and models.get(name).hf is not None:
    return models.get(name).hf
  if name not in LAYOUTS:
    raise UnsupportedConfigError(f'model.name={name!r} has no Hugging Face layout; the families '
                                 f'that map are {", ".join(LAYOUTS)}.')
  return LAYOUTS[name]


def for_config(config) -> Layout:
  """The layout of a run's config.model.name."""
  return for_family(config.model.get('name', 'bert'))


def for_hf_config(hf_config: dict) -> Layout:
  """The layout of a config.json's model_type (no model_type: BERT, as old BERT configs)."""
  model_type = hf_config.get('model_type', 'bert')
  for layout in LAYOUTS.values():
    if layout.model_type == model_type:
      return layout
  raise UnsupportedConfigError(
      f'Unsupported HF config: model_type={model_type!r}; the model types that map onto our '
      f'families are {", ".join(repr(l.model_type) for l in LAYOUTS.values())}.')

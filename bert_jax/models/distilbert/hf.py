"""DistilBERT's Hugging Face layout (DistilBertForMaskedLM, DistilBertModel): its key table,
classifier rows and config.json conversion, beside its encoder (model.py). No jax here.
"""

from bert_jax.models import hf_layout
from bert_jax.models.hf_layout import HF_GELU, Layout, UnsupportedConfigError

# DistilBERT: BERT's layer under other names (q_lin, sa_layer_norm, ffn.lin1, ...), no segment
# table, no pooler; the MLM head is vocab_transform, vocab_layer_norm and vocab_projector (tied to
# the word embeddings, with the output bias).
_DISTIL_LAYER = 'distilbert.transformer.layer.{n}.'


TABLE = (
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

# DistilBertForSequenceClassification: pre_classifier (dense, ReLU) on [CLS], dropout,
# classifier; ours is the same (models/heads.py, Family.pre_classifier).
CLASSIFIER = (('pre_classifier/kernel', 'pre_classifier.weight', 'transpose'),
                      ('pre_classifier/bias', 'pre_classifier.bias', 'none'),
                      ('classifier/kernel', 'classifier.weight', 'transpose'),
                      ('classifier/bias', 'classifier.bias', 'none'))

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


LAYOUT = Layout(
    family='distilbert', model_type='distilbert', display='DistilBERT', prefix='distilbert.',
    base_class='DistilBertModel', head_classes=(('DistilBertForMaskedLM', 'vocab_'),),
    table=TABLE, heads={'predictions': 'mlm'}, ignored=hf_layout.buffers('distilbert.'),
    optional_pooler=False, to_overrides=distilbert_overrides, to_hf_config=distilbert_hf_config,
    exports_pooler=lambda config: False, tokenizer='wordpiece', classifier=CLASSIFIER)

"""RoBERTa's Hugging Face layout (RobertaForMaskedLM, RobertaModel): its key table, classifier
rows and config.json conversion, beside its encoder (model.py). XLM-R's (models/xlm/hf.py) is
this one under XLMRoberta* names. No jax here.
"""

from bert_jax.models import hf_layout
from bert_jax.models.bert import hf as bert_hf
from bert_jax.models.hf_layout import Layout, UnsupportedConfigError

# RoBERTa's backbone is BERT's under `roberta.`; its MLM head is lm_head (no transform.*).
TABLE = tuple(
    (path, 'roberta.' + key[len('bert.'):], transform)
    for path, key, transform in bert_hf.TABLE if path.startswith('bert/') and transform != 'tied'
) + (
    ('predictions/transform_dense/kernel', 'lm_head.dense.weight', 'transpose'),
    ('predictions/transform_dense/bias', 'lm_head.dense.bias', 'none'),
    ('predictions/transform_LayerNorm/scale', 'lm_head.layer_norm.weight', 'none'),
    ('predictions/transform_LayerNorm/bias', 'lm_head.layer_norm.bias', 'none'),
    ('predictions/output_bias', 'lm_head.bias', 'none'),
    ('bert/embeddings/word_embeddings', 'lm_head.decoder.weight', 'tied'),
    ('predictions/output_bias', 'lm_head.decoder.bias', 'tied'),
)

# RobertaClassificationHead: dense, tanh, out_proj on <s>'s state, which is our pooler (dense,
# tanh on the first token) and classifier; RobertaForSequenceClassification has no pooler of its
# own. Only the dropout differs (HF's also before the dense): none in evaluation.
CLASSIFIER = (('bert/pooler/dense/kernel', 'classifier.dense.weight', 'transpose'),
                       ('bert/pooler/dense/bias', 'classifier.dense.bias', 'none'),
                       ('classifier/kernel', 'classifier.out_proj.weight', 'transpose'),
                       ('classifier/bias', 'classifier.out_proj.bias', 'none'))
# RobertaForMultipleChoice keeps RobertaModel's pooler and scores with a Linear on it, as BERT's.
HEADS = CLASSIFIER + bert_hf.LINEAR_CLASSIFIER


def roberta_overrides(hf_config: dict, name: str = 'roberta', display: str = 'RoBERTa') -> dict:
  """HF RobertaConfig dict -> our config.model values (model.name 'roberta'; XLM-R's config, of
  the same fields, for 'xlm')."""
  # RobertaLMHead applies the exact GELU whatever hidden_act says; ours follows model.gelu.
  problems = (hf_layout.common_problems(hf_config, {'gelu': 'erf'})
              + hf_layout.not_causal(hf_config, display))
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


LAYOUT = Layout(
    family='roberta', model_type='roberta', display='RoBERTa', prefix='roberta.',
    base_class='RobertaModel', head_classes=(('RobertaForMaskedLM', 'lm_head.'),),
    table=TABLE, heads={'predictions': 'mlm'}, ignored=hf_layout.buffers('roberta.'),
    optional_pooler=True, to_overrides=roberta_overrides, to_hf_config=roberta_hf_config,
    exports_pooler=lambda config: False,  # RobertaForMaskedLM has no pooler.
    tokenizer='bpe', classifier=HEADS)

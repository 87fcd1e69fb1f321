"""DeBERTa's Hugging Face layout (DebertaV2 checkpoints): its key table and config.json
conversion, beside its encoder (model.py) and keys (config.py). No jax here."""

from bert_jax.models import hf_layout
from bert_jax.models.hf_layout import HF_GELU, Layout, UnsupportedConfigError

# DeBERTa-v2/v3 (DebertaV2ForMaskedLM, legacy head): BERT's layer names with *_proj denses,
# the position projections when not shared, the relative table and its LayerNorm; no segments,
# no pooler; absolute positions only with position_biased_input.
_DEBERTA_LAYER = 'deberta.encoder.layer.{n}.'
DEBERTA_TABLE = (
    ('bert/embeddings/word_embeddings', 'deberta.embeddings.word_embeddings.weight', 'none'),
    ('bert/embeddings/position_embeddings', 'deberta.embeddings.position_embeddings.weight',
     'none'),
    ('bert/embeddings/LayerNorm/scale', 'deberta.embeddings.LayerNorm.weight', 'none'),
    ('bert/embeddings/LayerNorm/bias', 'deberta.embeddings.LayerNorm.bias', 'none'),
) + hf_layout.layer_rows(_DEBERTA_LAYER, (
        ('attention/self/query/', 'attention.self.query_proj.', 'transpose_split_out', 'split'),
        ('attention/self/key/', 'attention.self.key_proj.', 'transpose_split_out', 'split'),
        ('attention/self/value/', 'attention.self.value_proj.', 'transpose_split_out', 'split'),
        ('attention/self/pos_key/', 'attention.self.pos_key_proj.', 'transpose_split_out',
         'split'),
        ('attention/self/pos_query/', 'attention.self.pos_query_proj.', 'transpose_split_out',
         'split'),
        ('attention/output/dense/', 'attention.output.dense.', 'transpose_split_in', 'none'),
        ('attention/output/LayerNorm/', 'attention.output.LayerNorm.', 'none', 'none'),
        ('intermediate/dense/', 'intermediate.dense.', 'transpose', 'none'),
        ('output/dense/', 'output.dense.', 'transpose', 'none'),
        ('output/LayerNorm/', 'output.LayerNorm.', 'none', 'none'))
) + (
    ('bert/encoder/rel_embeddings', 'deberta.encoder.rel_embeddings.weight', 'none'),
    ('bert/encoder/rel_LayerNorm/scale', 'deberta.encoder.LayerNorm.weight', 'none'),
    ('bert/encoder/rel_LayerNorm/bias', 'deberta.encoder.LayerNorm.bias', 'none'),
    ('predictions/transform_dense/kernel', 'cls.predictions.transform.dense.weight', 'transpose'),
    ('predictions/transform_dense/bias', 'cls.predictions.transform.dense.bias', 'none'),
    ('predictions/transform_LayerNorm/scale', 'cls.predictions.transform.LayerNorm.weight',
     'none'),
    ('predictions/transform_LayerNorm/bias', 'cls.predictions.transform.LayerNorm.bias', 'none'),
    ('predictions/output_bias', 'cls.predictions.bias', 'none'),
    ('bert/embeddings/word_embeddings', 'cls.predictions.decoder.weight', 'tied'),
    ('predictions/output_bias', 'cls.predictions.decoder.bias', 'tied'),
)

def _deberta_terms(value) -> tuple[str, list[str]]:
  """pos_att_type (a list, or 'p2c|c2p') -> (our 'c2p|p2c', the names we do not know)."""
  named = value if isinstance(value, (list, tuple)) else str(value or '').split('|')
  named = {str(t).strip().lower() for t in named if str(t).strip()}
  return '|'.join(t for t in ('c2p', 'p2c') if t in named), sorted(named - {'c2p', 'p2c'})


def deberta_overrides(hf_config: dict) -> dict:
  """HF DebertaV2Config dict -> our config.model values (model.name 'deberta')."""
  problems = hf_layout.common_problems({k: v for k, v in hf_config.items()
                               if k != 'position_embedding_type'}, HF_GELU)
  if hf_config.get('conv_kernel_size', 0) > 0:
    problems.append(f'conv_kernel_size={hf_config["conv_kernel_size"]}; our DeBERTa has no '
                    'convolution beside the first layer')
  if hf_config.get('type_vocab_size', 0) > 0:
    problems.append(f'type_vocab_size={hf_config["type_vocab_size"]}; our DeBERTa has no '
                    'segment embeddings (the released models have none)')
  hidden = hf_config.get('hidden_size', 1536)
  if hf_config.get('embedding_size', hidden) != hidden:
    problems.append('embedding_size differs from hidden_size; our DeBERTa has no embed_proj')
  head = hf_config.get('attention_head_size')
  if head and head * hf_config.get('num_attention_heads', 24) != hidden:
    problems.append(f'attention_head_size={head}; ours is hidden_size / num_attention_heads')
  if not hf_config.get('legacy', True):
    problems.append("legacy=false; our MLM head is the legacy one (cls.predictions)")
  norms = {t.strip() for t in str(hf_config.get('norm_rel_ebd', 'none')).lower().split('|')}
  if norms - {'none', 'layer_norm', ''}:
    problems.append(f'norm_rel_ebd={hf_config["norm_rel_ebd"]!r}; ours is layer_norm or none')
  terms, unknown = _deberta_terms(hf_config.get('pos_att_type'))
  if unknown:
    problems.append(f'pos_att_type {unknown}; ours are c2p and p2c')
  if problems:
    raise UnsupportedConfigError('Unsupported HF DeBERTa config: ' + '; '.join(problems) + '.')
  overrides = hf_layout.shape_overrides(hf_config)
  overrides.pop('type_vocab_size', None)
  relative = bool(hf_config.get('relative_attention', False))
  return {'name': 'deberta', **overrides, 'gelu': HF_GELU[hf_config.get('hidden_act', 'gelu')],
          'positions': 'absolute' if hf_config.get('position_biased_input', True) else 'none',
          'relative_attention': terms if relative else '',
          'relative_buckets': max(hf_config.get('position_buckets', -1), 0),
          'relative_positions': max(hf_config.get('max_relative_positions', -1), 0),
          'share_relative_key': bool(hf_config.get('share_att_key', False)),
          'relative_norm': 'layer_norm' in norms}


def deberta_hf_config(config) -> dict:
  """Our full config -> an HF DebertaV2Config dict for DebertaV2ForMaskedLM."""
  m = config.model
  terms = [t for t in ('c2p', 'p2c') if t in str(m.relative_attention).split('|')]
  fields = hf_layout.shape_fields(m)
  fields['type_vocab_size'] = 0
  return {
      'architectures': ['DebertaV2ForMaskedLM'], 'model_type': 'deberta-v2', **fields,
      'hidden_act': 'gelu' if m.gelu == 'erf' else 'gelu_new', 'pad_token_id': 0,
      'relative_attention': bool(terms), 'pos_att_type': terms,
      'position_buckets': m.relative_buckets or -1,
      'max_relative_positions': m.relative_positions or -1,
      'share_att_key': bool(m.share_relative_key),
      'norm_rel_ebd': 'layer_norm' if m.relative_norm else 'none',
      'position_biased_input': m.positions == 'absolute', 'legacy': True, 'conv_kernel_size': 0,
  }


def export_note(config) -> str | None:
  """The warning of an export whose MLM head was trained on the enhanced mask decoder."""
  if not config.model.get('enhanced_mask_decoder', False):
    return None
  return ('The MLM head was trained on the enhanced mask decoder, which transformers\' '
          'DebertaV2ForMaskedLM does not have: the backbone is exported exactly, but its MLM '
          'logits read the last layer.')


LAYOUT = Layout(
    family='deberta', model_type='deberta-v2', display='DeBERTa', prefix='deberta.',
    base_class='DebertaV2Model', head_classes=(('DebertaV2ForMaskedLM', 'cls.'),),
    table=DEBERTA_TABLE, heads={'predictions': 'mlm'}, ignored=hf_layout.buffers('deberta.'),
    optional_pooler=False, to_overrides=deberta_overrides, to_hf_config=deberta_hf_config,
    exports_pooler=lambda config: False, tokenizer='sentencepiece', export_note=export_note)

"""ModernBERT's Hugging Face layout (ModernBertForMaskedLM, ModernBertModel): its key table and
config.json conversion, beside its encoder (model.py). No jax here.
"""

from bert_jax.models import hf_layout
from bert_jax.models.hf_layout import Layout, UnsupportedConfigError
from bert_jax.models.modernbert import config as modernbert_config

# ModernBERT (ModernBertForMaskedLM): `model.` backbone, pre-norm layers (layer 0 has no
# attn_norm, in both trees), one Wqkv [3 * heads * kv, H] (ours [H, 3, heads, kv]) and one Wi
# [2F, H] whose first half is the activated input, second the gate (ours [H, 2, F]); `head.` is
# our predictions transform, `decoder.` the tied output with its bias. Bias rows apply when
# model.use_bias is True (attention_bias = mlp_bias = norm_bias = classifier_bias).
_MODERN_LAYER = 'model.layers.{n}.'
_OUR_MODERN_LAYER = 'bert/encoder/layer_{n}/'
TABLE = (
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
  types = ['full_attention' if modernbert_config.is_global(m, i) else 'sliding_attention'
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


LAYOUT = Layout(
    family='modernbert', model_type='modernbert', display='ModernBERT', prefix='model.',
    base_class='ModernBertModel', head_classes=(('ModernBertForMaskedLM', 'head.'),),
    table=TABLE, heads={'predictions': 'mlm'}, ignored=hf_layout.buffers('model.'),
    optional_pooler=False, to_overrides=modernbert_overrides,
    to_hf_config=modernbert_hf_config, exports_pooler=lambda config: False, tokenizer='bpe')

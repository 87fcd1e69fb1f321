"""DeBERTa pretraining (He et al., 2021): BERT's recipe on the disentangled-attention encoder.

Arguments (comma separated): `size=base|large` (default base), then configs/base.py's
(`configs/deberta.py:size=large,steps=10000`). The model is 'deberta' (models/deberta.py) with
DeBERTa-v3's encoder settings: content-to-position and position-to-content terms, 256 log
buckets over 512 positions, the layer's query and key denses shared with the position table, a
LayerNorm on that table, no absolute positions, no segments, LayerNorm eps 1e-7. The objective
is MLM alone on single segments (DeBERTa-v1's; v3's replaced-token detection with
gradient-disentangled embedding sharing is not implemented), the vocab a SentencePiece model of
128,000 pieces trained on the corpus (cased), the optimiser and schedule configs/base.py's
(BERT's).
"""

from configs import base
from configs import roberta

# (layers, hidden, heads): microsoft/deberta-v3-base and -large.
SIZES = {'base': (12, 768, 12), 'large': (24, 1024, 16)}


def get_config(arg=None):
  """DeBERTa-`size` (base by default); `arg` holds size= and configs/base.py's arguments."""
  size, arg = roberta.split_size(arg, SIZES)
  layers, hidden, heads = SIZES[size]
  config = base.get_config()
  config.objectives = 'mlm'  # No NSP: it has no segment embeddings.
  config.model.update(
      name='deberta', vocab_size=128100, num_layers=layers, hidden_size=hidden,
      num_heads=heads, intermediate_size=4 * hidden, type_vocab_size=1, layer_norm_eps=1e-7,
      positions='none', relative_attention='c2p|p2c', relative_buckets=256,
      relative_positions=0, share_relative_key=True, relative_norm=True)
  config.data.update(tokenizer='sentencepiece', lowercase=False, tokenizer_vocab_size=128000)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config

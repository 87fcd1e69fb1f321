"""DeBERTa pretraining (He et al., 2021): the disentangled-attention encoder, by MLM (v1's
objective) or by v3's replaced-token detection.

Arguments (comma separated): `size=base|large|tiny` (default base), `objective=mlm|rtd` (default
mlm), then configs/base.py's (`configs/deberta.py:size=large,objective=rtd,steps=10000`). The
model is 'deberta' (models/deberta.py) with DeBERTa-v3's encoder settings: content-to-position
and position-to-content terms, 256 log buckets over 512 positions, the layer's query and key
denses shared with the position table, a LayerNorm on that table, no absolute positions, no
segments, LayerNorm eps 1e-7; single segments, no NSP; the vocab a SentencePiece model of
128,000 pieces trained on the corpus (cased); the optimiser and schedule configs/base.py's
(BERT's).

`objective=rtd` is DeBERTa-v3's pretraining (He et al., 2021, "DeBERTaV3"): ELECTRA's
replaced-token detection (objectives/rtd.py: generator MLM + 50 x RTD; every masked position
[MASK], as microsoft/DeBERTa's rtd_task.py masks) with a generator as wide as the discriminator
and half as deep, and gradient-disentangled embedding sharing (model.embedding_sharing='gdes',
models/sharing.py).
"""

from configs import base
from configs import roberta

# (layers, hidden, heads): microsoft/deberta-v3-base and -large.
SIZES = {'base': (12, 768, 12), 'large': (24, 1024, 16)}
OBJECTIVES = ('mlm', 'rtd')


def get_config(arg=None):
  """DeBERTa-`size` (base by default) trained by `objective`; `arg` holds size=, objective= and
  configs/base.py's arguments."""
  own, arg = base.split_arguments(arg, ('objective',))
  objective = own.get('objective', 'mlm')
  if objective not in OBJECTIVES:
    raise ValueError(f'Config argument objective={objective!r}: expected one of '
                     f'{", ".join(OBJECTIVES)}.')
  size, arg = roberta.split_size(arg, (*SIZES, 'tiny'))
  layers, hidden, heads = SIZES['base' if size == 'tiny' else size]
  config = base.get_config()
  config.objectives = objective  # No NSP: it has no segment embeddings.
  config.model.update(
      name='deberta', vocab_size=128100, num_layers=layers, hidden_size=hidden,
      num_heads=heads, intermediate_size=4 * hidden, type_vocab_size=1, layer_norm_eps=1e-7,
      positions='none', relative_attention='c2p|p2c', relative_buckets=256,
      relative_positions=0, share_relative_key=True, relative_norm=True)
  if objective == 'rtd':
    config.model.update(generator_fraction=1.0, generator_layer_fraction=0.5, disc_weight=50.0,
                        embedding_sharing='gdes')
    config.masking.update(mask_token_fraction=1.0, random_token_fraction=0.0, keep_fraction=0.0)
  config.data.update(tokenizer='sentencepiece', lowercase=False, tokenizer_vocab_size=128000)
  if size == 'tiny':
    base.shrink_to_tiny(config)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config

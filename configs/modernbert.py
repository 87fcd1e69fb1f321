"""ModernBERT pretraining (Warner et al., 2024): the modern encoder block on a masked LM.

Arguments (comma separated): `size=base|large|tiny` (default base), then configs/base.py's
(`configs/modernbert.py:size=large,steps=10000`; `steps` without `warmup` keeps the warmup's
share). The model is 'modernbert' (models/modernbert/): pre-norm layers with LayerNorms
without biases, no biases anywhere else, GeGLU feed-forward, rotary positions (theta 160,000 in
the global layers, 10,000 in the local ones), every third layer global and the others attending
within 128 tokens; MLM only at a 30% masking rate; byte-level BPE rows of 1,024 tokens filled
with whole sentences (FULL-SENTENCES rows: no padding computed); dropout 0 as in the released
checkpoints' configs. Shapes are those of answerdotai/ModernBERT-base and -large. The paper's
optimiser is StableAdamW with a warmup-stable-decay schedule; this config keeps bert_jax's AdamW
with warmup and linear decay at the paper's peak learning rates and batch of 4,608 rows.
"""

from configs import base
from configs import roberta

# (layers, hidden, heads, feed-forward width, peak learning rate).
SIZES = {'base': (22, 768, 12, 1152, 8e-4), 'large': (28, 1024, 16, 2624, 5e-4)}


def get_config(arg=None):
  """ModernBERT-`size` (base by default); `arg` holds size= and configs/base.py's arguments."""
  size, arg = roberta.split_size(arg, (*SIZES, 'tiny'))
  layers, hidden, heads, mlp, lr = SIZES['base' if size == 'tiny' else size]
  config = base.get_config()
  config.objectives = 'mlm'  # No NSP: full rows of sentences.
  config.model.update(
      name='modernbert', vocab_size=50368, num_layers=layers, hidden_size=hidden,
      num_heads=heads, intermediate_size=mlp, max_position_embeddings=8192,
      type_vocab_size=1, layer_norm_eps=1e-5, hidden_dropout_rate=0.0,
      attention_dropout_rate=0.0, norm='layer_norm', use_bias=False, feed_forward='geglu',
      positions='rotary', rope_theta=160_000.0, local_rope_theta=10_000.0, local_window=128,
      global_every=3,
      # The first layer and the local ones differ from the others: unrolled.
      scan_layers=False)
  config.masking.rate = 0.3
  config.data.update(
      tokenizer='bpe', lowercase=False, tokenizer_vocab_size=50368, rows='full_sentences',
      max_seq_length=1024, max_predictions_per_seq=308)
  config.train.update(
      batch_size=4608, num_steps=360_000, warmup_steps=640, learning_rate=lr, adam_b2=0.98,
      adam_eps=1e-6, weight_decay=1e-5,
      # 4608 rows of 1024 as 18 micro-batches of 256; scale it with the devices.
      grad_accum_steps=18)
  if size == 'tiny':
    base.shrink_to_tiny(config)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config

"""ALBERT pretraining (Lan et al., 2019): factorised embeddings, one shared layer, MLM + SOP.

Arguments (comma separated): `size=base|large|xlarge|tiny` (default base), then configs/base.py's
(`configs/albert.py:size=large,steps=10000`; `steps` without `warmup` keeps the warmup's
share, 3,125 of 125k). The model is 'albert' (E=128 projected to H, every layer the same
parameters); the objectives MLM and sentence-order prediction; the vocab a 30k SentencePiece,
lowercased; LAMB at batch 4096, as the paper; n-gram masking, n <= 3.
"""

from configs import base
from configs import roberta

# (layers, hidden, heads); the feed-forward width is 4 x hidden, the embeddings 128 wide. xlarge's
# 16 heads are the released albert_xlarge's (albert-xlarge-v2 config.json: 128-wide heads).
SIZES = {'base': (12, 768, 12), 'large': (24, 1024, 16), 'xlarge': (24, 2048, 16)}


def get_config(arg=None):
  """ALBERT-`size` (base by default); `arg` holds size= and configs/base.py's arguments."""
  size, arg = roberta.split_size(arg, (*SIZES, 'tiny'))
  layers, hidden, heads = SIZES['base' if size == 'tiny' else size]
  config = base.get_config()
  config.objectives = 'mlm,sop'  # SOP labels each pair: 0 in order, 1 swapped.
  config.masking.max_ngram = 3  # Spans of 1-3 words, p(n) ~ 1/n.
  config.model.update(
      name='albert', vocab_size=30000, embedding_size=128, num_layers=layers, hidden_size=hidden,
      num_heads=heads, intermediate_size=4 * hidden,
      # The original code's GELU is the tanh one (HF: hidden_act 'gelu_new'); v2 drops dropout.
      gelu='tanh', hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
  config.data.update(
      tokenizer='sentencepiece', lowercase=True, tokenizer_vocab_size=30000,
      # The original run_pretraining caps predictions at 20 a row; 80 keeps 15% of 512.
      max_seq_length=512, max_predictions_per_seq=80)
  config.train.update(
      optimizer='lamb', batch_size=4096, num_steps=125_000, warmup_steps=3_125,
      learning_rate=0.00176, weight_decay=0.01, adam_eps=1e-6,
      # 4096 rows of 512 as 16 micro-batches of 256 (32 per accelerator on 8); scale it with the
      # devices: any value that divides the batch takes the same optimizer step.
      grad_accum_steps=16)
  if size == 'tiny':
    base.shrink_to_tiny(config)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config

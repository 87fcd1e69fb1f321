"""RoBERTa pretraining (Liu et al., 2019): BERT's encoder and MLM, without NSP, at batch 8k.

Arguments (comma separated): `size=base|large|tiny` (the papers' shapes; tiny: the recipe at
configs/tiny.py's shape, base.shrink_to_tiny; default base), then configs/base.py's
(`configs/roberta.py:size=large,steps=100000`; `steps` without `warmup` keeps the warmup's
share, 24k of 500k). The model is 'roberta' (fairseq positions from 2, one
segment row, LayerNorm eps 1e-5, 514 position rows), the vocab RoBERTa's byte-level BPE of
50,265 tokens (`<s> <pad> </s> <unk>`, `<mask>` last), rows FULL-SENTENCES of 512 tokens with
dynamic masking (base.py's default).
"""

from configs import base

# (layers, hidden, heads); the feed-forward width is 4 x hidden.
SIZES = {'base': (12, 768, 12), 'large': (24, 1024, 16)}
# Table 9 of the paper: peak learning rate by size.
PEAK_LEARNING_RATES = {'base': 6e-4, 'large': 4e-4}


def get_config(arg=None):
  """RoBERTa-`size` (base by default); `arg` holds size= and configs/base.py's arguments."""
  size, arg = split_size(arg, (*SIZES, 'tiny'))
  shape = 'base' if size == 'tiny' else size  # tiny shrinks the base recipe.
  layers, hidden, heads = SIZES[shape]
  config = base.get_config()
  config.objectives = 'mlm'  # No NSP: full sentences, single segments.
  config.model.update(
      name='roberta', vocab_size=50265, num_layers=layers, hidden_size=hidden, num_heads=heads,
      intermediate_size=4 * hidden,
      # fairseq numbers positions from 2 (padding_idx 1 + 1): 512 tokens read rows 2..513.
      max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5)
  config.data.update(
      tokenizer='bpe', lowercase=False, tokenizer_vocab_size=50265,
      # FULL-SENTENCES: whole sentences fill every row to 512 tokens, across documents.
      rows='full_sentences', max_seq_length=512, max_predictions_per_seq=80)
  config.train.update(
      batch_size=8192, num_steps=500_000, warmup_steps=24_000,
      learning_rate=PEAK_LEARNING_RATES[shape], adam_b2=0.98, adam_eps=1e-6, weight_decay=0.01,
      # 8192 sequences of 512 tokens do not fit at once on any single host: 32 micro-batches of
      # 256 (32 sequences per accelerator on 8). Scale it with the devices; the optimizer step,
      # and so the recipe, is the same for any value that divides the batch.
      grad_accum_steps=32)
  if size == 'tiny':
    base.shrink_to_tiny(config)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config


def split_size(arg, sizes) -> tuple[str, str]:
  """('base', 'steps=10') from 'size=base,steps=10': the size= argument (default 'base') and the
  rest for configs/base.py; ValueError naming the sizes for another."""
  own, rest = base.split_arguments(arg, ('size',))
  size = own.get('size', 'base')
  if size not in sizes:
    raise ValueError(f'Config argument size={size!r}: expected one of {", ".join(sizes)}.')
  return size, rest

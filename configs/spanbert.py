"""SpanBERT pretraining (Joshi et al., 2020): span masking and the span boundary objective.

Arguments (comma separated): `size=base|large|tiny` (BERT's shapes; default base), then
configs/base.py's (`configs/spanbert.py:size=large,steps=100000`; `steps` without `warmup`
keeps the warmup's share, 10k of 2.4M). BERT's encoder; the objectives MLM + SBO
('mlm,sbo': no NSP), each row one contiguous segment of up to 512 tokens of one document
(no short rows, as the released run's --short-seq-prob 0); spans of whole words, lengths
Geometric(0.2) clipped at 10, until 15% of the tokens, one 80/10/10 decision per span; dynamic
masking. The recipe of the paper and its released command: AdamW (beta2 0.999, eps 1e-8,
weight decay 0.01), peak lr 1e-4, 10k warmup steps then linear decay, 2.4M steps of 256 x 512,
clipping at 1.0.
The paper tokenizes with BERT's cased WordPiece (28,996 tokens): set data.vocab_file to
bert-base-cased's vocab.txt for that; without one, a cased WordPiece of that size is trained on
the corpus.
"""

from configs import base
from configs import roberta

# (layers, hidden, heads); the feed-forward width is 4 x hidden.
SIZES = {'base': (12, 768, 12), 'large': (24, 1024, 16)}


def get_config(arg=None):
  """SpanBERT-`size` (base by default); `arg` holds size= and configs/base.py's arguments."""
  size, arg = roberta.split_size(arg, (*SIZES, 'tiny'))
  layers, hidden, heads = SIZES['base' if size == 'tiny' else size]
  config = base.get_config()
  config.objectives = 'mlm,sbo'  # No NSP: single segments.
  config.masking.update(spans='geometric', span_p=0.2, max_span=10, whole_word=True)
  config.model.update(vocab_size=28996, num_layers=layers, hidden_size=hidden, num_heads=heads,
                      intermediate_size=4 * hidden)
  config.data.update(
      lowercase=False, tokenizer_vocab_size=28996,
      # 15% of 512 is 77 predictions.
      max_seq_length=512, max_predictions_per_seq=80, short_seq_prob=0.0)
  config.train.update(batch_size=256, num_steps=2_400_000, warmup_steps=10_000,
                      learning_rate=1e-4, weight_decay=0.01, adam_b2=0.999, adam_eps=1e-8,
                      max_grad_norm=1.0)
  if size == 'tiny':
    base.shrink_to_tiny(config)
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config

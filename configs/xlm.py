"""Cross-lingual pretraining: XLM-R (Conneau et al., 2020) or XLM's MLM + TLM (Lample and Conneau,
2019), both on the encoder 'xlm' (models/xlm/: RoBERTa's, with optional language embeddings).

Arguments (comma separated): `recipe=xlmr|xlm` (default xlmr), `size=base|large|tiny` (XLM-R's
shapes, default base; recipe=xlm has its own), then configs/base.py's
(`configs/xlm.py:size=large,steps=100000`; `steps` without `warmup` keeps the warmup's share).
The corpus is the user's: `--config.data.corpus='wiki.{lang}.txt'` with `--config.data.languages=
en,fr,...` (each language's documents), and for TLM `--config.data.parallel='en-fr:FILES,...'`
(tab-separated sentence pairs). One SentencePiece vocab, cased, is trained on all of it.
- xlmr: XLM-R-`size`: no language embeddings, MLM only on FULL-SENTENCES rows of 512 tokens
  (never across languages), languages sampled with alpha 0.3, a vocab of 250,002 pieces,
  RoBERTa's optimiser and learning rates (the paper names neither) at batch 8192 for 1.5M
  updates (section 3).
- xlm: XLM's XNLI-15 model: 12 layers 1024 wide, 8 heads, language embeddings for XNLI's 15
  languages, MLM rows of 256 tokens and TLM rows from data.parallel shuffled together (XLM
  alternates MLM and TLM batches), alpha 0.5, batch 64, Adam at 1e-4 with beta2 0.98; a
  SentencePiece vocab of 95,000 in place of its fastBPE codes, and configs/base.py's linear
  schedule in place of its inverse square root. Positions are XLM-R's (fairseq's, from 2).
"""

from configs import base
from configs import roberta

# (layers, hidden, heads): xlm-roberta-base and -large; the feed-forward width is 4 x hidden.
SIZES = {'base': (12, 768, 12), 'large': (24, 1024, 16)}
RECIPES = ('xlmr', 'xlm')
# XNLI's 15 languages, XLM's MLM + TLM model's (mlm_tlm_xnli15_1024), in its order.
XNLI_LANGUAGES = 'en,fr,es,de,el,bg,ru,tr,ar,vi,th,zh,hi,sw,ur'


def get_config(arg=None):
  """XLM-R-`size` or XLM's MLM + TLM (`recipe`); `arg` holds recipe=, size= and
  configs/base.py's arguments."""
  own, rest = base.split_arguments(arg, ('recipe', 'size'))
  recipe, size = own.get('recipe', 'xlmr'), own.get('size', 'base')
  if recipe not in RECIPES:
    raise ValueError(f'Config argument recipe={recipe!r}: expected one of {", ".join(RECIPES)}.')
  if size not in (*SIZES, 'tiny'):
    raise ValueError(f'Config argument size={size!r}: expected one of '
                     f'{", ".join((*SIZES, "tiny"))}.')
  if recipe == 'xlm' and 'size' in own:
    raise ValueError(f"Config argument size={size!r} with recipe='xlm': sizes are XLM-R's "
                     "(recipe=xlmr); XLM's MLM + TLM model has one shape.")
  config = base.get_config()
  config.objectives = 'mlm'  # No NSP: TLM pairs are a sentence and its translation.
  shape = 'base' if size == 'tiny' else size  # tiny shrinks the base recipe.
  layers, hidden, heads = SIZES[shape] if recipe == 'xlmr' else (12, 1024, 8)
  config.model.update(
      name='xlm', vocab_size=250_002 if recipe == 'xlmr' else 95_000, num_layers=layers,
      hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden,
      # fairseq numbers positions from 2 (padding_idx 1 + 1): 512 tokens read rows 2..513.
      max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5)
  config.data.update(tokenizer='sentencepiece_fairseq', lowercase=False,
                     tokenizer_vocab_size=config.model.vocab_size, rows='full_sentences')
  if recipe == 'xlmr':
    config.data.update(max_seq_length=512, max_predictions_per_seq=80, language_alpha=0.3)
    config.train.update(
        batch_size=8192, num_steps=1_500_000, warmup_steps=24_000,
        learning_rate=roberta.PEAK_LEARNING_RATES[shape], adam_b2=0.98, adam_eps=1e-6,
        weight_decay=0.01, grad_accum_steps=32)  # As configs/roberta.py: 32 x 256 rows.
  else:
    config.model.num_languages = len(XNLI_LANGUAGES.split(','))
    config.data.update(languages=XNLI_LANGUAGES, max_seq_length=256,
                       max_predictions_per_seq=40, language_alpha=0.5)
    config.train.update(batch_size=64, learning_rate=1e-4, warmup_steps=4000, adam_b2=0.98,
                        weight_decay=0.0)
  if size == 'tiny':
    base.shrink_to_tiny(config)
  if rest:
    base.apply_pretraining_arguments(config, rest)
  return config

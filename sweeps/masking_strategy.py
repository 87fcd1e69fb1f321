"""BERT appendix C.2: what the chosen tokens become. [MASK] / random token / unchanged shares:
80/10/10 (BERT), 100/0/0, 80/0/20, 80/20/0, 0/20/80, 0/0/100.

  python -m bert_jax.sweep run --sweep=sweeps/masking_strategy.py --workdir=runs/masking_strategy
"""

from sweeps import common

# The paper's appendix C.2 (dev): MNLI-m fine-tuned, NER fine-tuned and feature-based.
PAPER = {
    (80, 10, 10): {'mnli': 84.2, 'ner': 95.4, 'ner_feature': 94.9},
    (100, 0, 0): {'mnli': 84.3, 'ner': 94.9, 'ner_feature': 94.0},
    (80, 0, 20): {'mnli': 84.1, 'ner': 95.2, 'ner_feature': 94.6},
    (80, 20, 0): {'mnli': 84.4, 'ner': 95.2, 'ner_feature': 94.7},
    (0, 20, 80): {'mnli': 83.7, 'ner': 94.8, 'ner_feature': 94.6},
    (0, 0, 100): {'mnli': 83.6, 'ner': 94.9, 'ner_feature': 94.6},
}


def get_config():
  sweep = common.sweep(
      'masking_strategy', 'Masking strategy (BERT appendix C.2)',
      'Of the 15% of tokens chosen for prediction, the shares replaced by [MASK], by a random '
      'token, and left unchanged. Every arm is scored on the same held-out masks (80/10/10).')
  common.with_arms(sweep, {
      f'mask{m}_rand{r}_keep{k}': {
          'label': f'{m}/{r}/{k}',
          'pretrain': {'masking': {'mask_token_fraction': m / 100,
                                   'random_token_fraction': r / 100, 'keep_fraction': k / 100}},
          'paper': PAPER[(m, r, k)]}
      for m, r, k in PAPER})
  sweep.paper = {'source': 'Devlin et al. (2019), appendix C.2 (dev)',
                 'columns': ['mnli', 'ner', 'ner_feature']}
  return sweep

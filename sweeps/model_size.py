"""BERT Table 6: model size. Four of the paper's shapes (L layers, H wide, A heads), the same
data, steps and batch; held-out MLM perplexity and fine-tuning against size.

  python -m bert_jax.sweep run --sweep=sweeps/model_size.py --workdir=runs/model_size
"""

from sweeps import common

# The paper's Table 6 (dev): held-out MLM perplexity, MNLI-m, MRPC, SST-2.
PAPER = {
    (3, 768, 12): {'ppl': 5.84, 'mnli': 77.9, 'mrpc': 79.8, 'sst2': 88.4},
    (6, 768, 3): {'ppl': 5.24, 'mnli': 80.6, 'mrpc': 82.2, 'sst2': 90.7},
    (6, 768, 12): {'ppl': 4.68, 'mnli': 81.9, 'mrpc': 84.8, 'sst2': 91.3},
    (12, 768, 12): {'ppl': 3.99, 'mnli': 84.4, 'mrpc': 86.7, 'sst2': 92.9},
}


def get_config():
  sweep = common.sweep(
      'model_size', 'Model size (BERT Table 6)',
      'The paper\'s four smallest shapes, each trained for the same steps on the same batches. '
      'The feed-forward width is 4H throughout.')
  common.with_arms(sweep, {
      f'L{layers}_H{hidden}_A{heads}': {
          'label': f'L={layers}, H={hidden}, A={heads}',
          'args': f'layers={layers},hidden={hidden},heads={heads}',
          'pretrain': {'model': {'intermediate_size': 4 * hidden}},
          'paper': PAPER[(layers, hidden, heads)]}
      for layers, hidden, heads in PAPER})
  sweep.paper = {'source': 'Devlin et al. (2019), Table 6 (dev; ppl: held-out MLM perplexity)',
                 'columns': ['ppl', 'mnli', 'mrpc', 'sst2']}
  return sweep

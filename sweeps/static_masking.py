"""Static against dynamic masking (RoBERTa, section 4.1): the same masks every epoch
(data.dupe_factor=1, as one pass of BERT's create_pretraining_data.py) against fresh masks every
time a row is seen (dupe_factor=0).

  python -m bert_jax.sweep run --sweep=sweeps/static_masking.py --workdir=runs/static_masking
"""

from sweeps import common


def get_config():
  sweep = common.sweep(
      'static_masking', 'Static against dynamic masking (RoBERTa 4.1)',
      'The same model, data and steps; the static arm sees each row with the same masks every '
      'epoch, the dynamic arm with fresh ones. With a budget of few epochs the two differ only '
      'from the second epoch on.')
  common.with_arms(sweep, {
      'static': {'label': 'static (dupe_factor=1)', 'pretrain': {'data': {'dupe_factor': 1}},
                 'paper': {'squad': 78.3, 'mnli': 84.3, 'sst2': 92.5}},
      'dynamic': {'label': 'dynamic', 'pretrain': {'data': {'dupe_factor': 0}},
                  'paper': {'squad': 78.7, 'mnli': 84.0, 'sst2': 92.9}},
  })
  sweep.paper = {'source': 'Liu et al. (2019), RoBERTa Table 1 (BERT-Base, dev; SQuAD 2.0 F1)',
                 'columns': ['squad', 'mnli', 'sst2']}
  return sweep

"""BERT Table 5: the pre-training tasks. MLM + NSP (BERT), MLM only, a left-to-right LM, and the
left-to-right LM with a BiLSTM on top at fine-tuning; and, as a floor, no pretraining at all.

  python -m bert_jax.sweep run --sweep=sweeps/table5.py --workdir=runs/table5
"""

from sweeps import common

# The paper's Table 5 (BERT-Base, dev): MNLI-m, QNLI, MRPC accuracy, SST-2, SQuAD v1.1 F1.
PAPER = {
    'mlm_nsp': {'mnli': 84.4, 'qnli': 88.4, 'mrpc': 86.7, 'sst2': 92.7, 'squad': 88.5},
    'mlm': {'mnli': 83.9, 'qnli': 84.9, 'mrpc': 86.5, 'sst2': 92.6, 'squad': 87.9},
    'ltr': {'mnli': 82.1, 'qnli': 84.3, 'mrpc': 77.5, 'sst2': 92.1, 'squad': 77.8},
    'ltr_bilstm': {'mnli': 82.1, 'qnli': 84.1, 'mrpc': 75.7, 'sst2': 91.6, 'squad': 84.9},
}
# The left-to-right LM: causal attention (the XLA attention path), next-token prediction at
# every position, no masking and no NSP.
LTR = {'objectives': 'clm', 'model': {'causal': True, 'attention_impl': 'xla'}}


def get_config():
  sweep = common.sweep(
      'table5', 'Pre-training tasks (BERT Table 5)',
      'Each arm pretrains the same model on the same tokens with another objective, then is '
      'fine-tuned with the same settings and seeds. "No pretraining" fine-tunes the same shape '
      'from random initialisation.')
  common.with_arms(sweep, {
      'mlm_nsp': {'label': 'MLM + NSP (BERT)', 'paper': PAPER['mlm_nsp']},
      'mlm': {'label': 'No NSP', 'args': 'nsp=False', 'paper': PAPER['mlm']},
      'ltr': {'label': 'LTR & No NSP', 'pretrain': LTR, 'paper': PAPER['ltr']},
      'ltr_bilstm': {'label': '+ BiLSTM', 'pretrain': LTR,
                     'finetune': {'task': {'lstm_layers': 1}}, 'paper': PAPER['ltr_bilstm']},
      'random': {'label': 'No pretraining', 'init': 'random'},
  })
  sweep.paper = {'source': 'Devlin et al. (2019), Table 5 (BERT-Base, dev)',
                 'columns': ['mnli', 'qnli', 'mrpc', 'sst2', 'squad']}
  sweep.notes = [
      'The LTR arms\' held-out loss is a next-token loss, not a masked-token loss: its '
      'perplexity is not comparable with the MLM arms\'.',
  ]
  return sweep

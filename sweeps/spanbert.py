"""SpanBERT against BERT-style token masking at one shape and one compute budget, on SQuAD v1.1.

Both arms are configs/small.py's shape and recipe (6 layers, 768 wide, seq 128, batch 256) on the
same documents, single segments and no NSP (SpanBERT's setting, Joshi et al. 2020, section 3.3):

  BERT      MLM with token masking (15%, 80/10/10 per token).
  SpanBERT  MLM + the span boundary objective with span masking (whole-word spans of
            Geometric(0.2) words clipped at 10, one 80/10/10 decision per span).

The SpanBERT arm pretrains for the steps at which its training FLOPs (its boundary head
included) match BERT's (`sweep.equal_flops`). Each checkpoint is fine-tuned on SQuAD v1.1: no
training file is at hand, so on half of the dev articles, scored on the other half (the same
split for both arms), with the paper's settings (lr 3e-5, batch 32, 2 epochs, seq 384, stride
128), 3 seeds. The paper reports SQuAD 1.1 F1 88.0 -> 92.4 for Large at its full budget
(Table 1, Google BERT -> SpanBERT); this sweep measures the direction at a small one.

  python -m bert_jax.sweep run --sweep=sweeps/spanbert.py --workdir=runs/spanbert
"""

from sweeps import common

SPANBERT = {'objectives': 'mlm,sbo',
            'masking': {'spans': 'geometric', 'span_p': 0.2, 'max_span': 10, 'whole_word': True}}
# SQuAD v1.1 from its dev file: half the articles to train on, the rest to score.
SQUAD = {'task': {'split_dev_fraction': 0.5, 'write_predictions': False},
         'data': {'max_seq_length': 384},
         'train': {'learning_rate': 3e-5, 'batch_size': 32, 'num_epochs': 2.0}}


def get_config():
  sweep = common.sweep(
      'spanbert', 'SpanBERT against token masking at equal compute (SQuAD v1.1)',
      'One shape (6 layers, 768 wide), single segments without NSP, and one pretraining budget '
      'in FLOPs; the arms differ in what is masked (tokens, or spans of words) and in the span '
      'boundary objective, then are fine-tuned on SQuAD v1.1 with the same settings and seeds.')
  common.with_arms(sweep, {
      'bert': {'label': 'BERT masking (MLM, tokens)', 'pretrain': {'objectives': 'mlm'},
               'paper': {'squad': 88.0}},
      'spanbert': {'label': 'SpanBERT (MLM + SBO, spans)', 'pretrain': SPANBERT,
                   'paper': {'squad': 92.4}},
  })
  sweep.equal_flops = 'bert'
  sweep.finetune.tasks = 'squad'  # configs/squad.py: version 1.1.
  sweep.finetune.task_overrides = {'squad': SQUAD}
  sweep.paper = {'source': 'Joshi et al. (2020), Table 1: SQuAD 1.1 dev F1 of Large models, '
                           'Google BERT and SpanBERT', 'columns': ['squad']}
  sweep.notes = [
      'SQuAD v1.1 is trained on half of the dev articles and scored on the other half (no '
      'train-v1.1.json at hand); the paper trains on the train set and scores all of dev.',
      'The arms pretrain for equal training FLOPs (steps x batch x model FLOPs per sequence), '
      'not equal steps.',
  ]
  return sweep

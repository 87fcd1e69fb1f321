"""DistilBERT: a student of half its teacher's depth distilled from a BERT trained in the sweep.

The teacher is configs/small.py's recipe (6 layers, 768 wide, MLM + NSP, 20,000 steps of
256 x 128). The student is DistilBERT's encoder (no segment table, no pooler) at the teacher's
width with 3 layers, initialised from the teacher's layers 0, 3 and 5, its embeddings and MLM
head, and trained for the same steps on the same documents with the distillation loss
(5.0 x T^2 x KL at T = 2 over every real token, 2.0 x MLM, 1.0 x cosine of the last hidden
states; objectives/distill.py), the teacher's forward in the same step, and DistilBERT's Adam
settings (eps 1e-6, no weight decay, clipping at 5). Single segments, no NSP. Both are
fine-tuned with the same settings and seeds; DistilBERT reports 97% of its teacher's GLUE score
at 60% of its inference time (Sanh et al., 2019).

  python -m bert_jax.sweep run --sweep=sweeps/distillation.py --workdir=runs/distillation
"""

from sweeps import common

STUDENT = {
    'objectives': 'distill',
    'model': {'name': 'distilbert', 'num_layers': 3},
    'train': {'adam_eps': 1e-6, 'weight_decay': 0.0, 'max_grad_norm': 5.0},
}


def get_config():
  sweep = common.sweep(
      'distillation', 'DistilBERT: a 3-layer student of a 6-layer BERT',
      'The teacher pretrains with the recipe; the student, half its depth and initialised from '
      'its layers, distils from it for the same steps on the same documents; both are '
      'fine-tuned with the same settings and seeds.')
  common.with_arms(sweep, {
      # The recipe's depth, stated: the student's is half of it.
      'bert': {'label': 'BERT teacher (6 layers)', 'pretrain': {'model': {'num_layers': 6}}},
      'distilbert': {'label': 'DistilBERT student (3 layers)', 'teacher': 'bert',
                     'pretrain': STUDENT},
  })
  sweep.notes = [
      'The student trains for the teacher\'s steps; a step of it also runs the teacher\'s '
      'forward, so its budget column counts that forward once.',
  ]
  return sweep

"""DistilBERT (Sanh et al., 2019): a student of half its teacher's depth, distilled from it.

`python -m bert_jax.main --config=configs/distilbert.py --workdir=DIR
--config.distill.teacher=TEACHER_WORKDIR` (or `hf:DIR`). The teacher's shape, vocab size and
vocab come from its checkpoint; the student is DistilBERT's encoder (no segment table, no
pooler) at the teacher's width with `layers` of its layers (default 6: BERT-base's 12 halved),
initialised from the teacher's layers 0, 2, 4, 7, 9, 11 (config.distill.teacher_layers), its
embeddings and MLM head. The loss is 5.0 x T^2 x KL + 2.0 x MLM + 1.0 x cosine at T = 2
(objectives/distill.py).

The recipe is transformers' research_projects/distillation README and train.py: batches of
about 4K rows (DistilBERT's paper: "very large batches (up to 4K examples per batch)"), here
4,096 in 16 accumulated micro-batches of 256; Adam at 5e-4, eps 1e-6, no weight decay, clipping
at 5.0, warmup over 5% of the steps then linear decay; dynamic masking at 15% (80/10/10), no
NSP, no token types; rows of up to 512 tokens of one document (the reference's rows are lines of
the dump cut at 512 tokens). Not reproduced: mlm_smoothing (the reference draws masked tokens
with probability ~ frequency^-0.7; ours uniformly, as BERT) and its batches grouped by length.
The step count is the reference's three epochs of BERT's corpus (3.3B words), taken as 3.3B
tokens in full rows of 512: 3.3e9 / (4,096 x 512) = about 1,570 steps an epoch, 4,700 for three
(a lower bound: WordPiece makes more tokens than words).
Arguments: `layers=N` (the student's depth), then configs/base.py's.
"""

from configs import base


def get_config(arg=None):
  """The DistilBERT recipe; `arg` holds layers= and configs/base.py's arguments."""
  layers, rest = 6, []
  for item in (arg or '').split(','):
    name, sep, value = item.partition('=')
    if sep and name.strip() == 'layers':
      layers = int(value)
    elif item.strip():
      rest.append(item)
  config = base.get_config()
  config.objectives = 'distill'
  config.model.update(name='distilbert', num_layers=layers)
  config.data.update(max_seq_length=512, max_predictions_per_seq=80)
  config.train.update(
      batch_size=4096, grad_accum_steps=16, num_steps=4700, warmup_steps=235,
      learning_rate=5e-4, adam_eps=1e-6, weight_decay=0.0, max_grad_norm=5.0,
      log_every=20, eval_every=600, checkpoint_every=600)
  if rest:
    base.apply_pretraining_arguments(config, ','.join(rest))
  return config

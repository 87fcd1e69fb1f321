"""Sentence-order prediction (ALBERT): are segments A and B in their document's order (label 0)
or swapped (label 1)?

Lan et al. (2019) replace NSP, whose random B is told apart by topic alone, with a pair of two
consecutive runs of sentences of one document, swapped for half the pairs; labels as
transformers' AlbertForPreTraining `sentence_order_label` (0: A then B, 1: B then A) and the
original create_pretraining_data.py. The head is a 2-way dense layer on the pooled [CLS] state,
`sop_classifier` (HF's sop_classifier.classifier), without dropout, as the original TF code.

The data contract is NSP's (instances='pairs'): rows `[CLS] A [SEP] B [SEP]`, the label in
next_sentence_labels, [] per row, or with packed rows [pairs] with nsp_positions (each pair's
[CLS], which the encoder pools) and nsp_weights (1.0 for a real pair). pair_kind='order' has the
data make swapped consecutive segments (data/pretraining.py) instead of NSP's random B.
"""

import jax.numpy as jnp

from bert_jax import objectives
from bert_jax.models import layers
from bert_jax.objectives import nsp


def head(config, encoded: objectives.Encoded, batch, deterministic: bool) -> dict:
  del batch, deterministic
  dense = layers.DenseGeneral(2, ('embed', 'classes'), dtype=config.dtype,
                              param_dtype=config.param_dtype, kernel_init=config.init,
                              name='sop_classifier')
  return {'sop_logits': dense(encoded.pooled).astype(jnp.float32)}  # [batch, (pairs,) 2]


def losses(outputs, batch) -> dict:
  return nsp.pair_losses('sop', outputs['sop_logits'], batch)


def counts(batch) -> dict:
  return {'sop_count': jnp.sum(nsp.pair_weights(batch))}


def loss(stats):
  """Mean cross-entropy over the pairs."""
  return stats['sop_loss_sum'] / stats['sop_count']


def metrics(stats) -> dict:
  return nsp.pair_metrics('sop', stats)


def flops(model, shape: objectives.BatchShape) -> float:
  del model, shape  # Two logits per pair, as NSP's: negligible.
  return 0


OBJECTIVE = objectives.register(objectives.Objective(
    name='sop', batch_spec=nsp.batch_spec, head=head, losses=losses, loss=loss, metrics=metrics,
    flops=flops, counts=counts, instances='pairs', pair_kind='order'))

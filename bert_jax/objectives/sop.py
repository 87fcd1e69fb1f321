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
import optax

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
  logits = outputs['sop_logits']  # [batch, 2], packed: [batch, pairs, 2]
  labels = batch['next_sentence_labels']
  weights = batch.get('nsp_weights', jnp.ones(labels.shape, jnp.float32))
  return {
      'sop_loss_sum': jnp.sum(
          optax.softmax_cross_entropy_with_integer_labels(logits, labels) * weights),
      'sop_count': jnp.sum(weights),
      'sop_correct': jnp.sum((jnp.argmax(logits, -1) == labels) * weights),
  }


def counts(batch) -> dict:
  labels = batch['next_sentence_labels']
  return {'sop_count': jnp.sum(batch.get('nsp_weights', jnp.ones(labels.shape, jnp.float32)))}


def loss(stats):
  """Mean cross-entropy over the pairs."""
  return stats['sop_loss_sum'] / stats['sop_count']


def metrics(stats) -> dict:
  return {'sop_loss': stats['sop_loss_sum'] / stats['sop_count'],
          'sop_accuracy': stats['sop_correct'] / stats['sop_count']}


def flops(model, shape: objectives.BatchShape) -> float:
  del model, shape  # Two logits per pair, as NSP's: negligible.
  return 0


OBJECTIVE = objectives.register(objectives.Objective(
    name='sop', batch_spec=nsp.batch_spec, head=head, losses=losses, loss=loss, metrics=metrics,
    flops=flops, counts=counts, instances='pairs', pair_kind='order'))

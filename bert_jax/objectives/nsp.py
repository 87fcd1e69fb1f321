"""Next-sentence prediction (BERT): is segment B the text that follows A (label 0) or a random
run of sentences from another document (label 1)?

The head is a 2-way dense layer (`cls/seq_relationship`) on the pooled [CLS] state. Batch key:
next_sentence_labels, [] per row, or with packed rows [pairs] with nsp_positions (each pair's
[CLS], which the encoder pools) and nsp_weights (1.0 for a real pair).
"""

import jax.numpy as jnp
import optax

from bert_jax import objectives
from bert_jax.models import layers


def batch_spec(shape: objectives.BatchShape) -> objectives.BatchSpec:
  k = shape.max_pairs_per_row
  if not k:
    return {'next_sentence_labels': ((), jnp.int32)}
  return {'next_sentence_labels': ((k,), jnp.int32), 'nsp_positions': ((k,), jnp.int32),
          'nsp_weights': ((k,), jnp.float32)}


def head(config, encoded: objectives.Encoded, batch, deterministic: bool) -> dict:
  del batch, deterministic
  dense = layers.DenseGeneral(2, ('embed', 'classes'), dtype=config.dtype,
                              param_dtype=config.param_dtype, kernel_init=config.init,
                              name='seq_relationship')
  return {'nsp_logits': dense(encoded.pooled).astype(jnp.float32)}  # [batch, (pairs,) 2]


def pair_weights(batch):
  """1.0 per real pair: every row's one pair, or packed rows' nsp_weights."""
  labels = batch['next_sentence_labels']
  return batch.get('nsp_weights', jnp.ones(labels.shape, jnp.float32))


def pair_losses(prefix: str, logits, batch) -> dict:
  """Cross-entropy sum, count and correct predictions of a 2-way pair classifier's `logits`
  ([batch, (pairs,) 2]) against next_sentence_labels; keys PREFIX_loss_sum, _count, _correct."""
  labels = batch['next_sentence_labels']
  weights = pair_weights(batch)
  return {
      f'{prefix}_loss_sum': jnp.sum(
          optax.softmax_cross_entropy_with_integer_labels(logits, labels) * weights),
      f'{prefix}_count': jnp.sum(weights),
      f'{prefix}_correct': jnp.sum((jnp.argmax(logits, -1) == labels) * weights),
  }


def pair_metrics(prefix: str, stats) -> dict:
  return {f'{prefix}_loss': stats[f'{prefix}_loss_sum'] / stats[f'{prefix}_count'],
          f'{prefix}_accuracy': stats[f'{prefix}_correct'] / stats[f'{prefix}_count']}


def losses(outputs, batch) -> dict:
  return pair_losses('nsp', outputs['nsp_logits'], batch)  # nsp_logits: [batch, (pairs,) 2]


def counts(batch) -> dict:
  return {'nsp_count': jnp.sum(pair_weights(batch))}


def loss(stats):
  """Mean cross-entropy over the pairs."""
  return stats['nsp_loss_sum'] / stats['nsp_count']


def metrics(stats) -> dict:
  return pair_metrics('nsp', stats)


def flops(model, shape: objectives.BatchShape) -> float:
  del model, shape  # Two logits per pair: negligible, as DESIGN.md's formula counts it.
  return 0


OBJECTIVE = objectives.register(objectives.Objective(
    name='nsp', batch_spec=batch_spec, head=head, losses=losses, loss=loss, metrics=metrics,
    flops=flops, counts=counts, instances='pairs'))

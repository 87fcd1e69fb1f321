"""A pytest plugin (`-p registered_objectives`) that registers two objectives from outside
bert_jax before collection, as a user's package would, for tests/test_conformance_proof.py:

- 'segment': test_objective_registry.py's SEGMENT (which segment each token is in), with its
  counts;
- 'mean_segment': the same head whose losses are the batch's means under the names of sums, so
  that its evaluation over many batches (and its devices' pooling) would weigh a small batch
  like a full one.
"""

import dataclasses

import jax.numpy as jnp

from bert_jax import objectives

MEAN = 'mean_segment'


def pytest_configure(config):
  del config
  # Its conftest is loaded now.
  import test_objective_registry  # pylint: disable=g-import-not-at-top
  segment = test_objective_registry.SEGMENT

  def mean_losses(outputs, batch):
    stats = segment.losses(outputs, batch)
    count = stats['segment_count']
    return {'mean_segment_loss_sum': stats['segment_loss_sum'] / count,
            'mean_segment_correct': stats['segment_correct'] / count,
            'mean_segment_count': jnp.ones_like(count)}

  objectives.register(dataclasses.replace(segment, counts=lambda batch: {
      'segment_count': jnp.sum(batch['input_mask'].astype(jnp.float32))}))
  objectives.register(dataclasses.replace(
      segment, name=MEAN, losses=mean_losses,
      loss=lambda s: s['mean_segment_loss_sum'] / s['mean_segment_count'],
      metrics=lambda s: {'mean_segment_loss': s['mean_segment_loss_sum'] / s['mean_segment_count'],
                         'mean_segment_accuracy': s['mean_segment_correct']
                                                  / s['mean_segment_count']}))

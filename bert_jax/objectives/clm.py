"""Left-to-right language modelling: predict the next token at every position.

The BERT paper's Table 5 ablation "LTR & No NSP": the same encoder with causal attention
(config.model.causal=True: each token attends to itself and earlier tokens), trained on unmasked
single segments to predict each next token; no masking, no NSP. Fine-tuning then pools the last
real token, the only one that has seen the whole row.

The head is MLM's `predictions` (mlm.MaskedLmHead: Dense(gelu) -> LayerNorm -> tied-embedding
logits + output bias) at every position, so checkpoints and HF export line up with an MLM's.
Position t's target is input_ids[t + 1], weighted 1 where both t and t + 1 are real tokens: the
last real token and the padding predict nothing. It reads no batch keys beyond the encoder's.

FLOPs per sequence (forward), in DESIGN.md's terms with s positions predicted:
`s*(2*h*h + 2*h*V)`: the transform dense and the vocabulary logits at every position; with
ALBERT's E-wide embeddings `s*(2*h*E + 2*E*V)`, as MLM's head.
"""

import jax.numpy as jnp

from bert_jax import objectives
from bert_jax.objectives import mlm


def batch_spec(shape: objectives.BatchShape) -> objectives.BatchSpec:
  del shape  # The targets are the inputs, shifted.
  return {}


def head(config, encoded: objectives.Encoded, batch, deterministic: bool) -> dict:
  del batch, deterministic  # No dropout in the head, as MLM's.
  logits = mlm.MaskedLmHead(config, name='predictions')(encoded.sequence, encoded.attend)
  return {'clm_logits': logits}  # [batch, length, vocab] float32


def targets(batch):
  """(next-token labels, weights) [batch, length]: input_ids shifted left by one; weight 1.0 where
  the position and the next one are both real tokens."""
  ids, real = batch['input_ids'], batch['input_mask'] > 0  # [batch, length]
  labels = jnp.concatenate([ids[:, 1:], jnp.zeros_like(ids[:, :1])], axis=1)
  next_real = jnp.concatenate([real[:, 1:], jnp.zeros_like(real[:, :1])], axis=1)
  return labels, (real & next_real).astype(jnp.float32)


def losses(outputs, batch) -> dict:
  """Cross-entropy sum, weight and correct predictions over the positions with a next token."""
  labels, weights = targets(batch)  # clm_logits: [batch, length, vocab] float32.
  return mlm.prediction_stats('clm', outputs['clm_logits'], labels, weights)


def counts(batch) -> dict:
  return mlm.weight_count('clm', targets(batch)[1])


def loss(stats):
  """Mean cross-entropy per predicted token."""
  return stats['clm_loss_sum'] / (stats['clm_weight'] + 1e-5)


def metrics(stats) -> dict:
  weight = max(stats['clm_weight'], 1e-5)
  return {'clm_loss': stats['clm_loss_sum'] / weight,
          'clm_accuracy': stats['clm_correct'] / weight}


def flops(model, shape: objectives.BatchShape) -> float:
  """The head's forward FLOPs at every position: MLM's head (mlm.head_flops), E-wide logits
  included where the embeddings are factorised (ALBERT)."""
  return mlm.head_flops(model, shape.max_seq_length)


OBJECTIVE = objectives.register(objectives.Objective(
    name='clm', batch_spec=batch_spec, head=head, losses=losses, loss=loss, metrics=metrics,
    flops=flops, counts=counts, causal=True))

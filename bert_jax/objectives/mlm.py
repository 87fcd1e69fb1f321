"""Masked language modelling (BERT): predict the tokens at the masked positions.

The head is the original BERT's `cls/predictions`: gather the masked positions first, then
Dense(gelu) -> LayerNorm -> logits against the tied word embeddings plus a per-token output
bias; the dense maps H to the embeddings' width (H, or ALBERT's factorised E). Batch keys:
masked_lm_positions, masked_lm_ids and masked_lm_weights (1.0 real, 0.0 padding),
[max_predictions] each.
"""

import flax.linen as nn
import jax.numpy as jnp
import optax

from bert_jax import objectives
from bert_jax.models import layers


class MaskedLmHead(nn.Module):
  """`cls/predictions`: Dense(gelu) -> LayerNorm -> tied-embedding logits + output bias."""
  # The encoder's model config (embed_width, vocab_size, gelu, layer_norm_eps, dtypes, init).
  config: object

  @nn.compact
  def __call__(self, x, attend):
    cfg = self.config
    # x: [batch, predictions, embed], already gathered at the masked positions; the dense maps it
    # to the word embeddings' width, which `attend` reads.
    # The modern encoder's head (model.use_bias, model.norm) drops the biases, or normalises
    # by RMS; BERT's has both biases and a LayerNorm.
    x = layers.DenseGeneral(cfg.embed_width, ('embed', 'embed_out'), dtype=cfg.dtype,
                            param_dtype=cfg.param_dtype, kernel_init=cfg.init,
                            use_bias=cfg.use_bias, name='transform_dense')(x)
    x = layers.gelu(x, cfg.gelu)
    x = layers.norm(cfg.norm, cfg.layer_norm_eps, cfg.use_bias, cfg.dtype, cfg.param_dtype,
                    name='transform_LayerNorm')(x)
    bias = self.param('output_bias', nn.with_logical_partitioning(nn.initializers.zeros,
                                                                   ('vocab',)),
                      (cfg.vocab_size,), cfg.param_dtype)
    logits = attend(x).astype(jnp.float32) + bias.astype(jnp.float32)
    return logits  # [batch, predictions, vocab]


def batch_spec(shape: objectives.BatchShape) -> objectives.BatchSpec:
  p = (shape.max_predictions,)
  return {'masked_lm_positions': (p, jnp.int32), 'masked_lm_ids': (p, jnp.int32),
          'masked_lm_weights': (p, jnp.float32)}


def head(config, encoded: objectives.Encoded, batch, deterministic: bool) -> dict:
  del deterministic  # The head has no dropout, as the original.
  gathered = layers.gather_positions(encoded.sequence, batch['masked_lm_positions'])
  return {'mlm_logits': MaskedLmHead(config, name='predictions')(gathered, encoded.attend)}


def prediction_stats(prefix: str, logits, labels, weights) -> dict:
  """Cross-entropy sum, weight and correct predictions of token predictions (logits
  [..., vocab] float32 against labels [...], weighted); keys PREFIX_loss_sum, _weight, _correct.
  MLM and the left-to-right LM share it."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return {
      f'{prefix}_loss_sum': jnp.sum(ce * weights),
      **weight_count(prefix, weights),
      f'{prefix}_correct': jnp.sum((jnp.argmax(logits, -1) == labels) * weights),
  }


def weight_count(prefix: str, weights) -> dict:
  """{PREFIX_weight: the sum of the weights}: what the loss divides by, in `losses` and in
  `counts` alike."""
  return {f'{prefix}_weight': jnp.sum(weights)}


def losses(outputs, batch) -> dict:
  """Cross-entropy sum, weight and correct predictions over the real masked positions."""
  # mlm_logits: [batch, predictions, vocab] float32.
  return prediction_stats('mlm', outputs['mlm_logits'], batch['masked_lm_ids'],
                          batch['masked_lm_weights'])


def counts(batch) -> dict:
  return weight_count('mlm', batch['masked_lm_weights'])


def loss(stats):
  """Mean cross-entropy over real masked positions."""
  return stats['mlm_loss_sum'] / (stats['mlm_weight'] + 1e-5)


def metrics(stats) -> dict:
  weight = max(stats['mlm_weight'], 1e-5)
  return {'mlm_loss': stats['mlm_loss_sum'] / weight,
          'mlm_accuracy': stats['mlm_correct'] / weight}


def head_flops(model, predictions: int) -> float:
  """The head's forward FLOPs at `predictions` positions: the transform dense (H -> E) and the
  vocabulary logits against the E-wide embeddings; E = H but for ALBERT's factorised
  embeddings (model.embedding_size)."""
  h, v = model.hidden_size, model.vocab_size
  e = getattr(model, 'embedding_size', 0) or h
  return predictions * (2 * h * e + 2 * e * v)


def flops(model, shape: objectives.BatchShape) -> float:
  """The head's forward FLOPs at the masked positions (head_flops)."""
  return head_flops(model, shape.max_predictions)


OBJECTIVE = objectives.register(objectives.Objective(
    name='mlm', batch_spec=batch_spec, head=head, losses=losses, loss=loss, metrics=metrics,
    flops=flops, counts=counts, masks_inputs=True))

"""The span boundary objective (SpanBERT, Joshi et al., 2020): predict each token of a masked span
from the encoder's outputs at the two tokens just outside the span and the token's position in
it, without reading the token's own output.

For a masked token x_i of the span x_s..x_e: y_i = f(h_{s-1}, h_{e+1}, p_{i-s}), where p is a
learned embedding of the offset i - s and f is SpanBERT's MLPWithLayerNorm, two layers of
Dense -> GeLU -> LayerNorm, the second as wide as the word embeddings; logits against the tied
word embeddings plus the head's own output bias, and cross-entropy against the token as MLM's.
As SpanBERT's run (--max-pair-targets 15 --pair-positional-embedding-size 200), offsets are
embedded 200 wide and the first 15 tokens of a span are predicted (a longer span's later tokens
are MLM's alone). Its loss is added to MLM's (config.objectives='mlm,sbo').

Batch keys, per masked prediction ([max_predictions] each, beside masked_lm_*):
span_left_positions and span_right_positions (the boundary tokens: text, or [CLS] / [SEP]) and
span_offsets (i - s), made by data/masking.py's span_boundaries. The head is dropped on export:
SpanBERT's released checkpoints are BERT's classes.
"""

import flax.linen as nn
import jax.numpy as jnp

from bert_jax import objectives
from bert_jax.core.errors import ConfigError
from bert_jax.models import layers
from bert_jax.objectives import mlm

MAX_OFFSETS = 15  # Tokens of a span the objective predicts (SpanBERT's max_pair_targets).
OFFSET_WIDTH = 200  # Width of the offset embedding (SpanBERT's pair_positional_embedding_size).


class SpanBoundaryHead(nn.Module):
  """Boundary states and offset embedding -> two Dense(gelu) -> LayerNorm layers -> tied-embedding
  logits + output bias."""
  config: object  # The encoder's model config (hidden_size, embed_width, vocab_size, ...).

  @nn.compact
  def __call__(self, left, right, offsets, attend):
    cfg = self.config
    # left, right: [batch, predictions, embed], the boundary tokens' states; offsets:
    # [batch, predictions] int, each in [0, MAX_OFFSETS).
    table = self.param('offset_embeddings', nn.with_logical_partitioning(
        cfg.init, (None, None)), (MAX_OFFSETS, OFFSET_WIDTH), cfg.param_dtype)
    offset = jnp.take(table, offsets, axis=0).astype(cfg.dtype)  # [batch, predictions, width]
    x = jnp.concatenate([left.astype(cfg.dtype), right.astype(cfg.dtype), offset], -1)
    # The concatenation's axis has no rule: its kernel rows stay whole under every preset.
    x = layers.DenseGeneral(cfg.hidden_size, (None, 'embed'), dtype=cfg.dtype,
                            param_dtype=cfg.param_dtype, kernel_init=cfg.init,
                            name='dense_1')(x)
    x = layers.gelu(x, cfg.gelu)
    x = layers.layer_norm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name='LayerNorm_1')(x)
    x = layers.DenseGeneral(cfg.embed_width, ('embed', 'embed_out'), dtype=cfg.dtype,
                            param_dtype=cfg.param_dtype, kernel_init=cfg.init,
                            name='dense_2')(x)
    x = layers.gelu(x, cfg.gelu)
    x = layers.layer_norm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name='LayerNorm_2')(x)
    bias = self.param('output_bias', nn.with_logical_partitioning(nn.initializers.zeros,
                                                                   ('vocab',)),
                      (cfg.vocab_size,), cfg.param_dtype)
    return attend(x).astype(jnp.float32) + bias.astype(jnp.float32)  # [batch, predictions, vocab]


def batch_spec(shape: objectives.BatchShape) -> objectives.BatchSpec:
  p = (shape.max_predictions,)
  return {'masked_lm_ids': (p, jnp.int32), 'masked_lm_weights': (p, jnp.float32),
          'span_left_positions': (p, jnp.int32), 'span_right_positions': (p, jnp.int32),
          'span_offsets': (p, jnp.int32)}


def head(config, encoded: objectives.Encoded, batch, deterministic: bool) -> dict:
  del deterministic  # No dropout, as SpanBERT's head.
  left = layers.gather_positions(encoded.sequence, batch['span_left_positions'])
  right = layers.gather_positions(encoded.sequence, batch['span_right_positions'])
  offsets = jnp.minimum(batch['span_offsets'], MAX_OFFSETS - 1)  # Beyond: weighted 0 below.
  logits = SpanBoundaryHead(config, name='span_boundary')(left, right, offsets, encoded.attend)
  return {'sbo_logits': logits}


def weights(batch):
  """1.0 for each real masked prediction within the first MAX_OFFSETS tokens of its span."""
  return batch['masked_lm_weights'] * (batch['span_offsets'] < MAX_OFFSETS)


def losses(outputs, batch) -> dict:
  """Cross-entropy sum, weight and correct predictions over the predicted span tokens."""
  # sbo_logits: [batch, predictions, vocab] float32.
  return mlm.prediction_stats('sbo', outputs['sbo_logits'], batch['masked_lm_ids'],
                              weights(batch))


def counts(batch) -> dict:
  return mlm.weight_count('sbo', weights(batch))


def loss(stats):
  """Mean cross-entropy over the predicted span tokens."""
  return stats['sbo_loss_sum'] / (stats['sbo_weight'] + 1e-5)


def metrics(stats) -> dict:
  weight = max(stats['sbo_weight'], 1e-5)
  return {'sbo_loss': stats['sbo_loss_sum'] / weight,
          'sbo_accuracy': stats['sbo_correct'] / weight}


def head_flops(model, predictions: int) -> float:
  """The head's forward FLOPs at `predictions` positions: the first dense (2H + offset width ->
  H), the second (H -> E) and the vocabulary logits against the E-wide embeddings."""
  h, v = model.hidden_size, model.vocab_size
  e = getattr(model, 'embedding_size', 0) or h
  return predictions * (2 * (2 * h + OFFSET_WIDTH) * h + 2 * h * e + 2 * e * v)


def flops(model, shape: objectives.BatchShape) -> float:
  """The head's forward FLOPs at every masked position (head_flops)."""
  return head_flops(model, shape.max_predictions)


def check(config, names) -> None:
  """The span boundary objective predicts masked spans: it needs span masking."""
  if 'sbo' in names and not config.masking.spans:
    raise ConfigError(
        f'config.objectives={config.objectives!r} trains the span boundary objective, which '
        f"predicts masked spans, but config.masking.spans={config.masking.spans!r} masks none; "
        "set config.masking.spans='geometric' (SpanBERT), or drop 'sbo'.")


OBJECTIVE = objectives.register(objectives.Objective(
    name='sbo', batch_spec=batch_spec, head=head, losses=losses, loss=loss, metrics=metrics,
    flops=flops, counts=counts, masks_inputs=True, check=check))

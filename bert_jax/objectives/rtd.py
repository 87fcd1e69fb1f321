"""Replaced-token detection (ELECTRA, DeBERTa-v3): a small generator fills the masked positions
with tokens sampled from its MLM softmax, and the encoder (the discriminator) tells each token of
the corrupted row original or replaced.

Clark et al. (2020); google-research/electra's run_pretraining.py. The objective's `corrupt`
step runs before the encoder (objectives/pretraining.py): the generator (the family's
Family.generator: models/electra/'s ElectraGenerator, models/deberta/model.py's DebertaGenerator;
`generator/`, at electra.generator_shape's size, on the embeddings model.embedding_sharing gives
it) and its MLM head (`generator_predictions/`, MaskedLmHead at H_g: logits against the shared
embeddings + its own bias) at the masked positions; a token sampled from each softmax
(Gumbel-max, temperature 1) replaces the masked one, without a gradient through the sampling; a
sampled token equal to the original counts as original. The discriminator's head
(`discriminator_predictions/`: Dense H -> H, the model's GELU, Dense H -> 1, as
ElectraForPreTraining) scores every token.

Loss: the generator's MLM cross-entropy (mean over the masked positions) + model.disc_weight
(50) x the mean sigmoid cross-entropy over every real token. Training draws the samples from the
'dropout' stream; evaluation (no rngs) from the fixed key EVAL_SAMPLING_SEED, so that one
checkpoint scores the same on the same held-out batches. The AUC is pooled over batches and
devices from fixed-bin histograms of the discriminator's logits, ties within a bin counted half
(a monotone map of the sigmoid scores, so the same ranking). The bins are even in asinh(logit)
(auc_bins): about 0.0006 wide near a logit of 0, 0.002 at 3, 0.04 at 64 where the ends open, so
that a weak discriminator, whose logits spread little around its prior's log-odds, reads its
own AUC and not 0.5: within 1e-4 of the exact AUC at a spread of 0.05 (tests/test_electra.py;
0.2-wide bins read 0.54 for an exact 0.62).

Batch keys: MLM's (masked_lm_positions, masked_lm_ids, masked_lm_weights).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import models
from bert_jax import objectives
from bert_jax.models import electra
from bert_jax.models import layers
from bert_jax.objectives import mlm

# The key of evaluation's samples (the train step passes no rngs to evaluation).
EVAL_SAMPLING_SEED = 0
# Bins of the discriminator's logits for the pooled AUC: even in asinh(logit) over
# [-asinh(AUC_RANGE), asinh(AUC_RANGE)], the ends open. Two [AUC_BINS] float32 stats a step.
AUC_BINS = 16384
AUC_RANGE = 64.0


class GeneratorSample(nn.Module):
  """One token per masked position drawn from the generator's softmax: [..., vocab] logits ->
  [...] ids. No parameters; the key is the 'dropout' stream's in training, EVAL_SAMPLING_SEED's
  otherwise."""

  @nn.compact
  def __call__(self, logits, deterministic):
    key = (jax.random.PRNGKey(EVAL_SAMPLING_SEED) if deterministic
           else self.make_rng('dropout'))
    # The discriminator's loss must not reach the generator through its samples (the reference
    # stops the gradient too; an integer draw would carry none, this says so).
    return jax.random.categorical(key, jax.lax.stop_gradient(logits), axis=-1)


def scatter_positions(values, positions, weights, default):
  """values [batch, predictions] written at positions [batch, predictions] of default
  [batch, length] where weights > 0 (padded predictions write nothing)."""
  length = default.shape[1]
  # [batch, predictions, length]: which position each real prediction writes.
  hit = (positions[..., None] == jnp.arange(length)) & (weights[..., None] > 0)
  written = jnp.sum(jnp.where(hit, values[..., None], 0), axis=1).astype(default.dtype)
  return jnp.where(jnp.any(hit, axis=1), written, default)  # [batch, length]


def corrupt(config, encoder, batch, deterministic: bool):
  """The generator's MLM logits at the masked positions, its samples in place of the masked
  tokens, and the RTD labels: (batch with the corrupted input_ids, outputs)."""
  gen_cfg = electra.generator_config(config)
  generator = models.family_of(encoder).generator
  input_ids, input_mask = batch['input_ids'], batch['input_mask']
  positions, weights = batch['masked_lm_positions'], batch['masked_lm_weights']
  # The embeddings the generator reads (model.embedding_sharing), E wide: [batch, length, E].
  embedded = encoder.generator_embed(input_ids, batch['segment_ids'], deterministic,
                                     batch.get('position_ids'), input_mask)
  states = generator(gen_cfg, name='generator')(
      embedded, input_mask, deterministic, batch.get('pair_ids'))  # [batch, length, H_g]
  gathered = layers.gather_positions(states, positions)  # [batch, predictions, H_g]
  logits = mlm.MaskedLmHead(gen_cfg, name='generator_predictions')(
      gathered, encoder.generator_attend)  # [batch, predictions, vocab] float32
  sampled = GeneratorSample(name='generator_sample')(logits, deterministic)
  corrupted = scatter_positions(sampled, positions, weights, input_ids)  # [batch, length]
  original = scatter_positions(batch['masked_lm_ids'], positions, weights, input_ids)
  labels = (corrupted != original) & (input_mask > 0)  # [batch, length]: replaced tokens.
  return ({**batch, 'input_ids': corrupted},
          {'rtd_gen_logits': logits, 'rtd_labels': labels.astype(jnp.float32)})


class DiscriminatorHead(nn.Module):
  """ElectraDiscriminatorPredictions: Dense H -> H, GELU, Dense H -> 1; a logit per token."""
  config: object

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    # x: [batch, length, embed]
    x = layers.DenseGeneral(cfg.hidden_size, ('embed', 'embed_out'), dtype=cfg.dtype,
                            param_dtype=cfg.param_dtype, kernel_init=cfg.init, name='dense')(x)
    x = layers.gelu(x, cfg.gelu)
    x = layers.DenseGeneral(1, ('embed', 'classes'), dtype=cfg.dtype,
                            param_dtype=cfg.param_dtype, kernel_init=cfg.init,
                            name='dense_prediction')(x)
    return x[..., 0].astype(jnp.float32)  # [batch, length]


def head(config, encoded: objectives.Encoded, batch, deterministic: bool) -> dict:
  del batch, deterministic  # No dropout, as the reference.
  return {'rtd_disc_logits': DiscriminatorHead(config, name='discriminator_predictions')(
              encoded.sequence),
          # `loss` sees pooled stats only: the weight travels with them (losses scales by it).
          'rtd_disc_weight': jnp.asarray(config.disc_weight, jnp.float32)}


def _histogram_key(kind: str) -> str:
  return f'rtd_auc_{kind}'


def auc_bins(logits):
  """The AUC histogram bin of each logit (int32, same shape): even steps of asinh(logit), so
  fine where logits crowd (a weak discriminator's) and coarse far out; monotone."""
  end = jnp.arcsinh(jnp.float32(AUC_RANGE))
  scaled = (jnp.arcsinh(logits.astype(jnp.float32)) + end) * (AUC_BINS / (2 * end))
  return jnp.clip(jnp.floor(scaled), 0, AUC_BINS - 1).astype(jnp.int32)


def losses(outputs, batch) -> dict:
  """The generator's MLM sums (rtd_gen_*), the discriminator's over the real tokens
  (rtd_disc_*), and the histograms of its logits for replaced and original tokens."""
  stats = mlm.prediction_stats('rtd_gen', outputs['rtd_gen_logits'], batch['masked_lm_ids'],
                               batch['masked_lm_weights'])
  real = batch['input_mask'].astype(jnp.float32)  # [batch, length]
  logits, labels = outputs['rtd_disc_logits'], outputs['rtd_labels']  # [batch, length] each
  disc = jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels) * real)
  stats.update({
      'rtd_disc_loss_sum': disc,
      'rtd_disc_weighted_sum': outputs['rtd_disc_weight'] * disc,
      'rtd_disc_count': jnp.sum(real),
      'rtd_disc_correct': jnp.sum(((logits > 0) == (labels > 0)) * real),
      'rtd_replaced': jnp.sum(labels * real),
  })
  bins = auc_bins(logits)  # [batch, length]
  for kind, weight in (('replaced', labels * real), ('original', (1 - labels) * real)):
    # [AUC_BINS]: one stat a histogram, so the step reports and sums two leaves, not 200.
    stats[_histogram_key(kind)] = jax.ops.segment_sum(weight.ravel(), bins.ravel(),
                                                      num_segments=AUC_BINS)
  return stats


def counts(batch) -> dict:
  return {**mlm.weight_count('rtd_gen', batch['masked_lm_weights']),
          'rtd_disc_count': jnp.sum(batch['input_mask'].astype(jnp.float32))}


def loss(stats):
  """The generator's mean MLM loss + disc_weight x the discriminator's mean loss."""
  return (stats['rtd_gen_loss_sum'] / (stats['rtd_gen_weight'] + 1e-5)
          + stats['rtd_disc_weighted_sum'] / (stats['rtd_disc_count'] + 1e-5))


def auc(replaced, original) -> float | None:
  """Area under the ROC curve from histograms (lists, ascending score) of the replaced and the
  original tokens' scores: P(a replaced token scores above an original one), ties half; None
  without tokens of both kinds."""
  replaced = np.asarray(replaced, np.float64)
  original = np.asarray(original, np.float64)
  positives, negatives = replaced.sum(), original.sum()
  if positives <= 0 or negatives <= 0:
    return None
  below = np.cumsum(original) - original  # Originals in the bins under each bin.
  return float(np.sum(replaced * (below + 0.5 * original)) / (positives * negatives))


def metrics(stats) -> dict:
  gen_weight = max(stats['rtd_gen_weight'], 1e-5)
  count = max(stats['rtd_disc_count'], 1e-5)
  gen_loss = stats['rtd_gen_loss_sum'] / gen_weight
  out = {
      'rtd_loss': gen_loss + stats['rtd_disc_weighted_sum'] / count,
      'rtd_gen_loss': gen_loss,
      'rtd_gen_accuracy': stats['rtd_gen_correct'] / gen_weight,
      'rtd_disc_loss': stats['rtd_disc_loss_sum'] / count,
      'rtd_disc_accuracy': stats['rtd_disc_correct'] / count,
      'rtd_replaced_fraction': stats['rtd_replaced'] / count,
  }
  area = auc(stats[_histogram_key('replaced')], stats[_histogram_key('original')])
  if area is not None:
    out['rtd_disc_auc'] = area
  return out


def flops(model, shape: objectives.BatchShape) -> float:
  """Forward FLOPs beyond the discriminator's encoder: the generator's encoder on every token,
  its MLM head at the masked positions (H_g -> E and E x vocab logits), the discriminator's head
  on every token (H -> H and H -> 1)."""
  s, h = shape.max_seq_length, model.hidden_size
  e = model.get('embedding_size', 0) or h
  gen_h = electra.generator_shape(model)['hidden_size']
  return (electra.generator_flops(model, s)
          + shape.max_predictions * (2 * gen_h * e + 2 * e * model.vocab_size)
          + s * (2 * h * h + 2 * h))


OBJECTIVE = objectives.register(objectives.Objective(
    name='rtd', batch_spec=mlm.batch_spec, head=head, losses=losses, loss=loss, metrics=metrics,
    flops=flops, counts=counts, masks_inputs=True, corrupt=corrupt))

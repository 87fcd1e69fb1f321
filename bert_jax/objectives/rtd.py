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
from bert_jax.core.errors import ConfigError
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


def check(config, names) -> None:
  """'rtd' trains the encoder of a family with a generator (models.Family.generator: ELECTRA's,
  DeBERTa-v3's) with a generator no wider or deeper than it (model.generator_fraction and
  generator_layer_fraction in (0, 1]) and takes no other masked-token objective;
  model.embedding_sharing is its alone."""
  model = config.model
  sharing = model.get('embedding_sharing', 'shared')
  if 'rtd' not in names:
    if sharing != 'shared':
      raise ConfigError(f'config.model.embedding_sharing={sharing!r} with config.objectives='
                        f"{config.objectives!r}: the generator and the discriminator share "
                        "embeddings only under 'rtd'; leave it 'shared' or add 'rtd'.")
    return
  name = model.get('name', 'bert')
  if name not in models.available() or models.get(name).generator is None:
    families = [n for n in dict.fromkeys((*models.BUILTIN, *models.available()))
                if models.get(n).generator is not None]  # electra, deberta: the shipped order.
    raise ConfigError(f"config.objectives={config.objectives!r} with config.model.name="
                      f"{name!r}: 'rtd' (replaced-token detection) trains a discriminator and a "
                      f"generator of {' or '.join(families)} (ELECTRA, DeBERTa-v3); set "
                      "config.model.name='electra'.")
  if name == 'deberta' and model.generator_fraction != 1:
    raise ConfigError(f'config.model.generator_fraction={model.generator_fraction!r} with '
                      "config.model.name='deberta': DeBERTa's embeddings have no projection, so "
                      "its generator is as wide as the discriminator (DeBERTa-v3's); set "
                      'generator_fraction=1.0 and make it smaller by generator_layer_fraction.')
  depth = model.get('generator_layer_fraction', 1.0)
  if not 0 < depth <= 1:
    raise ConfigError(f'config.model.generator_layer_fraction={depth!r}: the generator\'s layers '
                      'as a fraction of num_layers must be in (0, 1] (ELECTRA: 1, DeBERTa-v3: '
                      '0.5).')
  others = [n for n in names if n in ('mlm', 'clm')]
  if others:
    raise ConfigError(f"config.objectives={config.objectives!r}: 'rtd' already trains a masked "
                      'LM (its generator) and its encoder reads sampled tokens; drop '
                      f"{', '.join(repr(n) for n in others)} (valid: 'rtd', or 'rtd' with 'nsp' "
                      "or 'sop').")
  fraction = model.generator_fraction
  if not 0 < fraction <= 1:
    raise ConfigError(f'config.model.generator_fraction={fraction!r}: the generator\'s width as a '
                      'fraction of hidden_size must be in (0, 1] (ELECTRA: 0.25 small and large, '
                      '1/3 base); a generator wider than the discriminator is not ELECTRA\'s.')
  if round(model.hidden_size * fraction) < 1:
    raise ConfigError(f'config.model.generator_fraction={fraction!r} of config.model.hidden_size='
                      f'{model.hidden_size} leaves the generator no unit; valid fractions are at '
                      f'least {0.5 / model.hidden_size:.3g}.')
  generator = electra.generator_shape(model)
  if generator['hidden_size'] % generator['num_heads']:
    raise ConfigError(
        f'config.model.generator_fraction={fraction!r} gives a generator {generator["hidden_size"]}'
        f' wide with {generator["num_heads"]} heads (one per {electra.GENERATOR_HEAD_WIDTH} '
        'units), which do not divide it; choose a fraction whose width, round(fraction x '
        f'hidden_size={model.hidden_size}), its heads divide: e.g. a multiple of '
        f'{electra.GENERATOR_HEAD_WIDTH}, or less than {electra.GENERATOR_HEAD_WIDTH * 2}.')
  if model.disc_weight < 0:
    raise ConfigError(f'config.model.disc_weight={model.disc_weight!r}: the discriminator loss\'s '
                      'weight must be >= 0 (ELECTRA: 50).')


OBJECTIVE = objectives.register(objectives.Objective(
    name='rtd', batch_spec=mlm.batch_spec, head=head, losses=losses, loss=loss, metrics=metrics,
    flops=flops, counts=counts, masks_inputs=True, corrupt=corrupt, check=check))

"""Knowledge distillation (DistilBERT, Sanh et al. 2019): a student learns a frozen teacher's
masked-LM distribution, its last hidden states and the masked tokens.

config.objectives='distill' on a student whose MLM head is the usual `predictions`. The teacher
(an encoder of its own shape, config.distill.teacher_model, with its MLM head) sits in the
pretraining model under the top-level scope `teacher` (`teacher/bert/...`,
`teacher/predictions/...`) and runs in the same compiled step, without dropout and under
stop_gradient; its parameters are frozen (Objective.frozen): the optimizer gives them no update
and no state. It pools nothing, so it has no pooler.

The loss is transformers' research_projects/distillation/distiller.py with the DistilBERT
weights of its README (`--alpha_ce 5.0 --alpha_mlm 2.0 --alpha_cos 1.0`, temperature 2):

  alpha_ce * T^2 * KL(softmax(t / T) || softmax(s / T))  over every real token (input_mask;
                                                          restrict_ce_to_mask=False, its default)
  + alpha_mlm * cross-entropy of the student's logits     over the masked positions
  + alpha_cos * (1 - cos(student state, teacher state))   over every real token, last layer

each a mean over its positions (KLDivLoss(reduction='batchmean') over the selected tokens,
CrossEntropyLoss, CosineEmbeddingLoss). The student's MLM head runs at every position (the KL
needs its whole distribution); the MLM term reads it at masked_lm_positions. metrics.jsonl:
distill_loss (the weighted sum), distill_kl (the KL at temperature T, per real token, without
the T^2), distill_cos (1 - cosine, per real token), distill_mlm_loss, distill_mlm_accuracy.

FLOPs per sequence (the `flops` field is training FLOPs / 3): the student's head at all s
positions (mlm.head_flops), plus the teacher's forward, encoder and head at s positions, divided
by 3 since it runs forward only (no backward). Softmaxes and the cosine are not counted, as
DESIGN.md counts matmuls.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import models
from bert_jax import objectives
from bert_jax.core import schema
from bert_jax.models import architecture
from bert_jax.models import layers
from bert_jax.objectives import mlm

# The teacher's top-level parameter scope.
TEACHER = 'teacher'
# config.distill.teacher_model keys: the teacher's architecture, adopted from its checkpoint.
# Teachers are BERT-family encoders (ALBERT's embedding width, a causal LM's attention): the
# other architecture keys (the modern encoder's switches, the units' keys) keep BERT's values.
TEACHER_MODEL_KEYS = ('name', *architecture.SHAPE_KEYS, 'embedding_size', 'causal', 'gelu')
BERT_VALUES = {key: value for key, value in architecture.SOURCE_DEFAULTS.items()
               if key not in TEACHER_MODEL_KEYS}

# config.distill's numbers and their valid values (config_lib checks them in every config).
RANGES = {
    'distill.temperature': schema.POSITIVE, 'distill.alpha_ce': schema.NON_NEGATIVE,
    'distill.alpha_mlm': schema.NON_NEGATIVE, 'distill.alpha_cos': schema.NON_NEGATIVE,
    'distill.teacher_model.vocab_size': schema.POSITIVE,
    'distill.teacher_model.hidden_size': schema.POSITIVE,
    'distill.teacher_model.embedding_size': schema.NON_NEGATIVE,
    'distill.teacher_model.num_layers': schema.POSITIVE,
    'distill.teacher_model.num_heads': schema.POSITIVE,
    'distill.teacher_model.intermediate_size': schema.POSITIVE,
    'distill.teacher_model.max_position_embeddings': schema.POSITIVE,
    'distill.teacher_model.type_vocab_size': schema.POSITIVE,
    'distill.teacher_model.layer_norm_eps': schema.POSITIVE,
}
CHOICES = {'distill.teacher_model.gelu': ('erf', 'tanh')}


@dataclasses.dataclass(frozen=True)
class Settings:
  """What a run's config.distill fixes for the objective's functions."""
  teacher_family: str  # The teacher's name in the models registry.
  teacher: Any  # Its encoder's frozen config (its family's config_from, without a pooler).
  teacher_model: Any  # config.distill.teacher_model (FrozenConfigDict), for FLOPs.
  temperature: float
  alpha_ce: float
  alpha_mlm: float
  alpha_cos: float


def teacher_run_config(config) -> ml_collections.ConfigDict:
  """The run's config with config.model's architecture keys replaced by the teacher's."""
  run = ml_collections.ConfigDict(config.to_dict())
  for key in TEACHER_MODEL_KEYS:
    run.model[key] = config.distill.teacher_model[key]
  run.model.update(BERT_VALUES)
  return run


def settings_of(config) -> Settings:
  d = config.distill
  name = d.teacher_model.name
  teacher = models.get(name).config_from(teacher_run_config(config))
  return Settings(name, dataclasses.replace(teacher, pooler=False),
                  ml_collections.FrozenConfigDict(d.teacher_model), float(d.temperature),
                  float(d.alpha_ce), float(d.alpha_mlm), float(d.alpha_cos))


class Teacher(nn.Module):
  """The teacher's encoder and MLM head: batch -> (last states [batch, length, embed], logits
  [batch, length, vocab] float32), without dropout."""
  settings: Settings

  @nn.compact
  def __call__(self, batch):
    cfg = self.settings.teacher
    family = models.get(self.settings.teacher_family)
    encoder = family.encoder(cfg, name=family.scope)
    sequence, _ = encoder(batch['input_ids'], batch['segment_ids'], batch['input_mask'], True,
                          batch.get('position_ids'), batch.get('pair_ids'))
    logits = mlm.MaskedLmHead(cfg, name='predictions')(sequence, encoder.attend)
    return sequence, logits


def batch_spec(shape: objectives.BatchShape) -> objectives.BatchSpec:
  return mlm.batch_spec(shape)


def head(settings: Settings, config, encoded: objectives.Encoded, batch,
         deterministic: bool) -> dict:
  del deterministic  # The MLM head has no dropout; the teacher never has.
  logits = mlm.MaskedLmHead(config, name='predictions')(encoded.sequence, encoded.attend)
  teacher_states, teacher_logits = Teacher(settings, name=TEACHER)(batch)
  return {
      'distill_logits': logits,  # [batch, length, vocab] float32
      'distill_states': encoded.sequence,  # [batch, length, embed]
      'distill_teacher_logits': jax.lax.stop_gradient(teacher_logits),
      'distill_teacher_states': jax.lax.stop_gradient(teacher_states),
  }


def token_terms(temperature: float, outputs) -> tuple[jax.Array, jax.Array]:
  """(KL(teacher || student) at `temperature`, 1 - cosine of the last states), per token:
  [batch, length] float32 each."""
  student = jax.nn.log_softmax(outputs['distill_logits'] / temperature, axis=-1)
  teacher = jax.nn.log_softmax(outputs['distill_teacher_logits'] / temperature, axis=-1)
  kl = jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1)
  s = outputs['distill_states'].astype(jnp.float32)
  t = outputs['distill_teacher_states'].astype(jnp.float32)
  # torch's cosine_similarity: each norm kept above eps.
  norms = (jnp.maximum(jnp.linalg.norm(s, axis=-1), 1e-8)
           * jnp.maximum(jnp.linalg.norm(t, axis=-1), 1e-8))
  return kl, 1.0 - jnp.sum(s * t, axis=-1) / norms


def losses(settings: Settings, outputs, batch) -> dict:
  """KL and cosine sums over the real tokens, the MLM sums over the masked positions."""
  kl, cos = token_terms(settings.temperature, outputs)
  real = (batch['input_mask'] > 0).astype(jnp.float32)  # [batch, length]
  masked = layers.gather_positions(outputs['distill_logits'], batch['masked_lm_positions'])
  return {'distill_kl_sum': jnp.sum(kl * real), 'distill_cos_sum': jnp.sum(cos * real),
          **token_count(batch),
          **mlm.prediction_stats('distill_mlm', masked, batch['masked_lm_ids'],
                                 batch['masked_lm_weights'])}


def token_count(batch) -> dict:
  return {'distill_token_weight': jnp.sum(batch['input_mask'] > 0).astype(jnp.float32)}


def counts(batch) -> dict:
  return {**token_count(batch), **mlm.weight_count('distill_mlm', batch['masked_lm_weights'])}


def terms(stats) -> tuple:
  """(KL, 1 - cosine, MLM cross-entropy), each a mean over its positions."""
  tokens = stats['distill_token_weight'] + 1e-5
  return (stats['distill_kl_sum'] / tokens, stats['distill_cos_sum'] / tokens,
          stats['distill_mlm_loss_sum'] / (stats['distill_mlm_weight'] + 1e-5))


def loss(settings: Settings, stats):
  kl, cos, ce = terms(stats)
  return (settings.alpha_ce * settings.temperature ** 2 * kl + settings.alpha_mlm * ce
          + settings.alpha_cos * cos)


def metrics(settings: Settings, stats) -> dict:
  kl, cos, ce = terms(stats)
  return {'distill_loss': float(loss(settings, stats)), 'distill_kl': kl, 'distill_cos': cos,
          'distill_mlm_loss': ce,
          'distill_mlm_accuracy': stats['distill_mlm_correct']
                                  / max(stats['distill_mlm_weight'], 1e-5)}


def teacher_forward_flops(teacher_model, length: int) -> float:
  """The teacher's forward FLOPs on a sequence: its encoder without a pooler and its MLM head at
  every position."""
  h = teacher_model.hidden_size
  return (models.get(teacher_model.name).flops(teacher_model, length) - 2 * h * h
          + mlm.head_flops(teacher_model, length))


def flops(settings: Settings, model, shape: objectives.BatchShape) -> float:
  """The student's head at every position, and the teacher's forward counted once (/ 3: the
  caller multiplies by 3 for the backward, which the teacher has none of)."""
  s = shape.max_seq_length
  return mlm.head_flops(model, s) + teacher_forward_flops(settings.teacher_model, s) / 3


def unconfigured(*args, **kwargs):
  raise ValueError("The 'distill' objective needs the run's settings: use "
                   'objectives.resolve(config) or pretraining.build(config), which configure '
                   'it from config.distill.')


def configure(config) -> objectives.Objective:
  """The objective with config.distill's settings bound."""
  settings = settings_of(config)
  bind = lambda fn: _Bound(fn, settings)  # noqa: E731
  return dataclasses.replace(OBJECTIVE, head=bind(head), losses=bind(losses), loss=bind(loss),
                             metrics=bind(metrics), flops=bind(flops))


@dataclasses.dataclass(frozen=True)
class _Bound:
  """fn with the settings as its first argument; equal (and hashing alike) for equal settings,
  so two models of one config compare equal."""
  fn: Any
  settings: Settings

  def __call__(self, *args):
    return self.fn(self.settings, *args)


OBJECTIVE = objectives.register(objectives.Objective(
    name='distill', batch_spec=batch_spec, head=unconfigured, losses=unconfigured,
    loss=unconfigured, metrics=unconfigured, flops=unconfigured, counts=counts,
    masks_inputs=True, configure=configure, frozen=(TEACHER,), ranges=RANGES, choices=CHOICES))

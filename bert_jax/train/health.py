"""Run-health alarms: whether a pretraining run has gone degenerate, read from its held-out
evaluations and its train intervals. Pure: pretrain.py feeds it records and writes what it says.

A run can train without error and learn nothing: ELECTRA-Small's discriminator, in some runs of
its short recipe, outputs a constant from step 2,000 on (held-out loss at the entropy of the
replaced share, AUC 0.5), and a generator can stay at the unigram prediction for 30,000 steps.
Nothing stops such a run; an alarm says so in the log, in metrics.jsonl (`alarms` of the record)
and in a sweep's report, and train.stop_on_alarms can make it stop the run.

Held-out alarms (each needs its condition at two evaluations in a row, both after warmup: one
evaluation can catch a passing moment, two are a state; a loss at its unigram floor twice that
fell by more than PRIOR_MARGIN of the floor between them is on its way down, not stuck):
  discriminator_at_prior  the replaced-token discriminator ranks replaced tokens no better than
                          a constant: its held-out AUC at most 0.5 + AUC_BAND (exact to 1e-4:
                          objectives/rtd.py), or at most 0.5 + DEAD_AUC_BAND with its loss
                          within DEAD_LOSS_MARGIN of the prior's; without an AUC, its loss within
                          PRIOR_MARGIN of
                          the binary entropy of the replaced share (the loss of predicting that
                          share everywhere), which the record carries as rtd_disc_prior_loss.
  mlm_at_unigram          the MLM's loss at least (1 - PRIOR_MARGIN) x the unigram loss (that of
                          predicting each masked token by its frequency alone; see unigram_loss):
                          the model reads no context.
  generator_at_unigram    the same for ELECTRA's / DeBERTa-v3's generator (rtd_gen_loss).
  loss_diverging          the held-out loss above (1 + DIVERGENCE) x the lowest it reached after
                          warmup.
Train alarms (one interval suffices):
  loss_spike              the interval's mean train loss above (1 + SPIKE) x the interval's
                          before (both after warmup).
  nonfinite_steps         steps of the interval skipped for a NaN or inf loss or gradient
                          (train.max_nonfinite_skips > 0; without skips the run stops at once).
"""

import dataclasses
import math

import numpy as np

from bert_jax import config_lib

# How close to a floor a loss may come and still count as learning: 2% of the floor. The dead
# discriminators measured sat within 1.5% of the replaced share's entropy (0.417 vs 0.423 on CPU;
# 0.393 vs 0.393 on an H200), a live one that drifted back toward it at 8% (0.389).
PRIOR_MARGIN = 0.02
# An AUC at most 0.5 + AUC_BAND ranks replaced tokens no better than chance. A weak live
# discriminator read 0.56 on an H200 at 1,000 steps.
AUC_BAND = 0.02
# A discriminator whose held-out loss sits within 0.5% of the prior's and whose AUC is at most
# 0.55 is dead too: on an H100 the shipped ELECTRA-Small recipe's seed 9 sat at 0.3917 vs 0.3916
# with an AUC of 0.52-0.53 over its last 4,000 of 10,000 steps (AUC_BAND alone let it go from
# step 6,250); no live evaluation after step 500 of the 18 H100 runs there read an AUC under
# 0.557, and those under 0.56 sat 0.9% or more under the prior
# (benchmarks/results/h100_electra_small_*.jsonl).
DEAD_LOSS_MARGIN = 0.005
DEAD_AUC_BAND = 0.05
# The held-out loss above 1.5x its lowest after warmup: diverging. ELECTRA's summed loss rises
# legitimately as its generator improves (the discriminator's task gets harder), by ~20%.
DIVERGENCE = 0.5
# An interval's train loss above 1.5x the interval's before.
SPIKE = 0.5

EVAL_ALARMS = ('discriminator_at_prior', 'mlm_at_unigram', 'generator_at_unigram',
               'loss_diverging')
TRAIN_ALARMS = ('loss_spike', 'nonfinite_steps')
ALARMS = EVAL_ALARMS + TRAIN_ALARMS


class RunHealthError(RuntimeError):
  """A run stopped by an alarm named in train.stop_on_alarms."""


def parse_stop(value, key: str = 'config.train.stop_on_alarms') -> tuple[str, ...]:
  """The alarms that stop the run: comma-separated names of ALARMS, 'all', or '' for none.
  ConfigError naming the entry and the valid names otherwise."""
  if not isinstance(value, str):
    raise config_lib.ConfigError(f'{key}={value!r}: expected alarm names separated by commas '
                                 f"('all', or '' for none); names: {', '.join(ALARMS)}.")
  names = [name.strip() for name in value.split(',') if name.strip()]
  if names == ['all']:
    return ALARMS
  unknown = [name for name in names if name not in ALARMS]
  if unknown:
    raise config_lib.ConfigError(f'{key}={value!r}: {unknown[0]!r} is not an alarm; valid: '
                                 f"{', '.join(ALARMS)}, or 'all' ('' for none).")
  return tuple(dict.fromkeys(names))


def binary_entropy(share: float) -> float:
  """Nats per token of predicting `share` everywhere for labels of that share: the loss of a
  discriminator that says the prior and nothing else."""
  if not 0 < share < 1:
    return 0.0
  return -(share * math.log(share) + (1 - share) * math.log(1 - share))


def unigram_loss(batches, vocab_size: int, smoothing: float = 0.5) -> float | None:
  """Nats per masked token of predicting each held-out masked token by its frequency among the
  other masked tokens of `batches` (leave-one-out, add-`smoothing` over the vocab), the loss a
  model that ignores its context reaches at best. Leaving the token out keeps a small held-out
  set from scoring the unigram better than it would score on unseen tokens. None without
  masked tokens (a run with no MLM rows)."""
  ids = np.concatenate([np.asarray(b['masked_lm_ids']).reshape(-1)[
      np.asarray(b['masked_lm_weights']).reshape(-1) > 0] for b in batches])
  if ids.size < 2:
    return None
  counts = np.bincount(ids, minlength=vocab_size).astype(np.float64)
  probability = (counts[ids] - 1 + smoothing) / (ids.size - 1 + smoothing * len(counts))
  return float(-np.mean(np.log(probability)))


@dataclasses.dataclass(frozen=True)
class Alarm:
  name: str  # One of ALARMS.
  step: int
  message: str  # What was measured against what, for the log.


def _at_prior(record: dict) -> str | None:
  """Why the record's discriminator is at its prior, or None. The AUC decides where the record
  has one: a discriminator whose loss sits at the prior's while it ranks replaced tokens well
  (a micro run: loss 0.433 vs 0.433, AUC 0.70) has learned a ranking, not yet its calibration;
  one at the prior's loss that ranks barely above chance (AUC <= 0.5 + DEAD_AUC_BAND) is dead.
  The loss decides without an AUC (no replaced or no original token in the held-out set)."""
  loss, share = record.get('rtd_disc_loss'), record.get('rtd_replaced_fraction')
  auc = record.get('rtd_disc_auc')
  if loss is None or share is None:
    return None
  prior = binary_entropy(share)
  what = (f'held-out discriminator AUC {auc:.4f} (chance: 0.5)' if auc is not None else
          'held-out discriminator (no AUC)')
  near = lambda margin: prior > 0 and abs(loss - prior) <= margin * prior  # noqa: E731
  at_prior = (auc <= 0.5 + AUC_BAND or (auc <= 0.5 + DEAD_AUC_BAND and near(DEAD_LOSS_MARGIN))
              if auc is not None else near(PRIOR_MARGIN))
  if not at_prior:
    return None
  return (f'{what}, loss {loss:.4f} vs {prior:.4f} for predicting the {100 * share:.1f}% '
          'replaced share everywhere')


def _at_unigram(record: dict, key: str, what: str) -> str | None:
  loss, floor = record.get(key), record.get('unigram_loss')
  if loss is None or floor is None or not loss >= (1 - PRIOR_MARGIN) * floor:
    return None
  return (f'held-out {what} loss {loss:.4f} vs {floor:.4f} for predicting each masked token '
          'by its frequency')


def _conditions(record: dict) -> dict[str, str]:
  """{eval alarm: why} of the conditions one evaluation meets (divergence aside)."""
  found = {'discriminator_at_prior': _at_prior(record),
           'mlm_at_unigram': _at_unigram(record, 'mlm_loss', 'MLM'),
           'generator_at_unigram': _at_unigram(record, 'rtd_gen_loss', 'generator MLM')}
  return {name: why for name, why in found.items() if why}


# The loss each unigram alarm watches.
UNIGRAM_LOSSES = {'mlm_at_unigram': 'mlm_loss', 'generator_at_unigram': 'rtd_gen_loss'}


def _leaving(name: str, before: dict, now: dict) -> bool:
  """Whether a model at its unigram floor at both evaluations is still leaving it: its loss fell
  by more than PRIOR_MARGIN of the floor between them (a model reaches the unigram on its way
  down; it is stuck only where it stays)."""
  key = UNIGRAM_LOSSES.get(name)
  if key is None:
    return False
  return now[key] < before[key] - PRIOR_MARGIN * now['unigram_loss']


def eval_alarms(evals: list[dict], warmup_steps: int) -> list[Alarm]:
  """The alarms the newest of `evals` (eval records in step order) raises."""
  after = [r for r in evals if r['step'] > warmup_steps]
  if len(after) < 2 or after[-1] is not evals[-1]:
    return []
  before, now = after[-2], after[-1]
  found, previous = _conditions(now), _conditions(before)
  step = now['step']
  alarms = [Alarm(name, step, f'{why}, at steps {before["step"]} and {step}')
            for name, why in found.items()
            if name in previous and not _leaving(name, before, now)]
  lowest = min(r['loss'] for r in after[:-1])
  if now['loss'] > (1 + DIVERGENCE) * lowest:
    alarms.append(Alarm('loss_diverging', step, f'held-out loss {now["loss"]:.4f}, '
                        f'{now["loss"] / lowest:.2f}x its lowest after warmup ({lowest:.4f})'))
  return alarms


def train_alarms(step: int, loss: float, previous: tuple[int, float] | None,
                 skipped_steps: list[int], warmup_steps: int) -> list[Alarm]:
  """The alarms of one train interval ending at `step` with mean `loss`; `previous`: (step,
  loss) of the interval before (None for the first); `skipped_steps`: the interval's steps
  whose update was skipped."""
  alarms = []
  previous_step, previous_loss = previous or (None, None)
  if (previous is not None and previous_step > warmup_steps
      and loss > (1 + SPIKE) * previous_loss):
    alarms.append(Alarm('loss_spike', step, f'train loss {loss:.4f} at step {step}, '
                        f'{loss / previous_loss:.2f}x the {previous_loss:.4f} of step '
                        f'{previous_step}'))
  if skipped_steps:
    alarms.append(Alarm('nonfinite_steps', step, f'{len(skipped_steps)} step(s) skipped for a '
                        f'non-finite loss or gradient: {skipped_steps}'))
  return alarms

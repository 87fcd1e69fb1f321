"""Batch-size warmup (ModernBERT's): the first steps train on smaller batches that grow to
train.batch_size, one micro-batch at a time. Pure integers, no jax.

The batch grows from train.batch_warmup_rows by one micro-batch (train.batch_size /
train.grad_accum_steps rows) at a time, each size for the same number of steps (so the size
grows linearly in steps, as ModernBERT's BatchSizeWarmupScheduler), until the sizes below the
full batch have trained train.batch_warmup_tokens tokens (rows x data.max_seq_length, padding
included: a pure function of the step, so a resume and the learning-rate schedule need no data).
A step of n micro-batches accumulates n of them, as train.grad_accum_steps does for the full
batch; the data stream yields micro-batches and a step reads n in a row, so a run with the
warmup reads the rows in the order a run without it does, and its data position is always
between micro-batches (an exact resume anywhere).
"""

import dataclasses
import math

import numpy as np

from bert_jax.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Stage:
  """Steps of one batch size."""
  last_step: int  # Its last step (the first is the previous stage's last + 1).
  micro_batches: int  # Micro-batches per optimizer step.
  rows: int  # Sequences per optimizer step: micro_batches x the micro-batch.


def enabled(train) -> bool:
  return bool(train.get('batch_warmup_rows', 0))


def micro_rows(train) -> int:
  """Rows of one micro-batch: what the batch grows by, and what the data stream yields."""
  return train.batch_size // train.grad_accum_steps


def stream_rows(train) -> int:
  """Rows per batch of the phase-1 training stream: the micro-batch with a warmup (a step reads
  several), else the whole batch."""
  return micro_rows(train) if enabled(train) else train.batch_size


def steps_per_size(train, seq_length: int) -> int:
  """Steps at each size below the full batch: the fewest whose sizes train at least
  batch_warmup_tokens tokens."""
  micro = micro_rows(train)
  sizes = range(train.batch_warmup_rows // micro, train.grad_accum_steps)
  return max(1, math.ceil(train.batch_warmup_tokens / (seq_length * micro * sum(sizes))))


def stages(train, seq_length: int) -> list[Stage]:
  """The warmup's stages, smaller than the full batch, in order ([] without a warmup); steps
  after the last one train the full batch."""
  if not enabled(train):
    return []
  micro, each = micro_rows(train), steps_per_size(train, seq_length)
  first = train.batch_warmup_rows // micro
  return [Stage(each * (i + 1), n, n * micro)
          for i, n in enumerate(range(first, train.grad_accum_steps))]


def describe(train, seq_length: int) -> str:
  """'Batch-size warmup: 4 to 8 rows, 2 more at a time, 2 steps each (steps 1-4, 1,280
  tokens).' ('' without a warmup)."""
  ramp = stages(train, seq_length)
  if not ramp:
    return ''
  tokens = sum((s.last_step - p) * s.rows for s, p in
               zip(ramp, [0] + [s.last_step for s in ramp])) * seq_length
  return (f'Batch-size warmup: {ramp[0].rows} to {train.batch_size} rows, '
          f'{micro_rows(train)} more at a time, {ramp[0].last_step} steps each (steps '
          f'1-{ramp[-1].last_step}, {tokens:,} tokens).')


def check(config) -> None:
  """The warmup's keys fit the batch, its micro-batches and phase 1; ConfigError naming the key,
  its value and what would be valid."""
  train = config.train
  rows, tokens = train.get('batch_warmup_rows', 0), train.get('batch_warmup_tokens', 0)
  if not rows and not tokens:
    return
  keys = (f'config.train.batch_warmup_rows={rows} and config.train.batch_warmup_tokens='
          f'{tokens}')
  if not rows or not tokens:
    raise ConfigError(f'{keys}: a batch-size warmup needs both, the first batch and the tokens '
                      'over which it grows to train.batch_size (0 and 0: no warmup).')
  batch, steps = train.batch_size, train.grad_accum_steps
  if steps == 1:
    unit = math.gcd(batch, rows)
    raise ConfigError(
        f'config.train.batch_warmup_rows={rows}: the batch grows one micro-batch '
        '(train.batch_size / train.grad_accum_steps rows) at a time, and with grad_accum_steps=1 '
        f'that is the whole batch of {batch}; set config.train.grad_accum_steps to a count whose '
        f'micro-batch divides {rows} (e.g. {batch // unit}: micro-batches of {unit}).')
  micro = micro_rows(train)
  if rows % micro or rows >= batch:
    valid = ', '.join(str(n * micro) for n in range(1, min(steps, 6)))
    raise ConfigError(
        f'config.train.batch_warmup_rows={rows} is not a whole number of micro-batches below '
        f'config.train.batch_size={batch} (micro-batches of {micro}: batch_size / '
        f'grad_accum_steps={steps}); use one of {valid}{", ..." if steps > 6 else ""}.')
  seq = config.data.max_seq_length
  end = stages(train, seq)[-1].last_step
  phase1 = train.num_steps - int(round(train.get('phase2_fraction', 0.0) * train.num_steps))
  if end > phase1:
    sizes = range(rows // micro, steps)
    most = phase1 // len(sizes) * seq * micro * sum(sizes)
    where = 'phase 1' if phase1 < train.num_steps else 'the run'
    raise ConfigError(
        f'config.train.batch_warmup_tokens={tokens} takes {end} steps ({len(sizes)} batch sizes '
        f'of {end // len(sizes)} steps), beyond the {phase1} steps of {where} '
        f'(config.train.num_steps={train.num_steps}); '
        + (f'use at most {most} tokens.' if most else
           f'{where} needs at least {len(sizes)} steps, one per batch size.'))


def grouped(batches, count: int):
  """(`count` batches of `batches` concatenated along their rows, the data position after the
  last) for each step, from an iterator of (batch, position after it). It reads exactly `count`
  a step, so that the next size's steps read on from the same iterator."""
  while True:
    parts = [next(batches) for _ in range(count)]
    if count == 1:
      yield parts[0]
    else:
      yield ({k: np.concatenate([batch[k] for batch, _ in parts]) for k in parts[0][0]},
             parts[-1][1])

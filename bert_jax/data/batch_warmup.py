"""Batch-size warmup (ModernBERT's): the first steps train on smaller batches that grow to
train.batch_size. Pure integers, no jax.

The batch grows by train.batch_warmup_rows at a time: r, 2r, 3r, ... rows (batch_size a multiple
of r), each size for the same number of steps, so it grows linearly in steps as ModernBERT's
BatchSizeWarmupScheduler (768 to 4,608 rows: its 96 rows a GPU on 8 GPUs, one to six
micro-batches), until the smaller sizes have trained train.batch_warmup_tokens tokens (rows x
data.max_seq_length, padding included: a pure function of the step, so a resume and the
learning-rate schedule need no data). A size's step accumulates its rows in micro-batches of the
run's (batch_size / grad_accum_steps, which must divide r), or with grad_accum_steps=1 trains
them as one batch. The data stream yields batches of r rows and a step reads as many as its size
needs, so a run with the warmup reads the rows in the order a run without it does, and its data
position is always between two of them (an exact resume anywhere, on any accumulation count).
"""

import dataclasses
import math

import numpy as np

from bert_jax.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Stage:
  """Steps of one batch size."""
  last_step: int  # Its last step (the first is the previous stage's last + 1).
  micro_batches: int  # Micro-batches per optimizer step (its grad_accum_steps).
  rows: int  # Sequences per optimizer step.


def enabled(train) -> bool:
  return bool(train.get('batch_warmup_rows', 0))


def stream_rows(train) -> int:
  """Rows per batch of the phase-1 training stream: batch_warmup_rows with a warmup (a step
  reads several), else the whole batch."""
  return train.batch_warmup_rows if enabled(train) else train.batch_size


def steps_per_size(train, seq_length: int) -> int:
  """Steps at each size below the full batch: the fewest whose sizes train at least
  batch_warmup_tokens tokens."""
  rows, sizes = train.batch_warmup_rows, train.batch_size // train.batch_warmup_rows
  return max(1, math.ceil(train.batch_warmup_tokens / (seq_length * rows * sum(range(sizes)))))


def stages(train, seq_length: int) -> list[Stage]:
  """The warmup's stages, smaller than the full batch, in order ([] without a warmup); steps
  after the last one train the full batch."""
  if not enabled(train):
    return []
  rows, each = train.batch_warmup_rows, steps_per_size(train, seq_length)
  micro = train.batch_size // train.grad_accum_steps
  return [Stage(each * k, k * rows // micro if train.grad_accum_steps > 1 else 1, k * rows)
          for k in range(1, train.batch_size // rows)]


def tokens_through(train, seq_length: int, step: int) -> int:
  """Tokens (rows x seq_length) trained by steps 1..`step` at train's batch sizes: the smaller
  batches of a warmup, then the full one."""
  tokens, done = 0, 0  # done: the last step of the sizes before (they follow one another).
  for stage in stages(train, seq_length):
    tokens += max(0, min(step, stage.last_step) - done) * stage.rows * seq_length
    done = stage.last_step
  return tokens + max(0, step - done) * train.batch_size * seq_length


def describe(train, seq_length: int) -> str:
  """'Batch-size warmup: 2 to 8 rows, 2 more at a time, 2 steps each (steps 1-6, 1,536
  tokens).' ('' without a warmup)."""
  ramp = stages(train, seq_length)
  if not ramp:
    return ''
  each = ramp[0].last_step
  tokens = tokens_through(train, seq_length, ramp[-1].last_step)
  return (f'Batch-size warmup: {ramp[0].rows} to {train.batch_size} rows, '
          f'{train.batch_warmup_rows} more at a time, {each} steps each (steps '
          f'1-{ramp[-1].last_step}, {tokens:,} tokens).')


def check(config) -> None:
  """The warmup's keys fit the batch, its micro-batches and phase 1; ConfigError naming the key,
  its value and what would be valid."""
  train = config.train
  rows, tokens = train.get('batch_warmup_rows', 0), train.get('batch_warmup_tokens', 0)
  if not rows and not tokens:
    return
  if not rows or not tokens:
    raise ConfigError(
        f'config.train.batch_warmup_rows={rows} and config.train.batch_warmup_tokens={tokens}: '
        'a batch-size warmup needs both, the first batch (and what it grows by) and the tokens '
        'over which it grows to train.batch_size (0 and 0: no warmup).')
  batch, steps = train.batch_size, train.grad_accum_steps
  if rows >= batch or batch % rows:
    divisors = [d for d in range(batch // 2, 0, -1) if batch % d == 0][:6]
    raise ConfigError(
        f'config.train.batch_warmup_rows={rows}: the batch grows by it (r, 2r, ... rows) to '
        f'config.train.batch_size={batch}, so it must divide batch_size and be smaller; use '
        f'one of {", ".join(map(str, divisors))}, ... (0 and batch_warmup_tokens=0: no '
        'warmup).')
  micro = batch // steps
  if steps > 1 and rows % micro:
    raise ConfigError(
        f'config.train.batch_warmup_rows={rows} is not a whole number of micro-batches of '
        f'{micro} rows (config.train.batch_size={batch} / grad_accum_steps={steps}), which '
        'each smaller batch accumulates; use a multiple of '
        f'{micro}, or grad_accum_steps={batch // math.gcd(batch, rows)} (micro-batches of '
        f'{math.gcd(batch, rows)}; 0 and batch_warmup_tokens=0: no warmup).')
  seq = config.data.max_seq_length
  end = stages(train, seq)[-1].last_step
  phase1 = train.num_steps - int(round(train.get('phase2_fraction', 0.0) * train.num_steps))
  if end > phase1:
    sizes = batch // rows - 1
    most = phase1 // sizes * seq * rows * sum(range(sizes + 1))
    where = 'phase 1' if phase1 < train.num_steps else 'the run'
    raise ConfigError(
        f'config.train.batch_warmup_tokens={tokens} takes {end} steps ({sizes} batch sizes of '
        f'{end // sizes} steps), beyond the {phase1} steps of {where} '
        f'(config.train.num_steps={train.num_steps}); '
        + (f'use at most {most} tokens.' if most else
           f'{where} needs at least {sizes} steps, one per batch size.'))


def check_devices(config, batch_divisor: int) -> None:
  """Without accumulation each smaller batch is one batch of its rows, split over the
  batch_divisor devices (data x fsdp mesh axes): batch_warmup_rows must split evenly."""
  rows = config.train.get('batch_warmup_rows', 0)
  if rows and config.train.grad_accum_steps == 1 and rows % batch_divisor:
    raise ConfigError(
        f'config.train.batch_warmup_rows={rows} is not divisible by the {batch_divisor} devices '
        f'each smaller batch is split over (mesh data x fsdp); use a multiple of '
        f'{batch_divisor}.')


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

"""The step loop (train/loop.py) on stand-ins for a mode's parts: what its train records say about
where an interval's time went."""

import itertools
import logging
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.train import loop
from bert_jax.train import metrics


class Records:
  """The writer, checkpointer and preemption a mode hands the loop, reduced to what it calls."""
  requested = False

  def __init__(self):
    self.written = []

  def write(self, step, split, values):
    self.written.append((step, split, values))

  def sync(self):
    pass

  def close(self):
    pass

  def reached(self, step, checkpointer):
    del step, checkpointer
    return False

  def should_save(self, step, final):
    del step
    return final

  def save(self, step, state, fields):
    del step, state, fields

  def describe_latest(self):
    return 'no checkpoint'


@jax.jit
def _work(x):
  """A few milliseconds of the device's time: the step."""
  for _ in range(8):
    x = jnp.tanh(x @ x)
  return x


def train_records(batch_seconds: float, num_steps: int = 12, log_every: int = 4) -> list[dict]:
  """The train records of a run whose batches each take `batch_seconds` of the host to make and
  whose step takes the device a few milliseconds."""
  state = types.SimpleNamespace(params={'w': jnp.zeros(4)}, opt_state={'m': jnp.zeros(4)})
  rows = jax.device_put(np.full((512, 512), 0.001, np.float32))  # On the device already.

  def batches():
    for index in itertools.count():
      if batch_seconds:
        time.sleep(batch_seconds)
      yield {'x': rows}, {'epoch': 0, 'batch': index + 1}

  def train_step(state, batch):
    stats = {'loss': jnp.sum(_work(batch['x'])), 'grad_norm': jnp.float32(1.0),
             'finite': jnp.bool_(True)}
    return state, stats

  records = Records()
  stretch = loop.Stretch(num_steps, batches(), lambda batch: batch, rows=4, flops_per_seq=1.0)
  hooks = loop.Hooks(
      summarize=lambda stats, applied: {'loss': float(stats['loss']) / applied},
      evaluate=lambda step, state: None, evaluate_at=lambda step: False,
      saved_fields=lambda step, stretch, position, skipped: {},
      log_line=lambda step, values, eta: metrics.log_train_line(step, num_steps, values, eta))
  settings = loop.Settings(num_steps=num_steps, log_every=log_every, max_nonfinite_skips=0,
                           warmup_steps=0, peak_flops=1e12, schedule=lambda step: 1e-3)
  loop.run(state, train_step, iter([stretch]), start_step=0, settings=settings, hooks=hooks,
           checkpointer=records, writer=records, preemption=records)
  return [values for _, split, values in records.written if split == 'train']


def test_a_run_waiting_on_its_batches_says_so_in_its_records_and_lines(caplog):
  with caplog.at_level(logging.INFO):
    slow = train_records(batch_seconds=0.1)
  # Each batch takes 100 ms of the host's time, several times the step's: most of the interval.
  assert len(slow) == 3 and all(0.5 < r['input_share'] <= 1.0 for r in slow), slow
  lines = [m for m in caplog.messages if m.startswith('step ')]
  assert len(lines) == 3 and all(' | input ' in line for line in lines), lines
  # Said once, from the second interval (the first holds the stream's start), with the remedy.
  said = [m for m in caplog.messages if m.startswith('The input bounds the steps')]
  assert len(said) == 1 and 'of steps 5-8 making and sending batches' in said[0], said
  assert 'data.workers=N' in said[0]


def test_a_run_whose_batches_are_ready_shows_no_input_share(caplog):
  with caplog.at_level(logging.INFO):
    fast = train_records(batch_seconds=0.0)
  # The step's dispatch and the interval's reductions, not the batches, take its time.
  assert all(0 <= r['input_share'] < metrics.INPUT_SHARE_SHOWN for r in fast[1:]), fast
  lines = [m for m in caplog.messages if m.startswith('step ')]
  assert lines and not any(' | input ' in line for line in lines[1:]), lines
  assert not any('The input bounds the steps' in m for m in caplog.messages)


@pytest.mark.parametrize('field', metrics.TIMING_FIELDS)
def test_every_timing_field_is_in_the_train_records(field):
  assert all(field in r for r in train_records(batch_seconds=0.0, num_steps=4))

"""The step loop of pretraining and fine-tuning, written once.

A mode (train/pretrain.py, train/finetune.py) builds the state, the compiled step, the batches,
the checkpointer and the metric writer, and hands them to `run` with its hooks. The loop does,
the same way for both: the logging interval's sums of the step's stats (one dispatch a step),
throughput and MFU over train steps only (a stretch's first step compiles; evaluations and saves
are paused time), the non-finite checks before every save (a non-finite step is never
checkpointed; with train.max_nonfinite_skips its update was skipped and counted), the train
alarms, evaluation and saving at the steps the mode asks for, and preemption (SIGTERM: save, then
stop).
"""

import dataclasses
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from absl import logging

from bert_jax.train import guard
from bert_jax.train import health
from bert_jax.train import metrics

# The logging interval's running sums of the step's stats: one dispatch a step, however many
# leaves the objectives report (ELECTRA's AUC histograms are two of them).
add_stats = jax.jit(lambda total, stats: jax.tree.map(jnp.add, total, stats))


@dataclasses.dataclass
class Stretch:
  """Steps of one batch shape (a pretraining phase; a fine-tuning seed): its first compiles."""
  last_step: int
  batches: Iterator[tuple[dict, dict]]  # (host batch, the data position after it).
  to_global: Callable[[dict], Any]  # A host batch -> the step's global batch.
  rows: int  # Sequences per optimizer step: what throughput and MFU count.
  flops_per_seq: float  # Model FLOPs of one sequence's forward and backward.
  source: Any = None  # The input, when it has close() (streams end their workers).
  phase: int = 1
  train_step: Callable | None = None  # Its own step (another model's settings); None: run's.
  # The next stretch reads on from the same source (a batch-size warmup's next size): no save
  # at its end, its source left open.
  continues: bool = False


@dataclasses.dataclass
class Hooks:
  """What a mode adds to the loop. `subject` names the run in messages ('' or 'seed 3 ')."""
  summarize: Callable[[dict, int], dict]  # (interval's summed stats, applied steps) -> fields.
  evaluate: Callable[[int, Any], Any]  # (step, state) -> what the mode reports.
  evaluate_at: Callable[[int], bool]  # Whether a step evaluates (never when preempted).
  saved_fields: Callable[[int, Stretch, dict, int], dict]  # (step, stretch, position,
  # skipped steps) -> what its checkpoint saves beside the state.
  log_line: Callable[[int, dict, float], None]  # (step, train fields, ETA in seconds).
  log_at: Callable[[int], bool] = lambda step: False  # Logs besides every log_every (epochs).
  # Fields every train record adds for its step (pretraining: the tokens trained so far).
  step_fields: Callable[[int], dict] = lambda step: {}
  save_at_end_of_stretch: bool = True  # So that a resume starts the next stretch afresh.
  subject: str = ''
  remedy: str = ('Lower train.learning_rate, check the data, or set train.max_nonfinite_skips '
                 'to skip such steps.')


@dataclasses.dataclass
class Settings:
  """The loop's numbers, from config.train."""
  num_steps: int
  log_every: int
  max_nonfinite_skips: int
  warmup_steps: int
  peak_flops: float
  schedule: Callable[[int], Any]  # Optimizer step -> learning rate.
  stop_on: tuple[str, ...] = ()  # Alarms that stop the run (train.stop_on_alarms).
  stop_on_setting: str = ''  # How the config spells it, for the message.


@dataclasses.dataclass
class Outcome:
  state: Any
  last_eval: Any  # The last evaluation's result (the mode's type); None when none ran.
  stopped_at: int | None  # Preempted after this step, its checkpoint saved; None: finished.
  skipped: int  # Steps whose update was skipped for a non-finite loss or gradient, in all.
  train_seconds: float  # Time in train steps (compilations, evaluations, saves excluded).
  timed_rows: int  # Sequences of the timed steps.


def raise_alarms(alarms, settings: Settings, writer, checkpointer) -> None:
  """Logs each alarm; stops the run on one that settings.stop_on names."""
  for alarm in alarms:
    logging.warning('ALARM %s at step %d: %s.', alarm.name, alarm.step, alarm.message)
  stopping = [a for a in alarms if a.name in settings.stop_on]
  if stopping:
    writer.close()
    raise health.RunHealthError(
        f'Stopped at step {stopping[0].step} by the alarm {stopping[0].name} '
        f'({settings.stop_on_setting}): {stopping[0].message}; '
        f'{checkpointer.describe_latest()}.')


def _nonfinite_steps(flags, first_step: int) -> list[int]:
  """Steps of an interval whose loss or gradients were not finite (flags: per-step 0/1)."""
  return [first_step + i for i, ok in enumerate(jax.device_get(flags)) if not ok]


def run(state, train_step, stretches: Iterator[Stretch], *, start_step: int, settings: Settings,
        hooks: Hooks, checkpointer, writer, preemption, last_eval=None,
        skipped: int = 0) -> Outcome:
  """Trains from start_step to settings.num_steps; see the module docstring.

  stretches: the stretch holding step start_step + 1, then each later one (made when reached).
  The writer is left open when preempted or finished; an alarm that stops the run closes it.
  """
  num_steps, max_skips = settings.num_steps, settings.max_nonfinite_skips
  subject = hooks.subject
  who = f'{subject.strip().capitalize()}: ' if subject else ''  # Starts an error's message.
  if preemption.requested and start_step < num_steps:
    logging.warning('Stopped by SIGTERM before the first step, at step %d of %d; rerun the same '
                    'command to resume.', start_step, num_steps)
    return Outcome(state, last_eval, start_step, skipped, 0.0, 0)
  state_finite = jax.jit(guard.all_finite)
  stretch = next(stretches)
  first_of_stretch = start_step + 1
  previous_train = None  # (step, loss) of the last train interval: the spike alarm's reference.
  train_seconds, timed_rows, stopped_at = 0.0, 0, None
  # Throughput counts train steps only: a stretch's first step (its compilation), evaluations
  # and saves are excluded from the interval's time.
  accumulated, finite_flags, timed_steps = None, [], 0
  interval_start, excluded = time.perf_counter(), 0.0
  # The host's time making and sending the interval's batches: the device waits for it unless
  # the steps it queued take longer (JAX dispatches a step without waiting for the last).
  input_seconds = 0.0
  input_bound_said = False
  for step in range(start_step + 1, num_steps + 1):
    if step > stretch.last_step:
      if not stretch.continues and hasattr(stretch.source, 'close'):
        stretch.source.close()
      stretch, first_of_stretch = next(stretches), step
    input_start = time.perf_counter()
    batch, position = next(stretch.batches)
    global_batch = stretch.to_global(batch)
    step_start = time.perf_counter()
    input_seconds += step_start - input_start
    state, stats = (stretch.train_step or train_step)(state, global_batch)
    if step == first_of_stretch:  # Compiles.
      jax.block_until_ready(add_stats(stats, stats))  # Compiles the adding too.
      excluded += time.perf_counter() - step_start
    else:
      timed_steps += 1
    finite_flags.append(stats['finite'])
    accumulated = stats if accumulated is None else add_stats(accumulated, stats)
    final = step == num_steps
    preempted = preemption.reached(step, checkpointer)
    save = checkpointer.should_save(
        step, final or (hooks.save_at_end_of_stretch and step == stretch.last_step
                        and not stretch.continues)) or preempted
    if step % settings.log_every == 0 or final or save or hooks.log_at(step):
      first = step - len(finite_flags) + 1  # The interval's first step.
      # Every save is preceded by this check: a non-finite step is never checkpointed.
      bad = _nonfinite_steps(finite_flags, first)
      if bad and (skipped + len(bad) > max_skips):
        raise guard.NonFiniteLossError(
            f'{who}The loss or the gradients were NaN or inf at step {bad[0]}'
            + (f' (and {len(bad) - 1} more up to step {step})' if len(bad) > 1 else '')
            + (f', beyond config.train.max_nonfinite_skips={max_skips} ({skipped} skipped '
               'before)' if max_skips else '')
            + f'; {checkpointer.describe_latest()}. {hooks.remedy}')
      if not state_finite(state.params, state.opt_state):
        raise guard.NonFiniteLossError(
            f'{who}The parameters or the optimizer state became NaN or inf by step {step} (after '
            f'step {step - len(finite_flags)}, with a finite loss and gradients); '
            f'{checkpointer.describe_latest()}. {hooks.remedy}')
      if bad:
        skipped += len(bad)
        logging.warning('Skipped the update of step(s) %s: loss or gradients not finite '
                        '(%d skipped in all, at most %d allowed).', bad, skipped, max_skips)
      stats = jax.device_get(accumulated)
      elapsed = time.perf_counter() - interval_start - excluded
      train_seconds += elapsed
      timed_rows += timed_steps * stretch.rows
      seq_per_s = timed_steps * stretch.rows / elapsed if timed_steps else 0.0
      applied = len(finite_flags) - len(bad)
      values = hooks.summarize(stats, applied)
      values.update(learning_rate=float(settings.schedule(step - 1)),
                    grad_norm=float(stats['grad_norm']) / max(applied, 1),
                    seq_per_s=seq_per_s,
                    mfu=seq_per_s * stretch.flops_per_seq / settings.peak_flops,
                    input_share=min(1.0, input_seconds / elapsed) if elapsed > 0 else 0.0,
                    **hooks.step_fields(step))
      if max_skips:
        values['nonfinite_skips'] = skipped
      alarms = health.train_alarms(step, values['loss'], previous_train, bad,
                                   settings.warmup_steps)
      if alarms:
        values['alarms'] = [a.name for a in alarms]
      previous_train = (step, values['loss'])
      writer.write(step, 'train', values)
      eta = (num_steps - step) * stretch.rows / seq_per_s if seq_per_s else 0.0
      hooks.log_line(step, values, eta)
      # A stretch's first interval holds its stream's start (worker processes, a first epoch).
      if (not input_bound_said and first > first_of_stretch
          and values['input_share'] >= metrics.INPUT_BOUND_SHARE):
        input_bound_said = True
        logging.warning(
            '%sThe input bounds the steps: the host spent %.0f%% of steps %d-%d making and '
            'sending batches, while the device waited. With a prepared corpus '
            '(data.prepared), data.workers=N makes them in N worker processes; a data.corpus '
            'run makes each epoch at once in a thread beside the steps (docs/pretraining.md).',
            who, 100 * values['input_share'], first, step)
      raise_alarms(alarms, settings, writer, checkpointer)
      accumulated, finite_flags, timed_steps, input_seconds = None, [], 0, 0.0
      interval_start, excluded = time.perf_counter(), 0.0
    pause_start = time.perf_counter()
    if hooks.evaluate_at(step) and not preempted:
      last_eval = hooks.evaluate(step, state)
    if save:
      writer.sync()  # gs://: the records this checkpoint covers are uploaded before it.
      checkpointer.save(step, state, hooks.saved_fields(step, stretch, position, skipped))
    excluded += time.perf_counter() - pause_start
    if preempted:
      stopped_at = step
      break
  if hasattr(stretch.source, 'close'):
    stretch.source.close()
  if stopped_at is not None:
    logging.warning('Preempted: %sstopped after step %d of %d with its checkpoint saved in %s; '
                    'rerun the same command to resume.', subject, stopped_at, num_steps,
                    checkpointer.directory)
  return Outcome(state, last_eval, stopped_at, skipped, train_seconds, timed_rows)

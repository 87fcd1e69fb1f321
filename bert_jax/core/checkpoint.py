"""Orbax checkpoints of the train state and the data position, saved atomically.

A step's checkpoint is written to a temporary directory and renamed when complete, so a run
killed mid-save leaves the previous checkpoints intact; old ones are deleted only after a newer
one is complete. A newest checkpoint that cannot be read (truncated or corrupted files) while an
older one can is moved aside to `<step>.unreadable-<time>` (never deleted), and the older one is
restored instead.
Every checkpoint carries integrity data written at save: two position-weighted sums of each
array's bits and a sha256 of the data position. Restore recomputes them, so a checkpoint whose
bytes changed on disk (a flipped bit) is unreadable like a truncated one, and the previous good
step is restored instead; the warning names the array that differs. A step whose orbax metadata
names another tree (a flipped bit renames an array) reads as another shape: it is damaged when an
older step fits the config, and the config changed only when none does. A step without its record
(which every save writes: one damaged byte of the data's JSON removes it) is unreadable the same
way, unless BERT_JAX_READ_UNVERIFIED=1 asks for it. read_step reads one named step of another
run (init_from, export, predict) with the same check and no fallback.
A save that fails (disk full, permissions) is an error that names the step and the newest good
checkpoint; the good ones stay.
A gs:// directory is written by orbax itself (tensorstore); there a step counts once orbax's
commit marker is written, since Cloud Storage has no directory rename.
"""

import contextlib
import gc
import hashlib
import json
import os
import re
import shutil
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from bert_jax.core import errors
from bert_jax.core import files

INTEGRITY_KEY = 'integrity'
# Set to 1: a checkpoint without its integrity record is read (unverified, with a warning)
# instead of being unreadable.
UNVERIFIED_ENV = 'BERT_JAX_READ_UNVERIFIED'
# What orbax writes last into a step on Cloud Storage (atomicity_types.COMMIT_SUCCESS_FILE).
GCS_COMMIT_FILE = 'commit_success.txt'


class CheckpointError(RuntimeError):
  """A checkpoint could not be written, or none of the existing ones can be read."""


class IntegrityError(ValueError):
  """A restored checkpoint differs from what was saved (its files changed on disk)."""


def _leaf_checksums(x):
  """[2] uint32: the sum of the array's bits as words, and their sum weighted by position (1,
  2, ...), both modulo 2**32. Integer sums are exact in any order, so they are the same
  sharded or whole, on any device; any single changed bit changes the first."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  x = x.reshape(-1)
  if x.dtype == jnp.bool_:
    words = x.astype(jnp.uint32)
  else:
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
    words = jax.lax.bitcast_convert_type(x, unsigned)
    if x.dtype.itemsize == 8:  # Both halves count.
      words = (words ^ (words >> 32)).astype(jnp.uint32)
    words = words.astype(jnp.uint32)
  position = jnp.arange(1, words.size + 1, dtype=jnp.uint32)
  return jnp.stack([jnp.sum(words, dtype=jnp.uint32),
                    jnp.sum(words * position, dtype=jnp.uint32)])


# One small program per leaf shape and dtype, not one per state: the states a process checks (a
# TrainState at save, the same restored as dicts, the next run's) share their leaves' shapes, so
# each compiles once; a program over the whole tree compiled again for every new tree structure.
_leaf_checksums_jit = jax.jit(_leaf_checksums)


def state_checksums(state) -> dict:
  """{array path: [sum, position-weighted sum]} of every array in the state."""
  # Leaf by leaf, each fetched before the next starts: a sharded leaf's sums are a collective,
  # and the CPU runtime aborted when several processes had many of them in flight at once.
  sums = jax.tree.map(lambda x: jax.device_get(_leaf_checksums_jit(x)), state)
  return {jax.tree_util.keystr(path): [int(v) for v in np.asarray(value)]
          for path, value in jax.tree_util.tree_leaves_with_path(sums)}


def _digest(value) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _position_digest(position: dict) -> str:
  return _digest({k: v for k, v in position.items() if k != INTEGRITY_KEY})


def array_dtypes(state) -> dict:
  """{array path (attributes as keys): dtype name} of every array in a state or its abstract
  form."""
  return {_array_name(jax.tree_util.keystr(path)): str(np.dtype(x.dtype))
          for path, x in jax.tree_util.tree_leaves_with_path(state)
          if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)}


def with_integrity(state, position: dict) -> dict:
  """The data position with the integrity record of (state, position) added (the arrays'
  dtypes too, with their own digest: a restore casts to the target's, so another dtype would
  read as damage)."""
  dtypes = array_dtypes(state)
  return {**position, INTEGRITY_KEY: {'arrays': state_checksums(state), 'dtypes': dtypes,
                                      'dtypes_sha256': _digest(dtypes),
                                      'position_sha256': _position_digest(position)}}


def _saved_dtypes(record) -> dict | None:
  """The record's dtype table; IntegrityError when it differs from its digest (a changed bit in
  it would otherwise read as a config change). None where none was recorded; a table written
  before its digest existed is taken as it is."""
  saved = record.get('dtypes') if isinstance(record, dict) else None
  if not isinstance(saved, dict):
    return None
  if 'dtypes_sha256' in record and _digest(saved) != record['dtypes_sha256']:
    raise IntegrityError('its record of the arrays\' dtypes differs from the one saved (its '
                         'sha256)')
  return saved


def dtype_changes(position: dict, abstract_state) -> list[str]:
  """'PATH: saved SAVED, now NOW' for each array whose dtype the target changes (none for a
  checkpoint written before dtypes were recorded); IntegrityError when the record of the dtypes
  is damaged."""
  saved = _saved_dtypes(position.get(INTEGRITY_KEY))
  if saved is None:
    return []
  now = array_dtypes(abstract_state)
  return [f'{path}: saved {saved[path]}, now {now[path]}'
          for path in sorted(now) if path in saved and saved[path] != now[path]]


def _array_name(path: str) -> str:
  """An array's path with attributes written as keys (`.params` as `['params']`): a state read
  without a target comes back as nested dicts, and must match the TrainState saved."""
  return re.sub(r'\.(\w+)', r"['\1']", path)


def verify_integrity(state, position: dict) -> bool:
  """Raises IntegrityError naming what differs from the record written at save, or when the
  checkpoint has none (every save writes one); False for a checkpoint without a record when
  BERT_JAX_READ_UNVERIFIED=1 asks to read it unverified."""
  record = position.get(INTEGRITY_KEY)
  if record is None:
    if os.environ.get(UNVERIFIED_ENV, '') == '1':
      return False
    raise IntegrityError(
        'it has no integrity record (every save writes one: its data JSON was damaged, or it was '
        f'written before records existed); set {UNVERIFIED_ENV}=1 to read it unverified')
  if not isinstance(record, dict) or _position_digest(position) != record.get('position_sha256'):
    raise IntegrityError('the data position differs from the one saved (its sha256)')
  _saved_dtypes(record)
  saved = {_array_name(k): v for k, v in record.get('arrays', {}).items()}
  read = {_array_name(k): v for k, v in state_checksums(state).items()}
  changed = [path for path in read if saved.get(path) != read[path]]
  if changed or set(saved) != set(read):
    changed = changed or sorted(set(saved) ^ set(read))
    raise IntegrityError(
        f'array {changed[0]} differs from the one saved (checksum)'
        + (f', and {len(changed) - 1} more' if len(changed) > 1 else ''))
  return True


class Checkpointer:
  """Saves {state, data position} every `every` steps, keeps the newest `keep`.

  The directory is created by the first save, not before: a run refused at restore leaves none.
  """

  def __init__(self, directory: str, every: int, keep: int):
    self.directory = files.absolute(directory)
    self.every = every
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=('state', 'data'),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=False,
                                             cleanup_tmp_directories=True))
    self._pending_step = None  # Step of the save in flight (async), if any.
    self._quiet = contextlib.ExitStack()  # Open while a save is in flight.

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def restore(self, abstract_state) -> tuple[Any, dict] | None:
    """(state, data position) of the newest readable checkpoint, or None when there is none.

    When the newest cannot be read, older ones are tried; once an older one restores with the
    same target (so the config is not the problem), the unreadable newer ones are moved aside
    with a warning. CheckpointError when checkpoints exist but none can be read (then nothing
    is moved), naming another shape when a step's state has one (a changed config, since no
    step fits), or when a checkpoint holds arrays of another dtype.
    """
    with _orbax_failures_reported_here():
      return self._restore(abstract_state)

  def _restore(self, abstract_state) -> tuple[Any, dict] | None:
    failures = []
    mismatch = None  # (step, error) of the newest step of another shape or structure.
    for step in sorted(self._manager.all_steps(), reverse=True):
      try:
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        position = dict(restored['data'])
        changed = dtype_changes(position, abstract_state)
        if changed:
          raise CheckpointError(
              f'The checkpoint at step {step} in {self.directory} holds {len(changed)} arrays in '
              f'another dtype than this config builds ({changed[0]}'
              + (f'; and {len(changed) - 1} more' if len(changed) > 1 else '') + '): '
              'config.model.param_dtype or config.train.adam_mu_dtype differs from the run that '
              'wrote it. It is not damaged: resume with its config.json values, or start a new '
              '--workdir (config.init_from can start from its parameters).')
        if not verify_integrity(restored['state'], position):
          logging.warning('Checkpoint step %d has no integrity record; restored unverified.',
                          step)
        position.pop(INTEGRITY_KEY, None)
        if not all(isinstance(position.get(k), int) for k in ('epoch', 'batch')):
          raise ValueError(f'the data position lacks integer epoch/batch: {str(position)[:200]}')
      except CheckpointError:
        raise  # A config that does not fit the checkpoint: no older step would fit either.
      except Exception as e:  # pylint: disable=broad-except
        # Another shape or structure is a changed config, or a damaged step's metadata (one
        # flipped bit renames an array in orbax's tree): the older steps tell which.
        if _is_shape_mismatch(e) and mismatch is None:
          mismatch = (step, e)
        failures.append((step, _first_line(e)))
        logging.warning('Checkpoint step %d in %s cannot be read (%s); trying the previous '
                        'one.', step, self.directory, _first_line(e))
        continue
      for bad_step, error in failures:
        aside = self._move_aside(bad_step)
        logging.warning('Checkpoint step %d was unreadable (%s); moved it to %s (not deleted).',
                        bad_step, error, aside)
      if failures:
        logging.warning('Restored the previous good checkpoint, step %d, after %d unreadable '
                        'newer one(s).', step, len(failures))
      return restored['state'], position
    if mismatch is not None:
      step, error = mismatch
      raise CheckpointError(
          f'The checkpoint at step {step} in {self.directory} holds a state of another '
          f'shape or structure than this config builds (model size, NSP head, optimizer: '
          f'{_first_line(error)}), and no older step fits it either; use the config that wrote '
          'it (its config.json), or another --workdir. Nothing was moved or deleted.') from error
    if failures:
      raise CheckpointError(
          f'No checkpoint in {self.directory} can be read ('
          + '; '.join(f'step {step}: {error}' for step, error in failures) + '); nothing was '
          'moved or deleted. If the config changed since they were written, use the original '
          'one; else start over with another --workdir.')
    return None

  def _move_aside(self, step: int) -> str:
    """Renames step's directory out of orbax's sight (kept for inspection) and rescans."""
    target = files.move_aside(os.path.join(self.directory, str(step)),
                              renamer=jax.process_index() == 0)
    self._manager.reload()
    return target

  def reached_preemption(self, step: int) -> bool:
    """Several processes: whether JAX's preemption sync point says to stop at `step` (all
    processes get the same answer for the same step)."""
    return self._manager.reached_preemption(step)

  def should_save(self, step: int, final: bool) -> bool:
    return final or (self.every > 0 and step % self.every == 0)

  def save(self, step: int, state, data_position: dict) -> None:
    """Starts an (async) save; the previous one is finished (and its errors raised) first."""
    self.wait()
    # Orbax's echoes of a failure are dropped until wait() has raised it as one CheckpointError.
    self._quiet.enter_context(_orbax_failures_reported_here())
    try:
      files.makedirs(self.directory)
      data_position = with_integrity(state, data_position)
      self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position)),
                         force=True)
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(step, e) from e
    self._pending_step = step

  def wait(self) -> None:
    """Blocks until the save in flight is complete; CheckpointError if it failed."""
    step, self._pending_step = self._pending_step, None
    try:
      self._manager.wait_until_finished()
      self._manager.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(step, e) from e
    finally:
      self._quiet.close()

  def _save_error(self, step, error) -> CheckpointError:
    """The error of a failed save, once its temporary directory is removed: a half-written step
    on a full disk would hold the space the rerun needs."""
    try:
      self._manager.wait_until_finished()
    except Exception:  # pylint: disable=broad-except
      pass  # The failure being reported.
    self._quiet.close()
    if step is not None and jax.process_index() == 0 and files.exists(self.directory):
      for name in files.listdir(self.directory):
        if name.startswith(f'{step}.orbax-checkpoint-tmp'):
          _remove_partial(os.path.join(self.directory, name))
    self._manager.reload()
    return CheckpointError(
        f'Saving the checkpoint of step {step} in {self.directory} failed '
        f'({_write_failure(error)}); {self.describe_latest()}, intact. Free disk space or fix the '
        'directory, then rerun the same command to resume from it.')

  def finish_quietly(self) -> None:
    """Completes the save in flight, logging (not raising) its failure: for error paths."""
    try:
      self.wait()
    except CheckpointError as e:
      logging.error('%s', e)

  def describe_latest(self) -> str:
    """'last good checkpoint: step N in DIR', once the save in flight is complete."""
    self.finish_quietly()
    step = self._manager.latest_step()
    if step is None:
      return 'no checkpoint was saved yet'
    return f'last good checkpoint: step {step} in {self.directory}'

  def close(self) -> None:
    self.wait()
    self._manager.close()


def _remove_partial(path: str, tries: int = 20) -> None:
  """Removes a failed save's directory. Orbax's writer threads of the other arrays may still be
  finishing after the failure surfaced (rmtree then meets a file created behind it): retried a
  few times, then left with a warning, never hiding the failure being reported."""
  for attempt in range(tries):
    try:
      files.remove_tree(path)
      return
    except FileNotFoundError:
      return
    except OSError as e:
      if attempt == tries - 1:
        logging.warning('Could not remove the failed save\'s %s (%s); remove it by hand.', path,
                        e)
        return
      time.sleep(0.1)


def read_step(directory: str, step: int) -> tuple[Any, dict]:
  """(state as nested dicts, data position) of checkpoint `step` in `directory`, without a
  target state (another run's, e.g. for init_from), checked like Checkpointer.restore checks.

  Raises IntegrityError when the arrays or the position differ from their record, and orbax's
  error when the files cannot be read; never falls back to another step.
  """
  manager = ocp.CheckpointManager(directory, item_names=('state', 'data'),
                                  options=ocp.CheckpointManagerOptions(create=False))
  try:
    with _orbax_failures_reported_here():
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(), data=ocp.args.JsonRestore()))
  finally:
    manager.close()
  position = dict(restored['data'])
  if not verify_integrity(restored['state'], position):
    logging.warning('Checkpoint step %d in %s has no integrity record; read unverified.', step,
                    directory)
  position.pop(INTEGRITY_KEY, None)
  return restored['state'], position


@contextlib.contextmanager
def closing(checkpointer: Checkpointer):
  """A loop's checkpointer: closed when the loop ends; on an error the save in flight is completed
  first (its own failure logged), then the error propagates, so a failing run never leaves a
  half-written checkpoint behind a good one."""
  try:
    yield checkpointer
  except BaseException:
    checkpointer.finish_quietly()
    raise
  checkpointer.close()


class _OrbaxLogFilter:
  """Drops orbax's ERROR records (each a full traceback, several per failure) while our caller
  reports the same failure itself in one line."""

  def filter(self, record) -> bool:
    return record.levelno < 40 or '/orbax/' not in record.pathname.replace('\\', '/')


@contextlib.contextmanager
def _orbax_failures_reported_here():
  """A failed orbax read or write abandons its pending coroutines and tensorstore callbacks; as
  they are collected, Python prints each as an unraisable exception ('Exception ignored in
  <coroutine ...>', 'Event loop is closed': 180 tracebacks for one failed save of the tiny
  model), and orbax logs the error from each of its threads. The caller reports the failure in
  one line (restore's warning, save's CheckpointError), so these echoes are dropped: the ones
  raised inside orbax, tensorstore or asyncio, and orbax's ERROR log records."""
  previous = sys.unraisablehook

  def hook(unraisable):
    frames, tb = [], unraisable.exc_traceback
    while tb is not None:
      frames.append(tb.tb_frame.f_code.co_filename)
      tb = tb.tb_next
    if not any('/orbax/' in f or '/tensorstore/' in f or '/asyncio/' in f for f in frames):
      previous(unraisable)
  log_filter = _OrbaxLogFilter()
  absl_logger = logging.get_absl_logger()
  sys.unraisablehook = hook
  absl_logger.addFilter(log_filter)
  try:
    yield
  finally:
    gc.collect()
    absl_logger.removeFilter(log_filter)
    sys.unraisablehook = previous
    # Callbacks of an abandoned operation can still fire later, in training or at exit: their
    # 'Event loop is closed' is dropped for the rest of the process (nothing else is).
    errors.quiet_closed_loop_echoes()


def _first_line(error: BaseException) -> str:
  text = str(error).strip() or type(error).__name__
  return f'{type(error).__name__}: {text.splitlines()[0][:300]}'


def _write_failure(error: BaseException) -> str:
  """The OS error under a failed tensorstore write ('No space left on device (errno 28)'), which
  the first line of its message buries after two paths; else that first line."""
  match = re.search(r"os_error_code='(\d+)'", str(error))
  if match:
    code = int(match.group(1))
    return f'{os.strerror(code)} (errno {code})'
  return _first_line(error)


def _is_shape_mismatch(error: BaseException) -> bool:
  text = str(error)
  return any(s in text for s in ('shape mismatch', 'Shape mismatch', 'incompatible shape',
                                 'Requested shape', 'tree structures do not match',
                                 'Structure mismatch'))


def write_probe(directory: str) -> None:
  """Writes, syncs and removes a 4 KiB file in `directory`; the OSError of a step that fails."""
  probe = os.path.join(directory, f'.write-test-{os.getpid()}')
  if files.is_url(directory):
    with files.open(probe, 'wb') as f:
      f.write(b'\0' * 4096)
    files.remove(probe)
    return
  try:
    with open(probe, 'wb') as f:
      f.write(b'\0' * 4096)
      f.flush()
      os.fsync(f.fileno())
  finally:
    if os.path.exists(probe):
      os.remove(probe)


def check_writable(workdir: str, bytes_needed: int) -> None:
  """Before training: the workdir accepts files and has room for a checkpoint.

  Raises CheckpointError naming the directory, what failed and how much space is needed.
  """
  checkpoints = os.path.join(workdir, 'checkpoints')
  if files.is_url(workdir):  # A bucket has no free space to check.
    try:
      write_probe(workdir)
    except Exception as e:  # Cloud Storage's errors: pylint: disable=broad-except
      raise CheckpointError(f'--workdir={workdir!r} is not writable ({type(e).__name__}: '
                            f'{str(e)[:300]}); check the bucket and its permissions.') from e
    return
  try:
    write_probe(checkpoints if os.path.isdir(checkpoints) else workdir)
  except OSError as e:
    raise CheckpointError(f'--workdir={workdir!r} is not writable ({e.strerror}: '
                          f'{e.filename}); choose a writable directory.') from e
  free = shutil.disk_usage(workdir).free
  if free < bytes_needed:
    raise CheckpointError(
        f'--workdir={workdir!r} has {free / 2**30:.2f} GiB free, less than one checkpoint of '
        f'this model needs ({bytes_needed / 2**30:.2f} GiB: parameters, optimizer state); free '
        'space or choose another directory.')


def state_bytes(abstract_state) -> int:
  """Bytes of one checkpoint of the state (uncompressed)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract_state))


def checkpoint_steps(workdir: str) -> list[int]:
  """Complete checkpoint steps in workdir/checkpoints, oldest first (complete ones are renamed
  from a temporary name, so a half-written save never counts; unreadable ones moved aside do
  not either)."""
  directory = os.path.join(workdir, 'checkpoints')
  if files.is_url(directory):
    return _committed_steps(directory)
  if not os.path.isdir(directory):
    return []
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit())


def _committed_steps(directory: str) -> list[int]:
  """Steps of a gs:// checkpoint directory that orbax finished: on Cloud Storage it writes a step
  under its final name and marks it complete with a commit file last."""
  return sorted(int(name) for name in files.listdir(directory) if name.isdigit()
                and files.exists(f'{directory}/{name}/{GCS_COMMIT_FILE}'))


def latest_step(workdir: str) -> int | None:
  """Newest complete checkpoint step in workdir/checkpoints, or None."""
  steps = checkpoint_steps(workdir)
  return steps[-1] if steps else None


def abstract_like(state, shardings):
  """ShapeDtypeStructs with the given shardings: what restore fills in."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      state, shardings)

"""What keeps a run's workdir trustworthy, for pretraining and fine-tuning alike.

- `check_workdir`: only a new or empty directory, or one a bert_jax run of the same mode wrote,
  is accepted; `/`, a model directory or a folder of other files is refused before anything runs.
- `claim`: one run per workdir. An exclusive lock (`.lock`, flock) is held for the run's life;
  a second run on the workdir is refused at once, naming the holder. The kernel drops the lock of
  a process that dies, so a lock left by a killed run is taken over, with a message. Until the run
  `commit`s (every check passed), nothing else is written, and a refused run leaves the directory
  as it found it. A gs:// workdir is locked by an object instead (object_lock).
- `all_finite`: the check that keeps a non-finite state out of every checkpoint.
- `Preemption`: SIGTERM is caught from the start of a run to its end (saves included) and asks
  the loop for a checkpoint and a clean exit.
"""

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import threading
import time

import jax
import jax.numpy as jnp
from absl import logging

from bert_jax import config_lib
from bert_jax.core import files
from bert_jax.train import object_lock

LOCK_NAME = '.lock'
# What runs write into their workdir (fine-tuning also writes seed_<N>/ directories).
RUN_FILES = {
    'pretrain': {'config.json', 'metrics.jsonl', 'tensorboard', 'checkpoints', 'vocab.txt',
                 'eval_results.json', 'plots', LOCK_NAME},
    'finetune': {'config.json', 'results.json', LOCK_NAME},
}
# Files that make a directory a model (HF, TF, ours exported), never a workdir.
MODEL_FILES = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin',
               'tf_model.h5', 'flax_model.msgpack', 'bert_model.ckpt.index')


class NonFiniteLossError(FloatingPointError):
  """The loss, the gradients or the state became NaN or inf (more often than config allows)."""


def all_finite(*trees) -> jax.Array:
  """Whether every floating value of the trees is finite: x * 0 is 0 for finite x, NaN else."""
  leaves = [x for x in jax.tree.leaves(trees) if jnp.issubdtype(x.dtype, jnp.floating)]
  return jnp.all(jnp.stack([jnp.sum(x.astype(jnp.float32) * 0) == 0 for x in leaves]))


def data_layout(config, keys) -> dict:
  """{dotted key: value} of `keys` in `config` (keys it lacks are left out): the values that
  decide a run's batches, saved with each checkpoint."""
  layout = {}
  for key in keys:
    node = config
    for part in key.split('.'):
      node = node.get(part) if hasattr(node, 'get') else None
    if node is not None:
      layout[key] = node
  return layout


def layout_changes(saved: dict | None, now: dict, source: str = 'the checkpoint') -> list[str]:
  """'config.KEY=NOW (the checkpoint: SAVED)' for each value a resume would change (none when
  the checkpoint has no layout); `source` names what holds SAVED."""
  if saved is None:
    return []
  return [f'config.{k}={now.get(k)!r} ({source}: {saved.get(k)!r})'
          for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]


class WorkdirError(config_lib.ConfigError):
  """The workdir cannot hold this run: not a run directory, or in use by another run."""


def run_mode(config) -> str:
  return 'finetune' if config.get('mode') == 'finetune' else 'pretrain'


def _saved_config(path: str):
  """The parsed config.json of a directory, or None where it is absent or not JSON."""
  try:
    with files.open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def check_workdir(workdir: str, mode: str) -> str:
  """The absolute workdir, once it is one this run may use (read-only: nothing is written).

  Accepted: a directory that does not exist yet, an empty one, or one holding a bert_jax run of
  the same mode (its config.json, or only files such runs write).
  """
  if files.is_url(workdir):
    path = files.absolute(workdir)
    if not path.startswith('gs://') or '/' not in path[len('gs://'):]:
      raise WorkdirError(f'--workdir={workdir!r}: of URLs only gs://BUCKET/DIR (Cloud Storage, '
                         'a directory of its own in the bucket) is supported; or mount the '
                         'bucket (gcsfuse) and pass the mounted path.')
  else:
    path = os.path.abspath(os.path.expanduser(workdir))
    if path == os.path.abspath(os.sep) or path == os.path.expanduser('~'):
      raise WorkdirError(f'--workdir={workdir!r} is {path}: give a directory of its own, e.g. '
                         'runs/NAME.')
  if not files.exists(path):
    return path
  if not files.isdir(path):
    raise WorkdirError(f'--workdir={workdir!r} is a file, not a directory; give a new or '
                       'empty directory, or a run directory.')
  entries = sorted(files.listdir(path))
  if not entries:
    return path
  models = [name for name in entries if name in MODEL_FILES]
  if models:
    raise WorkdirError(f'--workdir={workdir!r} is a model directory (it holds {models[0]}); a '
                       'run would overwrite its files. Read it with init_from and give a new '
                       '--workdir.')
  saved = _saved_config(os.path.join(path, 'config.json'))
  if isinstance(saved, dict) and {'train', 'data', 'model'} <= set(saved):
    saved_mode = 'finetune' if saved.get('mode') == 'finetune' else 'pretrain'
    if saved_mode != mode:
      raise WorkdirError(f'--workdir={workdir!r} holds a {saved_mode} run (its config.json); '
                         f'this is a {mode} run. Give another --workdir.')
  else:
    known = RUN_FILES[mode]
    foreign = [name for name in entries if name not in known and not (
        mode == 'finetune' and name.startswith('seed_'))]
    if 'config.json' in entries or foreign:
      named = ('config.json' if 'config.json' in entries else ', '.join(foreign[:3]) + (
          f' and {len(foreign) - 3} more' if len(foreign) > 3 else ''))
      raise WorkdirError(f'--workdir={workdir!r} holds files that are not a bert_jax {mode} '
                         f'run\'s ({named}); give a new or empty directory, or a run directory.')
  checkpoints = os.path.join(path, 'checkpoints')
  if files.exists(checkpoints) and not files.isdir(checkpoints):
    raise WorkdirError(f'{checkpoints} is a file where the run keeps its checkpoint directory; '
                       'move it away or give another --workdir.')
  return path


def _holder(path: str) -> dict:
  try:
    with open(path, encoding='utf-8') as f:
      return json.loads(f.read() or '{}')
  except (OSError, ValueError):
    return {}


def _who(holder: dict, started: bool = False) -> str:
  """'process PID on HOST' (', started TIME') of a lock's holder record, else 'another
  process'."""
  if not holder.get('pid'):
    return 'another process'
  return (f'process {holder["pid"]} on {holder.get("host", "?")}'
          + (f', started {holder.get("started", "?")}' if started else ''))


def in_use(workdir: str) -> str | None:
  """'process PID on HOST' while a run holds `workdir`'s lock (local workdirs), else None.

  Tested with a shared lock taken and dropped at once, which no run's exclusive claim allows.
  """
  path = os.path.join(workdir, LOCK_NAME)
  try:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
  except OSError:
    return None  # No lock file, or a URL: nothing holds it here.
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except OSError as e:
    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      return None
    return _who(_holder(path))
  finally:
    os.close(fd)  # Also drops the shared lock.
  return None


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class Claim:
  """A workdir held by this run: see `claim`."""

  def __init__(self, workdir: str):
    self.workdir = workdir
    self.committed = False
    self._fd = None
    self._object_lock = None  # A gs:// workdir's lock.
    self._created = []  # What the claim made: removed again when the run is refused.

  def acquire(self) -> None:
    if files.is_url(self.workdir):
      self._acquire_object()
      return
    if not os.path.isdir(self.workdir):
      missing, parent = [], self.workdir
      while not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
      try:
        os.makedirs(self.workdir)
      except OSError as e:
        raise WorkdirError(f'--workdir={self.workdir!r} cannot be created ({e.strerror}); '
                           'choose a writable directory.') from e
      self._created.extend(missing)  # Deepest first: removed in this order.
    path = os.path.join(self.workdir, LOCK_NAME)
    if not os.path.exists(path):
      self._created.insert(0, path)
    try:
      self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
      self.release()
      raise WorkdirError(f'--workdir={self.workdir!r} is not writable ({e.strerror}: {path}); '
                         'choose a writable directory.') from e
    try:
      fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        # File systems without locks (some FUSE mounts): the run goes on unguarded.
        logging.warning('Cannot lock %s (%s): a second run on this workdir would not be '
                        'refused.', path, e.strerror)
        return
      who = _who(_holder(path), started=True)
      os.close(self._fd)
      self._fd = None
      raise WorkdirError(f'--workdir={self.workdir!r} is in use by another run ({who}); wait '
                         'for it to end, or give another --workdir.') from e
    previous = _holder(path)
    if previous.get('pid'):
      here = previous.get('host') == socket.gethostname()
      state = ('no longer running' if here and not _alive(previous['pid']) else
               'its lock is released' if here else f'on {previous.get("host")}, lock released')
      logging.warning('Took over %s: the run of process %s (started %s) ended without '
                      'releasing it (%s).', path, previous['pid'], previous.get('started', '?'),
                      state)
    os.ftruncate(self._fd, 0)
    os.pwrite(self._fd, json.dumps({
        'pid': os.getpid(), 'host': socket.gethostname(),
        'started': time.strftime('%Y-%m-%d %H:%M:%S')}).encode(), 0)

  def _acquire_object(self) -> None:
    """The lock of a gs:// workdir: an object only one run can create (object_lock)."""
    path = f'{self.workdir}/{LOCK_NAME}'
    lock = object_lock.ObjectLock(path)
    try:
      previous = lock.acquire(
          lambda holder: holder.get('host') == socket.gethostname() and 'pid' in holder
          and not _alive(holder['pid']))
    except object_lock.LockHeldError as e:
      who = _who(e.holder, started=True)
      renewed = f', renewed {e.age_s:.0f} s ago' if e.age_s is not None else ''
      raise WorkdirError(
          f'--workdir={self.workdir!r} is in use by another run ({who}{renewed}); wait for it '
          f'to end (a run that stops renewing {path} is taken over after '
          f'{lock.stale_s:.0f} s), or give another --workdir.') from e
    except Exception as e:  # Cloud Storage's errors: pylint: disable=broad-except
      raise WorkdirError(f'--workdir={self.workdir!r}: cannot write {path} ({type(e).__name__}: '
                         f'{str(e)[:300]}); check the bucket and its permissions.') from e
    self._object_lock = lock
    if previous:
      logging.warning('Took over %s: the run of process %s on %s (started %s) ended without '
                      'releasing it.', path, previous.get('pid', '?'), previous.get('host', '?'),
                      previous.get('started', '?'))

  def commit(self) -> None:
    """Every check passed: the run may write its files; a later failure keeps them."""
    self.committed = True

  def release(self) -> None:
    if self._object_lock is not None:  # Deleted at any end: the next run has no holder to report.
      self._object_lock.release()
      self._object_lock = None
    if self._fd is not None:
      if self.committed:
        os.ftruncate(self._fd, 0)  # A clean end: the next run has no holder to report.
      os.close(self._fd)
      self._fd = None
    if not self.committed:
      for path in self._created:
        with contextlib.suppress(OSError):
          (os.rmdir if os.path.isdir(path) else os.remove)(path)
      self._created = []


@contextlib.contextmanager
def claim(workdir: str):
  """Holds `workdir` for one run (see the module docstring); the first process of several holds
  the lock for all of them. Yields the Claim: call its commit() once every check has passed."""
  held = Claim(workdir)
  if jax.process_index() == 0:
    held.acquire()
  else:  # The first process may not have made it yet; the others check it is writable.
    files.makedirs(workdir)
  try:
    yield held
  finally:
    held.release()


class Preemption:
  """SIGTERM (what a TPU VM gets before maintenance or preemption) asks for a checkpoint + exit.

  One process: a handler, installed for the whole run, sets a flag that the loop reads after
  each step; a SIGTERM during a save or the final evaluation lets them finish. Several
  processes: JAX's coordination service catches SIGTERM and all processes agree on the step to
  stop at (orbax's reached_preemption), so no handler is installed.
  """

  def __init__(self):
    self.requested = False

  def _handle(self, signum, frame):
    del signum, frame
    if not self.requested:
      logging.warning('SIGTERM received: the run saves a checkpoint at the next step boundary, '
                      'then exits (a save in progress is completed).')
    self.requested = True

  @contextlib.contextmanager
  def handling(self):
    install = jax.process_count() == 1 and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, self._handle) if install else None
    try:
      yield self
    finally:
      if install:
        signal.signal(signal.SIGTERM, previous)

  def reached(self, step: int, checkpointer) -> bool:
    if jax.process_count() > 1:
      return checkpointer.reached_preemption(step)
    return self.requested

"""Metrics out of a run: metrics.jsonl, TensorBoard events, the log line, MFU.

A gs:// workdir's metrics.jsonl is an object, which cannot be appended to and takes about one
write a second: the writer keeps the file's lines and uploads them whole at most every
UPLOAD_EVERY_S seconds, at every checkpoint (sync) and at the end, so every record a checkpoint
covers is in the bucket before the checkpoint is. TensorBoard's event file is written on local
disk and uploaded with it (tensorboardX's own gs:// writer rewrites the object at its every
flush, and once more when it is garbage-collected).
"""

import atexit
import contextlib
import json
import os
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
from absl import logging

from bert_jax import models
from bert_jax import objectives
from bert_jax.core import chips
from bert_jax.core import files

UPLOAD_EVERY_S = 30.0  # gs://: the most often metrics.jsonl and TensorBoard are rewritten.


def model_flops_per_sequence(config) -> float:
  """DESIGN.md's formula: training FLOPs of one sequence (3x forward, attention in full): the
  encoder's (its family's flops) and each objective head's."""
  m, d = config.model, config.data
  shape = objectives.BatchShape(d.max_seq_length, d.max_predictions_per_seq)
  forward = models.get(m.get('name', 'bert')).flops(m, d.max_seq_length)
  for objective in objectives.resolve(config).objectives:
    forward += objective.flops(m, shape)
  return 3.0 * forward


# A measured peak this far above the datasheet's is not a real figure (e.g. XLA's
# --xla_gpu_autotune_level=0 gave 10.9 PFLOP/s on an H200 whose datasheet says 0.989).
_ABOVE_DATASHEET = 1.05


def peak_fields(device_kind: str, measured: float, model_flops_per_s: float) -> dict:
  """The fields a benchmark line gives beside its MFU against the measured peak: the datasheet
  peak, the MFU against it, and whether the measured peak is above it (then that MFU is not
  a real figure either)."""
  datasheet = chips.datasheet_peak_flops(device_kind)
  return {
      'datasheet_peak_flops_per_device': datasheet,
      'mfu_vs_datasheet': model_flops_per_s / datasheet if datasheet else None,
      'peak_above_datasheet': bool(datasheet and measured > _ABOVE_DATASHEET * datasheet),
  }


def measure_peak_flops(device=None, trials: int | None = None) -> float:
  """Dense matmul FLOP/s measured on `device`: 8192^3 bf16 on accelerators, 1024^3 fp32 on CPU;
  the best of `trials` timings (5 on accelerators, 1 on CPU) of `repeats` queued matmuls. One
  timing of 20 matmuls moved by up to 3% between processes on one H100 (776-802 TFLOP/s), which
  moved every MFU computed against it; a peak is a maximum, so the best timing is kept."""
  device = device or jax.devices()[0]
  on_cpu = device.platform == 'cpu'
  n, dtype = (1024, jnp.float32) if on_cpu else (8192, jnp.bfloat16)
  # Random operands: constant ones or zeros run measurably faster than real data on GPUs.
  a = jax.device_put(jax.random.normal(jax.random.key(0), (n, n), dtype), device)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()
  repeats = 3 if on_cpu else 20
  best = 0.0
  for _ in range(trials or (1 if on_cpu else 5)):
    start = time.perf_counter()
    for _ in range(repeats):
      out = matmul(a)
    out.block_until_ready()
    best = max(best, 2.0 * n**3 * repeats / (time.perf_counter() - start))
  return best


class MetricWriter:
  """Appends records to workdir/metrics.jsonl and TensorBoard; drops records past a resume."""

  def __init__(self, workdir: str, resume_step: int = 0):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self._file = self._tb = None
    self._lines = None  # gs://: the whole file, uploaded by sync().
    self._synced_at = 0.0
    self._tensorboard = os.path.join(workdir, 'tensorboard')
    self._tb_local = self._tensorboard  # gs://: a local directory, uploaded by sync().
    if jax.process_index() != 0:  # One writer per run: the first process.
      return
    # A fresh start (no checkpoint) keeps nothing, not even an aborted attempt's step-0 eval.
    kept = _records_up_to(self.path, resume_step if resume_step else -1)
    if files.is_url(self.path):
      self._lines = kept
      self._tb_local = tempfile.mkdtemp(prefix='bert_jax_tensorboard_')
      atexit.register(shutil.rmtree, self._tb_local, True)
    else:
      if files.exists(self.path):
        files.write_text(self.path, ''.join(kept))
      self._file = open(self.path, 'a', encoding='utf-8')
    import tensorboardX  # pylint: disable=g-import-not-at-top
    self._tb = tensorboardX.SummaryWriter(self._tb_local,
                                          purge_step=resume_step + 1 if resume_step else None)
    if self._lines is not None:
      self.sync()

  def write(self, step: int, split: str, values: dict) -> None:
    if self._tb is None:
      return
    record = {'step': int(step), 'split': split, **{k: _plain(v) for k, v in values.items()}}
    for key, value in record.items():
      if key not in ('step', 'split') and isinstance(value, (int, float)):
        self._tb.add_scalar(f'{split}/{key}', value, step)
    if self._lines is not None:
      self._lines.append(json.dumps(record) + '\n')
      if time.monotonic() - self._synced_at >= UPLOAD_EVERY_S:
        self.sync()
      return
    self._file.write(json.dumps(record) + '\n')
    self._file.flush()
    self._tb.flush()

  def sync(self) -> None:
    """Every record written so far is in metrics.jsonl and TensorBoard (gs://: uploaded now;
    locally each write already is)."""
    if self._lines is not None:
      files.write_text(self.path, ''.join(self._lines))
      self._tb.flush()
      for name in os.listdir(self._tb_local):
        files.upload(os.path.join(self._tb_local, name), f'{self._tensorboard}/{name}')
      self._synced_at = time.monotonic()

  def close(self) -> None:
    self.sync()
    if self._file is not None:
      self._file.close()
    if self._tb is not None:
      self._tb.close()


def read_record(workdir: str, step: int, split: str) -> dict | None:
  """The values of metrics.jsonl's last `split` record at `step`, or None."""
  found = None
  with contextlib.suppress(OSError):
    with files.open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
      for line in f:
        try:
          record = json.loads(line)
        except ValueError:
          continue
        if record.get('step') == step and record.get('split') == split:
          found = {k: v for k, v in record.items() if k not in ('step', 'split')}
  return found


def _plain(value):
  if isinstance(value, (list, tuple)):  # e.g. a record's alarm names.
    return [_plain(v) for v in value]
  return value if isinstance(value, (str, int, bool)) else float(value)


def _records_up_to(path: str, step: int) -> list[str]:
  """The lines of the metrics file `path` (none when it is absent) whose records are at or before
  `step`: a resumed run re-logs what came after its checkpoint."""
  if not files.exists(path):
    return []
  kept = []
  for line in files.read_text(path).splitlines(True):
    try:
      if json.loads(line)['step'] <= step:
        kept.append(line)
    except (ValueError, KeyError):
      pass  # A line cut short by a crash.
  return kept


def announced(step_fn, what: str):
  """`step_fn` (a jitted step) whose first call with each new argument shape says that it
  compiles: 'Compiling WHAT...' before, then 'WHAT ready in N s (XLA compiled for M s)' once
  its outputs are ready, so that the minutes a large model's first step (or phase 2's longer
  rows) can take are never silent. Later calls go straight through; the outputs are the same.

  A call is new by the shapes of its arguments after the first, the train state (or the
  parameters), whose shapes a run never changes: keying on its ~1,000 leaves (BERT-base,
  unscanned, with Adam's moments) would cost about 1 ms of host time per step."""
  seen = set()

  def call(*args, **kwargs):
    shapes = tuple((getattr(x, 'shape', None), getattr(x, 'dtype', None))
                   for x in jax.tree.leaves((args[1:], kwargs)))
    if shapes in seen:
      return step_fn(*args, **kwargs)
    compile_seconds, cache_hits = [], []

    def on_duration(event, seconds, **unused):
      if 'backend_compile' in event:
        compile_seconds.append(seconds)

    def on_event(event, **unused):
      if event.endswith('cache_hits'):
        cache_hits.append(event)

    logging.info('Compiling %s...', what)
    start = time.perf_counter()
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    try:
      outputs = jax.block_until_ready(step_fn(*args, **kwargs))
    finally:
      jax.monitoring.unregister_event_duration_listener(on_duration)
      jax.monitoring.unregister_event_listener(on_event)
    seen.add(shapes)
    how = (f'XLA compiled for {sum(compile_seconds):.1f} s' if compile_seconds else
           'nothing to compile')
    if cache_hits:
      how += f'; {len(cache_hits)} program(s) from the persistent compilation cache'
    logging.info('%s ready in %.1f s (%s).', what[:1].upper() + what[1:],
                 time.perf_counter() - start, how)
    return outputs

  return call


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f'{h}h{m:02d}m' if h else f'{m}m{s:02d}s'


def objective_parts(values: dict) -> list[str]:
  """'NAME LOSS (acc ACCURACY)' for each objective's '<name>_loss' in values."""
  parts = []
  for key in values:
    name = key[:-len('_loss')]
    if not key.endswith('_loss') or not name:
      continue
    accuracy = values.get(f'{name}_accuracy')
    parts.append(f'{name} {values[key]:.4f}'
                 + (f' (acc {accuracy:.3f})' if accuracy is not None else ''))
  return parts


# Fields of a train record that measure the machine, not the training: they differ between
# two runs that train identically (a resumed run and an uninterrupted one).
TIMING_FIELDS = ('seq_per_s', 'mfu', 'input_share')
# A train line shows the share of the interval's time the host spent making and sending batches
# from this share on (below it the input is not what bounds the step).
INPUT_SHARE_SHOWN = 0.1
# From this share on the device spent most of an interval waiting for the host's batches: the
# run says so once (train/loop.py).
INPUT_BOUND_SHARE = 0.5


def log_train_line(step: int, num_steps: int, values: dict, eta_seconds: float,
                   prefix: str = '') -> None:
  """'step 100/1000 | loss ... | ETA 1m40s'; prefix names the run ('seed 2 ') where several share
  a log."""
  parts = [f'{prefix}step {step}/{num_steps}', f'loss {values["loss"]:.4f}', *objective_parts(values)]
  parts += [f'lr {values["learning_rate"]:.2e}', f'{values["seq_per_s"]:.1f} seq/s',
            f'mfu {100 * values["mfu"]:.1f}%']
  if values.get('input_share', 0.0) >= INPUT_SHARE_SHOWN:
    parts.append(f'input {100 * values["input_share"]:.0f}%')
  parts.append(f'ETA {format_duration(eta_seconds)}')
  logging.info(' | '.join(parts))

"""The in-memory input's wait at an epoch's start, with the next epoch built ahead and without.

  python benchmarks/epoch_build_ahead.py --config=configs/small.py \
      --config.data.corpus='DIR/*.xz' [--step_ms=10] [--batches=N]

The in-memory stream (data/pipeline.PretrainingStream, a `data.corpus` run) pairs and masks
every document of an epoch at the epoch's start: on a corpus of tens of MB, seconds of host work
while the device has only the few steps already queued. This reads the stream as the step loop
does, from the first batch across the first epoch's end (`--batches`, default one epoch and
BUILD_AHEAD_AFTER more), with `--step_ms` of device time a step (a sleep, which releases the GIL
as waiting on the device does), twice: as the loop reads it (the next epoch built in a thread once
BUILD_AHEAD_AFTER batches of the epoch before are read) and with the build ahead turned off.
Prints one JSON line per setting: the seconds spent waiting for batches, the longest wait, the
wall time against batches x step_ms, and the seconds one epoch takes to build here.
"""

import json
import os
import sys
import tempfile
import time

from absl import app
from absl import flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.data import pipeline  # noqa: E402
from bert_jax.train import pretrain  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/small.py', 'Config file.')
_STEP_MS = flags.DEFINE_float('step_ms', 10.0, 'Device time of a step (a sleep).')
_BATCHES = flags.DEFINE_integer('batches', 0, 'Batches read (0: one epoch and '
                                'BUILD_AHEAD_AFTER more, across the first epoch\'s end).')


def read(stream, batches: int, step_s: float) -> dict:
  waits = []
  start = time.perf_counter()
  iterator = stream.batches({'epoch': 0, 'batch': 0})
  for _ in range(batches):
    before = time.perf_counter()
    next(iterator)
    waits.append(time.perf_counter() - before)
    time.sleep(step_s)
  wall = time.perf_counter() - start
  return {'batches': batches, 'wall_s': round(wall, 3),
          'device_s': round(batches * step_s, 3), 'input_wait_s': round(sum(waits), 3),
          'longest_wait_s': round(max(waits), 3)}


def main(argv):
  del argv
  config = _CONFIG.value
  with tempfile.TemporaryDirectory() as workdir:
    stream = pretrain.prepare_data(config, workdir)[0]
    if not isinstance(stream, pipeline.PretrainingStream):
      raise SystemExit('The config streams a prepared corpus (data.prepared): this measures the '
                       'in-memory input of a data.corpus run.')
    start = time.perf_counter()
    per_epoch = stream.batches_per_epoch(0)  # Builds epoch 0.
    build_s = time.perf_counter() - start
    batches = _BATCHES.value or per_epoch + pipeline.BUILD_AHEAD_AFTER
    settings = {'step_ms': _STEP_MS.value, 'batches_per_epoch': per_epoch,
                'epoch_build_s': round(build_s, 3)}
    default = pipeline.BUILD_AHEAD_AFTER
    for name, after in (('built_ahead', default), ('built_at_the_epoch_start', 10**12)):
      pipeline.BUILD_AHEAD_AFTER = after
      fresh = pipeline.PretrainingStream(stream.documents, stream.settings, stream.batch_size,
                                         stream.seed, stream.build)
      fresh.epoch_examples(0)  # Both start with epoch 0 built, as a run's first step finds it.
      print(json.dumps({'setting': name, **settings, **read(fresh, batches,
                                                            _STEP_MS.value / 1000)}), flush=True)
    pipeline.BUILD_AHEAD_AFTER = default


if __name__ == '__main__':
  app.run(main)

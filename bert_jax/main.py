"""Entry point: `python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/bert`."""

import logging as python_logging
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

# Config files import `configs.base`: make the repository root importable from anywhere.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.core import chips  # pylint: disable=g-import-not-at-top,wrong-import-position
from bert_jax.core import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from bert_jax.core import errors  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/tiny.py.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory; resumes when it has checkpoints.')
flags.mark_flags_as_required(['config', 'workdir'])


def _quiet_libraries(record) -> bool:
  """Keeps orbax's per-save INFO chatter out of the run log; its warnings still show."""
  return record.levelno >= python_logging.WARNING or '/orbax/' not in record.pathname


def _count_cache_reads() -> dict:
  """Counts, from JAX's monitoring events, the compiles that asked the persistent compilation
  cache and those it answered."""
  import jax  # pylint: disable=g-import-not-at-top
  events = {'/jax/compilation_cache/compile_requests_use_cache': 'requests',
            '/jax/compilation_cache/cache_hits': 'hits'}
  counts = dict.fromkeys(events.values(), 0)

  def listener(event, **_):
    if event in events:
      counts[events[event]] += 1
  jax.monitoring.register_event_listener(listener)
  return counts


def out_of_memory(error, config) -> str:
  """One line for an allocation the device could not make (XLA's RESOURCE_EXHAUSTED): what was
  asked for, and the settings that shrink a step's memory."""
  first = next((line.strip() for line in str(error).splitlines() if line.strip()), '')
  return (f'Out of device memory: {first[:300]} The step of this config needs more memory than '
          'the device has: lower config.train.batch_size (config.train.grad_accum_steps='
          f'{2 * config.train.get("grad_accum_steps", 1)} keeps the batch the optimizer sees) '
          'or config.data.max_seq_length, recompute in the backward (config.model.remat_policy='
          "'dots'), or shard the parameters and optimizer state over the devices "
          "(config.mesh.preset='fsdp').")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  logging.get_absl_logger().addFilter(_quiet_libraries)
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.train import xla  # pylint: disable=g-import-not-at-top
  xla.apply_xla_flags(_CONFIG.value)  # Before JAX starts its backends.
  import jax  # pylint: disable=g-import-not-at-top
  # Explicit signals only: libtpu itself sets CLOUD_TPU_* variables in any process that loads it.
  if os.environ.get('JAX_COORDINATOR_ADDRESS') or os.environ.get('BERT_JAX_MULTIHOST') == '1':
    # Cloud TPU (and SLURM, Open MPI, k8s) detect the process count and id; JAX reads no
    # variable for them, so elsewhere JAX_NUM_PROCESSES and JAX_PROCESS_ID give them.
    count, index = os.environ.get('JAX_NUM_PROCESSES'), os.environ.get('JAX_PROCESS_ID')
    jax.distributed.initialize(num_processes=int(count) if count else None,
                               process_id=int(index) if index else None)
  from bert_jax.core import checkpoint  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks import base as tasks_base  # pylint: disable=g-import-not-at-top
  config = _CONFIG.value
  logging.info('JAX %s on %d %s device(s).', jax.__version__, jax.device_count(),
               jax.devices()[0].platform)
  cache_dir, cache_reads = '', {}
  try:
    cache_dir = xla.apply_compilation_cache(config)
    cache_reads = _count_cache_reads() if cache_dir else {}
    if config.get('mode') == 'finetune':
      from bert_jax.train import finetune  # pylint: disable=g-import-not-at-top
      finetune.run(config, _WORKDIR.value)
    else:
      pretrain.train_and_evaluate(config, _WORKDIR.value)
  # Each error once, as stderr's last line (sys.exit prints it), not also as a log record.
  except tasks_base.TaskError as e:
    sys.exit(f'Task data error: {e}')
  except config_lib.ConfigError as e:
    sys.exit(f'Invalid config: {e}')
  except checkpoint.CheckpointError as e:
    sys.exit(f'Checkpoint error: {e}')
  except (pretrain.NonFiniteLossError, pretrain.RunHealthError) as e:
    sys.exit(f'Stopped: {e}')
  except jax.errors.JaxRuntimeError as e:
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    sys.exit(out_of_memory(e, config))
  finally:
    if cache_reads:
      logging.info('Compilation cache %s: %d of %d compiles read from it.', cache_dir,
                   cache_reads['hits'], cache_reads['requests'])


def run() -> None:
  """The command: `python -m bert_jax.main`, or the last line of a launcher that first registers
  its own attention kernels, objectives, task kinds or families (docs/ARCHITECTURE.md)."""
  chips.quiet_absent_tpu()  # Before JAX starts.
  errors.quiet_closed_loop_echoes()
  # One-line errors for bad flags and config files; --help adds the config keys.
  app.run(main, flags_parser=cli.flags_parser(__name__))


if __name__ == '__main__':
  run()

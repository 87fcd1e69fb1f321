"""Train-step throughput: `python -m bert_jax.benchmark --config=configs/base.py [--config.X=Y]`.

Runs the real train step (same state, shardings and mesh as training) on fixed random batches of
the config's shape, no input pipeline, and prints one JSON line: devices, mesh, batch, seq/s,
tokens/s, MFU against a dense bf16 matmul peak measured in this process, peak memory, and on
NVIDIA GPUs the SM clock and power under the timed steps and under the peak (bert_jax.tools.gpu_clocks),
and `code`, a fingerprint of the package's sources (which code ran).
With `--config.data.prepared=DIR` the batches are real ones from that prepared corpus (made
before timing, cycled; `data.packing` applies), and `real_tokens_per_s` counts non-pad tokens.

`--sweep=32,64,128` times those batch sizes, each in its own process (its own peak memory and a
clean device), one JSON line each (`{"batch": B, "error": "out of memory: ..."}` for one that does
not fit), then a last line with `largest_batch_that_fits`. `--sweep=double` starts at the
config's batch and doubles it until a batch runs out of memory.
"""

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags
from ml_collections import config_flags

from bert_jax.core import chips
from bert_jax.core import cli

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/base.py.')
_STEPS = flags.DEFINE_integer('steps', 20, 'Timed steps.')
_WARMUP = flags.DEFINE_integer('warmup', 3, 'Untimed steps first (compilation, autotuning).')
_SWEEP = flags.DEFINE_string(
    'sweep', '', "Batch sizes to time, each in its own process: '32,64,128', or 'double' (the "
    "config's batch, doubled until one runs out of memory). Ends with largest_batch_that_fits.")
flags.mark_flags_as_required(['config'])


def random_batch(config, rng):
  """A batch of the config's shapes: random ids, full-length rows, distinct random masked
  positions."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  b, s, p = (config.train.batch_size, config.data.max_seq_length,
             config.data.max_predictions_per_seq)
  lengths = np.full(b, s)  # Full-length rows, as packed or long-document pretraining feeds.
  input_mask = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  batch = {
      'input_ids': rng.integers(5, config.model.vocab_size, (b, s)).astype(np.int32) * input_mask,
      'input_mask': input_mask,
      'segment_ids': (np.arange(s)[None] >= lengths[:, None] // 2).astype(np.int32) * input_mask,
      # Distinct positions, as the input pipeline's (ELECTRA writes its samples back at them),
      # unless the row has fewer inner positions than predictions.
      'masked_lm_positions': np.sort(np.stack([
          rng.choice(np.arange(1, s - 1), p, replace=p > s - 2) for _ in range(b)]),
                                     axis=1).astype(np.int32),
      'masked_lm_ids': rng.integers(5, config.model.vocab_size, (b, p)).astype(np.int32),
      'masked_lm_weights': np.ones((b, p), np.float32),
  }
  if objectives.resolve(config).sentence_pairs:
    batch['next_sentence_labels'] = rng.integers(0, 2, b).astype(np.int32)
  return batch


def code_fingerprint(root: str | None = None) -> str:
  """The first 12 hex digits of a sha256 over every .py file under `root` (default: this
  package), by relative path and contents: which code a benchmark line measured, also where the
  tree was copied without its git history (a GPU machine)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha256()
  paths = sorted(os.path.relpath(os.path.join(d, f), root)
                 for d, _, files in os.walk(root) for f in files if f.endswith('.py'))
  for path in paths:
    with open(os.path.join(root, path), 'rb') as f:
      digest.update(path.replace(os.sep, '/').encode() + b'\0' + f.read() + b'\0')
  return digest.hexdigest()[:12]


_REAL_BATCHES = 8  # Distinct real batches cycled through when timing a prepared corpus.


def corpus_batches(config, count: int) -> list:
  """`count` global batches of the prepared corpus, as training would stream them."""
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  stream = pretrain.prepare_streaming(config, with_eval=False)[0]
  batches = stream.batches({'epoch': 0, 'batch': 0})
  out = [next(batches)[0] for _ in range(count)]
  stream.close()
  return out


class Setup:
  """What a timing run needs: validated config, mesh and rules, model, optimizer, sharded state,
  the jitted (donated) train step and one random batch on the devices. Use under `in_mesh()`."""

  def __init__(self, config):
    import numpy as np  # pylint: disable=g-import-not-at-top
    from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
    from bert_jax.core import xla_options  # pylint: disable=g-import-not-at-top
    from bert_jax.train import optim  # pylint: disable=g-import-not-at-top
    from bert_jax import sharding  # pylint: disable=g-import-not-at-top
    from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
    from bert_jax.train import xla  # pylint: disable=g-import-not-at-top
    if not config.data.prepared:
      config.data.corpus = config.data.corpus or 'builtin'  # Not read; validation wants one.
    # The step timed is the full batch's: a batch-size warmup's smaller ones are not.
    config.train.batch_warmup_rows = config.train.batch_warmup_tokens = 0
    config_lib.validate(config)
    xla.apply_xla_flags(config)  # Before the mesh starts JAX's backends.
    self.config = config
    self.mesh = sharding.create_mesh(config.mesh)
    self.rules = sharding.logical_axis_rules(config.mesh.preset)
    config_lib.validate_runtime(config, 0, sharding.batch_divisor(self.mesh))
    self.model, self.tx = steps.build_model(config), optim.for_pretraining(config)
    steps.check_state_divides(config, self.model, self.tx, self.mesh, self.rules)
    with self.in_mesh():
      self.state, shardings = steps.create_train_state(config, self.model, self.tx, self.mesh,
                                                       self.rules)
      batch_sharding = sharding.batch_sharding(self.mesh)
      self.step = steps.jit_pretraining_step(
          config, self.model, self.tx, shardings, batch_sharding,
          compiler_options=xla_options.parse(config))
      host_batches = ([random_batch(config, np.random.default_rng(0))] if not
                      config.data.prepared else corpus_batches(config, _REAL_BATCHES))
      self.real_tokens = float(np.mean([b['input_mask'].sum() for b in host_batches]))
      self.batches = [sharding.global_batch(b, batch_sharding) for b in host_batches]
      self.batch = self.batches[0]

  def in_mesh(self):
    from bert_jax import sharding  # pylint: disable=g-import-not-at-top
    return sharding.activation_rules(self.mesh, self.rules)


def run(config, num_steps: int, warmup: int) -> dict:
  """Times `num_steps` train steps after `warmup`; returns the JSON record."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.tools import gpu_clocks  # pylint: disable=g-import-not-at-top
  from bert_jax.train import metrics  # pylint: disable=g-import-not-at-top
  setup = Setup(config)
  mesh, state, step, batches = setup.mesh, setup.state, setup.step, setup.batches
  # The SM clock and power (GPUs) under the peak's matmuls and under the timed steps: a GPU at
  # its power cap may run the steps at a lower clock than the peak's short burst.
  with gpu_clocks.ClockSampler() as peak_clocks:
    peak = metrics.measure_peak_flops()
  with setup.in_mesh():
    # Where the warm-up goes: tracing and lowering (Python), XLA's compile (autotuning
    # included), then the first step (kernels that initialise on their first run).
    compile_start = time.perf_counter()
    lowered = step.lower(state, batches[0])
    lowered_at = time.perf_counter()
    step = lowered.compile()
    compiled_at = first_step_at = time.perf_counter()
    for i in range(warmup):
      state, stats = step(state, batches[i % len(batches)])
      if i == 0:
        jax.block_until_ready(stats)
        first_step_at = time.perf_counter()
    jax.block_until_ready(state)
    compile_seconds = time.perf_counter() - compile_start
    with gpu_clocks.ClockSampler() as clocks:
      start = time.perf_counter()
      for i in range(num_steps):
        state, stats = step(state, batches[i % len(batches)])
      jax.block_until_ready(stats)
      seconds = (time.perf_counter() - start) / num_steps
  b, s = config.train.batch_size, config.data.max_seq_length
  devices = jax.devices()
  seq_per_s = b / seconds
  model_flops_per_s = seq_per_s * metrics.model_flops_per_sequence(config) / len(devices)
  memory = [d.memory_stats() or {} for d in jax.local_devices()]
  return {
      'device': devices[0].device_kind, 'devices': len(devices), 'mesh': dict(mesh.shape),
      'preset': config.mesh.preset, 'dtype': config.model.dtype,
      'remat': config.model.remat_policy, 'adam_mu_dtype': config.train.adam_mu_dtype,
      'attention_impl': config.model.attention_impl, 'layers': config.model.num_layers,
      'hidden': config.model.hidden_size, 'batch': b, 'seq': s,
      'predictions': config.data.max_predictions_per_seq, 'step_ms': 1000 * seconds,
      'seq_per_s': seq_per_s, 'seq_per_s_per_device': seq_per_s / len(devices),
      'tokens_per_s': seq_per_s * s, 'real_tokens_per_s': setup.real_tokens / seconds,
      'prepared': config.data.prepared, 'packing': config.data.packing,
      'mfu': model_flops_per_s / peak, 'peak_flops_per_device': peak,
      **metrics.peak_fields(devices[0].device_kind, peak, model_flops_per_s),
      'warmup_seconds': compile_seconds,
      'lower_seconds': lowered_at - compile_start, 'compile_seconds': compiled_at - lowered_at,
      'first_step_seconds': first_step_at - compiled_at if warmup else None,
      'peak_memory_bytes': max((m.get('peak_bytes_in_use', 0) for m in memory), default=0),
      'clocks': clocks.summary(), 'peak_clocks': peak_clocks.summary(),
      'code': code_fingerprint(), 'jax': jax.__version__,
      'loss': float(jax.device_get(stats['loss'])),
  }


_MAX_DOUBLINGS = 16
# What an out-of-memory failure prints (XLA's allocator, at compile time or while running).
_OUT_OF_MEMORY = ('RESOURCE_EXHAUSTED', 'Out of memory', 'out of memory')


def sweep_batches(spec: str) -> list[int] | None:
  """--sweep's batch sizes: a list, or None for 'double' (the config's batch, 2x, 4x, ... until
  out of memory). A bad spec raises ValueError naming it and what is valid."""
  if spec == 'double':
    return None
  try:
    batches = [int(part) for part in spec.split(',')]
  except ValueError:
    batches = []
  if not batches or min(batches) < 1:
    raise ValueError(f"--sweep={spec!r}: give batch sizes >= 1 separated by commas (e.g. "
                     f"'32,64,128') or 'double'.")
  return batches


def flags_without_sweep(args: list[str]) -> list[str]:
  """The command line's flags less --sweep (as `--sweep=X` or `--sweep X`)."""
  kept, skip = [], False
  for arg in args:
    if skip:
      skip = False
    elif arg in ('--sweep', '-sweep'):
      skip = True
    elif not arg.startswith(('--sweep=', '-sweep=')):
      kept.append(arg)
  return kept


def run_child(args: list[str]) -> subprocess.CompletedProcess:
  """`python -m bert_jax.benchmark ARGS` in a fresh process."""
  return subprocess.run([sys.executable, '-m', 'bert_jax.benchmark', *args], capture_output=True,
                        text=True, check=False)


def child_record(proc: subprocess.CompletedProcess) -> dict:
  """A benchmark process's JSON record (its last line starting with '{', kept also when the
  process failed after printing it, e.g. at exit), or {'error': why} for one that printed none:
  the line that says why (our setup check's, XLA's out-of-memory one, a failed check, the last
  exception), prefixed 'out of memory: ' for that. benchmarks/harness.py reads ours and the peer's
  processes with it too."""
  records = [line for line in proc.stdout.splitlines() if line.startswith('{')]
  if records:
    return json.loads(records[-1])
  lines = proc.stderr.strip().splitlines()
  error = next((line for test in ('Invalid benchmark setup', 'RESOURCE_EXHAUSTED', 'Check failed',
                                  'Error')
                for line in reversed(lines) if test in line),
               lines[-1] if lines else f'exit status {proc.returncode}')
  if any(marker in proc.stderr for marker in _OUT_OF_MEMORY):
    error = f'out of memory: {error}'
  return {'error': error[:500]}


def sweep(args: list[str], spec: str, first_batch: int, child=run_child,
          batch_flag: str = '--config.train.batch_size') -> list[dict]:
  """Runs `child` (the benchmark) once per --sweep batch, with `args` then `batch_flag=B`,
  printing each record; returns them with the summary last. 'double' stops at the first batch
  that fails; a list runs every batch. benchmarks/peer.py sweeps the peer with it."""
  batches = sweep_batches(spec)
  doubling = batches is None
  if doubling:
    batches = [first_batch * 2**i for i in range(_MAX_DOUBLINGS + 1)]
  records = []
  for batch in batches:
    record = child_record(child([*args, f'{batch_flag}={batch}']))
    if 'error' in record:
      record = {'batch': batch, **record}
    print(json.dumps(record), flush=True)
    records.append(record)
    if doubling and 'error' in record:
      break
  fits = [r['batch'] for r in records if 'error' not in r]
  summary = {'sweep': spec, 'batches': [r['batch'] for r in records], 'fits': fits,
             'largest_batch_that_fits': max(fits, default=None),
             'out_of_memory': [r['batch'] for r in records
                               if r.get('error', '').startswith('out of memory')]}
  print(json.dumps(summary), flush=True)
  return [*records, summary]


def main(argv):
  del argv
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding  # pylint: disable=g-import-not-at-top
  if _SWEEP.value:
    try:
      sweep_batches(_SWEEP.value)
    except ValueError as e:
      sys.exit(f'Invalid benchmark setup: {e}')
    sweep(flags_without_sweep(sys.argv[1:]), _SWEEP.value, _CONFIG.value.train.batch_size)
    return
  try:
    record = run(_CONFIG.value, _STEPS.value, _WARMUP.value)
  except (config_lib.ConfigError, sharding.MeshError) as e:
    sys.exit(f'Invalid benchmark setup: {e}')
  print(json.dumps(record), flush=True)


def run_command():
  chips.quiet_absent_tpu()  # Before JAX starts.
  app.run(main, flags_parser=cli.flags_parser(__name__))


if __name__ == '__main__':
  run_command()

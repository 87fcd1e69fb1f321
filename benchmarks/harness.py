"""The timing harness every tool in benchmarks/ runs on.

- Commands: `ours(...)` is `python -m bert_jax.benchmark` for a shape and a named variant of the
  config; `peer(...)` is benchmarks/peer.py, HF transformers' BertForPreTraining (PyTorch, eager or
  torch.compile) on the same shape.
- Processes: `run_process` runs one measurement in its own process, in a given code tree, with
  XLA_FLAGS and a timeout, and returns its JSON record; `best_of` keeps the fastest of repeats.
- Steps: `time_steps` runs the warm-up, then the timed steps with the GPU's SM clock and power
  sampled under them (bert_jax.tools.gpu_clocks), for ours and the peer alike.
- A/B: `with_autotune_cache` lets the processes of an A/B share XLA's gemm autotuning, so that
  the A/B measures the change, not which cuBLAS kernels each process's autotuning picked.

No jax and no torch are imported here: the peer's process imports torch only, and a tool that
only launches processes imports neither.
"""

import math
import os
import subprocess
import sys
import time
from typing import Any, Callable, NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # The tools run as scripts (`python benchmarks/compare.py`).
  sys.path.insert(0, REPO)

# pylint: disable-next=g-import-not-at-top,wrong-import-position
from bert_jax.tools import gpu_clocks  # NVML through ctypes: no jax, no torch.

# A shape's MODEL: BERT's sizes and the family's (docs/family.md), each at its recipe but for
# the shape's seq, predictions and batch (one step: no gradient accumulation).
CONFIGS = {'base': 'configs/base.py', 'large': 'configs/large.py',
           **{f'roberta-{size}': f'configs/roberta.py:size={size}' for size in ('base', 'large')},
           **{f'albert-{size}': f'configs/albert.py:size={size}'
              for size in ('base', 'large', 'xlarge')},
           # A BERT-base teacher and its 6-layer student; the teacher's forward is in the step.
           'distilbert': 'configs/distilbert.py',
           **{f'electra-{size}': f'configs/electra.py:size={size}'
              for size in ('small', 'base', 'large')},
           **{f'spanbert-{size}': f'configs/spanbert.py:size={size}' for size in ('base', 'large')},
           # DeBERTa-v3's encoder by MLM and by its RTD (the generator in the step).
           **{f'deberta-{size}': f'configs/deberta.py:size={size}' for size in ('base', 'large')},
           **{f'deberta-rtd-{size}': f'configs/deberta.py:size={size},objective=rtd'
              for size in ('base', 'large')},
           **{f'modernbert-{size}': f'configs/modernbert.py:size={size}'
              for size in ('base', 'large')},
           **{f'xlmr-{size}': f'configs/xlm.py:size={size}' for size in ('base', 'large')}}
# The models benchmarks/peer.py has (HF BertForPreTraining).
PEER_MODELS = ('base', 'large')
PEER_MODES = ('eager', 'compile')
AUTOTUNE_CACHE_FLAG = '--xla_gpu_per_fusion_autotune_cache_dir'

# configs/large_gpu.py's settings as flags over configs/{base,large}.py (bf16 is set for every
# variant), so that Base runs them too; tests/test_config.py checks that they match the config.
LARGE_GPU = ['--config.model.scan_layers=False', '--config.model.gelu=tanh',
             '--config.model.attention_impl=pallas', '--config.model.layer_norm_impl=pallas',
             '--config.model.flat_matmuls=True', '--config.model.ffn_impl=pallas',
             '--config.model.long_attention_backward=mosaic',
             '--config.model.short_attention_backward=mosaic',
             '--config.train.xla_options=xla_gpu_enable_triton_gemm=false']
VARIANTS = {
    'paper': [],  # configs/{base,large}.py as they are: XLA attention, threefry dropout masks.
    'large_gpu': LARGE_GPU,
    # cuDNN's attention with the paper's attention dropout in the kernel, layers unrolled.
    'cudnn': ['--config.model.scan_layers=False', '--config.model.gelu=tanh',
              '--config.model.attention_impl=cudnn'],
}


def predictions(seq: int, rate: float = 0.15) -> int:
  """Masked positions per row: the paper's 20 at 128 tokens, 80 at 512, or every position a
  higher masking rate picks (ModernBERT's 30%: 39 at 128)."""
  return max(80 if seq >= 512 else 20, math.ceil(rate * seq))


def model_config(model: str):
  """The config of a shape's MODEL: its recipe as CONFIGS names it."""
  from bert_jax.core import cli  # pylint: disable=g-import-not-at-top
  path, _, arg = CONFIGS[model].partition(':')
  return cli.load_config_file(path, arg or None)


def variant_flags(variant: str) -> list[str]:
  """'NAME+FLAG+FLAG' -> VARIANTS[NAME] followed by the FLAGs (a config flag, or `env:FLAG` for
  an XLA flag of that process); a ValueError names an unknown NAME."""
  name, *extra = variant.split('+')
  if name not in VARIANTS:
    raise ValueError(f'unknown variant {name!r}; known: {", ".join(VARIANTS)}')
  return [*VARIANTS[name], *extra]


def parse_shape(shape: str) -> tuple[str, int, int]:
  """'MODEL:SEQ:BATCH' -> (model, seq, batch); a ValueError names a bad entry."""
  parts = shape.split(':')
  if len(parts) != 3 or parts[0] not in CONFIGS or not all(p.isdigit() for p in parts[1:]):
    raise ValueError(f'--shapes entry {shape!r}: use MODEL:SEQ:BATCH with MODEL one of '
                     f'{", ".join(CONFIGS)}.')
  return parts[0], int(parts[1]), int(parts[2])


def ours(model: str, seq: int, batch: int, variant: str, steps: int) -> list[str]:
  """The command of `python -m bert_jax.benchmark` for a shape and variant, bf16 compute."""
  return [sys.executable, '-m', 'bert_jax.benchmark', f'--config={CONFIGS[model]}',
          f'--steps={steps}', '--config.model.dtype=bfloat16',
          f'--config.data.max_seq_length={seq}',
          f'--config.data.max_predictions_per_seq={predictions(seq, model_config(model).masking.rate)}',
          f'--config.train.batch_size={batch}', '--config.train.grad_accum_steps=1',
          *variant_flags(variant)]


def peer(model: str, seq: int, batch: int, mode: str, steps: int,
         attention_dropout: float = 0.1) -> list[str]:
  """The command of benchmarks/peer.py for a shape, eager or torch.compile."""
  if model not in PEER_MODELS:
    raise ValueError(f'peer model {model!r}: benchmarks/peer.py has {", ".join(PEER_MODELS)}.')
  if mode not in PEER_MODES:
    raise ValueError(f'peer mode {mode!r}: use one of {", ".join(PEER_MODES)}.')
  command = [sys.executable, os.path.join(REPO, 'benchmarks', 'peer.py'), f'--model={model}',
             f'--seq={seq}', f'--batch={batch}', f'--steps={steps}',
             f'--attention_dropout={attention_dropout}']
  return command + (['--compile'] if mode == 'compile' else [])


def split_env(command: list[str], base_flags: str | None = None) -> tuple[list[str], str]:
  """'env:FLAG' entries of a command -> (command without them, XLA_FLAGS with them after
  base_flags, by default this process's XLA_FLAGS)."""
  flags = [c[len('env:'):] for c in command if c.startswith('env:')]
  base = os.environ.get('XLA_FLAGS', '') if base_flags is None else base_flags
  xla_flags = ' '.join([base, *flags]).strip()
  return [c for c in command if not c.startswith('env:')], xla_flags


def with_autotune_cache(xla_flags: str, cache_dir: str) -> str:
  """XLA_FLAGS with a shared autotuning cache directory, unless they name one already."""
  if not cache_dir or AUTOTUNE_CACHE_FLAG in xla_flags:
    return xla_flags
  return f'{xla_flags} {AUTOTUNE_CACHE_FLAG}={cache_dir}'.strip()


def run_process(command: list[str], cwd: str = REPO, base_flags: str | None = None,
                timeout: float | None = None, env: dict[str, str] | None = None) -> dict:
  """The record of one measurement process run in `cwd` (its package is the one imported:
  `python -m` puts the working directory first on the path), with XLA_FLAGS as split_env says
  and `env` (e.g. CUDA_VISIBLE_DEVICES) over this process's environment; {'error': ...} for one
  that printed none or ran past `timeout` seconds."""
  from bert_jax.tools import benchmark  # pylint: disable=g-import-not-at-top
  command, xla_flags = split_env(command, base_flags)
  env = dict(os.environ, **(env or {}), XLA_FLAGS=xla_flags)
  try:
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False,
                          env=env, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {'error': f'timed out after {timeout:g} s'}
  record = benchmark.child_record(proc)
  if xla_flags:
    record['xla_flags'] = xla_flags
  return record


def best_of(run: Callable[[], dict], repeats: int) -> dict:
  """The fastest of `repeats` records of run() (the first error if none ran), with `repeats`
  and, past one, `seq_per_s_all`: every run's seq/s in order. XLA autotunes its gemms in each
  process on a GPU whose clock follows its power cap, so one process can come out a few percent
  slower than the next."""
  records = [run() for _ in range(repeats)]
  timed = [r for r in records if 'seq_per_s' in r]
  if not timed:
    return records[0]
  best = dict(max(timed, key=lambda r: r['seq_per_s']), repeats=repeats)
  if repeats > 1:
    best['seq_per_s_all'] = [r.get('seq_per_s') for r in records]
  return best


class Timing(NamedTuple):
  """What time_steps measured."""
  seconds_per_step: float
  warmup_seconds: float  # The warm-up steps, compilation included.
  clocks: dict | None  # SM clock and power under the timed steps; None without NVML.
  last: Any  # The last step's output.


def time_steps(step: Callable[[], Any], sync: Callable[[Any], Any], warmup: int, steps: int,
               read: gpu_clocks.Reader | None = None) -> Timing:
  """Calls step() `warmup` times, waits for the device (sync(output)), then times `steps` calls
  queued back to back, waiting once at the end, with the GPU's clocks sampled under them.
  `read` replaces NVML's reader (tests)."""
  if steps < 1 or warmup < 0:
    raise ValueError(f'time_steps: steps={steps} must be >= 1 and warmup={warmup} >= 0.')
  out = None
  start = time.perf_counter()
  for _ in range(warmup):
    out = step()
  sync(out)
  warmup_seconds = time.perf_counter() - start
  with gpu_clocks.ClockSampler(read) as clocks:
    start = time.perf_counter()
    for _ in range(steps):
      out = step()
    sync(out)
    seconds = (time.perf_counter() - start) / steps
  return Timing(seconds, warmup_seconds, clocks.summary(), out)

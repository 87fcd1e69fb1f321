"""Ours against HF PyTorch on one GPU, back to back: `python experiments/bench_compare.py
  --shapes=large:128:128,large:512:32,base:128:256 [--variants=paper,rbg,cudnn] [--peer=eager,compile]
  [--out=results.jsonl]`

Each measurement is its own process (`python -m bert_jax.benchmark` or
experiments/bench_peer.py), one after another on the same GPU, and appends one JSON line to
--out; the table at the end gives seq/s, MFU and peak memory, and ours over the peer's
torch.compile. Variants of ours (all bf16 compute, fp32 master weights, AdamW, NSP):
  paper   dropout 0.1 on hidden states and attention probabilities, threefry masks
  rbg     the same dropout, masks drawn with XLA's RngBitGenerator
  cudnn   cuDNN fused attention, attention-probability dropout 0 (hidden dropout 0.1), rbg
  paper_unrolled, cudnn_unrolled   paper / cuDNN (threefry) with the scan fully unrolled
  cudnn_dropout_tanh   cuDNN attention with the paper's attention dropout in the kernel,
                       scan_layers=False, tanh GELU (paper-faithful dropout)
  large_gpu            configs/large_gpu.py: cudnn_dropout_tanh with our attention kernels for
                       rows up to 512 tokens (attention_impl=pallas), the fused LayerNorm kernels,
                       2-d matmuls (flat_matmuls), the Mosaic GPU feed-forward kernels
                       (ffn_impl=pallas, Hopper), every matmul on cuBLAS (train.xla_options)
  cudnn_dropout_tanh_cublas   cudnn_dropout_tanh with XLA's Triton GEMMs off (an `env:` entry of a
                       variant adds an XLA flag to that process's XLA_FLAGS)
A variant may add flags after `+`: `cudnn_dropout_tanh+env:--xla_gpu_enable_cudnn_layer_norm=true`
or `cudnn_dropout_tanh+--config.model.dropout_rng_impl=rbg` (several: `+A+B`).

`--repeats=N` runs each measurement in N processes, one after another, and the table keeps the
fastest, with the spread: XLA autotunes its gemms in each process by timing them on a GPU whose
clock moves with its power cap, and a process can come out a few percent slower than the next
(78.7 against 73.0 ms at BERT-Large 32 x 512 on an H200; experiments/perf_notes.md).
"""

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# pylint: disable-next=g-import-not-at-top,wrong-import-position
from bert_jax.tools import benchmark  # Reads each process's record (benchmark.child_record).
CONFIGS = {'base': 'configs/base.py', 'large': 'configs/large.py'}
LAYERS = {'base': 12, 'large': 24}
UNROLL = '--config.model.scan_unroll={layers}'
CUDNN = ['--config.model.attention_impl=cudnn', '--config.model.attention_dropout_rate=0.0']
# configs/large_gpu.py's settings over configs/{base,large}.py (bf16 is set for every variant):
# GPU before the fused LayerNorm kernels, LARGE_GPU now.
GPU = ['--config.model.scan_layers=False', '--config.model.gelu=tanh',
       '--config.model.attention_impl=cudnn']
LARGE_GPU = [*GPU[:2], '--config.model.attention_impl=pallas',
             '--config.model.layer_norm_impl=pallas', '--config.model.flat_matmuls=True',
             '--config.model.ffn_impl=pallas', '--config.model.long_attention_backward=mosaic',
             '--config.model.short_attention_backward=mosaic',
             '--config.train.xla_options=xla_gpu_enable_triton_gemm=false']
VARIANTS = {
    'paper': [],
    'rbg': ['--config.model.dropout_rng_impl=rbg'],
    'cudnn': ['--config.model.dropout_rng_impl=rbg', *CUDNN],
    'paper_unrolled': [UNROLL],
    'cudnn_unrolled': [UNROLL, *CUDNN],
    'paper_unrolled_tanh': [UNROLL, '--config.model.gelu=tanh'],
    'cudnn_unrolled_tanh': [UNROLL, '--config.model.gelu=tanh', *CUDNN],
    # cuDNN attention WITH the paper's attention dropout (in-kernel), layers unrolled: the
    # settings of configs/large_gpu.py; then that with one change each.
    'cudnn_dropout_tanh': GPU,
    'large_gpu': LARGE_GPU,
    'cudnn_dropout_tanh_mubf16': [*GPU, '--config.train.adam_mu_dtype=bfloat16'],
    'cudnn_dropout_tanh_cublaslt': [*GPU, 'env:--xla_gpu_enable_cublaslt=true'],
    'cudnn_dropout_tanh_cublas': [*GPU, 'env:--xla_gpu_enable_triton_gemm=false'],
    'cudnn_noscan_tanh': [*GPU, '--config.model.attention_dropout_rate=0.0'],
    'paper_noscan_tanh': ['--config.model.scan_layers=False', '--config.model.gelu=tanh'],
}


def predictions(seq):
  return 80 if seq >= 512 else 20


def variant_flags(variant):
  """'NAME+FLAG+FLAG' -> VARIANTS[NAME] followed by the FLAGs."""
  name, *extra = variant.split('+')
  if name not in VARIANTS:
    raise SystemExit(f'unknown variant {name!r}; known: {", ".join(VARIANTS)}')
  return [*VARIANTS[name], *extra]


def ours(model, seq, batch, variant, steps):
  return [sys.executable, '-m', 'bert_jax.benchmark', f'--config={CONFIGS[model]}',
          f'--steps={steps}', '--config.model.dtype=bfloat16',
          f'--config.data.max_seq_length={seq}',
          f'--config.data.max_predictions_per_seq={predictions(seq)}',
          f'--config.train.batch_size={batch}',
          *(flag.format(layers=LAYERS[model]) for flag in variant_flags(variant))]


def peer(model, seq, batch, mode, steps, attention_dropout):
  command = [sys.executable, os.path.join(REPO, 'experiments', 'bench_peer.py'),
             f'--model={model}', f'--seq={seq}', f'--batch={batch}', f'--steps={steps}',
             f'--attention_dropout={attention_dropout}']
  return command + (['--compile'] if mode == 'compile' else [])


def split_env(command, base_flags=None):
  """'env:FLAG' entries of a command -> (command without them, XLA_FLAGS with them after
  base_flags, by default this process's XLA_FLAGS)."""
  flags = [c[len('env:'):] for c in command if c.startswith('env:')]
  base = os.environ.get('XLA_FLAGS', '') if base_flags is None else base_flags
  xla_flags = ' '.join([base, *flags]).strip()
  return [c for c in command if not c.startswith('env:')], xla_flags


def run_process(command, cwd=REPO, base_flags=None, timeout=None) -> dict:
  """The record of one measurement process run in `cwd` (its package is the one imported:
  `python -m` puts the working directory first on the path), with XLA_FLAGS as split_env says;
  {'error': ...} for one that printed none or ran past `timeout` seconds."""
  command, xla_flags = split_env(command, base_flags)
  env = dict(os.environ, XLA_FLAGS=xla_flags)
  try:
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False,
                          env=env, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {'error': f'timed out after {timeout:g} s'}
  record = benchmark.child_record(proc)
  if xla_flags:
    record['xla_flags'] = xla_flags
  return record


def measure(command, label, out):
  print(f'== {label}', flush=True)
  record = run_process(command)
  record['label'] = label
  with open(out, 'a', encoding='utf-8') as f:
    f.write(json.dumps(record) + '\n')
  print(json.dumps(record), flush=True)
  return record


def best_of(run, repeats: int) -> dict:
  """The fastest of `repeats` records of run() (the first error if none ran), with `repeats`
  and, past one, `seq_per_s_all`: every run's seq/s in order."""
  records = [run() for _ in range(repeats)]
  timed = [r for r in records if 'seq_per_s' in r]
  if not timed:
    return records[0]
  best = dict(max(timed, key=lambda r: r['seq_per_s']), repeats=repeats)
  if repeats > 1:
    best['seq_per_s_all'] = [r.get('seq_per_s') for r in records]
  return best


def seq_per_s_cell(record) -> str:
  """seq/s, and its spread over the repeats when there were several."""
  runs = [x for x in record.get('seq_per_s_all') or () if x is not None]
  spread = f' ({min(runs):.0f}-{max(runs):.0f} in {len(runs)})' if len(runs) > 1 else ''
  return f'{record["seq_per_s"]:.0f}{spread}'


def percent(x) -> str:
  return '' if x is None else f'{100 * x:.1f}%'


def mfu_cell(record) -> str:
  """The MFU against the measured peak, unless that peak is above the datasheet's."""
  if record.get('peak_above_datasheet'):
    return (f'not a real figure: peak measured {record["peak_flops_per_device"] / 1e12:.0f} '
            'TFLOP/s, above the datasheet\'s')
  return percent(record['mfu'])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--shapes', default='large:128:128,large:512:32,base:128:256')
  parser.add_argument('--variants', default='paper,paper_unrolled,cudnn_unrolled')
  parser.add_argument('--peer', default='eager,compile')
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('--out', default='bench_compare.jsonl')
  parser.add_argument('--repeats', type=int, default=1,
                      help='Processes per measurement; the table keeps the fastest.')
  args = parser.parse_args()
  if args.repeats < 1:
    parser.error(f'--repeats={args.repeats}: must be at least 1.')
  rows = []
  for shape in args.shapes.split(','):
    model, seq, batch = shape.split(':')
    seq, batch = int(seq), int(batch)
    results = {}
    for mode in filter(None, args.peer.split(',')):
      command = peer(model, seq, batch, mode, args.steps, 0.1)
      results[f'peer-{mode}'] = best_of(
          lambda c=command, m=mode: measure(c, f'{shape} peer {m}', args.out), args.repeats)
    for variant in filter(None, args.variants.split(',')):
      command = ours(model, seq, batch, variant, args.steps)
      results[variant] = best_of(
          lambda c=command, v=variant: measure(c, f'{shape} ours {v}', args.out), args.repeats)
    rows.append((shape, results))
  print('\n| shape | run | seq/s | MFU | MFU vs datasheet | peak GiB | vs peer compile | '
        'SM MHz (peak\'s) | W |\n|---|---|---|---|---|---|---|---|---|')
  for shape, results in rows:
    base = results.get('peer-compile', {}).get('seq_per_s')
    for name, r in results.items():
      if 'seq_per_s' not in r:
        print(f'| {shape} | {name} | error: {r.get("error")} | | | | | | |')
        continue
      ratio = f'{r["seq_per_s"] / base:.2f}x' if base else ''
      clocks, peak_clocks = r.get('clocks') or {}, r.get('peak_clocks') or {}
      print(f'| {shape} | {name} | {seq_per_s_cell(r)} | {mfu_cell(r)} | '
            f'{percent(r.get("mfu_vs_datasheet"))} | '
            f'{r["peak_memory_bytes"] / 2**30:.1f} | {ratio} | '
            f'{clocks.get("sm_mhz_median", "")} ({peak_clocks.get("sm_mhz_median", "")}) | '
            f'{clocks.get("power_w_median", "")} |')
  print(f'device: {next((r.get("device") for _, rs in rows for r in rs.values() if "device" in r), "?")}')


if __name__ == '__main__':
  main()

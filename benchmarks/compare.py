"""Ours against HF PyTorch on one GPU, back to back: `python benchmarks/compare.py
  --shapes=large:128:128,base:128:256 [--variants=large_gpu,paper] [--peer=eager,compile]
  [--repeats=N] [--out=compare.jsonl]`

Each measurement is its own process (`python -m bert_jax.benchmark` for ours, benchmarks/peer.py
for the peer; benchmarks/harness.py builds and runs both), one after another on the same GPU, and
appends one JSON line to --out. The table at the end gives, per shape and run, seq/s, the MFU
against the peak measured in the same process (none when that peak is above the datasheet's) and
against the datasheet's, peak memory, ours over the peer's torch.compile, the median SM clock
under the timed steps (and under the peak) and the power.

Variants of ours (harness.VARIANTS; all bf16 compute, fp32 master weights, AdamW, NSP):
  paper       configs/{base,large}.py as they are (XLA attention, the paper's dropout)
  large_gpu   configs/large_gpu.py's settings: our attention, LayerNorm and feed-forward kernels
  cudnn       cuDNN's attention with the paper's attention dropout in the kernel, layers unrolled
A variant may add flags after `+`: `large_gpu+--config.model.ffn_impl=xla` (a config flag) or
`large_gpu+env:--xla_gpu_enable_cudnn_layer_norm=true` (an XLA flag of that process); several:
`+A+B`.

`--repeats=N` runs each measurement in N processes and keeps the fastest, with the spread of the
repeats (harness.best_of).

The family at one shape (docs/family.md), no peer: MODEL is base or large (BERT),
roberta-base|large, albert-base|large|xlarge, spanbert-base|large, electra-small|base|large or
distilbert, each its recipe's model, objectives and optimizer:
  python benchmarks/compare.py --shapes=base:128:256,roberta-base:128:256,albert-base:128:256 \
      --peer= --variants=large_gpu --repeats=2 --out=family.jsonl
The peer (HF BertForPreTraining) runs for BERT's shapes only.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable-next=g-import-not-at-top,wrong-import-position
from benchmarks import harness


def measure(command: list[str], label: str, out: str) -> dict:
  """One process's record, labelled, appended to `out` and printed."""
  print(f'== {label}', flush=True)
  record = dict(harness.run_process(command), label=label)
  with open(out, 'a', encoding='utf-8') as f:
    f.write(json.dumps(record) + '\n')
  print(json.dumps(record), flush=True)
  return record


def seq_per_s_cell(record: dict) -> str:
  """seq/s, and its spread over the repeats when there were several."""
  runs = [x for x in record.get('seq_per_s_all') or () if x is not None]
  spread = f' ({min(runs):.0f}-{max(runs):.0f} in {len(runs)})' if len(runs) > 1 else ''
  return f'{record["seq_per_s"]:.0f}{spread}'


def percent(x) -> str:
  return '' if x is None else f'{100 * x:.1f}%'


def mfu_cell(record: dict) -> str:
  """The MFU against the measured peak, unless that peak is above the datasheet's."""
  if record.get('peak_above_datasheet'):
    return (f'not a real figure: peak measured {record["peak_flops_per_device"] / 1e12:.0f} '
            'TFLOP/s, above the datasheet\'s')
  return percent(record['mfu'])


def table(rows: list[tuple[str, dict]]) -> str:
  """Markdown: one line per (shape, run), ours over the peer's torch.compile of that shape."""
  lines = ['| shape | run | seq/s | MFU | MFU vs datasheet | peak GiB | vs peer compile | '
           'SM MHz (peak\'s) | W |', '|---|---|---|---|---|---|---|---|---|']
  for shape, results in rows:
    base = results.get('peer-compile', {}).get('seq_per_s')
    for name, r in results.items():
      if 'seq_per_s' not in r:
        lines.append(f'| {shape} | {name} | error: {r.get("error")} | | | | | | |')
        continue
      ratio = f'{r["seq_per_s"] / base:.2f}x' if base else ''
      clocks, peak_clocks = r.get('clocks') or {}, r.get('peak_clocks') or {}
      lines.append(
          f'| {shape} | {name} | {seq_per_s_cell(r)} | {mfu_cell(r)} | '
          f'{percent(r.get("mfu_vs_datasheet"))} | {r["peak_memory_bytes"] / 2**30:.1f} | '
          f'{ratio} | {clocks.get("sm_mhz_median", "")} '
          f'({peak_clocks.get("sm_mhz_median", "")}) | {clocks.get("power_w_median", "")} |')
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--shapes', default='large:128:128,large:512:32,base:128:256')
  parser.add_argument('--variants', default='large_gpu')
  parser.add_argument('--peer', default='eager,compile')
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('--out', default='compare.jsonl')
  parser.add_argument('--repeats', type=int, default=1,
                      help='Processes per measurement; the table keeps the fastest.')
  args = parser.parse_args(argv)
  if args.repeats < 1:
    parser.error(f'--repeats={args.repeats}: must be at least 1.')
  modes = [m for m in args.peer.split(',') if m]
  variants = [v for v in args.variants.split(',') if v]
  try:
    shapes = [(shape, *harness.parse_shape(shape)) for shape in args.shapes.split(',')]
    for mode in modes:
      harness.peer('base', 128, 1, mode, 1)
    for variant in variants:
      harness.variant_flags(variant)
  except ValueError as e:
    parser.error(str(e))
  rows = []
  for shape, model, seq, batch in shapes:
    results = {}
    for mode in modes if model in harness.PEER_MODELS else ():  # The peer is BERT only.
      command = harness.peer(model, seq, batch, mode, args.steps)
      results[f'peer-{mode}'] = harness.best_of(
          lambda c=command, m=mode: measure(c, f'{shape} peer {m}', args.out), args.repeats)
    for variant in variants:
      command = harness.ours(model, seq, batch, variant, args.steps)
      results[variant] = harness.best_of(
          lambda c=command, v=variant: measure(c, f'{shape} ours {v}', args.out), args.repeats)
    rows.append((shape, results))
  print('\n' + table(rows))
  devices = (r.get('device') for _, results in rows for r in results.values() if 'device' in r)
  print(f'device: {next(devices, "?")}')


if __name__ == '__main__':
  main()

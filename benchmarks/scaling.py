"""Scaling over the GPUs of one host, in one call: `python benchmarks/scaling.py
  [--gpus=1,2,4,8] [--presets=data,fsdp,fsdp_tensor]
  [--shapes=large:128:256,large:512:32,roberta-base:128:256] [--variant=large_gpu]
  [--out=scaling.jsonl]`

Each shape's BATCH is per GPU: n GPUs train a global batch of n x BATCH, so perfect scaling keeps
seq/s per GPU. Each run is its own process (`python -m bert_jax.benchmark`, harness.ours) with
`CUDA_VISIBLE_DEVICES` the first n GPUs, one after another. One GPU runs the data preset only (on
one device the presets lay out the same step); n > 1 GPUs run each preset on the mesh it names:

  data         data = n                 parameters and optimizer state replicated
  fsdp         fsdp = n                 parameters and optimizer state sharded (ZeRO-3)
  fsdp_tensor  fsdp = n / 2, tensor = 2 plus heads, MLP and vocabulary split over 2 GPUs, with
               the XLA feed-forward (the fused feed-forward kernel needs whole MLP rows); a
               vocabulary the tensor axis cannot split (RoBERTa's 50,265) is padded to the next
               multiple of 128 for these runs (vocab_flags)

GPU counts above what the host has are skipped and named. Every process shares one XLA autotuning
cache (harness.with_autotune_cache: the per-GPU gemms are the same at every count). Each run
appends one JSON line to --out (its record, with gpus, preset and shape); the table at the end
gives per shape and run the global batch, seq/s, seq/s per GPU, scaling against one GPU (seq/s
per GPU over one GPU's), MFU, step time and peak memory.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable-next=g-import-not-at-top,wrong-import-position
from benchmarks import harness

PRESETS = ('data', 'fsdp', 'fsdp_tensor')
TENSOR = {'data': 1, 'fsdp': 1, 'fsdp_tensor': 2}  # The tensor axis of each preset's mesh.


def mesh_flags(preset: str, gpus: int) -> list[str]:
  """config.mesh flags of `preset` over `gpus` devices; a ValueError for a preset that cannot
  split them (fsdp_tensor needs an even count)."""
  if preset not in PRESETS:
    raise ValueError(f'--presets entry {preset!r}: use one of {", ".join(PRESETS)}.')
  tensor = TENSOR[preset]
  data, fsdp = (gpus, 1) if preset == 'data' else (1, gpus // tensor)
  if data * fsdp * tensor != gpus:
    raise ValueError(f'preset {preset} needs an even GPU count, not {gpus}.')
  # ffn_impl='pallas' refuses a mesh that splits the MLP rows; the rest of the kernels split.
  ffn = ['--config.model.ffn_impl=xla'] if tensor > 1 else []
  return [f'--config.mesh.preset={preset}', f'--config.mesh.data={data}',
          f'--config.mesh.fsdp={fsdp}', f'--config.mesh.tensor={tensor}', *ffn]


def vocab_flags(model: str, preset: str, variant: str) -> list[str]:
  """--config.model.vocab_size padded to the next multiple of 128 where `preset` splits the
  vocabulary over a tensor axis that does not divide the model's own (the extra rows are never a
  label: the step's cost grows by their share of the output layer); nothing where it divides, or
  where the variant sets the vocabulary itself."""
  tensor = TENSOR[preset]
  if tensor == 1 or any(f.startswith('--config.model.vocab_size=')
                        for f in harness.variant_flags(variant)):
    return []
  vocab = harness.model_config(model).model.vocab_size
  return [] if vocab % tensor == 0 else [f'--config.model.vocab_size={-(-vocab // 128) * 128}']


def runs(gpu_counts: list[int], presets: list[str]) -> list[tuple[int, str]]:
  """(GPUs, preset) in the order run: one GPU's data preset first (the baseline), then each
  larger count with every preset."""
  return [(n, p) for n in sorted(gpu_counts) for p in (['data'] if n == 1 else presets)]


def available_gpus() -> int:
  """How many GPUs this host has (nvidia-smi -L; 0 without it)."""
  try:
    out = subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True, check=False,
                         timeout=60).stdout
  except (OSError, subprocess.TimeoutExpired):
    return 0
  return sum(line.startswith('GPU ') for line in out.splitlines())


def table(records: list[dict]) -> str:
  """Markdown: one line per run; scaling is seq/s per GPU over the shape's one-GPU run's."""
  lines = ['| shape (per GPU) | GPUs | preset | global batch | seq/s | seq/s per GPU | '
           'scaling vs 1 GPU | MFU | step ms | peak GiB |', '|---|---|---|---|---|---|---|---|---|---|']
  one = {r['shape']: r['seq_per_s'] for r in records if r['gpus'] == 1 and 'seq_per_s' in r}
  for r in records:
    head = f'| {r["shape"]} | {r["gpus"]} | {r["preset"]} |'
    if 'seq_per_s' not in r:
      lines.append(f'{head} | error: {r.get("error", "?")[:200]} | | | | | | |')
      continue
    per_gpu = r['seq_per_s'] / r['gpus']
    scaling = f'{100 * per_gpu / one[r["shape"]]:.1f}%' if r['shape'] in one else ''
    lines.append(f'{head} {r["batch"]} | {r["seq_per_s"]:.0f} | {per_gpu:.0f} | {scaling} | '
                 f'{100 * r["mfu"]:.1f}% | {r["step_ms"]:.1f} | '
                 f'{r["peak_memory_bytes"] / 2**30:.1f} |')
  return '\n'.join(lines)


def main(argv=None, run=harness.run_process, gpus_here=available_gpus):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--gpus', default='1,2,4,8', help='GPU counts; those above the host\'s '
                      'are skipped.')
  parser.add_argument('--presets', default=','.join(PRESETS))
  # 256 sequences of 128 per GPU: the paper's whole batch on each GPU (29.6 GiB on an H200 at
  # Large); the gradient all-reduce is once a step, so the per-GPU batch sets its share.
  parser.add_argument('--shapes', default='large:128:256,large:512:32,roberta-base:128:256',
                      help='MODEL:SEQ:BATCH, BATCH per GPU.')
  parser.add_argument('--variant', default='large_gpu', help='harness.VARIANTS, +flags.')
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('--timeout', type=float, default=400, help='Seconds per process.')
  parser.add_argument('--autotune_cache', default=os.path.join(tempfile.gettempdir(),
                                                               'scaling_autotune'))
  parser.add_argument('--out', default='scaling.jsonl')
  args = parser.parse_args(argv)
  try:
    counts = [int(n) for n in args.gpus.split(',') if n]
    if not counts or min(counts) < 1 or 1 not in counts:
      raise ValueError(f'--gpus={args.gpus!r}: positive counts, 1 among them (the baseline).')
    presets = [p for p in args.presets.split(',') if p]
    for preset in presets:
      mesh_flags(preset, 2)
    shapes = [(shape, *harness.parse_shape(shape)) for shape in args.shapes.split(',')]
    harness.variant_flags(args.variant)
  except ValueError as e:
    parser.error(str(e))
  here = gpus_here()
  skipped = [n for n in counts if n > here]
  plan = runs([n for n in counts if n <= here], presets)
  if skipped:
    print(f'skipped: {", ".join(map(str, skipped))} GPUs (this host has {here})', flush=True)
  xla_flags = harness.with_autotune_cache(os.environ.get('XLA_FLAGS', ''), args.autotune_cache)
  records = []
  for shape, model, seq, batch in shapes:
    for gpus, preset in plan:
      command = harness.ours(model, seq, gpus * batch, args.variant, args.steps)
      env = {'CUDA_VISIBLE_DEVICES': ','.join(map(str, range(gpus)))}
      record = dict(run(command + mesh_flags(preset, gpus)
                        + vocab_flags(model, preset, args.variant), harness.REPO, xla_flags,
                        args.timeout, env), gpus=gpus, preset=preset, shape=shape,
                    variant=args.variant)
      records.append(record)
      with open(args.out, 'a', encoding='utf-8') as f:
        f.write(json.dumps(record) + '\n')
      print(f'{shape} {gpus} GPU {preset}: ' + (
          f'{record["seq_per_s"]:.0f} seq/s, MFU {100 * record["mfu"]:.1f}%'
          if 'seq_per_s' in record else record.get('error', '?')), flush=True)
  print('\n' + table(records))
  device = next((r['device'] for r in records if 'device' in r), '?')
  print(f'device: {device} x {max((n for n, _ in plan), default=0)}'
        + (f'; not lent here: {", ".join(map(str, skipped))} GPUs' if skipped else ''))
  return records


if __name__ == '__main__':
  main()

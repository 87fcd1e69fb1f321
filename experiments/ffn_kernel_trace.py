"""Where `fused_ffn`'s kernels spend their time, from Mosaic GPU's on-device trace (Hopper GPUs).

`python experiments/ffn_kernel_trace.py [--kernel=forward,backward] [--tokens=32768 --embed=768
--mlp=3072] [--tiles=128-128-4-4-8] [--out=results.jsonl]`

For each kernel: its time per call untraced (the median of 3 runs of --calls queued calls), then one
traced call (`trace_dir`: each compute warpgroup's prologue and epilogue of every tile by the SM's
clock; its matmul is the time between a tile's prologue and its epilogue), summarised by
`summarize` into one JSON line:
- per tile, the median cycles of each region;
- `tensor_core_busy`: per block, the share of its span in which either compute warpgroup was in
  a matmul (the two take turns on the tensor cores), the median over blocks. A matmul span
  includes its waits for operands, i.e. for the other warpgroup's matmul, so this is the share
  with a matmul pending, not a measure of the tensor cores' rate: 1.0 means the epilogues are
  hidden, and below 1.0 the tensor cores had nothing queued;
- `epilogue_over_matmul`: the median epilogue over the median matmul. Above 1, a warpgroup's
  epilogue outlasts the other's matmul, so the tensor cores wait for it.

The trace needs 48 bytes of shared memory per range and block, which the default tiling leaves
(--tiles' untraced time is printed beside the default tiling's). The matmul region includes the
waits for operands (a warpgroup's first stage), so a matmul longer than its FLOPs need points at
memory.
"""

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REGIONS = ('prologue', 'matmul', 'epilogue')


def intervals(trace: dict) -> dict[tuple[int, int], dict[str, list[tuple[float, float]]]]:
  """A Chrome trace of Mosaic GPU's profiler -> {(block, warpgroup): {region: [(begin, end)]}}
  (pid is the block's SM, tid its warpgroup; begin and end events nest per thread). The kernels
  record prologues and epilogues; each tile's 'matmul' is added as the span from its prologue's
  end to its epilogue's begin."""
  open_regions = collections.defaultdict(list)
  out = collections.defaultdict(lambda: collections.defaultdict(list))
  for event in trace['traceEvents']:
    thread = (event['pid'], event['tid'])
    if event.get('ph') == 'B':
      open_regions[thread].append((event['name'], event['ts']))
    elif event.get('ph') == 'E':
      name, begin = open_regions[thread].pop()
      if name != event['name']:
        raise ValueError(f'trace: {event["name"]!r} ends inside {name!r} on {thread}')
      out[thread][name].append((begin, event['ts']))
  for regions in out.values():
    prologues, epilogues = sorted(regions['prologue']), sorted(regions['epilogue'])
    if len(prologues) != len(epilogues):
      raise ValueError(f'trace: {len(prologues)} prologues against {len(epilogues)} epilogues')
    regions['matmul'] = [(p_end, e_begin) for (_, p_end), (e_begin, _) in zip(prologues, epilogues)]
  return out


def _union_length(spans: list[tuple[float, float]]) -> float:
  total, end = 0.0, float('-inf')
  for begin, stop in sorted(spans):
    if stop > end:
      total += stop - max(begin, end)
      end = stop
  return total


def summarize(trace: dict) -> dict:
  """Medians over tiles and blocks of one traced call (see the module docstring); durations in
  the trace's units (the profiler's: SM clock cycles / 1000)."""
  threads = intervals(trace)
  per_region = {name: [stop - begin for regions in threads.values()
                       for begin, stop in regions.get(name, ())] for name in REGIONS}
  blocks = collections.defaultdict(list)
  for (block, _), regions in threads.items():
    blocks[block].append(regions)
  busy, spans = [], []
  for warpgroups in blocks.values():
    every = [interval for regions in warpgroups for name in REGIONS
             for interval in regions.get(name, ())]
    if not every:
      continue
    span = max(stop for _, stop in every) - min(begin for begin, _ in every)
    matmuls = [interval for regions in warpgroups for interval in regions.get('matmul', ())]
    busy.append(_union_length(matmuls) / span if span else 0.0)
    spans.append(span)
  median = {name: statistics.median(d) if d else None for name, d in per_region.items()}
  return {
      'tiles_traced': len(per_region['matmul']),
      'blocks': len(spans),
      **{f'{name}_per_tile': median[name] for name in REGIONS},
      'epilogue_over_matmul': (median['epilogue'] / median['matmul']
                               if median['matmul'] and median['epilogue'] is not None else None),
      'tensor_core_busy': statistics.median(busy) if busy else None,
      'block_span': statistics.median(spans) if spans else None,
  }


def main():
  # argparse, not absl flags: tests import this module beside other probes' absl flags.
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--kernel', default='forward,backward', help='forward, backward or both.')
  parser.add_argument('--tokens', type=int, default=32768, help='Rows (batch x length).')
  parser.add_argument('--embed', type=int, default=768, help='Model width.')
  parser.add_argument('--mlp', type=int, default=3072, help='Feed-forward width.')
  parser.add_argument('--tiles', default='128-128-4-4-8',
                      help="fused_ffn.Tiles fields joined by '-'.")
  parser.add_argument('--calls', type=int, default=50, help='Queued calls per timing.')
  parser.add_argument('--out', default='', help='Append the JSON lines here too.')
  flags = parser.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax.kernels.gpu import fused_ffn  # pylint: disable=g-import-not-at-top
  from fused_norm_bench import emit, timed  # pylint: disable=g-import-not-at-top

  if not fused_ffn.on_hopper():
    raise SystemExit(f'the kernels need an NVIDIA Hopper GPU; this run has {jax.devices()[0]}.')
  tiles = fused_ffn.Tiles(*map(int, flags.tiles.split('-')))
  tokens, embed, mlp = flags.tokens, flags.embed, flags.mlp
  keys = jax.random.split(jax.random.key(0), 4)
  bf16 = jnp.bfloat16
  args = {
      'forward': (jax.random.normal(keys[0], (tokens, embed), bf16),
                  (jax.random.normal(keys[1], (embed, mlp)) * 0.02).astype(bf16),
                  jax.random.normal(keys[2], (mlp,), jnp.float32) * 0.02),
      'backward': (jax.random.normal(keys[0], (tokens, embed), bf16),
                   (jax.random.normal(keys[1], (mlp, embed)) * 0.02).astype(bf16),
                   jax.random.uniform(keys[3], (tokens, mlp), bf16)),
  }
  kernels = {'forward': fused_ffn.gelu_matmul, 'backward': fused_ffn.dgelu_matmul}

  for name in flags.kernel.split(','):
    inputs = args[name]
    untraced = {
        f'ms_{label}': timed(jax.jit(lambda *a, t=t: kernels[name](*a, tiles=t)), *inputs,
                             calls=flags.calls, repeats=3)[1]
        for label, t in (('default_tiles', fused_ffn.TILES), ('these_tiles', tiles))}
    with tempfile.TemporaryDirectory() as trace_dir:
      traced = jax.jit(lambda *a: kernels[name](*a, tiles=tiles, trace_dir=trace_dir))
      jax.block_until_ready(traced(*inputs))
      jax.effects_barrier()  # The profiler writes its trace from a host callback.
      paths = sorted(glob.glob(os.path.join(trace_dir, '*.json')))
      if not paths:
        raise SystemExit(f'no trace in {trace_dir}: {os.listdir(trace_dir)}')
      with open(paths[-1]) as f:
        summary = summarize(json.load(f))
    emit({'device': jax.devices()[0].device_kind, 'kernel': name, 'tokens': tokens,
          'embed': embed, 'mlp': mlp, 'tiles': tiles._asdict(), **untraced, **summary}, flags.out)


if __name__ == '__main__':
  main()

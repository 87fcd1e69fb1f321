"""GPU time of one train step by kernel: `python benchmarks/profile_step.py --config=...`.

Runs bert_jax.benchmark's setup (the real jitted, donated train step on random full-length rows),
traces --steps steps with jax.profiler, and sums the device's kernel time by kernel name, with the
XLA op (`hlo_op`) of each. Run with XLA_FLAGS=--xla_gpu_enable_command_buffer= to see every
kernel's own op rather than its CUDA graph's. Prints one JSON object: milliseconds
per step in total, by kind (matmul = cuBLAS/cuBLASLt gemms, attention = cuDNN, other = XLA's
fusions and copies) and the top ops; with --out, the whole table as JSON lines.

`idle` says how long the GPU ran no kernel at all between the traced steps' first and last kernel
(per step), and where: the largest gaps summed by the kernels on either side of them. Run it with
command buffers on (the timed step's setting) to see the idle time of the real step.
`timed_step_ms` is --timed_steps steps timed untraced first (benchmarks/harness.time_steps, after
3 warm-up steps), in the same process: the step's wall time beside the trace's span and busy
time, and the SM clock and power under those steps (`timed_clocks`, bert_jax.tools.gpu_clocks).
"""

import collections
import glob
import json
import os
import sys
import tempfile

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable-next=g-import-not-at-top,wrong-import-position
from benchmarks import harness
from bert_jax.tools import benchmark  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG, _STEPS = benchmark._CONFIG, benchmark._STEPS  # pylint: disable=protected-access
_TOP = flags.DEFINE_integer('top', 40, 'Ops to list.')
_OUT = flags.DEFINE_string('out', '', 'Write every op as JSON lines here.')
_HLO_OUT = flags.DEFINE_string('hlo_out', '', 'Write the optimized HLO of the step here.')
_TIMED = flags.DEFINE_integer('timed_steps', 20, 'Steps timed untraced before the trace (0: none).')


def kind_of(name: str) -> str:
  lowered = name.lower()
  if any(k in lowered for k in ('gemm', 'cublas', 'sm90_xmma', 'nvjet', 'cutlass')):
    return 'matmul'
  if any(k in lowered for k in ('cudnn', 'flash', 'fmha', 'sdpa', 'short_attention',
                                'long_attention')):
    return 'attention'
  if 'memcpy' in lowered or 'memset' in lowered:
    return 'copy'
  return 'other'


def idle_gaps(events, steps: int, top: int = 15) -> dict:
  """events: (start_ns, end_ns, label) of every kernel on one device, any stream. Merges them into
  busy periods and returns per step the span (first start to last end), the busy and idle
  milliseconds, and the `top` gaps between busy periods summed by (label of the kernel that ended
  the period before, label of the one that starts the next), with their count per step."""
  events = sorted(events)
  if not events:
    return {'span_ms': 0.0, 'busy_ms': 0.0, 'idle_ms': 0.0, 'gaps': []}
  by_pair = collections.defaultdict(lambda: [0, 0])
  busy = 0
  period_start, period_end, last = events[0][0], events[0][1], events[0][2]
  for start, end, label in events[1:]:
    if start > period_end:  # A gap: the period before closes.
      busy += period_end - period_start
      entry = by_pair[(last, label)]
      entry[0] += start - period_end
      entry[1] += 1
      period_start, period_end, last = start, end, label
    elif end > period_end:
      period_end, last = end, label
  busy += period_end - period_start
  span = max(end for _, end, _ in events) - events[0][0]
  gaps = sorted(by_pair.items(), key=lambda item: -item[1][0])[:top]
  per_step = lambda ns: round(ns / steps / 1e6, 4)  # noqa: E731
  return {'span_ms': per_step(span), 'busy_ms': per_step(busy),
          'idle_ms': per_step(span - busy),
          'gaps': [{'after': after[:80], 'before': before[:80], 'ms': per_step(ns),
                    'count': round(count / steps, 1)}
                   for (after, before), (ns, count) in gaps]}


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top
  config = _CONFIG.value
  setup = benchmark.Setup(config)
  state, step, batch = setup.state, setup.step, setup.batch
  with setup.in_mesh():
    if _HLO_OUT.value:
      with open(_HLO_OUT.value, 'w', encoding='utf-8') as f:
        f.write(step.lower(state, batch).compile().as_text())

    def one_step():
      nonlocal state
      state, stats = step(state, batch)
      return stats

    # The same steps timed untraced, in this process: the trace's span compares with this, not
    # with a benchmark run on another machine.
    timing = harness.time_steps(one_step, jax.block_until_ready, warmup=3,
                                steps=max(_TIMED.value, 1))
    trace_dir = tempfile.mkdtemp()
    with jax.profiler.trace(trace_dir):
      for _ in range(_STEPS.value):
        state, stats = step(state, batch)
      jax.block_until_ready(stats)
  path = glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True)[0]
  profile = ProfileData.from_file(path)
  by_op = collections.defaultdict(lambda: [0.0, 0, ''])
  memset_before = collections.Counter()  # Kernel that runs next after each memset (its user).
  intervals = []  # (start, end, label) of every kernel on the device, for idle_gaps.
  for plane in profile.planes:
    if not plane.name.startswith('/device:GPU:0'):
      continue
    for line in plane.lines:
      if 'stream' not in line.name.lower():
        continue
      events = sorted(line.events, key=lambda e: e.start_ns)
      for event, following in zip(events, events[1:]):
        if 'memset' in event.name.lower():
          memset_before[following.name[:60]] += 1
      for event in events:
        # Kernels inside a CUDA graph (command buffer) all carry the buffer's hlo_op: key by
        # kernel name, and keep an XLA op name when there is one.
        op = dict(event.stats).get('hlo_op') or ''
        intervals.append((event.start_ns, event.start_ns + event.duration_ns,
                          f'{op} {event.name}'.strip()))
        entry = by_op[event.name]
        entry[0] += event.duration_ns / 1e6
        entry[1] += 1
        entry[2] = entry[2] or op
  n = _STEPS.value
  rows = sorted(((op, ms / n, count / n, kernel) for kernel, (ms, count, op) in by_op.items()),
                key=lambda r: -r[1])
  kinds = collections.Counter()
  for op, ms, _, kernel in rows:
    kinds[kind_of(kernel + ' ' + op)] += ms
  summary = {'device': jax.devices()[0].device_kind, 'batch': config.train.batch_size,
             'seq': config.data.max_seq_length, 'layers': config.model.num_layers,
             'timed_step_ms': (round(1000 * timing.seconds_per_step, 2)
                               if _TIMED.value else None),
             'timed_clocks': timing.clocks if _TIMED.value else None,
             'kernel_ms_per_step': round(sum(r[1] for r in rows), 2),
             'by_kind_ms': {k: round(v, 2) for k, v in kinds.most_common()},
             'memset_before': {k: round(v / n, 1) for k, v in memset_before.most_common(15)},
             'idle': idle_gaps(intervals, n),
             'top': [{'op': op, 'ms': round(ms, 3), 'launches': round(c, 1),
                      'kernel': kernel[:80]} for op, ms, c, kernel in rows[:_TOP.value]]}
  print(json.dumps(summary, indent=1), flush=True)
  if _OUT.value:
    with open(_OUT.value, 'w', encoding='utf-8') as f:
      for op, ms, count, kernel in rows:
        f.write(json.dumps({'op': op, 'ms': ms, 'launches': count, 'kernel': kernel}) + '\n')


if __name__ == '__main__':
  app.run(main)

"""The fused bias + dropout + residual + LayerNorm on a GPU: `python experiments/fused_norm_bench.py`.

For each [rows, embed] shape, times forward and forward+backward of the jnp reference (as XLA
fuses it) and of the Pallas kernels (per launch shape, as named at every width; by default
fused_norm's FORWARD/BACKWARD first), checks the kernels' output and gradients against the
reference on the device, and prints one JSON line per (shape, impl).
"""

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.kernels.gpu import fused_norm  # pylint: disable=wrong-import-position


def timed(fn, *args, calls=20, repeats=5):
  """(output, ms per call): the median over repeats of `calls` calls queued back to back, so the
  host's dispatch overlaps the device's work (one blocking call at a time adds tens of us)."""
  out = fn(*args)
  jax.block_until_ready(out)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(calls):
      result = fn(*args)
    jax.block_until_ready(result)
    times.append((time.perf_counter() - start) / calls)
  return out, 1e3 * float(np.median(times))


def emit(record: dict, out: str = '') -> None:
  """Prints `record` as one JSON line, and appends it to the file `out` when given."""
  line = json.dumps(record)
  print(line, flush=True)
  if out:
    with open(out, 'a', encoding='utf-8') as f:
      f.write(line + '\n')


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--shapes', default='16384:1024,65536:1024,32768:768')
  parser.add_argument('--launch', default='1:16:4/2:32:4:2,1:16:4/2:32:4,1:16:4',
                      help='fused_norm launch shapes to time, each tile_rows:max_block_rows:'
                      'num_warps[:num_stages] for both kernels, or FORWARD/BACKWARD (e.g. '
                      '1:16:4/2:32:4)')
  args = parser.parse_args()
  for shape in args.shapes.split(','):
    rows, embed = map(int, shape.split(':'))
    keys = jax.random.split(jax.random.key(0), 7)
    y = jax.random.normal(keys[0], (rows, embed), jnp.bfloat16)
    residual = jax.random.normal(keys[1], (rows, embed), jnp.bfloat16)
    bias, scale, offset = (0.1 * jax.random.normal(k, (embed,)) for k in keys[2:5])
    row_keys = fused_norm.row_keys(keys[5], rows)
    cotangent = jax.random.normal(keys[6], (rows, embed), jnp.bfloat16)
    runs = [('xla', '-')] + [('pallas', launch) for launch in args.launch.split(',')]
    reference = None
    for impl, launch in runs:
      if impl == 'pallas':
        shapes = [fused_norm.Launch(*map(int, part.split(':'))) for part in launch.split('/')]
        fused_norm.FORWARD, fused_norm.BACKWARD = shapes[0], shapes[-1]
        # The launch as named, at every width (the model's backward_launch drops the stages at
        # widths that are not powers of two).
        fused_norm.backward_launch = lambda embed, launch=shapes[-1]: launch
      def forward(y, bias, residual, scale, offset, impl=impl):
        return fused_norm.dropout_add_layer_norm(y, bias, residual, row_keys, scale, offset,
                                                 rate=0.1, eps=1e-12, impl=impl)
      def grads(*operands, forward=forward):
        out, vjp = jax.vjp(forward, *operands)
        return (out,) + vjp(cotangent)
      operands = (y, bias, residual, scale, offset)
      _, fwd_ms = timed(jax.jit(forward), *operands)
      results, both_ms = timed(jax.jit(grads), *operands)
      record = {'device': jax.devices()[0].device_kind, 'rows': rows, 'embed': embed,
                'impl': impl, 'launch': launch, 'fwd_ms': round(fwd_ms, 4),
                'fwd_bwd_ms': round(both_ms, 4),
                'traffic_gb_per_s_fwd': round(5 * rows * embed * 2 / fwd_ms / 1e6, 1)}
      if reference is None:
        reference = results
      else:
        record['max_rel_err'] = {  # max |a - b| / max |b|
            name: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                        / float(jnp.max(jnp.abs(b.astype(jnp.float32)))))
            for name, a, b in zip(('out', 'y', 'bias', 'residual', 'scale', 'offset'),
                                  results, reference)}
      print(json.dumps(record), flush=True)


if __name__ == '__main__':
  main()

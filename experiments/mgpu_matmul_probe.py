"""Times JAX's Mosaic GPU Hopper matmul (jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu) at the
FFN backward's dH = dY @ W2^T shapes (BERT-Base 256 x 128, Large 128 x 128) against cuBLAS, over
32 tilings: `XLA_FLAGS=--xla_gpu_enable_triton_gemm=false python experiments/mgpu_matmul_probe.py`
(JSON lines; results/h100_mgpu_matmul.jsonl). Hopper GPUs only.
"""

import functools
import itertools
import json
import time

import jax
from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
import jax.numpy as jnp

SHAPES = ((32768, 768, 3072), (16384, 1024, 4096))  # tokens, embed, mlp


def timed(fn, *args, calls=50):
  """(milliseconds per call over `calls` queued calls after one warm-up, the last output)."""
  out = fn(*args)
  jax.block_until_ready(out)
  start = time.perf_counter()
  for _ in range(calls):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / calls * 1e3, out


def main():
  device = jax.devices()[0].device_kind
  dims = hm.MatmulDimension
  for m, k, n in SHAPES:
    a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32).astype(jnp.bfloat16)
    b = (0.02 * jax.random.normal(jax.random.key(1), (k, n), jnp.float32)).astype(jnp.bfloat16)
    record = functools.partial(dict, shape=[m, k, n], device=device)
    ms, ref = timed(jax.jit(lambda a, b: a @ b), a, b)
    tflops = round(2 * m * k * n / ms / 1e9, 1)
    print(json.dumps(record(run='cublas', ms=round(ms, 4), tflops=tflops)), flush=True)
    for tile_n, steps, wg, minor, width in itertools.product((128, 64), (4, 3), dims, dims, (4, 8)):
      config = hm.TuningConfig(tile_m=128, tile_n=tile_n, tile_k=64, max_concurrent_steps=steps,
                               epi_tile_n=64, epi_tile_m=64, grid_minor_dim=minor,
                               grid_tile_width=width, wg_dimension=wg)
      name = f'mgpu_128-{tile_n}-64-{steps}-wg{wg}-minor{minor}-w{width}'
      try:
        ms, out = timed(jax.jit(functools.partial(hm.matmul, c=None, config=config)), a, b)
        diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))))
        print(json.dumps(record(run=name, ms=round(ms, 4),
                                tflops=round(2 * m * k * n / ms / 1e9, 1), max_abs_diff=diff)),
              flush=True)
      except Exception as err:  # Report and go on: pylint: disable=broad-except
        print(json.dumps(record(run=name, error=f'{type(err).__name__}: {str(err)[:400]}')),
              flush=True)


if __name__ == '__main__':
  main()

"""What the forward FFN kernel's epilogue costs, taken apart on its own skeleton (Hopper GPUs).

`python experiments/ffn_epilogue_variants.py [--shapes=base,large] [--variants=...]
[--stages=3,4] [--out=results.jsonl]`

Each variant is `fused_ffn._pingpong_matmul` with another epilogue, its output tiles staged whole
([2 warpgroups, outputs, 128, 128] of shared memory, as the forward kernel did before it stored
64 rows at a time), so that the differences between them price each part of the epilogue:
  out1      acc + bias, one output (the skeleton with the cheapest epilogue)
  out2      acc + bias written twice (a second output's stores, no GELU)
  gelu_h    the GELU's h only (its arithmetic, one output)
  gelu_hg   h and g = gelu'(pre) (the forward kernel's work, whole-tile buffers)
and, for reference, `kernel` (fused_ffn.gelu_matmul as it is, its stages set by --stages) and
`cublas` (x @ W1 alone through XLA). One JSON line per (shape, variant, stages): milliseconds per
call (the median of 3 runs of 50 queued calls) and, for variants computing h and g, their
largest difference from `fused_ffn.gelu_reference`. A variant whose buffers exceed shared memory
prints its error instead. perf_notes.md, fourteenth session, has what these measured.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {'base': (32768, 768, 3072), 'large': (16384, 1024, 4096)}  # tokens, embed, mlp
VARIANTS = ('out1', 'out2', 'gelu_h', 'gelu_hg')


def variant_matmul(variant, x, w1, b1, *, stages, sms=None):
  """The forward kernel's skeleton with `variant`'s epilogue (see the module docstring):
  x [tokens, embed] @ w1 [embed, mlp] + b1 in [128, 128] tiles; returns its outputs."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax import lax  # pylint: disable=g-import-not-at-top
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax.kernels.gpu import fused_ffn  # pylint: disable=g-import-not-at-top
  from bert_jax.models import layers  # pylint: disable=g-import-not-at-top

  if variant not in VARIANTS:
    raise ValueError(f'variant={variant!r}; valid: {VARIANTS}')
  tiles = fused_ffn.Tiles(forward_stages=stages)
  sms = sms or jax.devices()[0].core_count
  rows, cols = tiles.rows, tiles.cols
  outs = 1 if variant in ('out1', 'gelu_h') else 2

  def values(pre):
    if variant == 'out1':
      return (pre,)
    if variant == 'out2':
      return (pre, pre)
    h, g = layers.gelu_tanh_and_grad(pre)
    return (h,) if variant == 'gelu_h' else (h, g)

  def body(x_gmem, w1_gmem, b1_gmem, *out_gmems):
    def prologue(r, c, wg, scratch):
      del r
      _, b1_smem, fetched = scratch
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # Its last tile's outputs have left.
      plgpu.copy_gmem_to_smem(b1_gmem.at[c], b1_smem.at[wg], fetched.at[wg])

    def epilogue(acc, r, c, wg, scratch):
      out_smem, b1_smem, fetched = scratch
      plgpu.barrier_wait(fetched.at[wg])
      for piece in fused_ffn._pieces(rows, cols):  # pylint: disable=protected-access
        bias = lax.broadcast_in_dim(b1_smem[wg, piece[1]], (64, 64), (1,))
        for i, value in enumerate(values(acc[piece] + bias)):
          out_smem[(wg, i) + piece] = value.astype(out_smem.dtype)
      plgpu.commit_smem()
      for i, out_gmem in enumerate(out_gmems):
        plgpu.copy_smem_to_gmem(out_smem.at[wg, i], out_gmem.at[r, c])

    fused_ffn._pingpong_matmul(  # pylint: disable=protected-access
        x_gmem, w1_gmem, rows=rows, cols=cols, stages=stages, snake=tiles.snake, sms=sms,
        prologue=prologue, epilogue=epilogue,
        scratch=(plgpu.SMEM((2, outs, rows, cols), x.dtype,
                            transforms=fused_ffn._swizzled()),  # pylint: disable=protected-access
                 plgpu.SMEM((2, cols), jnp.float32), plgpu.Barrier(num_barriers=2)))

  out = jax.ShapeDtypeStruct((x.shape[0], w1.shape[1]), x.dtype)
  return fused_ffn._launch(body, (out,) * outs, sms, tiles)(x, w1, b1)  # pylint: disable=protected-access


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
  parser.add_argument('--shapes', default='base,large', help=f'Of {tuple(SHAPES)}.')
  parser.add_argument('--variants', default=','.join(('cublas', 'kernel') + VARIANTS))
  parser.add_argument('--stages', default='3,4', help='Operand stages to try.')
  parser.add_argument('--out', default='', help='Append the JSON lines here too.')
  flags = parser.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax.kernels.gpu import fused_ffn  # pylint: disable=g-import-not-at-top
  from fused_norm_bench import emit, timed  # pylint: disable=g-import-not-at-top

  if not fused_ffn.on_hopper():
    raise SystemExit(f'the kernels need an NVIDIA Hopper GPU; this run has {jax.devices()[0]}.')
  for shape in flags.shapes.split(','):
    tokens, embed, mlp = SHAPES[shape]
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (tokens, embed), jnp.bfloat16)
    w1 = (jax.random.normal(keys[1], (embed, mlp)) * 0.02).astype(jnp.bfloat16)
    b1 = jax.random.normal(keys[2], (mlp,), jnp.float32) * 0.02
    reference = jax.jit(fused_ffn.gelu_reference)(x, w1, b1)
    for variant in flags.variants.split(','):
      # cuBLAS has no stages to set: timed once.
      for stages in [None] if variant == 'cublas' else map(int, flags.stages.split(',')):
        record = {'device': jax.devices()[0].device_kind, 'shape': shape, 'variant': variant,
                  'stages': stages}
        if variant == 'cublas':
          fn = jax.jit(lambda x, w1, b1: x @ w1)
        elif variant == 'kernel':
          fn = jax.jit(lambda x, w1, b1, s=stages: fused_ffn.gelu_matmul(
              x, w1, b1, tiles=fused_ffn.Tiles(forward_stages=s)))
        else:
          fn = jax.jit(lambda x, w1, b1, v=variant, s=stages: variant_matmul(
              v, x, w1, b1, stages=s))
        try:
          out, record['ms'] = timed(fn, x, w1, b1, calls=50, repeats=3)
        except Exception as e:  # pylint: disable=broad-except  # e.g. shared memory exceeded
          record['error'] = repr(e)[:300]
        else:
          if variant in ('kernel', 'gelu_hg'):
            record['max_diff'] = max(
                float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                for a, b in zip(out, reference))
        emit(record, flags.out)


if __name__ == '__main__':
  main()

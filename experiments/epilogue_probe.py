"""Which cuBLASLt epilogues XLA fuses into the feed-forward block, and what they save.

`XLA_FLAGS=... python experiments/epilogue_probe.py --gelu=jax|vjp|fused [--tokens=16384]
[--embed=1024 --mlp=4096] [--tiles=128-128-4-4-8,...] [--column_sums]` times the
forward+backward of bf16 `gelu_tanh(x @ W1 + b1) @ W2 + b2` (fp32 parameters cast to bf16, as in
the model) at BERT-Large's FFN width and prints one JSON line: milliseconds per call (20 queued
calls after a warm-up) and the count of each gemm epilogue in the optimized HLO.

--gelu=jax is `jax.nn.gelu(approximate=True)` under JAX's autodiff (it saves the tanh for the
backward); --gelu=vjp is `layers.gelu_tanh`, whose custom VJP saves only its input, so that
XLA's GELU pattern (tanh with one user) can match and the gemm can write the pre-activation as
its auxiliary output (BIAS_GELU_AUX). --gelu=fused is `fused_ffn.ffn` (the up-projection, bias and
GELU in one Mosaic GPU kernel that saves gelu' for the backward; the backward's dH matmul times
gelu' in another; Hopper GPUs), once per
--tiles tiling (`fused_ffn.Tiles` fields joined by '-'; with --column_sums each also with the
bias gradient's column sums in the backward kernel), with its largest gradient differences
from --gelu=vjp's, and whether the kernel ran (`kernel_ran`: off Hopper GPUs the same custom VJP
computes `fused_ffn.gelu_reference` and `dgelu_reference` instead).
"""

import collections
import functools
import json
import os
import re
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_GELU = flags.DEFINE_enum('gelu', 'vjp', ['jax', 'vjp', 'fused'], 'GELU implementation.')
_TILES = flags.DEFINE_list('tiles', [], "fused_ffn.Tiles to time with --gelu=fused, each its "
                           "fields joined by '-' (default: fused_ffn.TILES).")
_TOKENS = flags.DEFINE_integer('tokens', 16384, 'Rows (batch x length).')
_EMBED = flags.DEFINE_integer('embed', 1024, 'Model width.')
_MLP = flags.DEFINE_integer('mlp', 4096, 'Feed-forward width.')
_CALLS = flags.DEFINE_integer('calls', 20, 'Timed calls.')
_SUMS = flags.DEFINE_bool('column_sums', False, 'With --gelu=fused, each tiling also with '
                          "fused_ffn.COLUMN_SUMS flipped ('_nosums' while it is on: the bias "
                          "gradient's column sums by an XLA pass over dPre instead of in the "
                          "backward kernel; '_sums' while it is off).")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax.kernels.gpu import fused_ffn  # pylint: disable=g-import-not-at-top
  from bert_jax.models import layers  # pylint: disable=g-import-not-at-top

  def loss(params, x, g, gelu, tiles=None):
    if gelu == 'fused':  # The same function; fused_ffn casts its parameters to bf16.
      w1, b1, w2, b2 = params
      y = fused_ffn.ffn(x, w1, b1, w2, tiles=tiles)
      return jnp.sum(((y + b2.astype(jnp.bfloat16)) * g).astype(jnp.float32))
    act = (lambda h: jax.nn.gelu(h, approximate=True)) if gelu == 'jax' else layers.gelu_tanh
    w1, b1, w2, b2 = (p.astype(jnp.bfloat16) for p in params)
    h = act(x @ w1 + b1)  # [tokens, mlp]
    y = h @ w2 + b2  # [tokens, embed]
    return jnp.sum((y * g).astype(jnp.float32))

  keys = jax.random.split(jax.random.key(0), 4)
  t, e, m = _TOKENS.value, _EMBED.value, _MLP.value
  params = (0.02 * jax.random.normal(keys[0], (e, m)), jnp.zeros((m,)),
            0.02 * jax.random.normal(keys[1], (m, e)), jnp.zeros((e,)))
  x = jax.random.normal(keys[2], (t, e), jnp.bfloat16)
  g = jax.random.normal(keys[3], (t, e), jnp.bfloat16)
  runs = {_GELU.value: None}
  model_sums = fused_ffn.COLUMN_SUMS
  flipped = '_nosums' if model_sums else '_sums'
  if _GELU.value == 'fused':
    specs = _TILES.value or ['-'.join(map(str, fused_ffn.TILES))]
    runs = {f'fused_{spec}{suffix}': fused_ffn.Tiles(*map(int, spec.split('-')))
            for spec in specs for suffix in ('', flipped) if suffix == '' or _SUMS.value}
    vjp_grads = jax.jit(jax.grad(functools.partial(loss, gelu='vjp'), argnums=(0, 1)))(
        params, x, g)
  for name, tiles in runs.items():
    fn = functools.partial(loss, gelu=_GELU.value, tiles=tiles)
    step = jax.jit(jax.grad(fn, argnums=(0, 1)))
    record = {'gelu': name, 'xla_flags': os.environ.get('XLA_FLAGS', ''), 'tokens': t,
              'embed': e, 'mlp': m, 'device': jax.devices()[0].device_kind}
    if tiles is not None:  # Off Hopper GPUs ffn runs gelu_reference, dgelu_reference instead.
      record['kernel_ran'] = fused_ffn.on_hopper()
    try:
      # Read when the step is traced, just below.
      fused_ffn.COLUMN_SUMS = model_sums != name.endswith(flipped)
      hlo = step.lower(params, x, g).compile().as_text()
      record['epilogues'] = dict(collections.Counter(re.findall(r'"epilogue":"([A-Z_]+)"', hlo)))
      grads = step(params, x, g)
      jax.block_until_ready(grads)
      start = time.perf_counter()
      for _ in range(_CALLS.value):
        out = step(params, x, g)
      jax.block_until_ready(out)
      record['fwd_bwd_ms'] = round((time.perf_counter() - start) / _CALLS.value * 1e3, 4)
      if tiles is not None:  # Largest relative difference of each gradient from the vjp way.
        record['max_rel_diff'] = [
            float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                  / jnp.maximum(jnp.max(jnp.abs(b.astype(jnp.float32))), 1e-30))
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(vjp_grads))]
    except Exception as err:  # Report and go on: pylint: disable=broad-except
      record['error'] = str(err).splitlines()[0][:300]
    print(json.dumps(record), flush=True)


if __name__ == '__main__':
  app.run(main)

"""Which cuBLASLt epilogues XLA fuses into the feed-forward block, and what they save.

`XLA_FLAGS=... python experiments/epilogue_probe.py --gelu=jax|vjp [--tokens=16384]` times the
forward+backward of bf16 `gelu_tanh(x @ W1 + b1) @ W2 + b2` (fp32 parameters cast to bf16, as in
the model) at BERT-Large's FFN width and prints one JSON line: milliseconds per call (20 queued
calls after a warm-up) and the count of each gemm epilogue in the optimized HLO.

--gelu=jax is `jax.nn.gelu(approximate=True)` under JAX's autodiff (it saves the tanh for the
backward); --gelu=vjp is `layers.gelu_tanh`, whose custom VJP saves only its input, so that
XLA's GELU pattern (tanh with one user) can match and the gemm can write the pre-activation as
its auxiliary output (BIAS_GELU_AUX).
"""

import collections
import json
import os
import re
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_GELU = flags.DEFINE_enum('gelu', 'vjp', ['jax', 'vjp'], 'GELU implementation.')
_TOKENS = flags.DEFINE_integer('tokens', 16384, 'Rows (batch x length).')
_EMBED = flags.DEFINE_integer('embed', 1024, 'Model width.')
_MLP = flags.DEFINE_integer('mlp', 4096, 'Feed-forward width.')
_CALLS = flags.DEFINE_integer('calls', 20, 'Timed calls.')


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax import layers  # pylint: disable=g-import-not-at-top

  gelu = (lambda h: jax.nn.gelu(h, approximate=True)) if _GELU.value == 'jax' else layers.gelu_tanh

  def loss(params, x, g):
    w1, b1, w2, b2 = (p.astype(jnp.bfloat16) for p in params)
    h = gelu(x @ w1 + b1)  # [tokens, mlp]
    y = h @ w2 + b2  # [tokens, embed]
    return jnp.sum((y * g).astype(jnp.float32))

  step = jax.jit(jax.grad(loss, argnums=(0, 1)))
  keys = jax.random.split(jax.random.key(0), 4)
  t, e, m = _TOKENS.value, _EMBED.value, _MLP.value
  params = (0.02 * jax.random.normal(keys[0], (e, m)), jnp.zeros((m,)),
            0.02 * jax.random.normal(keys[1], (m, e)), jnp.zeros((e,)))
  x = jax.random.normal(keys[2], (t, e), jnp.bfloat16)
  g = jax.random.normal(keys[3], (t, e), jnp.bfloat16)
  hlo = step.lower(params, x, g).compile().as_text()
  epilogues = collections.Counter(re.findall(r'"epilogue":"([A-Z_]+)"', hlo))
  jax.block_until_ready(step(params, x, g))
  start = time.perf_counter()
  for _ in range(_CALLS.value):
    out = step(params, x, g)
  jax.block_until_ready(out)
  ms = (time.perf_counter() - start) / _CALLS.value * 1e3
  print(json.dumps({'gelu': _GELU.value, 'xla_flags': os.environ.get('XLA_FLAGS', ''),
                    'tokens': t, 'embed': e, 'mlp': m, 'fwd_bwd_ms': round(ms, 4),
                    'epilogues': dict(epilogues), 'device': jax.devices()[0].device_kind}))


if __name__ == '__main__':
  app.run(main)

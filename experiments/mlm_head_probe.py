"""The MLM head's logits and loss alone, forward+backward, two ways (a candidate for Base's step).

`python experiments/mlm_head_probe.py [--rows=5120 --hidden=768 --vocab=30522]`: one JSON line
per way, milliseconds per forward+backward (20 queued calls after a warm-up), and the largest
differences of the loss and gradients from the model's way.

  model      as `model.MaskedLmHead` and `steps.pretraining_losses` compute it: bf16 logits
             against the tied embeddings, upcast, + the float32 output bias, softmax
             cross-entropy. On an H100 at Base 256 x 128 (5,120 predictions) XLA writes the
             softmax gradient in float32 (0.34 ms), pads and casts it to bf16 for the matmuls
             (0.30) and reduces the float32 copy for the bias (0.25)
             (experiments/results/h100_base128_profile.jsonl).
  bf16_grad  the same forward; the upcast's backward casts the gradient to the logits' dtype and
             sums the bias gradient from that bf16 copy, so the float32 gradient has one user
             (its cast) and need not be written (predict: about -0.6 ms at Base; the bias
             gradient then sums bf16-rounded values, as the matmuls already take them).

Measured on an H100 (2026-11-27, experiments/results/h100_mlm_head_probe.jsonl): 2.641 against
2.642 ms at Base's 5,120 rows, 1.880 against 1.892 at Large's 2,560 rows, and on the GPU the loss
and every gradient the same to the bit (on the CPU the bias gradients differ by up to 0.1%): XLA's
GPU compile makes the same work of both ways, so the model keeps its code.
"""

import functools
import json
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import optax

_ROWS = flags.DEFINE_integer('rows', 5120, 'Masked positions (batch x predictions).')
_HIDDEN = flags.DEFINE_integer('hidden', 768, 'Hidden size.')
_VOCAB = flags.DEFINE_integer('vocab', 30522, 'Vocabulary size.')
_CALLS = flags.DEFINE_integer('calls', 20, 'Timed calls.')


@jax.custom_vjp
def upcast_add_bias(logits, bias):
  """logits.astype(float32) + bias, whose backward gives both gradients from one bf16 copy."""
  return logits.astype(jnp.float32) + bias.astype(jnp.float32)


def _upcast_forward(logits, bias):
  # The dtypes travel as empty arrays (residuals must be arrays), as in bert_jax.kernels.gpu.fused_norm.
  return upcast_add_bias(logits, bias), (jnp.zeros((0,), logits.dtype),
                                         jnp.zeros((0,), bias.dtype))


def _upcast_backward(dtypes, g):
  low = g.astype(dtypes[0].dtype)
  dbias = jnp.sum(low.astype(jnp.float32), axis=tuple(range(g.ndim - 1)))
  return low, dbias.astype(dtypes[1].dtype)


upcast_add_bias.defvjp(_upcast_forward, _upcast_backward)


def head_loss(hidden, table, bias, labels, weights, *, way: str):
  """The MLM loss of hidden [rows, embed] (bf16) against the tied table [vocab, embed]."""
  logits = jnp.einsum('ne,ve->nv', hidden, table.astype(hidden.dtype))
  if way == 'model':
    logits = logits.astype(jnp.float32) + bias.astype(jnp.float32)
  else:
    logits = upcast_add_bias(logits, bias)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return jnp.sum(ce * weights) / jnp.sum(weights)


def main(argv):
  del argv
  n, h, v = _ROWS.value, _HIDDEN.value, _VOCAB.value
  keys = jax.random.split(jax.random.key(0), 4)
  hidden = jax.random.normal(keys[0], (n, h), jnp.bfloat16)
  table = 0.02 * jax.random.normal(keys[1], (v, h), jnp.float32)
  bias = 0.01 * jax.random.normal(keys[2], (v,), jnp.float32)
  labels = jax.random.randint(keys[3], (n,), 0, v)
  weights = jnp.ones((n,), jnp.float32)
  results = {}
  for way in ('model', 'bf16_grad'):
    step = jax.jit(jax.value_and_grad(functools.partial(head_loss, way=way), argnums=(0, 1, 2)))
    out = step(hidden, table, bias, labels, weights)
    jax.block_until_ready(out)
    start = time.perf_counter()
    for _ in range(_CALLS.value):
      out = step(hidden, table, bias, labels, weights)
    jax.block_until_ready(out)
    record = {'way': way, 'rows': n, 'hidden': h, 'vocab': v,
              'device': jax.devices()[0].device_kind,
              'fwd_bwd_ms': round((time.perf_counter() - start) / _CALLS.value * 1e3, 4)}
    results[way] = out
    if way != 'model':
      (loss, grads), (ref_loss, ref_grads) = out, results['model']
      record['loss_diff'] = float(abs(loss - ref_loss))
      for name, a, b in zip(('hidden', 'table', 'bias'), grads, ref_grads):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        record[f'max_rel_diff_{name}'] = float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
    print(json.dumps(record), flush=True)


if __name__ == '__main__':
  app.run(main)

"""Does cuDNN's fused-attention dropout behave as training needs? (GPU only.)

`python experiments/cudnn_dropout_probe.py [--out=probe.jsonl]`

XLA runs cuDNN's flash attention with dropout from a static seed and a per-kernel offset that
advances on every execution. This probe reads the masks back and checks, for each way of stacking
attention calls that a BERT step uses, that (1) a mask changes from one step to the next, (2) the
backward pass drops exactly the forward's probabilities, (3) different layers draw different
masks, (4) the keep rate is 1 - rate.

How a mask is read: with query = key = 0 every probability is 1/S, and with value[j] = e_j
(head_dim = S) the output row i is keep[i, :] / (S * (1 - rate)). The gradient of
sum(out * g) with respect to value is P_dropped^T g, which must equal the matrix built from that
very forward's mask.
"""

import argparse
import json

import jax
import jax.numpy as jnp
from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

RATE = 0.1
B, S, N = 4, 64, 2  # head_dim = S


def attention(q, k, v, seed, lengths=None):
  kwargs = {}
  if lengths is not None:
    kwargs = dict(q_seqlen=lengths, kv_seqlen=lengths, mask_type=cudnn_fa.MaskType.PADDING)
  return cudnn_fa.dot_product_attention(q, k, v, scale=1.0, seed=seed, dropout_rate=RATE,
                                        **kwargs)


def inputs(layers):
  q = jnp.zeros((layers, B, S, N, S), jnp.bfloat16)
  v = jnp.broadcast_to(jnp.eye(S, dtype=jnp.bfloat16)[None, None, :, None, :],
                       (layers, B, S, N, S))
  g = jax.random.normal(jax.random.key(0), (layers, B, S, N, S), jnp.float32).astype(jnp.bfloat16)
  return q, v, g


def keep_from_output(out):
  # out: [B, S(query), N, S(key)] -> keep [B, N, S, S] as 0/1.
  return (jnp.transpose(out.astype(jnp.float32), (0, 2, 1, 3)) > 0).astype(jnp.float32)


def expected_dv(keep, g, lengths=None):
  real = jnp.full((B,), S, jnp.float32) if lengths is None else lengths.astype(jnp.float32)
  probs = keep / (real[:, None, None, None] * (1 - RATE))  # [B, N, Sq, Sk]
  return jnp.einsum('bnqk,bqnd->bknd', probs, g.astype(jnp.float32))


def make_step(structure, layers, lengths=None, seeds=None):
  seeds = seeds or [42] * layers

  def loss(v, q, g):
    if structure == 'unrolled':
      outs = [attention(q[l], q[l], v[l], seeds[l], lengths) for l in range(layers)]
      outs = jnp.stack(outs)
    elif structure == 'remat':
      f = jax.checkpoint(lambda a, b: attention(a, a, b, seeds[0], lengths))
      outs = jnp.stack([f(q[l], v[l]) for l in range(layers)])
    else:  # scan
      def body(_, x):
        ql, vl = x
        return None, attention(ql, ql, vl, seeds[0], lengths)
      _, outs = jax.lax.scan(body, None, (q, v))
    return jnp.sum(outs.astype(jnp.float32) * g.astype(jnp.float32)), outs

  return jax.jit(jax.value_and_grad(loss, has_aux=True))


def check(structure, layers, steps=3, lengths=None, distinct_seeds=False):
  q, v, g = inputs(layers)
  seeds = [1000 + 17 * l for l in range(layers)] if distinct_seeds else None
  step = make_step(structure, layers, lengths, seeds)
  previous = None
  worst, changed, same_layers, keep_rates = 0.0, [], [], []
  for _ in range(steps):
    (_, outs), dv = step(v, q, g)
    keeps = [keep_from_output(outs[l]) for l in range(layers)]
    for l in range(layers):
      want = expected_dv(keeps[l], g[l], lengths)
      err = float(jnp.max(jnp.abs(dv[l].astype(jnp.float32) - want)) /
                  (jnp.max(jnp.abs(want)) + 1e-9))
      worst = max(worst, err)
    if lengths is None:
      keep_rates.append(float(jnp.mean(jnp.stack(keeps))))
    if layers > 1:
      same_layers.append(bool(jnp.all(keeps[0] == keeps[1])))
    if previous is not None:
      changed.append(not bool(jnp.all(previous == keeps[0])))
    previous = keeps[0]
  return dict(structure=structure, layers=layers, padded=lengths is not None,
              distinct_seeds=distinct_seeds, steps=steps,
              grad_matches_forward_mask=worst < 0.02, worst_relative_error=round(worst, 4),
              mask_changes_each_step=changed, layers_share_mask=same_layers,
              keep_rate=keep_rates)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='cudnn_dropout_probe.jsonl')
  args = parser.parse_args()
  lengths = jnp.array([S, S - 5, S // 2, 7], jnp.int32)
  cases = [
      dict(structure='unrolled', layers=1),
      dict(structure='unrolled', layers=3),
      dict(structure='unrolled', layers=3, distinct_seeds=True),
      dict(structure='unrolled', layers=3, distinct_seeds=True, lengths=lengths),
      dict(structure='scan', layers=3),
      dict(structure='remat', layers=2),
  ]
  with open(args.out, 'a') as f:
    for case in cases:
      try:
        row = check(**case)
      except Exception as e:  # pylint: disable=broad-except
        row = dict(case, lengths=case.get('lengths') is not None, error=f'{type(e).__name__}: {e}'[:400])
      row['device'] = jax.devices()[0].device_kind
      print(json.dumps(row), flush=True)
      f.write(json.dumps(row) + '\n')


if __name__ == '__main__':
  main()

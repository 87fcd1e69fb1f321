"""Attention alone, forward+backward, at one BERT shape: cuDNN (with and without its in-kernel
dropout), bert_jax.kernels.gpu.fused_attention (ours, with and without dropout) and JAX's Pallas Triton flash
attention (no dropout). Ours take q, k, v packed as the model's projection gives them
(`fused_attention.attention_qkv`), and JAX's Mosaic GPU flash attention (Hopper wgmma/TMA, no
dropout, no mask).

`python experiments/attention_probe.py [--batch=128 --seq=128 --heads=16] [--segments=packed]
[--long_blocks=128-64-64-64-8-4-3,...] [--warps=4,8,default]
[--short_backward=triton,mosaic] [--paired_draws] [--one_pass] [--keep_words] [--checks=1]
[--mgpu=64-128-2-64-64-64-64-1-f16,...]`:
one JSON line per implementation, milliseconds per forward+backward (20 queued calls after a
warm-up); ours also against their jnp reference.
"""

import contextlib
import functools
import json
import os
import sys
import time
import unittest.mock

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_BATCH = flags.DEFINE_integer('batch', 128, 'Rows.')
_SEQ = flags.DEFINE_integer('seq', 128, 'Sequence length.')
_HEADS = flags.DEFINE_integer('heads', 16, 'Heads (head_dim 64).')
_CALLS = flags.DEFINE_integer('calls', 20, 'Timed calls.')
_SEGMENTS = flags.DEFINE_enum(
    'segments', 'full', ['full', 'packed'], "Rows of ours: 'full' (every token real) or 'packed' "
    '(two segments of 3/8 and 1/2 of the row, then padding), against the reference.')
_CHECKS = flags.DEFINE_integer(
    'checks', 1, 'Times each of ours is run against the reference (a race between threads shows '
    'as gradients that differ from run to run): max_diff_* is the largest over them.')
_WARPS = flags.DEFINE_list(
    'warps', ['4', '8'], "num_warps of our short kernels to time (both kernels), or 'default' "
    '(fused_attention.FORWARD_WARPS forward, NUM_WARPS backward, as the model runs them).')
_SHORT = flags.DEFINE_list(
    'short_backward', ['triton'], 'Backwards of our short kernels to time (rows up to '
    "fused_attention.MAX_LENGTH): fused_attention.KERNELS ('triton'; 'mosaic': "
    'flash_backward.row_backward).')
_BIAS = flags.DEFINE_bool(
    'bias', False, "Ours with the projection's bias, its gradient taken too (the model's way: the "
    'kernels sum the bias gradient); each Mosaic GPU backward also timed with those sums by XLA '
    "over dqkv instead ('_xla_sums').")
_PAIRED = flags.DEFINE_bool(
    'paired_draws', False, 'Each Mosaic GPU backward also timed with flash_backward.PAIRED_DRAWS '
    "flipped ('_unpaired' while it is on: one hash per dropout draw; '_paired' while it is off: "
    'one hash per pair of keys, through the registers).')
_ONE_PASS = flags.DEFINE_bool(
    'one_pass', False, 'Each Mosaic GPU backward of long rows also timed with '
    "flash_backward.ONE_PASS flipped ('_two_pass' while it is on: a second pass over the keys for "
    "dQ; '_one_pass' while it is off: dQ added by TMA reduce-adds in the dK/dV pass).")
_KEEP_WORDS = flags.DEFINE_bool(
    'keep_words', False, 'Each Mosaic GPU backward of long rows also timed with '
    "flash_backward.KEEP_WORDS flipped ('_hashed' while it is on: the backward hashes the keep "
    "decisions again; '_words' while it is off: it reads the words the forward wrote).")
_LONG = flags.DEFINE_list(
    'long_blocks', [], 'fused_attention.LongBlocks to time at lengths over '
    "fused_attention.MAX_LENGTH, each its fields joined by '-', the eighth (the backward: "
    "'triton' or 'mosaic') optional (default: LONG_BLOCKS).")
_PALLAS = flags.DEFINE_list(
    'pallas', ['128x128w8s2'], "JAX's Pallas flash attention configurations to time, each "
    "'{block_q}x{block_k}w{num_warps}s{num_stages}'.")
_MGPU = flags.DEFINE_list(
    'mgpu', [], "JAX's Mosaic GPU (Hopper wgmma/TMA) flash attention configurations to time, no "
    "dropout, no mask, each '{block_q}-{block_kv}-{max_concurrent_steps}-{block_q_dkv}-"
    "{block_kv_dkv}-{block_q_dq}-{block_kv_dq}-{compute_wgs_bwd}-{dtype}' (dtype f16; bf16 "
    "fails in jax 0.11.2, whose shared-memory buffers are f16).")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.gpu import attention as pallas_attention  # pylint: disable=g-import-not-at-top
  from bert_jax.models import layers  # pylint: disable=g-import-not-at-top

  b, s, h, d = _BATCH.value, _SEQ.value, _HEADS.value, 64
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v, g = (jax.random.normal(key, (b, s, h, d), jnp.bfloat16) for key in keys)
  bias = layers.attention_bias(jnp.ones((b, s), jnp.int32), jnp.bfloat16)
  scale = 1 / d ** 0.5
  impls = {
      'cudnn_dropout0.1': functools.partial(layers.cudnn_attention, bias=bias, dropout_rate=0.1,
                                            seed=1),
      'cudnn_no_dropout': functools.partial(layers.cudnn_attention, bias=bias),
  }
  from bert_jax.kernels.gpu import fused_attention  # pylint: disable=g-import-not-at-top
  segment_ids = jnp.ones((b, s), jnp.int32)
  if _SEGMENTS.value == 'packed':
    segment_ids = jnp.asarray([1] * (s * 3 // 8) + [2] * (s // 2) + [0] * (s - s * 7 // 8),
                              jnp.int32)[None].repeat(b, axis=0)
  tile_keys = fused_attention.tile_keys(keys[0], b, h)
  qkv = jnp.stack([q, k, v], axis=2)  # Ours take the packed projection (the model's layout).
  qkv_bias = jax.random.normal(keys[1], (3, h, d), jnp.float32) if _BIAS.value else None
  patches = {}  # impl -> a context manager the impl is traced and timed under
  if s <= fused_attention.MAX_LENGTH:
    tilings = {f'w{w}_{backward}': {'num_warps': None if w == 'default' else int(w),
                                    'short_backward': backward}
               for w in _WARPS.value for backward in _SHORT.value}
  else:
    specs = _LONG.value or ['-'.join(map(str, fused_attention.LONG_BLOCKS))]
    tilings = {spec.replace('-', '_'): {'long_blocks': fused_attention.LongBlocks(
        *(int(p) if p.isdigit() else p for p in spec.split('-')))} for spec in specs}
  for rate in (0.1, 0.0) if fused_attention.supported(s, d) else ():
    for label, tiling in tilings.items():
      name = f'ours_dropout{rate}_{label}'
      impls[name] = functools.partial(
          fused_attention.attention_qkv, bias=qkv_bias, segment_ids=segment_ids, keys=tile_keys,
          rate=rate, **tiling)
      mosaic_backward = 'mosaic' in (
          tiling.get('short_backward'), getattr(tiling.get('long_blocks'), 'backward', None))
      from bert_jax.kernels.gpu import flash_backward  # pylint: disable=g-import-not-at-top

      def flip(switch, when_on, when_off):  # impls[name] again, flash_backward.switch flipped.
        on = getattr(flash_backward, switch)
        flipped = f'{name}_{when_on if on else when_off}'
        impls[flipped] = impls[name]
        patches[flipped] = functools.partial(
            unittest.mock.patch.object, flash_backward, switch, not on)
      if _PAIRED.value and mosaic_backward and rate:
        flip('PAIRED_DRAWS', 'unpaired', 'paired')
      if _ONE_PASS.value and getattr(tiling.get('long_blocks'), 'backward', None) == 'mosaic':
        flip('ONE_PASS', 'two_pass', 'one_pass')
      if (_KEEP_WORDS.value and rate
          and getattr(tiling.get('long_blocks'), 'backward', None) == 'mosaic'):
        flip('KEEP_WORDS', 'hashed', 'words')
      if _BIAS.value and mosaic_backward:
        impls[f'{name}_xla_sums'] = impls[name]
        patches[f'{name}_xla_sums'] = functools.partial(
            unittest.mock.patch.object, fused_attention, '_mosaic_backward',
            functools.partial(_mosaic_backward_xla_sums, fused_attention._mosaic_backward))  # pylint: disable=protected-access
  for spec in _PALLAS.value:
    blocks_part, rest = spec.split('w')
    bq, bk = map(int, blocks_part.split('x'))
    warps, stages = map(int, rest.split('s'))
    blocks = pallas_attention.BlockSizes(block_q=bq, block_k=bk, block_q_dkv=bq, block_kv_dkv=bk,
                                         block_q_dq=bq, block_kv_dq=bk)
    impls[f'pallas_{bq}x{bk}_w{warps}_no_dropout'] = functools.partial(
        pallas_attention.mha, segment_ids=None, sm_scale=scale, block_sizes=blocks,
        num_warps=warps, num_stages=stages)
  for spec in _MGPU.value:
    from jax.experimental.pallas.ops.gpu import attention_mgpu  # pylint: disable=g-import-not-at-top # noqa: E501
    *sizes, dtype = spec.split('-')
    bq, bkv, steps, bq_dkv, bkv_dkv, bq_dq, bkv_dq, wgs = map(int, sizes)
    config = attention_mgpu.TuningConfig(
        block_q=bq, block_kv=bkv, max_concurrent_steps=steps, block_q_dkv=bq_dkv,
        block_kv_dkv=bkv_dkv, block_q_dq=bq_dq, block_kv_dq=bkv_dq, compute_wgs_bwd=wgs)
    impls[f'mgpu_{spec}_no_dropout'] = functools.partial(
        lambda q, k, v, config, dtype: attention_mgpu.attention(
            q.astype(dtype), k.astype(dtype), v.astype(dtype), config),
        config=config, dtype={'f16': jnp.float16, 'bf16': jnp.bfloat16}[dtype])
  for name, fn in impls.items():
    args = (qkv,) if name.startswith('ours') else (q, k, v)
    loss = lambda *a, fn=fn: jnp.sum((fn(*a) * g).astype(jnp.float32))  # noqa: E731
    step = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    fwd = jax.jit(fn)
    if name.startswith('ours') and _BIAS.value:  # The bias's gradient too, as the model takes it.
      bias_loss = lambda a, bias, fn=fn: jnp.sum(  # noqa: E731
          (fn(a, bias=bias) * g).astype(jnp.float32))
      step = jax.jit(lambda a, grad=jax.grad(bias_loss, argnums=(0, 1)): grad(a, qkv_bias))
    record = {'impl': name, 'batch': b, 'seq': s, 'heads': h,
              'device': jax.devices()[0].device_kind}
    with patches.get(name, contextlib.nullcontext)():
      _time_one(jax, jnp, fn, name, args, step, fwd, record, qkv, g)


def _mosaic_backward_xla_sums(mosaic_backward, *args):
  """mosaic_backward (fused_attention._mosaic_backward, unpatched) on args, its bias gradient
  from an XLA pass over dqkv instead, the first version's way. The kernel still computes its own
  sums (unused here), so against the plain backward this times that XLA pass, not the kernel's
  sums."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  dqkv, *_ = mosaic_backward(*args)
  sums = jnp.sum(dqkv, axis=(0, 1), dtype=jnp.float32)[:, None, :, None, :]
  return (dqkv, *sums)


def _time_one(jax, jnp, fn, name, args, step, fwd, record, qkv, g):
  """Times fwd and step (forward+backward) and, for ours, checks them against the reference;
  prints the record."""
  try:
    for label, f in (('fwd_ms', fwd), ('fwd_bwd_ms', step)):
      jax.block_until_ready(f(*args))
      start = time.perf_counter()
      for _ in range(_CALLS.value):
        out = f(*args)
      jax.block_until_ready(out)
      record[label] = round((time.perf_counter() - start) / _CALLS.value * 1e3, 4)
    if name.startswith('ours'):  # Against the jnp reference of the same function, here.
      reference = functools.partial(fn, impl='xla')
      ref_loss = lambda a: jnp.sum((reference(a) * g).astype(jnp.float32))  # noqa: E731
      diff = lambda a, b: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))  # noqa: E731
      out_ref, grads_ref = jax.jit(reference)(qkv), jax.jit(jax.grad(ref_loss))(qkv)
      record['max_diff_out'] = max(diff(fwd(qkv), out_ref) for _ in range(_CHECKS.value))
      record['max_diff_grads'] = max(diff(step(qkv)[0], grads_ref)
                                     for _ in range(_CHECKS.value))
  except Exception as e:  # Report and go on: pylint: disable=broad-except
    record['error'] = str(e).splitlines()[0][:300]
  print(json.dumps(record), flush=True)


if __name__ == '__main__':
  app.run(main)

"""Multi-device checks for tests/test_sharding.py, run as a script on 8 fake CPU devices.

`python tests/sharding_check.py CHECK...`, each CHECK a preset, `fused_kernels` or
`mesh_mismatch`, prints one JSON object. A preset trains a micro BERT for a few steps once on one
device and then on its mesh shapes (PRESET_SHAPES), and reports each shape's loss and parameter
differences from the one-device run and the shardings the preset gave; `fused_kernels` does the
same for two meshes with the fused LayerNorm and attention kernels; `mesh_mismatch` reports how a
mesh that does not fit the devices fails. Pytest keeps one device; only this process sees eight.
"""

import os
import sys

# Compilation is nearly all of the time here; these CPU codegen flags cut it ~4x and leave the
# SPMD partitioning, which is what is under test, as it is.
FAST_COMPILE_FLAGS = ('--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'
                      ' --xla_cpu_use_fusion_emitters=false')

if __name__ == '__main__':
  os.environ['XLA_FLAGS'] = ' '.join([os.environ.get('XLA_FLAGS', ''), FAST_COMPILE_FLAGS,
                                      '--xla_force_host_platform_device_count=8'])
  os.environ['JAX_PLATFORMS'] = 'cpu'

# pylint: disable=g-import-not-at-top,wrong-import-position
import functools
import json
import tempfile

import jax
import numpy as np

from bert_jax import config_lib
from bert_jax.train import optim
from bert_jax.train import pretrain
from bert_jax import sharding
from bert_jax.train import step as steps
from configs import base

NUM_DEVICES = 8
PRESETS = ('data', 'fsdp', 'fsdp_tensor')
# Mesh shapes (data, fsdp, tensor) per preset: the two that give its sharded axes more than one
# device, one of them beside another axis; together (8, 1, 1), (2, 4, 1), (2, 2, 2) and
# (1, 4, 2), every axis trained, at half the runs of every preset on every shape.
PRESET_SHAPES = {'data': ((8, 1, 1), (2, 2, 2)), 'fsdp': ((2, 4, 1), (1, 4, 2)),
                 'fsdp_tensor': ((2, 2, 2), (1, 4, 2))}
NUM_STEPS = 3
BATCH, SEQ, PREDICTIONS, VOCAB = 8, 16, 3, 128
# Kernels whose shardings the tests inspect, by their path in the parameter tree.
INTERMEDIATE = ('bert', 'encoder', 'layer', 'intermediate', 'dense', 'kernel')
WORD_EMBEDDINGS = ('bert', 'embeddings', 'word_embeddings')


def micro_config(preset='data', mesh=(1, 1, 1), seq=SEQ):
  """A micro BERT (dropout on, fp32) whose sharded dims all divide the mesh axes."""
  config = base.get_config()
  config.model.update(
      vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
      max_position_embeddings=seq, hidden_dropout_rate=0.1, attention_dropout_rate=0.1)
  config.data.update(corpus='builtin', max_seq_length=seq, max_predictions_per_seq=PREDICTIONS,
                     tokenizer_vocab_size=VOCAB)
  config.train.update(batch_size=BATCH, num_steps=10, learning_rate=1e-2, warmup_steps=1)
  config.mesh.update(preset=preset, data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
  return config


def random_batches(num_batches, seed=0, seq=SEQ):
  """Fixed pretraining batches of rows of seq tokens: padded tails, NSP-style segments, some zero
  MLM weights."""
  rng = np.random.default_rng(seed)
  batches = []
  for _ in range(num_batches):
    lengths = rng.integers(seq // 2, seq + 1, BATCH)
    positions = np.arange(seq)
    input_mask = (positions[None] < lengths[:, None]).astype(np.int32)
    segment_ids = ((positions[None] >= lengths[:, None] // 2) * input_mask).astype(np.int32)
    input_ids = rng.integers(5, VOCAB, (BATCH, seq)).astype(np.int32) * input_mask
    masked_lm_positions = np.stack(
        [rng.choice(np.arange(1, n), PREDICTIONS, replace=False) for n in lengths])
    masked_lm_weights = (rng.random((BATCH, PREDICTIONS)) < 0.75).astype(np.float32)
    masked_lm_weights[0] = 1.0  # Never a batch without a prediction.
    batches.append({
        'input_ids': input_ids, 'input_mask': input_mask, 'segment_ids': segment_ids,
        'masked_lm_positions': masked_lm_positions.astype(np.int32),
        'masked_lm_ids': rng.integers(5, VOCAB, (BATCH, PREDICTIONS)).astype(np.int32),
        'masked_lm_weights': masked_lm_weights,
        'next_sentence_labels': rng.integers(0, 2, BATCH).astype(np.int32)})
  return batches


def train(config, batches, devices):
  """As pretrain._train: sharded state, jitted step with shardings and donation, rules in scope.

  Returns (per-step losses, final state, the last step's stats).
  """
  mesh = sharding.create_mesh(config.mesh, devices)
  rules = sharding.logical_axis_rules(config.mesh.preset)
  model = steps.build_model(config)
  tx = optim.create_optimizer(config.train)
  with sharding.activation_rules(mesh, rules):
    state, state_shardings = steps.create_train_state(config, model, tx, mesh, rules)
    batch_shardings = sharding.batch_sharding(mesh)
    train_step = jax.jit(functools.partial(steps.train_step,
                                           loss_fn=steps.pretraining_loss_fn(model), tx=tx),
                         in_shardings=(state_shardings, batch_shardings),
                         out_shardings=(state_shardings, None), donate_argnums=0)
    losses = []
    for batch in batches:
      state, stats = train_step(state, sharding.global_batch(batch, batch_shardings))
      losses.append(float(jax.device_get(stats['loss'])))
  return losses, state, jax.device_get(stats)


def max_diffs(reference, losses, state):
  """Largest absolute differences of the per-step losses and of any final parameter."""
  ref_losses, ref_params = reference
  params = jax.tree.leaves(jax.device_get(state.params))
  assert len(params) == len(ref_params)
  return {'loss': float(np.max(np.abs(np.subtract(losses, ref_losses)))),
          'params': max(float(np.max(np.abs(a - b))) for a, b in zip(params, ref_params))}


def describe(array):
  """An array's PartitionSpec (as JSON), global shape and the shape one device holds."""
  return {'spec': [None if a is None else a if isinstance(a, str) else list(a)
                   for a in array.sharding.spec],
          'shape': list(array.shape),
          'shard_shape': list(array.addressable_shards[0].data.shape),
          'replicated': array.sharding.is_fully_replicated}


def path_of(key_path):
  return tuple(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', None))) for k in key_path)


def layout(state):
  """Shardings of the inspected params, of their Adam moments, and whether all params replicate."""
  out = {'params': {}, 'mu': {}, 'nu': {}}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(state):
    path = path_of(key_path)
    for name in (INTERMEDIATE, WORD_EMBEDDINGS):
      if path[-len(name):] != name:
        continue
      group = 'params' if path[0] == 'params' else next(
          (m for m in ('mu', 'nu') if m in path), None)
      if group:
        out[group]['/'.join(name)] = describe(leaf)
  out['all_params_replicated'] = all(
      x.sharding.is_fully_replicated for x in jax.tree.leaves(state.params))
  out['all_moments_match_params'] = moments_match_params(state)
  return out


def moments_match_params(state):
  """Every Adam mu and nu leaf carries the sharding of the parameter it belongs to."""
  params = {path_of(p): x.sharding for p, x in jax.tree_util.tree_leaves_with_path(state.params)}
  found = 0
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state):
    path = path_of(key_path)
    for moment in ('mu', 'nu'):
      if moment in path:
        param_path = path[path.index(moment) + 1:]
        if param_path not in params or leaf.sharding != params[param_path]:
          return False
        found += 1
  return found == 2 * len(params)


_COMPILES = []  # backend_compile events of this process.


def mesh_mismatch_error(config=None):
  """train_and_evaluate with config.mesh.data=3 on 8 devices (or `config`): the error, and the
  compiles before it."""
  if not _COMPILES:
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _, **kw: _COMPILES.append(event) if 'backend_compile' in event else None)
  compiles_before = len(_COMPILES)
  config = config or micro_config(mesh=(3, 1, 1))
  config.data.tokenizer_cache_dir = ''
  with tempfile.TemporaryDirectory() as tmp:
    workdir = os.path.join(tmp, 'run')
    try:
      pretrain.train_and_evaluate(config, workdir)
      error = None
    except Exception as e:  # noqa: BLE001  # pylint: disable=broad-except
      error = e
    workdir_created = os.path.exists(workdir)
  return {'type': type(error).__name__,
          'is_config_error': isinstance(error, config_lib.ConfigError),
          'message': str(error), 'compile_events': len(_COMPILES) - compiles_before,
          'workdir_created': workdir_created}


def compare_preset(preset):
  """The mesh shapes of `preset` (PRESET_SHAPES) against the same steps on one device."""
  batches = random_batches(NUM_STEPS)
  ref_losses, ref_state, _ = train(micro_config(preset), batches, jax.devices()[:1])
  reference = (ref_losses, jax.tree.leaves(jax.device_get(ref_state.params)))
  cases = {}
  for shape in PRESET_SHAPES[preset]:
    losses, state, _ = train(micro_config(preset, shape), batches, jax.devices())
    cases[case_name(preset, shape)] = {
        'losses': losses, 'reference_losses': ref_losses,
        'diff': max_diffs(reference, losses, state),
        'mesh': list(state.step.sharding.mesh.shape.values()), 'layout': layout(state)}
  return cases


# (preset, mesh shape, row length): rows of 256 take fused_attention's flash kernels.
FUSED_KERNEL_CASES = (('fsdp_tensor', (2, 2, 2), SEQ), ('data', (8, 1, 1), SEQ),
                      ('fsdp_tensor', (2, 2, 2), 256))


def fused_kernel_case_name(preset, shape, seq):
  return f'fused_kernels-{case_name(preset, shape)}-{seq}'


def compare_fused_kernels():
  """layer_norm_impl='pallas' and attention_impl='pallas' (their kernels interpreted on CPU,
  under shard_map; ffn_impl='pallas' too on the data mesh) on a mesh against the same steps on
  one device."""
  cases = {}
  for preset, shape, seq in FUSED_KERNEL_CASES:
    batches = random_batches(NUM_STEPS, seq=seq)
    one, many = micro_config(preset, seq=seq), micro_config(preset, shape, seq)
    for config in (one, many):
      # Unrolled (cuDNN's conditions, which attention_impl='pallas' shares); head_dim 16, the
      # kernels' smallest; one layer, since the kernels are interpreted on CPU and a second layer
      # shards as the first.
      config.model.update(layer_norm_impl='pallas', attention_impl='pallas', scan_layers=False,
                          num_heads=2, num_layers=1)
      if preset == 'data':  # fused_ffn's kernel needs whole feed-forward rows (no tensor axis).
        config.model.update(ffn_impl='pallas', gelu='tanh')
    ref_losses, ref_state, _ = train(one, batches, jax.devices()[:1])
    losses, state, _ = train(many, batches, jax.devices())
    reference = (ref_losses, jax.tree.leaves(jax.device_get(ref_state.params)))
    cases[fused_kernel_case_name(preset, shape, seq)] = {
        'losses': losses, 'reference_losses': ref_losses,
        'diff': max_diffs(reference, losses, state),
        'mesh': list(state.step.sharding.mesh.shape.values())}
  return cases


def case_name(preset, shape):
  return f'{preset}-{"x".join(map(str, shape))}'


def main(checks):
  assert jax.device_count() == NUM_DEVICES, jax.devices()
  results = {'cases': {}}
  for check in checks:
    if check == 'mesh_mismatch':
      results['mesh_mismatch'] = mesh_mismatch_error()
      # The paper's vocabulary (30522 rows) cannot be split 4 ways over tensor=4.
      config = micro_config('fsdp_tensor', (1, 2, 4))
      config.model.vocab_size = 30522
      results['indivisible_vocab'] = mesh_mismatch_error(config)
    elif check == 'fused_kernels':
      results['cases'].update(compare_fused_kernels())
    else:
      results['cases'].update(compare_preset(check))
  print(json.dumps(results))


if __name__ == '__main__':
  main(sys.argv[1:])

"""Gradient accumulation: N micro-batches of B/N rows train as one batch of B rows.

The equality cases use 4 micro-batches of 8 against one batch of 32 (the ratio of 4 x 64 against
256, at CPU size), fp32 and no dropout. `python tests/test_grad_accum.py PRESET...` runs the
multi-device comparison on 8 fake CPU devices and prints one JSON object; the slow test starts it
in a subprocess, as tests/test_sharding.py does, since pytest keeps one device.
"""

import os
import sys

if __name__ == '__main__':
  # tests/sharding_check.py's fast CPU codegen: compiling is nearly all of the time here.
  os.environ['XLA_FLAGS'] = ' '.join([
      os.environ.get('XLA_FLAGS', ''), '--xla_backend_optimization_level=0',
      '--xla_llvm_disable_expensive_passes=true', '--xla_cpu_use_fusion_emitters=false',
      '--xla_force_host_platform_device_count=8'])
  os.environ['JAX_PLATFORMS'] = 'cpu'

# pylint: disable=g-import-not-at-top,wrong-import-position
import json
import signal
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import config_lib
from bert_jax import sharding
from bert_jax.train import optim
from bert_jax.train import pretrain
from bert_jax.train import step as steps
from conftest import assert_refused, micro_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, MICRO_BATCHES, NUM_STEPS = 32, 4, 10
SEQ, PREDICTIONS, VOCAB = 16, 3, 128
ATOL = 1e-6  # fp32: micro-batches and sharded reductions add the same terms in other orders.
# (preset, mesh (data, fsdp, tensor)) on 8 devices; each splits a micro-batch's 8 rows evenly.
MESH_CASES = (('data', (8, 1, 1)), ('fsdp', (2, 4, 1)), ('fsdp_tensor', (2, 2, 2)))


def equality_config(grad_accum_steps=1, preset='data', mesh=(1, 1, 1), **overrides):
  """A micro BERT (fp32, no dropout) whose sharded dims divide every mesh of MESH_CASES."""
  return micro_config(**{
      'model.vocab_size': VOCAB, 'data.tokenizer_vocab_size': VOCAB, 'model.num_heads': 4,
      'model.max_position_embeddings': SEQ, 'data.max_seq_length': SEQ,
      'data.max_predictions_per_seq': PREDICTIONS, 'model.hidden_dropout_rate': 0.0,
      'model.attention_dropout_rate': 0.0, 'train.batch_size': BATCH,
      'train.grad_accum_steps': grad_accum_steps, 'train.learning_rate': 1e-3,
      'train.warmup_steps': 2, 'mesh.preset': preset, 'mesh.data': mesh[0],
      'mesh.fsdp': mesh[1], 'mesh.tensor': mesh[2], **overrides})


def random_batches(num_batches, seed=0):
  """Pretraining batches with padded tails and MLM weights that differ between rows, so that
  the micro-batches hold different numbers of masked positions."""
  rng = np.random.default_rng(seed)
  batches = []
  for _ in range(num_batches):
    lengths = rng.integers(SEQ // 2, SEQ + 1, BATCH)
    positions = np.arange(SEQ)
    input_mask = (positions[None] < lengths[:, None]).astype(np.int32)
    segment_ids = ((positions[None] >= lengths[:, None] // 2) * input_mask).astype(np.int32)
    masked_lm_weights = (rng.random((BATCH, PREDICTIONS)) < 0.6).astype(np.float32)
    masked_lm_weights[0] = 1.0
    batches.append({
        'input_ids': rng.integers(5, VOCAB, (BATCH, SEQ)).astype(np.int32) * input_mask,
        'input_mask': input_mask, 'segment_ids': segment_ids,
        'masked_lm_positions': np.stack([rng.choice(np.arange(1, n), PREDICTIONS, replace=False)
                                         for n in lengths]).astype(np.int32),
        'masked_lm_ids': rng.integers(5, VOCAB, (BATCH, PREDICTIONS)).astype(np.int32),
        'masked_lm_weights': masked_lm_weights,
        'next_sentence_labels': rng.integers(0, 2, BATCH).astype(np.int32)})
  return batches


def train(config, batches, devices):
  """As pretrain._train: the jitted pretraining step on a sharded state, rules in scope.

  Returns (each step's metrics as summarize gives them, final parameters on the host).
  """
  mesh = sharding.create_mesh(config.mesh, devices)
  rules = sharding.logical_axis_rules(config.mesh.preset)
  model, tx = steps.build_model(config), optim.create_optimizer(config.train)
  with sharding.activation_rules(mesh, rules):
    state, state_shardings = steps.create_train_state(config, model, tx, mesh, rules)
    batch_shardings = sharding.batch_sharding(mesh)
    train_step = steps.jit_pretraining_step(config, model, tx, state_shardings, batch_shardings)
    metrics = []
    for batch in batches:
      state, stats = train_step(state, sharding.global_batch(batch, batch_shardings))
      stats = jax.device_get(stats)
      metrics.append({**steps.summarize(model, stats), 'step_loss': float(stats['loss']),
                      'grad_norm': float(stats['grad_norm'])})
  return metrics, jax.device_get(state.params)


def max_param_diff(a, b):
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b) > 0
  return max(float(np.max(np.abs(x - y))) for x, y in zip(leaves_a, leaves_b))


def max_metric_diff(a, b):
  assert [sorted(m) for m in a] == [sorted(m) for m in b]
  return max(abs(x[k] - y[k]) for x, y in zip(a, b) for k in x)


def test_four_micro_batches_of_8_train_as_one_batch_of_32():
  batches = random_batches(NUM_STEPS)
  one_metrics, one_params = train(equality_config(), batches, jax.devices()[:1])
  acc_metrics, acc_params = train(equality_config(MICRO_BATCHES), batches, jax.devices()[:1])
  assert max_param_diff(one_params, acc_params) <= ATOL
  # Loss and accuracies are the whole batch's (sums over all masked positions and pairs).
  assert max_metric_diff(one_metrics, acc_metrics) <= ATOL * 10


def test_each_micro_batch_draws_its_own_dropout_key():
  """A loss that reports its dropout draw: the step's sum is micro-batch i's draw from
  fold_in(step key, i), for every i."""
  def loss_fn(params, batch, rngs, counts=None):
    del counts
    draw = jax.random.uniform(rngs['dropout'])
    return jnp.sum(params['w'] * batch['x']), {'draw': draw}

  rng = jax.random.PRNGKey(3)
  state = steps.TrainState(step=jnp.int32(5), params={'w': jnp.ones(())},
                           opt_state=optax.sgd(0.1).init({'w': jnp.ones(())}), rng=rng)
  batch = {'x': jnp.arange(8.0)}
  _, stats = steps.train_step(state, batch, loss_fn=loss_fn, tx=optax.sgd(0.1),
                              grad_accum_steps=4, counts_fn=lambda b: {})
  step_key = jax.random.fold_in(rng, 5)
  draws = [float(jax.random.uniform(jax.random.fold_in(step_key, i))) for i in range(4)]
  assert len(set(draws)) == 4
  np.testing.assert_allclose(float(stats['draw']), sum(draws), rtol=1e-6)


def test_micro_batch_i_holds_rows_i_plus_multiples_of_n():
  rows = steps.split_rows(jnp.arange(12 * 2).reshape(12, 2), 3)
  assert rows.shape == (3, 4, 2)
  np.testing.assert_array_equal(rows[1, :, 0], [2, 8, 14, 20])  # Rows 1, 4, 7, 10.


@pytest.mark.slow
def test_clm_micro_batches_train_as_one_batch():
  config = dict(objectives='clm', **{'model.causal': True})
  batches = random_batches(3)
  one = train(equality_config(**config), batches, jax.devices()[:1])
  acc = train(equality_config(MICRO_BATCHES, **config), batches, jax.devices()[:1])
  assert max_param_diff(one[1], acc[1]) <= ATOL
  assert max_metric_diff(one[0], acc[0]) <= ATOL * 10


def compile_events():
  """A list that jax appends each backend compile to from now on."""
  events = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, _, **kw: events.append(event) if 'backend_compile' in event else None)
  return events


def test_a_batch_the_micro_batches_cannot_split_is_refused_before_compiling(tmp_path):
  events = compile_events()
  config = micro_config(**{'train.batch_size': 256, 'train.grad_accum_steps': 3})
  workdir = str(tmp_path / 'run')
  with pytest.raises(config_lib.ConfigError) as error:
    pretrain.train_and_evaluate(config, workdir)
  assert 'config.train.batch_size=256' in str(error.value)
  assert 'config.train.grad_accum_steps=3' in str(error.value)
  assert not events and not os.path.exists(workdir)


def test_a_phase2_batch_the_micro_batches_cannot_split_is_named():
  config = micro_config(**{'train.batch_size': 32, 'train.grad_accum_steps': 4,
                           'train.phase2_fraction': 0.1, 'train.phase2_batch_size': 6})
  assert_refused(config, r'phase2_batch_size=6 is not divisible by config\.train\.'
                         r'grad_accum_steps=4')


def test_micro_batches_the_data_devices_cannot_split_are_named():
  config = micro_config(**{'train.batch_size': 32, 'train.grad_accum_steps': 8})
  config_lib.validate(config)
  config_lib.validate_runtime(config, VOCAB, batch_divisor=4)  # 4 rows per micro-batch.
  with pytest.raises(config_lib.ConfigError,
                     match=r'batch_size=32 in config\.train\.grad_accum_steps=8 micro-batches '
                           r'gives 4 rows per micro-batch, not divisible by the 8 devices'):
    config_lib.validate_runtime(config, VOCAB, batch_divisor=8)


def test_the_log_names_the_micro_batches():
  assert pretrain.describe_batch(micro_config(**{'train.batch_size': 256})) == 'batch 256'
  assert pretrain.describe_batch(micro_config(**{
      'train.batch_size': 256, 'train.grad_accum_steps': 4})) == (
          'batch 256 (4 micro-batches of 64)')


# Several devices: a subprocess on 8 fake CPU devices.

def compare_on_meshes():
  """Per MESH_CASES: accumulated on the mesh against one batch on the mesh and on one device."""
  batches = random_batches(NUM_STEPS)
  _, reference = train(equality_config(), batches, jax.devices()[:1])
  results = {}
  for preset, mesh in MESH_CASES:
    one_metrics, one_params = train(equality_config(1, preset, mesh), batches, jax.devices())
    acc_metrics, acc_params = train(equality_config(MICRO_BATCHES, preset, mesh), batches,
                                    jax.devices())
    results[f'{preset}-{"x".join(map(str, mesh))}'] = {
        'params_vs_one_batch': max_param_diff(one_params, acc_params),
        'metrics_vs_one_batch': max_metric_diff(one_metrics, acc_metrics),
        'params_vs_one_device': max_param_diff(reference, acc_params)}
  return results


@pytest.mark.slow
def test_micro_batches_train_as_one_batch_on_8_devices_with_every_preset():
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [
      REPO, os.path.join(REPO, 'tests'), os.environ.get('PYTHONPATH')]))}
  result = subprocess.run([sys.executable, os.path.abspath(__file__)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-5000:]
  cases = json.loads(result.stdout.strip().splitlines()[-1])
  assert sorted(cases) == sorted(f'{p}-{"x".join(map(str, m))}' for p, m in MESH_CASES)
  for name, diffs in cases.items():
    assert diffs['params_vs_one_batch'] <= ATOL, (name, diffs)
    assert diffs['metrics_vs_one_batch'] <= ATOL * 10, (name, diffs)
    assert diffs['params_vs_one_device'] <= ATOL, (name, diffs)


# End to end: the run's loop, checkpoints and resume.

@pytest.mark.slow
def test_sigkill_then_the_same_command_ends_as_an_uninterrupted_accumulating_run(tmp_path):
  import test_train  # pylint: disable=g-import-not-at-top
  test_train._VOCAB_CACHE.append(str(tmp_path / 'vocab-cache'))  # pylint: disable=protected-access
  try:
    run = {'train.grad_accum_steps': 2, 'train.num_steps': 40, 'train.log_every': 10,
           'train.eval_every': 20, 'train.checkpoint_every': 10}
    reference = str(tmp_path / 'uninterrupted')
    test_train.run(reference, **run)
    workdir = str(tmp_path / 'killed')
    process = subprocess.Popen(test_train.command(workdir, **run), cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first_checkpoint = os.path.join(workdir, 'checkpoints', '10')
    deadline = time.time() + 240
    while not os.path.isdir(first_checkpoint) and time.time() < deadline:
      time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = sorted(int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints'))
                   if s.isdigit())
    assert saved and saved[-1] < 40, 'the run was not interrupted'
    result = test_train.run(workdir, **run)
    assert 'Resumed from step' in result.stderr
    assert '(2 micro-batches of 4)' in result.stderr
    test_train.assert_trees_equal(test_train.final_params(workdir, 40),
                                  test_train.final_params(reference, 40))
    assert (test_train.without_timing(test_train.read_metrics(workdir))
            == test_train.without_timing(test_train.read_metrics(reference)))
  finally:
    test_train._VOCAB_CACHE.pop()  # pylint: disable=protected-access


@pytest.mark.slow
def test_both_phases_accumulate_as_one_batch(tmp_path):
  """Phase 1 of batch 8 and phase 2 of batch 4, each in 2 micro-batches, against one batch."""
  import test_streaming  # pylint: disable=g-import-not-at-top
  prepared = test_streaming.write_prepared_with_vocab(tmp_path / 'prepared')
  two_phases = {'data.max_seq_length': 32, 'data.max_predictions_per_seq': 5,
                'train.phase2_fraction': 0.25, 'data.phase2_max_seq_length': 64,
                'data.phase2_max_predictions_per_seq': 10, 'train.phase2_batch_size': 4,
                'model.hidden_dropout_rate': 0.0, 'model.attention_dropout_rate': 0.0}
  params = []
  for accum in (1, 2):
    workdir = str(tmp_path / f'accum{accum}')
    pretrain.train_and_evaluate(test_streaming.tiny_config(
        prepared, **two_phases, **{'train.grad_accum_steps': accum}), workdir)
    params.append(test_streaming.final_params(workdir, 12))
  assert max_param_diff(*params) <= ATOL


if __name__ == '__main__':
  assert jax.device_count() == 8, jax.devices()
  print(json.dumps(compare_on_meshes()))

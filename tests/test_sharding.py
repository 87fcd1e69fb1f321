"""Sharding: every preset on two mesh shapes trains as one device does; the presets really shard.

The multi-device runs happen in subprocesses on 8 fake CPU devices (tests/sharding_check.py), one
per preset, all started together and shared by the tests of this module; pytest keeps 1 device.
"""

import json
import os
import subprocess
import sys

import pytest

import sharding_check
from bert_jax import sharding
from configs import base

pytestmark = pytest.mark.slow  # Every test here runs for many seconds.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATOL = 1e-5  # fp32: reductions split over devices sum in another order.
# One subprocess per preset; the first also checks the mesh-mismatch error.
SUBPROCESS_CHECKS = [['mesh_mismatch', 'data'], ['fsdp'], ['fsdp_tensor'], ['fused_kernels']]
CASES = [(preset, shape) for preset in sharding_check.PRESETS
         for shape in sharding_check.PRESET_SHAPES[preset]]


@pytest.fixture(scope='module')
def multi_device():
  """The merged JSON results of the sharding_check subprocesses, run in parallel."""
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [
      REPO, os.environ.get('PYTHONPATH')]))}
  script = os.path.join(REPO, 'tests', 'sharding_check.py')
  procs = [subprocess.Popen([sys.executable, script, *checks], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for checks in SUBPROCESS_CHECKS]
  results = {'cases': {}}
  try:
    for checks, proc in zip(SUBPROCESS_CHECKS, procs):
      stdout, stderr = proc.communicate(timeout=600)
      assert proc.returncode == 0, f'sharding_check {checks} failed:\n{stderr[-5000:]}'
      result = json.loads(stdout.strip().splitlines()[-1])
      results['cases'].update(result.pop('cases'))
      results.update(result)
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  return results


def case(results, preset, shape):
  return results['cases'][sharding_check.case_name(preset, shape)]


@pytest.mark.parametrize('preset,shape', CASES,
                         ids=[sharding_check.case_name(p, s) for p, s in CASES])
def test_training_matches_one_device(multi_device, preset, shape):
  result = case(multi_device, preset, shape)
  assert result['mesh'] == list(shape)
  assert len(result['losses']) == sharding_check.NUM_STEPS
  assert result['diff']['loss'] <= ATOL, (result['losses'], result['reference_losses'])
  assert result['diff']['params'] <= ATOL


@pytest.mark.parametrize('preset,shape,seq', sharding_check.FUSED_KERNEL_CASES,
                         ids=[sharding_check.fused_kernel_case_name(*c)
                              for c in sharding_check.FUSED_KERNEL_CASES])
def test_fused_kernels_under_shard_map_match_one_device(multi_device, preset, shape, seq):
  """The fused LayerNorm and attention kernels (interpreted) on 8 devices = one device, on short
  rows and on rows of the flash attention kernels."""
  result = multi_device['cases'][sharding_check.fused_kernel_case_name(preset, shape, seq)]
  assert result['mesh'] == list(shape)
  assert result['diff']['loss'] <= ATOL, (result['losses'], result['reference_losses'])
  assert result['diff']['params'] <= ATOL


def test_fsdp_shards_kernels_over_fsdp(multi_device):
  layout = case(multi_device, 'fsdp', (2, 4, 1))['layout']
  kernel = layout['params']['/'.join(sharding_check.INTERMEDIATE)]  # [layers, embed, mlp]
  assert kernel['spec'] == [None, 'fsdp', None]
  assert kernel['shape'] == [2, 32, 64]
  assert kernel['shard_shape'] == [2, 8, 64]
  embeddings = layout['params']['/'.join(sharding_check.WORD_EMBEDDINGS)]  # [vocab, embed]
  assert embeddings['spec'] == [None, 'fsdp']
  assert embeddings['shard_shape'] == [128, 8]


def test_fsdp_shards_adam_moments_like_params(multi_device):
  layout = case(multi_device, 'fsdp', (2, 4, 1))['layout']
  name = '/'.join(sharding_check.INTERMEDIATE)
  assert layout['mu'][name] == layout['nu'][name] == layout['params'][name]
  for preset, shape in CASES:
    assert case(multi_device, preset, shape)['layout']['all_moments_match_params'], (preset,
                                                                                     shape)


def test_fsdp_tensor_splits_mlp_and_vocab_over_tensor(multi_device):
  layout = case(multi_device, 'fsdp_tensor', (1, 4, 2))['layout']
  kernel = layout['params']['/'.join(sharding_check.INTERMEDIATE)]
  assert kernel['spec'] == [None, 'fsdp', 'tensor']
  assert kernel['shard_shape'] == [2, 8, 32]
  embeddings = layout['params']['/'.join(sharding_check.WORD_EMBEDDINGS)]
  assert embeddings['spec'] == ['tensor', 'fsdp']
  assert embeddings['shard_shape'] == [64, 8]
  assert layout['mu']['/'.join(sharding_check.WORD_EMBEDDINGS)] == embeddings


@pytest.mark.parametrize('shape', sharding_check.PRESET_SHAPES['data'])
def test_data_preset_replicates_params(multi_device, shape):
  layout = case(multi_device, 'data', shape)['layout']
  assert layout['all_params_replicated']
  kernel = layout['params']['/'.join(sharding_check.INTERMEDIATE)]
  assert kernel['shard_shape'] == kernel['shape']


def test_mesh_that_does_not_fit_fails_before_compiling(multi_device):
  error = multi_device['mesh_mismatch']
  assert error['is_config_error'], error
  assert 'data=3' in error['message'] and '8 devices' in error['message']
  assert error['compile_events'] == 0
  assert not error['workdir_created']


def test_vocab_the_tensor_axis_cannot_split_fails_before_compiling(multi_device):
  error = multi_device['indivisible_vocab']
  assert error['is_config_error'], error
  message = error['message']
  assert 'word_embeddings (30522, 32)' in message, message
  assert 'config.model.vocab_size=30522' in message and 'multiple of 4 (e.g. 30524)' in message
  assert error['compile_events'] == 0
  assert not error['workdir_created']


def mesh_config(data, fsdp, tensor):
  config = base.get_config().mesh
  config.update(data=data, fsdp=fsdp, tensor=tensor)
  return config


def test_mesh_shape_fills_the_minus_one_axis():
  assert sharding.mesh_shape(mesh_config(-1, 4, 1), 8) == (2, 4, 1)
  assert sharding.mesh_shape(mesh_config(2, -1, 2), 8) == (2, 2, 2)


def test_mesh_shape_rejects_sizes_that_do_not_divide_the_devices():
  with pytest.raises(sharding.MeshError, match=r'data=3.*does not divide the 8 devices'):
    sharding.mesh_shape(mesh_config(3, 1, 1), 8)
  with pytest.raises(sharding.MeshError, match=r'fsdp=3.*does not divide the 8 devices'):
    sharding.mesh_shape(mesh_config(-1, 3, 1), 8)


def test_mesh_shape_rejects_sizes_that_leave_devices_unused():
  with pytest.raises(sharding.MeshError, match=r'has 4 devices, but there are 8; set one axis'):
    sharding.mesh_shape(mesh_config(2, 2, 1), 8)


def test_mesh_shape_rejects_two_minus_ones():
  with pytest.raises(sharding.MeshError, match='at most one -1'):
    sharding.mesh_shape(mesh_config(-1, -1, 1), 8)


@pytest.mark.parametrize('sizes', [(0, 1, 1), (1, 0, 8), (-2, 1, 1)])
def test_mesh_shape_rejects_zero_and_negative_sizes(sizes):
  with pytest.raises(sharding.MeshError, match='sizes must be positive'):
    sharding.mesh_shape(mesh_config(*sizes), 8)


def test_unknown_preset_names_the_valid_ones():
  with pytest.raises(sharding.MeshError,
                     match=r"preset='zero3'; valid presets are \['data', 'fsdp', 'fsdp_tensor'\]"):
    sharding.logical_axis_rules('zero3')

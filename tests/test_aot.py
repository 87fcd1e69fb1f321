"""bert_jax.aot compiles the real train step for TPU topologies on CPU, through libtpu.

Each run is a subprocess: libtpu's compile-only devices and the CPU backend of the other tests
(8 fake devices) stay out of each other's process.
"""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # Every test here runs for many seconds.

REPO = pathlib.Path(__file__).resolve().parent.parent
# The tiny config, shrunk further where a test only needs a compiled step.
MICRO = ('--config.model.vocab_size=512', '--config.model.hidden_size=32',
         '--config.model.intermediate_size=64', '--config.train.batch_size=16')


def require_libtpu():
  """Skips without libtpu (jax[tpu]); fails instead when BERT_JAX_REQUIRE_DATA=1 (CI)."""
  if importlib.util.find_spec('libtpu') is None:
    reason = 'libtpu is not installed; pip install "jax[tpu]" to compile for TPU topologies.'
    if os.environ.get('BERT_JAX_REQUIRE_DATA') == '1':
      pytest.fail(f'BERT_JAX_REQUIRE_DATA=1 but {reason}')
    pytest.skip(reason)


@pytest.fixture(scope='module', autouse=True, name='libtpu')
def fixture_libtpu():
  """Every test here compiles for TPU topologies."""
  require_libtpu()


def run_aot(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'bert_jax.aot', '--config=configs/tiny.py', *args],
                        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


def report_of(*args: str) -> dict:
  result = run_aot(*args)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('topology,num_slices,devices,kind', [
    ('v4:2x2x1', 1, 4, 'TPU v4'),  # megacore: one device per chip
    ('v5e:2x2', 1, 4, 'TPU v5 lite'),
    ('v6e:2x2', 2, 8, 'TPU v6 lite'),  # two slices: the data axis spans DCN
])
def test_tiny_config_compiles_and_fits(topology, num_slices, devices, kind):
  report = report_of(f'--topology={topology}', f'--num_slices={num_slices}',
                     '--layer_probes=false')
  assert report['device_kind'] == kind
  assert report['num_devices'] == devices
  assert math.prod(report['mesh'].values()) == devices
  assert report['mesh']['data'] == devices  # The default mesh: data=-1, all devices.
  assert report['num_slices'] == num_slices
  assert (report['batch'], report['seq']) == (32, 64)
  assert report['fits'] is True
  assert 0 < report['needed_gib'] < report['hbm_per_device_gib']
  assert report['flops_per_device'] > 0 and report['model_flops_per_step'] > 0
  assert report['step_time_s'] > 0 and report['mfu'] > 0
  assert report['compile_s'] > 0


def test_layer_probes_count_every_scanned_layer():
  """XLA costs a scanned layer once; the probes' estimate adds the other layers."""
  report = report_of('--topology=v5e:2x2', '--config.model.num_layers=3', *MICRO)
  probes = report['layer_probes']
  assert probes['flops_per_layer'] > 0 and probes['seconds_per_layer'] > 0
  assert report['flops_per_device'] > report['xla_flops_per_device']
  assert report['step_time_s'] > report['xla_optimal_seconds']
  assert 'probes' in report['step_time_source']
  # Where the bytes go: every part of the model, counted over all layers as the totals are.
  parts = report['bytes_by_part']
  assert all(parts[part] > 0 for part in ('attention', 'feed_forward', 'norms', 'embeddings',
                                          'heads_and_loss', 'optimizer'))
  # The parts' own count against libtpu's: 0.36 on this micro step, 0.77-0.85 on BERT-Large.
  assert 0.2 < report['bytes_by_part_coverage'] < 1.5, report['bytes_by_part_coverage']
  assert abs(sum(report['cycles_by_part_share'].values()) - 1) < 0.01


def test_fsdp_preset_compiles_on_a_two_axis_mesh():
  report = report_of('--topology=v5e:2x2', '--config.mesh.preset=fsdp', '--config.mesh.fsdp=2',
                     '--config.model.num_layers=1', *MICRO)
  assert report['mesh'] == {'data': 2, 'fsdp': 2, 'tensor': 1}
  assert report['preset'] == 'fsdp' and report['fits'] is True


def test_step_too_big_for_hbm_reports_out_of_memory():
  result = run_aot('--topology=v5e:2x2', '--config.train.batch_size=131072')
  assert result.returncode == 2
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report['fits'] is False
  assert 'RESOURCE_EXHAUSTED' in report['out_of_memory']


@pytest.mark.parametrize('args,message', [
    (('--topology=v9z:2x2',), 'not a known TPU topology; valid names look like v3:2x2'),
    (('--topology=v4:3x3x3',), 'libtpu cannot describe it'),
    (('--topology=v5e:2x2', '--config.mesh.fsdp=3'), 'does not divide the 4 devices'),
    (('--topology=v5e:2x2', '--config.mesh.data=2', '--config.mesh.fsdp=2',
      '--config.train.batch_size=30'), 'is not divisible by the 4 devices'),
    (('--topology=v3:2x2', '--config.model.attention_impl=tpu', '--config.model.dtype=bfloat16'),
     'Mosaic does not compile the TPU attention kernels for TPU v3 devices'),
])
def test_bad_setup_fails_before_compiling(args, message):
  result = run_aot(*args)
  assert result.returncode != 0
  assert message in result.stderr
  assert 'Traceback' not in result.stderr

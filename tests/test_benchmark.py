"""bert_jax.benchmark: times the real train step and reports the DESIGN.md fields."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import harness
from bert_jax.tools import benchmark
from bert_jax.core import chips
from bert_jax.tools import gpu_clocks
from bert_jax.train import metrics
from configs import tiny


@pytest.mark.slow
def test_benchmark_reports_throughput_mfu_and_shape(monkeypatch):
  # A GPU's clocks: one reading per read, its clock counting the reads (the peak's come first).
  reads = iter(range(1, 10**6))
  monkeypatch.setattr(gpu_clocks, 'nvml_reader',
                      lambda: lambda: [gpu_clocks.Reading(next(reads), 500.0, 0)])
  config = tiny.get_config()
  config.model.update(hidden_size=32, intermediate_size=64, vocab_size=512)
  config.train.batch_size = 4
  record = benchmark.run(config, num_steps=2, warmup=1)
  assert (record['batch'], record['seq'], record['devices']) == (4, 64, 1)
  assert record['seq_per_s'] > 0 and record['tokens_per_s'] == record['seq_per_s'] * 64
  expected_mfu = (record['seq_per_s'] * metrics.model_flops_per_sequence(config)
                  / record['peak_flops_per_device'])
  assert abs(record['mfu'] - expected_mfu) < 1e-9
  assert record['loss'] > 0
  parts = [record[k] for k in ('lower_seconds', 'compile_seconds', 'first_step_seconds')]
  assert all(part > 0 for part in parts) and sum(parts) <= record['warmup_seconds']
  peak_clocks, clocks = record['peak_clocks'], record['clocks']
  assert peak_clocks['samples'] >= 2 and clocks['samples'] >= 2  # At least the two ends.
  assert clocks['sm_mhz_min'] > peak_clocks['samples']  # Read after the peak, not during it.
  assert clocks['power_w_median'] == 500.0
  assert record['code'] == benchmark.code_fingerprint()
  # No datasheet for a CPU: no MFU against one, and nothing flagged.
  assert (record['datasheet_peak_flops_per_device'], record['mfu_vs_datasheet'],
          record['peak_above_datasheet']) == (None, None, False)


def test_random_batch_masks_distinct_positions_inside_the_row():
  config = tiny.get_config()
  config.train.batch_size = 64
  config.data.update(max_seq_length=24, max_predictions_per_seq=20)
  positions = benchmark.random_batch(config, np.random.default_rng(0))['masked_lm_positions']
  assert positions.shape == (64, 20)
  # 20 of the 22 inner positions a row: drawn with replacement, nearly every row would repeat one.
  assert all(len(set(row)) == 20 for row in positions.tolist())
  assert positions.min() >= 1 and positions.max() <= 22


@pytest.mark.slow
def test_benchmark_of_electra_trains_on_its_random_batches():
  # ELECTRA writes its generator's samples back at the masked positions: a repeated position
  # summed two ids into one outside the vocabulary, and the loss was NaN.
  config = tiny.get_config()
  config.model.update(name='electra', hidden_size=32, intermediate_size=64, vocab_size=512,
                      num_layers=1)
  config.objectives = 'rtd'
  config.train.batch_size = 4
  record = benchmark.run(config, num_steps=1, warmup=1)
  assert np.isfinite(record['loss']) and record['loss'] > 0


@pytest.mark.slow
@pytest.mark.parametrize('model', ['deberta-base', 'deberta-rtd-base', 'modernbert-base',
                                   'xlmr-base'])
def test_benchmark_runs_each_family_recipe_on_its_random_batches(model):
  """The benchmark's shapes of DeBERTa (MLM and v3's RTD), ModernBERT and XLM-R, shrunk: the
  random batches suit each recipe (its masking rate, its generator) and the step trains."""
  config = harness.model_config(model)
  config.model.update(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                      vocab_size=512)
  config.train.update(batch_size=4, grad_accum_steps=1)
  config.data.update(max_seq_length=32,
                     max_predictions_per_seq=harness.predictions(32, config.masking.rate))
  record = benchmark.run(config, num_steps=1, warmup=1)
  assert np.isfinite(record['loss']) and record['loss'] > 0
  expected_mfu = (record['seq_per_s'] * metrics.model_flops_per_sequence(config)
                  / record['peak_flops_per_device'])
  assert record['mfu'] > 0 and abs(record['mfu'] - expected_mfu) < 1e-9


@pytest.mark.parametrize('device_kind, expected', [
    ('NVIDIA H100 80GB HBM3', 989e12), ('NVIDIA H100 PCIe', 756e12), ('NVIDIA H100 NVL', 835e12),
    ('NVIDIA H200', 989e12), ('NVIDIA H200 NVL', 835e12), ('NVIDIA A100-SXM4-80GB', 312e12),
    ('TPU v4', 275e12), ('TPU v3', 61.5e12), ('TPU v5 lite', 197e12), ('TPU v5', 459e12),
    ('TPU v6 lite', 918e12), ('cpu', None), ('NVIDIA GeForce RTX 4090', None)])
def test_datasheet_peak_by_device_name(device_kind, expected):
  """The variants (PCIe, NVL) before the names they contain; TPUs by chips.TPU_SPECS' exact
  device kinds (v5p's 'TPU v5' is not v5e's 'TPU v5 lite'); unknown kinds give None."""
  assert chips.datasheet_peak_flops(device_kind) == expected


def test_peak_fields_flag_a_measured_peak_above_the_datasheet():
  """A measured peak above the datasheet's (10.9 PFLOP/s on an H200 under
  --xla_gpu_autotune_level=0) is flagged; one below it is not, and the MFU against the datasheet
  divides by the datasheet's peak, not the measured one."""
  real = metrics.peak_fields('NVIDIA H200', 800e12, 445e12)
  assert real == {'datasheet_peak_flops_per_device': 989e12,
                  'mfu_vs_datasheet': pytest.approx(445 / 989), 'peak_above_datasheet': False}
  assert metrics.peak_fields('NVIDIA H200', 10.9e15, 445e12)['peak_above_datasheet']
  assert not metrics.peak_fields('NVIDIA H200', 1.0e15, 445e12)['peak_above_datasheet']  # +1%


def test_peak_flops_is_the_best_of_its_trials(monkeypatch):
  """A slow trial (a clock ramp, another process) must not lower the peak: the fastest one of
  the timings counts."""
  durations = iter([0.4, 0.1, 0.2])  # Seconds per trial: the second is the fastest.
  clock = {'now': 0.0, 'start': True}

  def fake_perf_counter():
    if clock['start']:  # A trial's start, then its end after that trial's duration.
      clock['start'] = False
    else:
      clock['now'] += next(durations)
      clock['start'] = True
    return clock['now']

  monkeypatch.setattr(metrics.time, 'perf_counter', fake_perf_counter)
  flops = metrics.measure_peak_flops(trials=3)
  assert flops == pytest.approx(2.0 * 1024**3 * 3 / 0.1)  # 1024^3 fp32, 3 a trial, on CPU.


def test_sweep_batches_reads_a_list_or_double_and_names_a_bad_spec():
  assert benchmark.sweep_batches('32,64,128') == [32, 64, 128]
  assert benchmark.sweep_batches('double') is None
  for bad in ('', 'a,b', '0,8', '32;64', '32,,64'):
    with pytest.raises(ValueError, match=rf"--sweep={bad!r}: give batch sizes >= 1 .* 'double'"):
      benchmark.sweep_batches(bad)


def test_child_record_is_the_last_record_or_the_line_that_says_why():
  def proc(returncode, stdout, stderr):
    return subprocess.CompletedProcess([], returncode, stdout, stderr)

  printed = 'log line\n{"seq_per_s": 1.0}\n{"seq_per_s": 2.0}\n'
  assert benchmark.child_record(proc(0, printed, '')) == {'seq_per_s': 2.0}
  # Printed, then failed at exit: the measurement stands.
  assert benchmark.child_record(proc(-11, printed, 'Segmentation fault')) == {'seq_per_s': 2.0}
  traceback = ('W0000 a warning about an Error that does not matter\nTraceback ...\n'
               'F0000 Check failed: stream->ok()\n')
  assert benchmark.child_record(proc(1, '', traceback)) == {
      'error': 'F0000 Check failed: stream->ok()'}
  assert benchmark.child_record(proc(1, '', 'Invalid benchmark setup: bad\nValueError: x\n')) == {
      'error': 'Invalid benchmark setup: bad'}
  assert benchmark.child_record(proc(1, '', 'torch.OutOfMemoryError: CUDA out of memory.')) == {
      'error': 'out of memory: torch.OutOfMemoryError: CUDA out of memory.'}
  assert benchmark.child_record(proc(9, '', '')) == {'error': 'exit status 9'}


def test_flags_without_sweep_drops_both_spellings():
  args = ['--config=c.py', '--sweep=8,16', '--steps=2', '--sweep', 'double', '--sweeping=1']
  kept = benchmark.flags_without_sweep(args)
  assert kept == ['--config=c.py', '--steps=2', '--sweeping=1']


def _fake_child(fails: dict):
  """A benchmark child process: its record, or the stderr of `fails[batch]`."""
  calls = []

  def child(args):
    calls.append(args)
    batch = int(args[-1].split('=')[1])
    if batch in fails:
      return subprocess.CompletedProcess(args, 1, '', f'W0000 a warning\n{fails[batch]}\n')
    return subprocess.CompletedProcess(args, 0, json.dumps({'batch': batch, 'seq_per_s': 1.0}),
                                       '')
  return child, calls


def test_sweep_double_stops_at_the_first_batch_out_of_memory(capsys):
  oom = ('jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to '
         'allocate 81.00GiB.')
  child, calls = _fake_child({32: oom, 64: oom})
  records = benchmark.sweep(['--config=c.py', '--steps=2'], 'double', 8, child=child)
  assert calls == [['--config=c.py', '--steps=2', f'--config.train.batch_size={b}']
                   for b in (8, 16, 32)]  # The batch override comes last, so it wins.
  assert records[2] == {'batch': 32, 'error': f'out of memory: {oom}'}
  assert records[-1] == {'sweep': 'double', 'batches': [8, 16, 32], 'fits': [8, 16],
                         'largest_batch_that_fits': 16, 'out_of_memory': [32]}
  printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  assert printed == records


def test_sweep_of_a_list_runs_every_batch_and_names_each_failure():
  invalid = 'Invalid benchmark setup: train.batch_size=12 must divide by 8 devices.'
  child, calls = _fake_child({12: invalid})
  records = benchmark.sweep(['--config=c.py'], '8,12,16', 8, child=child)
  assert len(calls) == 3 and records[1] == {'batch': 12, 'error': invalid}
  assert records[-1]['largest_batch_that_fits'] == 16 and records[-1]['out_of_memory'] == []


@pytest.mark.slow
def test_sweep_runs_the_benchmark_once_a_batch_in_its_own_process():
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [sys.executable, '-m', 'bert_jax.benchmark', '--config=configs/tiny.py',
             '--config.model.hidden_size=32', '--config.model.intermediate_size=64',
             '--config.model.vocab_size=512', '--steps=1', '--warmup=1']
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  bad = subprocess.run([*command, '--sweep=4;8'], cwd=repo, env=env, capture_output=True,
                       text=True, check=False)
  assert bad.returncode != 0 and "--sweep='4;8': give batch sizes" in bad.stderr
  done = subprocess.run([*command, '--sweep=2,4'], cwd=repo, env=env, capture_output=True,
                        text=True, check=True)
  *records, summary = [json.loads(line) for line in done.stdout.splitlines()
                       if line.startswith('{')]
  assert [(r['batch'], r['seq'], r['seq_per_s'] > 0) for r in records] == [(2, 64, True),
                                                                             (4, 64, True)]
  assert summary['largest_batch_that_fits'] == 4 and summary['fits'] == [2, 4]


def test_the_peer_sweeps_its_batch_flag_and_names_a_bad_spec():
  child, calls = _fake_child({})
  records = benchmark.sweep(['--model=large', '--seq=512'], '16,32', 16, child=child,
                            batch_flag='--batch')
  assert calls == [['--model=large', '--seq=512', '--batch=16'],
                   ['--model=large', '--seq=512', '--batch=32']]
  assert records[-1]['largest_batch_that_fits'] == 32
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  bad = subprocess.run([sys.executable, 'benchmarks/peer.py', '--sweep=x'], cwd=repo,
                       capture_output=True, text=True, check=False)
  assert bad.returncode == 2 and "--sweep='x': give batch sizes >= 1" in bad.stderr


def test_code_fingerprint_follows_the_sources(tmp_path):
  (tmp_path / 'sub').mkdir()
  (tmp_path / 'a.py').write_text('x = 1\n')
  (tmp_path / 'sub' / 'b.py').write_text('y = 2\n')
  (tmp_path / 'notes.txt').write_text('not code')
  first = benchmark.code_fingerprint(str(tmp_path))
  assert len(first) == 12 and first == benchmark.code_fingerprint(str(tmp_path))
  (tmp_path / 'notes.txt').write_text('still not code')
  assert benchmark.code_fingerprint(str(tmp_path)) == first
  (tmp_path / 'sub' / 'b.py').write_text('y = 3\n')
  changed = benchmark.code_fingerprint(str(tmp_path))
  assert changed != first
  (tmp_path / 'sub' / 'b.py').rename(tmp_path / 'b.py')  # The same contents elsewhere.
  assert benchmark.code_fingerprint(str(tmp_path)) != changed
  assert benchmark.code_fingerprint() == benchmark.code_fingerprint(  # The whole package.
      os.path.dirname(os.path.dirname(benchmark.__file__)))

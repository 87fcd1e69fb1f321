"""bert_jax.benchmark: times the real train step and reports the DESIGN.md fields."""

import pytest

from bert_jax import benchmark
from bert_jax import gpu_clocks
from bert_jax import metrics
from configs import tiny


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

"""bert_jax.benchmark: times the real train step and reports the DESIGN.md fields."""

from bert_jax import benchmark
from bert_jax import metrics
from configs import tiny


def test_benchmark_reports_throughput_mfu_and_shape():
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

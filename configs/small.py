"""A small BERT for ablation sweeps on one GPU: 6 layers, 768 wide, on corpus-large.

The recipe of the sweeps in sweeps/: BERT-Base's width at half its depth, seq 128, batch 256,
the bert-base-uncased vocab, streamed from the prepared corpus-large (a sweep prepares it once:
`data.prepared`), with the Hopper GPU settings of configs/large_gpu.py. The step budget suits a
run of a few minutes on one H200; docs/ablations.md gives the measured throughput. Takes
configs/base.py's arguments (`configs/small.py:layers=4,hidden=512,heads=8,steps=3000`);
`steps=N` keeps the warmup at 10% of the steps unless `warmup` is given.
On a GPU before Hopper, or on CPU/TPU, pass the `xla` settings the run's error names.
"""

import os

from configs import base


def _data(*parts: str) -> str:
  return os.path.join(os.environ.get('BERT_JAX_DATA', 'data'), *parts)


def get_config(arg=None):
  config = base.get_config()
  config.model.update(
      num_layers=6, hidden_size=768, num_heads=12, intermediate_size=3072,
      dtype='bfloat16', attention_impl='pallas', scan_layers=False, gelu='tanh',
      layer_norm_impl='pallas', flat_matmuls=True, ffn_impl='pallas',
      long_attention_backward='mosaic', short_attention_backward='mosaic',
      dropout_rng_impl='rbg')
  config.data.update(
      corpus=','.join([_data('corpus-large', 'enwiki-2015-wikiextractor', '*.xz'),
                       _data('corpus-large', 'gutenberg', '*.xz')]),
      vocab_file=_data('vocab', 'bert-base-uncased-vocab.txt'),
      max_seq_length=128, max_predictions_per_seq=20, eval_fraction=0.01, workers=4)
  config.train.update(
      batch_size=256, num_steps=5000, warmup_steps=500,
      # Measured on one H200 at 5000 steps (docs/ablations.md): a peak of 1e-3 collapses MLM to
      # the unigram prediction (held-out loss 7.3); 4e-4 leaves the plateau by step 2500 and
      # ends at 4.03, 2e-4 at 4.55.
      learning_rate=4e-4,
      eval_batches=16, checkpoint_every=3000, xla_options='xla_gpu_enable_triton_gemm=false')
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config

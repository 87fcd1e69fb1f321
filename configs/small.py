"""A small BERT for ablation sweeps on one GPU: 6 layers, 768 wide, on corpus-large.

The recipe of the sweeps in sweeps/: BERT-Base's width at half its depth, seq 128, batch 256,
the bert-base-uncased vocab, streamed from the prepared corpus-large (a sweep prepares it once:
`data.prepared`), in bf16 with the tanh GELU, computed by the kernels the machine takes
(`kernels`, below: configs/large_gpu.py's on a Hopper GPU). The step budget is the
shortest measured at which pretraining beats random initialisation on SST-2 by 3 points; a sweep
passes `--sweep.steps=5000` for a quick look (a quarter of the time, not yet paying on SST-2).
docs/ablations.md gives the measured throughput. Takes `kernels=` and then configs/base.py's
arguments (`configs/small.py:layers=4,hidden=512,heads=8,steps=3000`); `steps=N` keeps the
warmup at 10% of the steps unless `warmup` is given.

`kernels` picks how the same function is computed, not what it is (the dtype, the tanh GELU and
the dropout PRNG stay, so a sweep's arms compare the same things on any machine): 'hopper' (the
Triton and Mosaic GPU kernels of configs/large_gpu.py, NVIDIA Hopper GPUs), 'tpu' (the Pallas
TPU attention kernel, XLA for the rest), 'xla' (any device), or 'auto' (the default: 'tpu' where
TPU chips are attached, 'hopper' on a Hopper GPU, else 'xla'; found without starting JAX).
"""

import os

from bert_jax.core import chips
from configs import base
from configs import large_gpu

KERNELS = ('auto', 'hopper', 'tpu', 'xla')
# How each computes the recipe's function (config.model; train.xla_options).
KERNEL_SETTINGS = {
    'hopper': large_gpu.HOPPER_KERNELS,
    'tpu': dict(attention_impl='tpu'),
    'xla': dict(attention_impl='xla'),
}


def _data(*parts: str) -> str:
  return os.path.join(os.environ.get('BERT_JAX_DATA', 'data'), *parts)


def get_config(arg=None):
  own, arg = base.split_arguments(arg, ('kernels',))
  kernels = own.get('kernels', 'auto')
  if kernels not in KERNELS:
    raise ValueError(f'Config argument kernels={kernels!r}: expected one of {", ".join(KERNELS)}.')
  if kernels == 'auto':
    kernels = chips.kernels_here()
  config = base.get_config()
  config.model.update(
      num_layers=6, hidden_size=768, num_heads=12, intermediate_size=3072,
      dtype='bfloat16', gelu='tanh', dropout_rng_impl='rbg', **KERNEL_SETTINGS[kernels])
  config.data.update(
      corpus=','.join([_data('corpus-large', 'enwiki-2015-wikiextractor', '*.xz'),
                       _data('corpus-large', 'gutenberg', '*.xz')]),
      vocab_file=_data('vocab', 'bert-base-uncased-vocab.txt'),
      max_seq_length=128, max_predictions_per_seq=20, eval_fraction=0.01, workers=4)
  config.train.update(
      # 20,000 steps is where pretraining pays on SST-2 (docs/ablations.md, one H200): fine-tuned
      # from 5,000 / 10,000 / 15,000 / 20,000 steps it scores 79.8 / 81.1 / 82.7 / 83.7, against
      # 79.7 from random initialisation; a run takes about 7.5 minutes.
      batch_size=256, num_steps=20000, warmup_steps=2000,
      # Measured at 5000 steps: a peak of 1e-3 collapses MLM to the unigram prediction (held-out
      # loss 7.3); 4e-4 leaves the plateau by step 2500 and ends at 4.03, 2e-4 at 4.55.
      learning_rate=4e-4,
      eval_batches=16, checkpoint_every=3000)
  if kernels == 'hopper':
    config.train.xla_options = large_gpu.HOPPER_XLA_OPTIONS
  if arg:
    base.apply_pretraining_arguments(config, arg)
  return config

"""Trace and CUDA lowering time of the train step, on any machine:
`python experiments/lowering_time.py --config=configs/large_gpu.py [--config.KEY=VALUE]`.

Traces bert_jax.train.step.train_step (the model with its Pallas kernels as on a Hopper GPU: the
Triton and Mosaic GPU kernels, not their interpreter) on abstract state and batch, and lowers it
for CUDA, without a GPU: the part of a run's warm-up spent in Python before XLA compiles.
Prints one JSON object: trace_seconds, lower_seconds, module_mb (the lowered StableHLO's text)
and the shape. experiments/perf_notes.md ("Each kernel traced and lowered once per model")
compares the layers' kernels lowered once (fused_norm.lowered_once) against once a layer.
"""

import functools
import json
import os
import sys
import time
from unittest import mock

from absl import app
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Training config file.')


def main(argv):
  del argv
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.kernels.gpu import fused_ffn  # pylint: disable=g-import-not-at-top
  from bert_jax.train import optim  # pylint: disable=g-import-not-at-top
  from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
  config = _CONFIG.value
  # The kernels as on a Hopper GPU (an H100's 132 SMs: the CPU device has no count).
  launchers = {name: functools.partial(getattr(fused_ffn, name), sms=132)
               for name in ('gelu_matmul', 'dgelu_matmul')}
  with mock.patch.object(jax, 'default_backend', lambda: 'gpu'), \
       mock.patch.object(fused_ffn, 'on_hopper', lambda: True), \
       mock.patch.multiple(fused_ffn, **launchers):
    model, tx = steps.build_model(config), optim.create_optimizer(config.train)
    state = nn.meta.unbox(steps.abstract_train_state(config, model, tx))
    batch = steps.dummy_batch(config.train.batch_size, config.data.max_seq_length,
                              config.data.max_predictions_per_seq)
    step = jax.jit(functools.partial(steps.train_step, model=model, tx=tx))
    start = time.perf_counter()
    traced = step.trace(state, batch)
    traced_at = time.perf_counter()
    lowered = traced.lower(lowering_platforms=('cuda',))
    lowered_at = time.perf_counter()
  print(json.dumps({
      'layers': config.model.num_layers, 'hidden': config.model.hidden_size,
      'batch': config.train.batch_size, 'seq': config.data.max_seq_length,
      'trace_seconds': traced_at - start, 'lower_seconds': lowered_at - traced_at,
      'module_mb': len(lowered.as_text()) / 1e6}))


if __name__ == '__main__':
  app.run(main)

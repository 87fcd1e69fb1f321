"""Where a train step's time goes: forward, forward+backward, and the whole step, per variant.

  python experiments/bench_breakdown.py --config=configs/large.py --variants='base;scan=off' \
      [--config.KEY=VALUE ...]

A variant is `name:KEY=VALUE,KEY=VALUE` of config overrides (model.*, train.*), or `base` for the
config as given. Prints one JSON line per variant (milliseconds, median of --steps timed calls)
and a table; the device is named in every line.
"""

import functools
import json
import os
import statistics
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.tools import benchmark  # pylint: disable=g-import-not-at-top,wrong-import-position

# --config and --steps are bert_jax.benchmark's flags (defined when it is imported).
_CONFIG, _STEPS = benchmark._CONFIG, benchmark._STEPS  # pylint: disable=protected-access
_VARIANTS = flags.DEFINE_string('variants', 'base', 'Semicolon-separated name:KEY=VALUE,...')


def parse_variant(text):
  name, _, overrides = text.partition(':')
  pairs = [item.split('=', 1) for item in overrides.split(',') if item]
  return name, pairs


def apply(config, pairs):
  import copy  # pylint: disable=g-import-not-at-top
  config = copy.deepcopy(config)
  for key, value in pairs:
    section, leaf = key.split('.')
    current = config[section][leaf]
    config[section][leaf] = (value.lower() == 'true' if isinstance(current, bool)
                             else type(current)(value))
  return config


def timed(fn, *args, steps):
  import jax  # pylint: disable=g-import-not-at-top
  out = fn(*args)
  jax.block_until_ready(out)
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    times.append(time.perf_counter() - start)
  return 1000 * statistics.median(times)


def measure(config, steps):
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.train import step as steps_lib  # pylint: disable=g-import-not-at-top
  setup = benchmark.Setup(config)
  model, tx, state, batch = setup.model, setup.tx, setup.state, setup.batch
  with setup.in_mesh():
    rng = jax.random.key(1)

    def loss(params):
      outputs = model.apply({'params': params}, batch['input_ids'], batch['segment_ids'],
                            batch['input_mask'], batch['masked_lm_positions'],
                            deterministic=False, rngs={'dropout': rng})
      return steps_lib.total_loss(steps_lib.pretraining_losses(outputs, batch))

    options = config_lib.xla_options(config)  # As steps.jit_train_step compiles the step.
    forward = jax.jit(loss, compiler_options=options or None)
    backward = jax.jit(jax.grad(loss), compiler_options=options or None)
    step = jax.jit(functools.partial(steps_lib.train_step, model=model, tx=tx),
                   compiler_options=options or None)
    result = {'forward_ms': timed(forward, state.params, steps=steps),
              'forward_backward_ms': timed(backward, state.params, steps=steps)}
    # The whole step, not donated here so the same state can be reused.
    result['step_ms'] = timed(step, state, batch, steps=steps)
  result['seq_per_s'] = 1000 * config.train.batch_size / result['step_ms']
  result['optimizer_ms'] = result['step_ms'] - result['forward_backward_ms']
  result['device'] = jax.devices()[0].device_kind
  return result


def main(argv):
  del argv
  rows = []
  for text in _VARIANTS.value.split(';'):
    name, pairs = parse_variant(text)
    result = {'variant': name, 'overrides': dict(pairs),
              **measure(apply(_CONFIG.value, pairs), _STEPS.value)}
    print(json.dumps(result), flush=True)
    rows.append(result)
  print('\n| variant | forward ms | fwd+bwd ms | step ms | seq/s |\n|---|---|---|---|---|')
  for r in rows:
    print(f'| {r["variant"]} | {r["forward_ms"]:.1f} | {r["forward_backward_ms"]:.1f} | '
          f'{r["step_ms"]:.1f} | {r["seq_per_s"]:.0f} |')


if __name__ == '__main__':
  app.run(main)

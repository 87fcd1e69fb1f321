"""A run says when it waits for XLA: each jitted step's first call with a new shape is logged
before ('Compiling ...') and after (how long it took, how long XLA compiled)."""

import re

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.train import metrics


def messages(caplog):
  """What bert_jax's step wrapper logged (not JAX's own start-up lines)."""
  return [r.getMessage() for r in caplog.records
          if r.pathname.replace('\\', '/').endswith('bert_jax/train/metrics.py')]


def test_a_step_says_when_it_compiles_once_for_each_new_shape(caplog):
  caplog.set_level('INFO')
  # As a train step: (state, batch); a new batch shape compiles again.
  step = metrics.announced(jax.jit(lambda scale, x: x * scale), 'the scaling step')
  np.testing.assert_array_equal(step(2.0, jnp.ones(3)), [2.0, 2.0, 2.0])
  first = messages(caplog)
  assert first[0] == 'Compiling the scaling step...'
  assert re.fullmatch(r'The scaling step ready in [\d.]+ s \(XLA compiled for [\d.]+ s\)\.',
                      first[1]), first
  assert len(first) == 2
  np.testing.assert_array_equal(step(5.0, jnp.zeros(3)), [0.0, 0.0, 0.0])
  assert messages(caplog) == first  # The same shapes: no compilation, nothing said.
  np.testing.assert_array_equal(step(3.0, jnp.ones(4)), [3.0] * 4)
  assert messages(caplog)[2:] == ['Compiling the scaling step...', messages(caplog)[3]]
  assert messages(caplog)[3].startswith('The scaling step ready in ')

"""What every registered attention kernel owes, checked over ops.ATTENTION_KERNELS at collection:
a kernel a plugin registers (tests/registered_kernels.py, as a user's package would; see
test_kernel_registry.py's proof) is checked here with no edit to this file. The built-in
implementations have their own files (test_fused_attention.py, test_tpu_attention.py,
test_local_attention.py).

In each family whose validation takes it (at odd sizes, as test_families.py builds them), and in
BERT with causal attention: the MLM logits and every parameter's gradient equal the 'xla'
path's. A kernel with dropout draws its masks from the 'dropout' rng stream: the same key gives
the same output, another key another.
"""

import jax
import numpy as np
import pytest

import hf_parity
from bert_jax import config_lib
from bert_jax import models
from bert_jax import ops
from bert_jax.interop import param_tree
from bert_jax.train import step as steps

# Those that run on this backend (the others are refused there: test_kernel_registry.py).
KERNELS = [name for name in ops.ATTENTION_KERNELS.available()
           if jax.default_backend() in ops.ATTENTION_KERNELS.get(name).platforms]
if not KERNELS:
  pytest.skip('no attention kernel is registered for this backend (a plugin registers one: '
              '-p registered_kernels)', allow_module_level=True)
CAUSAL = 'bert_causal'
# float32 on CPU: another order of the same sums.
LOGITS_TOLERANCE, GRADIENT_RTOL, GRADIENT_ATOL = 1e-4, 1e-4, 1e-5


def kernel_config(kernel: str, variant: str):
  """(config with the kernel, its 'xla' twin) of a family (or CAUSAL: BERT trained with clm);
  skips a family whose validation refuses the kernel, with its reason."""
  config = hf_parity.family_config('bert' if variant == CAUSAL else variant)
  if variant == CAUSAL:
    config.objectives, config.model.causal = 'clm', True
  if not ops.ATTENTION_KERNELS.get(kernel).dropout:
    config.model.attention_dropout_rate = 0.0
  reference = config.copy_and_resolve_references()
  config.model.attention_impl = kernel
  try:
    config_lib.validate(config)
  except config_lib.ConfigError as e:
    pytest.skip(f'{variant} refuses attention_impl={kernel!r}: {e}')
  return config, reference


def logits_and_gradients(params, config, inputs):
  """(the MLM or CLM logits, every parameter's gradient of their sum, flattened)."""
  key = 'clm_logits' if config.model.causal else 'mlm_logits'

  def logits(p):
    return steps.build_model(config).apply({'params': p}, inputs)[key]
  out, vjp = jax.vjp(logits, params)
  return np.asarray(out), param_tree.flatten(vjp(np.ones_like(out))[0])


def inputs_of(config) -> dict:
  """hf_parity's rows (two of three padded) for the config's vocabulary and segments."""
  return hf_parity.batch({'vocab_size': config.model.vocab_size,
                          'type_vocab_size': config.model.get('type_vocab_size', 0)})


@pytest.mark.parametrize('variant', [*models.available(), CAUSAL])
@pytest.mark.parametrize('kernel', KERNELS)
def test_it_computes_the_xla_paths_logits_and_gradients(kernel, variant):
  config, reference = kernel_config(kernel, variant)
  params, inputs = hf_parity.random_params(reference), inputs_of(config)
  logits, grads = logits_and_gradients(params, config, inputs)
  want_logits, want_grads = logits_and_gradients(params, reference, inputs)
  assert hf_parity.max_diff(logits, want_logits) < LOGITS_TOLERANCE
  assert set(grads) == set(want_grads)
  for key, grad in want_grads.items():
    np.testing.assert_allclose(grads[key], grad, rtol=GRADIENT_RTOL, atol=GRADIENT_ATOL,
                               err_msg=key)


@pytest.mark.parametrize('kernel', [k for k in KERNELS if ops.ATTENTION_KERNELS.get(k).dropout])
def test_its_dropout_masks_come_from_the_dropout_stream(kernel):
  config, _ = kernel_config(kernel, 'bert')
  config.model.hidden_dropout_rate, config.model.attention_dropout_rate = 0.0, 0.3
  params, inputs = hf_parity.random_params(config), inputs_of(config)
  model = steps.build_model(config)

  def logits(seed):
    return np.asarray(model.apply({'params': params}, inputs, deterministic=False,
                                  rngs={'dropout': jax.random.key(seed)})['mlm_logits'])
  assert hf_parity.max_diff(logits(0), logits(0)) == 0.0
  assert hf_parity.max_diff(logits(0), logits(1)) > 1e-3

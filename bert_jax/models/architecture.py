"""The config.model keys of the families, derived once: each family unit's own keys (models/<name>/
config.py, KEY_UNITS) composed for configs and validation, and the architecture keys a
checkpoint fixes, for all who need them: init_from adopts them from its source, an HF import
checks them against config.json, a sweep's randomly initialised fine-tuning copies them from its
pretraining run, a distillation teacher states BERT's and takes BERT's values of the rest.

No jax here: configs/base.py and config_lib load this module without the encoders. It stands
above the unit configs it composes (models/__init__ imports none of them).
"""

from bert_jax.core import schema
from bert_jax.models import encoder
from bert_jax.models.deberta import config as deberta_keys
from bert_jax.models.modernbert import config as modernbert_keys
from bert_jax.models.xlm import config as xlm_keys

# The families whose own config.model keys, or whose check of the shared keys they own, are
# declared in their folder (models/<name>/config.py: the keys with defaults, ranges and
# meanings, and their check). A family defined outside this package adds its unit here
# (tests/test_family_unit.py).
KEY_UNITS = {'modernbert': modernbert_keys, 'deberta': deberta_keys, 'xlm': xlm_keys}

# The architecture keys of the shared encoder (models/encoder.py): the sizes every checkpoint's
# config states, and the switches whose BERT value a source that lacks them implies.
SHAPE_KEYS = schema.architecture(encoder.KEYS, 'shape')
_SWITCH_NAMES = schema.architecture(encoder.KEYS, 'switch')
ENCODER_SWITCHES = {f.name: f.default for f in encoder.KEYS if f.name in _SWITCH_NAMES}


def unit_defaults() -> dict:
  """{key: default} of every family unit's config.model keys (configs/base.py carries them)."""
  return {key: value for unit in KEY_UNITS.values() for key, value in unit.DEFAULTS.items()}


def unit_ranges() -> dict:
  """{'model.key': Range} of every family unit's keys that declare one (config_lib's RANGES),
  read at each call: a unit added since counts."""
  return {key: valid for unit in KEY_UNITS.values() for key, valid in unit.RANGES.items()}


def pretraining_only_defaults() -> dict:
  """{key: default} of the config.model keys that only pretraining may set (fine-tuning builds
  the encoder without them: DeBERTa's mask decoder; rtd's embedding sharing, whose tables a
  workdir's encoder holds materialised): the family units' and the shared encoder's."""
  shared = {f.name: f.default for f in encoder.KEYS
            if f.name in schema.pretraining_only(encoder.KEYS)}
  return {**{key: unit.DEFAULTS[key] for unit in KEY_UNITS.values()
             for key in unit.PRETRAINING_ONLY}, **shared}


def check_units(config, objective_names: list[str]) -> None:
  """Each family unit's check of its own keys: a family refuses its keys under another
  family's name and checks them under its own."""
  for unit in KEY_UNITS.values():
    unit.check(config, objective_names)


# The values a source implies for the architecture keys its config lacks (a workdir written
# before the key existed, an HF config of another family): BERT's.
SOURCE_DEFAULTS = {'name': 'bert', **ENCODER_SWITCHES,
                   **{key: unit.DEFAULTS[key] for unit in KEY_UNITS.values()
                      for key in unit.ARCHITECTURE}}
# The architecture: the config.model keys a checkpoint fixes.
ARCHITECTURE_KEYS = ('name', *SHAPE_KEYS, *(key for key in SOURCE_DEFAULTS if key != 'name'))

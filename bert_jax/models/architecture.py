"""The config.model keys of the families, derived once: each family unit's own keys (models/<name>/
config.py, KEY_UNITS) composed for configs and validation, and the architecture keys a
checkpoint fixes, for all who need them: init_from adopts them from its source, an HF import
checks them against config.json, a sweep's randomly initialised fine-tuning copies them from its
pretraining run, a distillation teacher is described by BERT's.

No jax here: configs/base.py and config_lib load this module without the encoders. It stands
above the unit configs it composes (models/__init__ imports none of them).
"""

from bert_jax.models.deberta import config as deberta_keys
from bert_jax.models.modernbert import config as modernbert_keys

# The families whose own config.model keys are declared in their folder (models/<name>/config.py:
# the keys with defaults, ranges and meanings, and their check). A family defined outside this
# package adds its unit here (tests/test_family_unit.py).
KEY_UNITS = {'modernbert': modernbert_keys, 'deberta': deberta_keys}

# config.model keys that describe BERT's architecture (a distillation teacher's, which is BERT-
# shaped); ARCHITECTURE_KEYS below adds every family's switches.
BERT_ARCHITECTURE_KEYS = ('name', 'vocab_size', 'hidden_size', 'embedding_size', 'num_layers',
                          'num_heads', 'intermediate_size', 'max_position_embeddings',
                          'type_vocab_size', 'layer_norm_eps', 'causal')
# The modern encoder's switches that shared code reads (configs/base.py) and BERT's values of
# them; ModernBERT's own keys are its unit's.
MODERN_DEFAULTS = {'norm': 'layer_norm', 'use_bias': True, 'feed_forward': 'gelu',
                   'positions': 'absolute'}


def unit_defaults() -> dict:
  """{key: default} of every family unit's config.model keys (configs/base.py carries them)."""
  return {key: value for unit in KEY_UNITS.values() for key, value in unit.DEFAULTS.items()}


def unit_ranges() -> dict:
  """{'model.key': Range} of every family unit's keys that declare one (config_lib's RANGES),
  read at each call: a unit added since counts."""
  return {key: valid for unit in KEY_UNITS.values() for key, valid in unit.RANGES.items()}


def pretraining_only_defaults() -> dict:
  """{key: default} of the unit keys that only pretraining may set (fine-tuning builds the
  encoder without them: DeBERTa's mask decoder)."""
  return {key: unit.DEFAULTS[key] for unit in KEY_UNITS.values()
          for key in unit.PRETRAINING_ONLY}


def check_units(config, objective_names: list[str]) -> None:
  """Each family unit's check of its own keys: a family refuses its keys under another
  family's name and checks them under its own."""
  for unit in KEY_UNITS.values():
    unit.check(config, objective_names)


# Every family's architecture switches beyond BERT's keys, with BERT's values of them (a source
# checkpoint's config.json lacks the keys of families other than its own).
SWITCH_DEFAULTS = {**MODERN_DEFAULTS,
                   **{key: unit.DEFAULTS[key] for unit in KEY_UNITS.values()
                      for key in unit.ARCHITECTURE},
                   # XLM's.
                   'num_languages': 0}

# The architecture: the config.model keys a checkpoint fixes.
ARCHITECTURE_KEYS = BERT_ARCHITECTURE_KEYS + tuple(SWITCH_DEFAULTS)
# The values a source implies for the keys its config lacks (a workdir written before the key
# existed, an HF config of another family); the shape keys every source states.
SOURCE_DEFAULTS = {'name': 'bert', 'embedding_size': 0, 'causal': False, **SWITCH_DEFAULTS}

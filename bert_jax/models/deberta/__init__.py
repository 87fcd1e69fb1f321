"""DeBERTa (models registry name 'deberta'), one folder: its config keys and their check
(config.py, no jax) and the encoder (model.py, which registers the family).

The encoder's names are read through this package (`deberta.DebertaModel`) and load model.py
when first asked for, so that configs and validation import config.py without jax.
"""

import importlib


def __getattr__(name):
  if name in ('config', 'model') or name.startswith('__'):
    # A submodule not imported yet (`from ... import config` asks here first), or a dunder.
    raise AttributeError(name)
  return getattr(importlib.import_module('bert_jax.models.deberta.model'), name)

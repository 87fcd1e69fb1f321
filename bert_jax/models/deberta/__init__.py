"""DeBERTa (models registry name 'deberta'), one folder: its config keys and their check
(config.py, no jax) and the encoder (model.py, which registers the family).

The encoder's names are read through this package (`deberta.DebertaModel`) and load model.py
when first asked for, so that configs and validation import config.py without jax.
"""

from bert_jax.core import registry

__getattr__ = registry.lazy_attributes('bert_jax.models.deberta.model')

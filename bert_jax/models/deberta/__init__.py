"""DeBERTa, the models registry's 'deberta': one folder holding the encoder (model.py, which
registers the family), its Hugging Face layout (hf.py) and its config.model keys with their check
(config.py).

The package's names (`deberta.DebertaModel`) are model.py's, loaded when first read: the HF
layout, configs and validation load without jax.
"""

from bert_jax.core import registry

__getattr__ = registry.lazy_attributes('bert_jax.models.deberta.model')

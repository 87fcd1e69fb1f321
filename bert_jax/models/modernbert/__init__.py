"""ModernBERT, the models registry's 'modernbert': one folder holding the encoder (model.py, which
registers the family), its Hugging Face layout (hf.py) and the layer pattern both read (config.py).

The package's names (`modernbert.ModernBertModel`) are model.py's, loaded when first read: the HF
layout and configs load without jax.
"""

from bert_jax.core import registry

__getattr__ = registry.lazy_attributes('bert_jax.models.modernbert.model')

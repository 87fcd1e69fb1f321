"""ELECTRA, the models registry's 'electra': one folder holding the encoder (model.py, which
registers the family) and its Hugging Face layout (hf.py).

The package's names (`electra.ElectraModel`) are model.py's, loaded when first read: the HF layout
and configs load without jax.
"""

from bert_jax.core import registry

__getattr__ = registry.lazy_attributes('bert_jax.models.electra.model')

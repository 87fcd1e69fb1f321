"""BERT, the models registry's 'bert': one folder holding the encoder (model.py, which registers the
family) and its Hugging Face layout (hf.py). Its encoder is the one the other families build on:
`bert.BertModel` and its layers, on the shared config (models/encoder.py:EncoderConfig).

The package's names (`bert.BertModel`) are model.py's, loaded when first read: the HF layout and
configs load without jax.
"""

from bert_jax.core import registry

__getattr__ = registry.lazy_attributes('bert_jax.models.bert.model')

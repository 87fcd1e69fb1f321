"""DistilBERT's encoder (models registry name 'distilbert'): BERT's without segments or pooler.

Sanh et al. (2019) keep BERT's post-LN layers and take out the token-type embeddings and the
pooler; the student is half the teacher's depth at its width. HF's DistilBertModel computes
what BertModel does with other names: `embeddings.{word,position}_embeddings` and `LayerNorm`,
each layer's `attention.{q,k,v,out}_lin`, `sa_layer_norm` (after the attention's residual),
`ffn.lin1`/`lin2` and `output_layer_norm` (after the feed-forward's); the MLM head
`vocab_transform`, GELU, `vocab_layer_norm` and `vocab_projector` (tied, with a bias) is our
`predictions`. Our tree is BERT's (hf.py maps the names), less
`bert/embeddings/token_type_embeddings` and `bert/pooler`; the pooled output is the [CLS] state,
which fine-tuning reads through DistilBertForSequenceClassification's `pre_classifier` (Dense,
ReLU) before its classifier.
"""

import dataclasses

from bert_jax import models
from bert_jax.models import bert
from bert_jax.models.distilbert import hf as distilbert_hf
from bert_jax.models.encoder import EncoderConfig


def config_from(config) -> EncoderConfig:
  """The run's ConfigDict -> BERT's config without the segment table and the pooler."""
  return dataclasses.replace(EncoderConfig.from_config(config), token_types=False,
                             pooler=False)


def encoder_flops(model, length: int) -> float:
  """BERT's encoder FLOPs (DESIGN.md's formula) less the pooler's 2*h*h: forward FLOPs of one
  sequence of `length` tokens."""
  return bert.encoder_flops(model, length) - 2 * model.hidden_size * model.hidden_size


FAMILY = models.register(models.Family(name='distilbert', config_from=config_from,
                                       encoder=bert.BertModel, flops=encoder_flops,
                                       pre_classifier=True, hf=distilbert_hf.LAYOUT))

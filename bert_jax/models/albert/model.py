"""ALBERT's encoder (models registry name 'albert'): factorised embeddings, one shared layer.

Lan et al. (2019): the embedding tables are model.embedding_size (E) wide and a dense layer,
`encoder/embedding_hidden_mapping_in`, projects them to hidden_size (H); every one of the
num_layers layers applies the same parameters (`encoder/shared_layer`: BERT's layer, post-LN,
the same names and logical axes, without the `layers` axis). Under model.scan_layers the scan
broadcasts those parameters to every iteration; unrolled, one module is called num_layers times.
The MLM head reads E-wide states (objectives/mlm.py: Dense H -> E, gelu, LayerNorm(E), logits
against the E-wide word embeddings); SOP is objectives/sop.py.
"""

import flax.linen as nn
import jax.numpy as jnp

from bert_jax import models
from bert_jax.models import bert
from bert_jax.models import layers
from bert_jax.models.albert import hf as albert_hf
from bert_jax.models.encoder import EncoderConfig

# Why layer-wise learning-rate decay (train/optim.py) refuses ALBERT, after
# 'config.train.layerwise_lr_decay[=value]'.
SHARED_LAYERS_REFUSAL = ("needs each layer's own parameters, and ALBERT's layers share one set "
                         "('bert/encoder/shared_layer'): set it to 0 for model.name='albert'.")

class AlbertEncoder(nn.Module):
  """E -> H projection, then one BertLayer's parameters applied num_layers times.

  Returns the last layer's output, or with return_all_layers every application's output stacked:
  [layers, batch, length, embed].
  """
  config: EncoderConfig
  return_all_layers: bool = False

  @nn.compact
  def __call__(self, x, bias, deterministic):
    cfg = self.config
    if cfg.attention_impl == 'cudnn' and cfg.attention_dropout_rate > 0 and not deterministic:
      # cuDNN's dropout is seeded per layer index, and a shared layer has one index: every
      # application would drop the same probabilities.
      raise ValueError("ALBERT's shared layer with attention_impl='cudnn' and attention dropout "
                       'would repeat one dropout mask in every layer; use attention_impl=\'xla\' '
                       'or attention_dropout_rate=0 (ALBERT v2\'s).')
    x = layers.DenseGeneral(cfg.hidden_size, ('embed', 'embed_out'), dtype=cfg.dtype,
                            param_dtype=cfg.param_dtype, kernel_init=cfg.init,
                            name='embedding_hidden_mapping_in')(x)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))  # [batch, length, H]
    policy = bert.REMAT_POLICIES[cfg.remat_policy]
    if cfg.scan_layers:
      layer_cls = bert.ScannedBertLayer
      if cfg.remat_policy != 'none':
        layer_cls = nn.remat(layer_cls, policy=policy, prevent_cse=False, static_argnums=(3,))
      stack = nn.scan(
          layer_cls, variable_broadcast='params', split_rngs={'params': False, 'dropout': True},
          in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_layers, unroll=cfg.scan_unroll)
      x, outputs = stack(cfg, emit=self.return_all_layers, name='shared_layer')(
          x, bias, deterministic)
      return outputs if self.return_all_layers else x
    layer_cls = bert.BertLayer
    if cfg.remat_policy != 'none':
      layer_cls = nn.remat(layer_cls, policy=policy, static_argnums=(3,))
    layer = layer_cls(cfg, name='shared_layer')
    outputs = []
    for _ in range(cfg.num_layers):
      x = layer(x, bias, deterministic)
      outputs.append(x)
    return jnp.stack(outputs) if self.return_all_layers else x


class AlbertModel(bert.BertModel):
  """BertModel's embeddings (E wide), AlbertEncoder and pooler: (sequence_output, pooled_output);
  `attend` gives logits of E-wide states against the word embeddings."""

  def setup(self):
    cfg = self.config
    self.embeddings = bert.BertEmbeddings(cfg)
    self.encoder = AlbertEncoder(cfg, self.return_all_layers)
    self.pooler = bert.BertPooler(cfg)


def encoder_flops(model, length: int) -> float:
  """BERT's encoder and pooler FLOPs (every application of the shared layer costs a layer's)
  plus the E -> H projection of each token."""
  e = getattr(model, 'embedding_size', 0) or model.hidden_size
  return bert.encoder_flops(model, length) + length * 2 * e * model.hidden_size


FAMILY = models.register(models.Family(name='albert', config_from=EncoderConfig.from_config,
                                       encoder=AlbertModel, flops=encoder_flops,
                                       hf=albert_hf.LAYOUT,
                                       shared_layers=SHARED_LAYERS_REFUSAL))

"""ELECTRA's encoders (models registry name 'electra'): the discriminator, and the generator the
'rtd' objective puts in front of it.

Clark et al. (2020). The discriminator is HF's ElectraModel: BERT's embeddings, E wide
(model.embedding_size; 0 is H), `embeddings_project` (a dense E -> H) when E != H, BERT's
post-LN layers. ElectraModel has no pooler; ours is ElectraClassificationHead's dense + exact
GELU on [CLS] (`pooler/dense`), so that fine-tuning maps ElectraForSequenceClassification's
`classifier.dense` onto it as RoBERTa's (pretraining never reads it; exports leave it out).

The generator (ElectraGenerator) is a BERT encoder of generator_shape's width and the
discriminator's depth, with its own E -> H_g projection. Its MLM head is objectives/mlm.py's
MaskedLmHead at H_g (Dense H_g -> E, GELU, LayerNorm(E), logits against the tied embeddings).
How the two share the embeddings is model.embedding_sharing (models/sharing.py): 'shared', the
reference's, reads the discriminator's embedding module (tables and LayerNorm) and both losses
train it; 'gdes' keeps the discriminator's loss off the generator's tables.
"""

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from bert_jax import models
from bert_jax.models import bert
from bert_jax.models import layers
from bert_jax.models import sharing
from bert_jax.models.electra import hf as electra_hf
from bert_jax.models.encoder import EncoderConfig
from bert_jax.ops import attention as attention_ops

# The reference's generator heads: one per 64 units of its width (get_generator_config).
GENERATOR_HEAD_WIDTH = 64


def generator_shape(model) -> dict:
  """The generator's hidden_size, num_heads, intermediate_size and num_layers from the
  discriminator's (model: config.model or an EncoderConfig): H_g = round(fraction x H),
  max(1, H_g // 64) heads, feed-forward 4 H_g, as google-research/electra's
  get_generator_config, and max(1, round(generator_layer_fraction x L)) layers (its
  `generator_layers`; DeBERTa-v3: half)."""
  hidden = int(round(model.hidden_size * model.generator_fraction))
  depth = max(1, int(round(model.num_layers * getattr(model, 'generator_layer_fraction', 1.0))))
  return {'hidden_size': hidden, 'num_heads': max(1, hidden // GENERATOR_HEAD_WIDTH),
          'intermediate_size': 4 * hidden, 'num_layers': depth}


def generator_config(cfg: EncoderConfig) -> EncoderConfig:
  """The generator's encoder config: the discriminator's with generator_shape's sizes; its
  embed_width stays E (the shared tables')."""
  return dataclasses.replace(cfg, embedding_size=cfg.embed_width, **generator_shape(cfg))


def generator_run_config(config):
  """A run's full config -> the config of its generator alone: a model of its family at the
  generator's shape with config.objectives='mlm' (ElectraForMaskedLM's layout for ELECTRA)."""
  gen = config.copy_and_resolve_references()
  # Alone, the generator shares nothing: its embeddings are the tables it trained.
  gen.model = generator_model(config.model)
  gen.objectives = 'mlm'
  return gen


# An ELECTRA run's generator subtrees -> their places in a generator-alone ('mlm') model.
_GENERATOR_PATHS = (('generator/', 'bert/'), ('generator_predictions/', 'predictions/'))


def generator_params(flat: dict) -> dict:
  """{path: array} of an ELECTRA run -> those of its generator alone (generator_run_config's
  model): the embeddings it reads, the generator's projection, layers and MLM head."""
  out = {k: v for k, v in flat.items()
         if k.startswith('bert/embeddings/') and not sharing.is_discriminator_embedding(k)}
  for path, value in flat.items():
    for ours, theirs in _GENERATOR_PATHS:
      if path.startswith(ours):
        out[theirs + path[len(ours):]] = value
  return out


def attention_bias(cfg: EncoderConfig, input_mask, pair_ids, length: int):
  """What the attention takes for these rows (BertModel's choice, bidirectional only): segment
  ids for the fused kernels, else the additive bias."""
  if attention_ops.takes_segment_ids(cfg.attention_impl, length, cfg.head_dim):
    return (input_mask if pair_ids is None else pair_ids).astype(jnp.int32)
  return layers.row_attention_bias(input_mask, pair_ids, cfg.dtype)


class ElectraPooler(nn.Module):
  """ElectraClassificationHead's dense + exact GELU on [CLS]: [..., embed] -> [..., embed]."""
  config: EncoderConfig

  @nn.compact
  def __call__(self, cls_state):
    cfg = self.config
    # transformers applies get_activation('gelu'), the exact one, whatever hidden_act says.
    return layers.gelu(layers.DenseGeneral(
        cfg.hidden_size, ('embed', 'embed_out'), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=cfg.init, name='dense')(cls_state), 'erf')


def _projection(cfg: EncoderConfig):
  """`embeddings_project`: E -> H, when they differ (None when they do not)."""
  if cfg.embed_width == cfg.hidden_size:
    return None
  return layers.DenseGeneral(cfg.hidden_size, ('embed', 'embed_out'), dtype=cfg.dtype,
                             param_dtype=cfg.param_dtype, kernel_init=cfg.init)


def _encode(cfg, project, encoder, x, input_mask, deterministic, pair_ids):
  """Embedded tokens [batch, length, E] -> the layers' output [batch, length, H] (or every
  layer's, [layers, batch, length, H])."""
  if project is not None:
    x = project(x)
  x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))  # [batch, length, H]
  return encoder(x, attention_bias(cfg, input_mask, pair_ids, x.shape[1]), deterministic)


# BERT's embeddings under gradient-disentangled sharing (model.embedding_sharing='gdes').
GDES_EMBEDDINGS = sharing.gdes(bert.BertEmbeddings)


class ElectraModel(nn.Module):
  """ELECTRA's discriminator: (sequence_output, pooled_output), as BertModel's; `attend` gives
  logits of E-wide states against the word embeddings; `generator_embed` and `generator_attend`
  are the embeddings the generator reads and its tied output (model.embedding_sharing)."""
  config: EncoderConfig
  return_all_layers: bool = False

  def setup(self):
    cfg = self.config
    if cfg.causal:
      raise ValueError("model.causal=True with model.name='electra': ELECTRA is bidirectional; "
                       'set model.causal=False.')
    self.embeddings = (GDES_EMBEDDINGS if cfg.embedding_sharing == 'gdes'
                       else bert.BertEmbeddings)(cfg)
    self.embeddings_project = _projection(cfg)
    self.encoder = bert.BertEncoder(cfg, self.return_all_layers)
    self.pooler = ElectraPooler(cfg)

  def __call__(self, input_ids, segment_ids, input_mask, deterministic=True, position_ids=None,
               pair_ids=None, cls_positions=None):
    # input_ids, segment_ids, input_mask: [batch, length]; packed rows as BertModel's.
    x = self.embeddings(input_ids, segment_ids, deterministic, position_ids, input_mask)
    x = _encode(self.config, self.embeddings_project, self.encoder, x, input_mask,
                deterministic, pair_ids)
    last = x[-1] if self.return_all_layers else x
    return x, self.pooler(layers.first_or_gathered(last, cls_positions))

  def attend(self, x):
    return self.embeddings.attend(x)

  def generator_embed(self, input_ids, segment_ids, deterministic, position_ids=None,
                      input_mask=None):
    """The generator's embedded inputs [batch, length, E]: the discriminator's own ('shared'), or
    the tables only the generator trains ('gdes')."""
    embed = getattr(self.embeddings, 'generator_embed', self.embeddings)
    return embed(input_ids, segment_ids, deterministic, position_ids, input_mask)

  def generator_attend(self, x):
    """The generator's tied output: logits of E-wide states against the word table it reads."""
    return getattr(self.embeddings, 'generator_attend', self.embeddings.attend)(x)


class ElectraGenerator(nn.Module):
  """The generator's encoder on the shared embeddings' output: its own `embeddings_project`
  (E -> H_g) and layers; config is generator_config's."""
  config: EncoderConfig

  def setup(self):
    self.embeddings_project = _projection(self.config)
    self.encoder = bert.BertEncoder(self.config)

  def __call__(self, embedded, input_mask, deterministic, pair_ids=None):
    # embedded: [batch, length, E], the discriminator's embedding module's output.
    return _encode(self.config, self.embeddings_project, self.encoder, embedded, input_mask,
                   deterministic, pair_ids)  # [batch, length, H_g]


def encoder_flops(model, length: int) -> float:
  """The discriminator's forward FLOPs: BERT's layers (DESIGN.md's formula without the pooler,
  which pretraining never runs) and the E -> H projection of each token when E != H."""
  h = model.hidden_size
  e = model.get('embedding_size', 0) or h
  return bert.encoder_flops(model, length) - 2 * h * h + (length * 2 * e * h if e != h else 0)


def generator_model(model):
  """config.model -> the generator's alone (generator_run_config's model): generator_shape's
  sizes, E kept where it differs from H_g, nothing shared."""
  gen = model.copy_and_resolve_references()
  shape = generator_shape(model)
  embed = model.get('embedding_size', 0) or model.hidden_size
  gen.update(shape, embedding_size=0 if embed == shape['hidden_size'] else embed,
             embedding_sharing='shared')
  return gen


def generator_flops(model, length: int) -> float:
  """The generator encoder's forward FLOPs on `length` tokens: its family's encoder FLOPs at
  generator_shape's size (ELECTRA's: its layers and its E -> H_g projection)."""
  return models.get(model.get('name', 'electra')).flops(generator_model(model), length)


FAMILY = models.register(models.Family(name='electra', config_from=EncoderConfig.from_config,
                                       encoder=ElectraModel, flops=encoder_flops,
                                       generator=ElectraGenerator, hf=electra_hf.LAYOUT))

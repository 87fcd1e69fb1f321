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
How the two share the embeddings is model.embedding_sharing:

  'shared'  ELECTRA's: the generator reads the discriminator's embedding module (tables and
            LayerNorm), and both losses train it.
  'gdes'    DeBERTa-v3's gradient-disentangled embedding sharing (He et al., 2021): the tables
            under `bert/embeddings/` are the generator's, trained by its MLM loss alone; the
            discriminator looks up stop_gradient(table) + its own `*_delta` (zeros at the start)
            and normalises with its own `discriminator_LayerNorm`, so the discriminator's loss
            never pulls the generator's tables. discriminator_params materialises its tables
            (table + delta) for export and fine-tuning; generator_params drops the deltas.
"""

import dataclasses

from flax import traverse_util
import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import models
from bert_jax.models import bert
from bert_jax.models import layers
from bert_jax.ops import attention as attention_ops

# The reference's generator heads: one per 64 units of its width (get_generator_config).
GENERATOR_HEAD_WIDTH = 64


def generator_shape(model) -> dict:
  """The generator's hidden_size, num_heads and intermediate_size from the discriminator's
  (model: config.model or a BertConfig): H_g = round(fraction x H), max(1, H_g // 64) heads,
  feed-forward 4 H_g, as google-research/electra's get_generator_config."""
  hidden = int(round(model.hidden_size * model.generator_fraction))
  return {'hidden_size': hidden, 'num_heads': max(1, hidden // GENERATOR_HEAD_WIDTH),
          'intermediate_size': 4 * hidden}


def generator_config(cfg: bert.BertConfig) -> bert.BertConfig:
  """The generator's encoder config: the discriminator's with generator_shape's sizes; its
  embed_width stays E (the shared tables')."""
  return dataclasses.replace(cfg, embedding_size=cfg.embed_width, **generator_shape(cfg))


def generator_run_config(config):
  """A run's full config -> the config of its generator alone: an 'electra' model of the
  generator's shape with config.objectives='mlm' (ElectraForMaskedLM's layout)."""
  gen = config.copy_and_resolve_references()
  shape = generator_shape(config.model)
  embed = config.model.get('embedding_size', 0) or config.model.hidden_size
  # Alone, the generator shares nothing: its embeddings are the tables it trained.
  gen.model.update(shape, embedding_size=0 if embed == shape['hidden_size'] else embed,
                   embedding_sharing='shared')
  gen.objectives = 'mlm'
  return gen


# An ELECTRA run's generator subtrees -> their places in a generator-alone ('mlm') model.
_GENERATOR_PATHS = (('generator/', 'bert/'), ('generator_predictions/', 'predictions/'))
# Under 'gdes', the discriminator's own parameters inside `bert/embeddings/`.
DELTA_SUFFIX = '_delta'
DISCRIMINATOR_LAYER_NORM = 'discriminator_LayerNorm'
_TABLES = ('word_embeddings', 'position_embeddings', 'token_type_embeddings')


def is_discriminator_embedding(path: str) -> bool:
  """Whether `path` is one of 'gdes' mode's discriminator-only embedding parameters (a table's
  delta or the discriminator's LayerNorm), which neither exported model holds as such."""
  if not path.startswith('bert/embeddings/'):
    return False
  leaf = path[len('bert/embeddings/'):]
  return leaf.endswith(DELTA_SUFFIX) or leaf.startswith(DISCRIMINATOR_LAYER_NORM + '/')


def generator_params(flat: dict) -> dict:
  """{path: array} of an ELECTRA run -> those of its generator alone (generator_run_config's
  model): the embeddings it reads, the generator's projection, layers and MLM head."""
  out = {k: v for k, v in flat.items()
         if k.startswith('bert/embeddings/') and not is_discriminator_embedding(k)}
  for path, value in flat.items():
    for ours, theirs in _GENERATOR_PATHS:
      if path.startswith(ours):
        out[theirs + path[len(ours):]] = value
  return out


def discriminator_params(flat: dict) -> dict:
  """{path: array} of an ELECTRA run -> the same with the discriminator's embeddings as it
  reads them: under 'gdes' each table is the generator's + its delta and `LayerNorm` is the
  discriminator's own; the deltas and `discriminator_LayerNorm` are gone. Unchanged under
  'shared' (no deltas). The generator's subtrees stay; callers keep what they need."""
  prefix = 'bert/embeddings/'
  if not any(is_discriminator_embedding(k) for k in flat):
    return dict(flat)
  out = {k: v for k, v in flat.items() if not is_discriminator_embedding(k)}
  for table in _TABLES:
    delta = flat.get(prefix + table + DELTA_SUFFIX)
    if delta is not None:
      out[prefix + table] = flat[prefix + table] + delta
  norm = prefix + DISCRIMINATOR_LAYER_NORM + '/'
  for path, value in flat.items():
    if path.startswith(norm):
      out[prefix + 'LayerNorm/' + path[len(norm):]] = value
  return out


def discriminator_tree(params: dict) -> dict:
  """discriminator_params on a nested parameter tree (a workdir's checkpoint); a tree without
  deltas comes back as it is."""
  embeddings = params.get('bert', {}).get('embeddings', {})
  if not any(k.endswith(DELTA_SUFFIX) or k == DISCRIMINATOR_LAYER_NORM for k in embeddings):
    return params
  flat = traverse_util.flatten_dict(params, sep='/')
  return traverse_util.unflatten_dict(discriminator_params(flat), sep='/')


def attention_bias(cfg: bert.BertConfig, input_mask, pair_ids, length: int):
  """What the attention takes for these rows (BertModel's choice, bidirectional only): segment
  ids for the fused kernels, else the additive bias."""
  if attention_ops.takes_segment_ids(cfg.attention_impl, length, cfg.head_dim):
    return (input_mask if pair_ids is None else pair_ids).astype(jnp.int32)
  return layers.row_attention_bias(input_mask, pair_ids, cfg.dtype)


class ElectraPooler(nn.Module):
  """ElectraClassificationHead's dense + exact GELU on [CLS]: [..., embed] -> [..., embed]."""
  config: bert.BertConfig

  @nn.compact
  def __call__(self, cls_state):
    cfg = self.config
    # transformers applies get_activation('gelu'), the exact one, whatever hidden_act says.
    return layers.gelu(layers.DenseGeneral(
        cfg.hidden_size, ('embed', 'embed_out'), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=cfg.init, name='dense')(cls_state), 'erf')


def _projection(cfg: bert.BertConfig):
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


class GdesEmbeddings(bert.BertEmbeddings):
  """The embedding module under 'gdes' (module docstring): BertEmbeddings' tables and LayerNorm
  are the generator's (`generator_embed`, `generator_attend`); calling it gives the
  discriminator's view, stop_gradient(table) + delta for each table, its own LayerNorm."""

  def setup(self):
    super().setup()
    cfg = self.config
    delta = lambda name, rows: self.param(  # pylint: disable=g-long-lambda
        name + DELTA_SUFFIX,
        nn.with_logical_partitioning(nn.initializers.zeros, (bert.name_axis(name), 'embed')),
        (rows, cfg.embed_width), cfg.param_dtype)
    self.word_embeddings_delta = delta('word_embeddings', cfg.vocab_size)
    self.position_embeddings_delta = delta('position_embeddings', cfg.max_position_embeddings)
    if cfg.token_types:
      self.token_type_embeddings_delta = delta('token_type_embeddings', cfg.type_vocab_size)
    self.discriminator_layer_norm = layers.layer_norm(
        cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name=DISCRIMINATOR_LAYER_NORM)

  def _discriminator_tables(self) -> dict:
    seen = lambda table, delta: jax.lax.stop_gradient(table) + delta  # noqa: E731
    tables = {'word': seen(self.word_embeddings, self.word_embeddings_delta),
              'position': seen(self.position_embeddings, self.position_embeddings_delta),
              'token_type': None}
    if self.config.token_types:
      tables['token_type'] = seen(self.token_type_embeddings, self.token_type_embeddings_delta)
    return tables

  def __call__(self, input_ids, segment_ids, deterministic, position_ids=None, input_mask=None,
               language_ids=None):
    return self.embed(self._discriminator_tables(), self.discriminator_layer_norm, input_ids,
                      segment_ids, deterministic, position_ids, input_mask, language_ids)

  def attend(self, x):
    """Logits against the discriminator's word table: [..., embed] -> [..., vocab]."""
    return layers.tied_logits(x, self._discriminator_tables()['word'], self.config.dtype)

  def generator_embed(self, input_ids, segment_ids, deterministic, position_ids=None,
                      input_mask=None):
    return super().__call__(input_ids, segment_ids, deterministic, position_ids, input_mask)

  def generator_attend(self, x):
    return super().attend(x)


class ElectraModel(nn.Module):
  """ELECTRA's discriminator: (sequence_output, pooled_output), as BertModel's; `attend` gives
  logits of E-wide states against the word embeddings; `generator_embed` and `generator_attend`
  are the embeddings the generator reads and its tied output (model.embedding_sharing)."""
  config: bert.BertConfig
  return_all_layers: bool = False

  def setup(self):
    cfg = self.config
    if cfg.causal:
      raise ValueError("model.causal=True with model.name='electra': ELECTRA is bidirectional; "
                       'set model.causal=False.')
    gdes = cfg.embedding_sharing == 'gdes'
    self.embeddings = (GdesEmbeddings if gdes else bert.BertEmbeddings)(cfg)
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
    if isinstance(self.embeddings, GdesEmbeddings):
      return self.embeddings.generator_embed(input_ids, segment_ids, deterministic, position_ids,
                                             input_mask)
    return self.embeddings(input_ids, segment_ids, deterministic, position_ids, input_mask)

  def generator_attend(self, x):
    """The generator's tied output: logits of E-wide states against the word table it reads."""
    if isinstance(self.embeddings, GdesEmbeddings):
      return self.embeddings.generator_attend(x)
    return self.embeddings.attend(x)


class ElectraGenerator(nn.Module):
  """The generator's encoder on the shared embeddings' output: its own `embeddings_project`
  (E -> H_g) and layers; config is generator_config's."""
  config: bert.BertConfig

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


def generator_flops(model, length: int) -> float:
  """The generator encoder's forward FLOPs on `length` tokens: its layers at generator_shape's
  width and its E -> H_g projection."""
  shape = generator_shape(model)
  h, f = shape['hidden_size'], shape['intermediate_size']
  e = model.get('embedding_size', 0) or model.hidden_size
  layers_ = model.num_layers
  return (layers_ * (length * (8 * h * h + 4 * h * f) + 4 * length * length * h)
          + (length * 2 * e * h if e != h else 0))


FAMILY = models.register(models.Family(name='electra', config_from=bert.BertConfig.from_config,
                                       encoder=ElectraModel, flops=encoder_flops))

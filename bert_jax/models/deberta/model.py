"""DeBERTa's encoder (models registry name 'deberta'): BERT's post-LN layers with disentangled
attention over relative positions.

He et al. (2021) score each query-key pair by content and by their relative position: besides
q_i . k_j, the query's content against the key's relative position (c2p: q_i . P^k_{d(i,j)})
and the key's content against the query's (p2c: k_j . P^q_{d(i,j)}), each scaled by
1 / sqrt(head_dim x (1 + the number of such terms)). P^k and P^q project one table of
2 x span relative-position embeddings (`bert/encoder/rel_embeddings`, LayerNorm-ed with
model.relative_norm) by each layer's key and query denses (model.share_relative_key, DeBERTa-v3)
or by their own (`pos_key`, `pos_query`); d(i, j) is i - j clipped to the span, or with
model.relative_buckets > 0 (v3: 256) bucketed logarithmically beyond half the buckets.
DeBERTa-v3 adds no absolute positions in the embeddings (model.positions='none'); v1 adds
BERT's learned table ('absolute'). Everything else is BERT's layer, under the same names
(`attention/self/query`, `attention/output/dense`, `intermediate`, `output`), so that
transformers' DebertaV2 checkpoints map by a table (hf.py). There is no pooler
(the pooled output is the first token's state); the MLM head is `predictions`, HF's legacy
`cls.predictions`. Not here: the convolution beside the first layer (HF conv_kernel_size).

model.enhanced_mask_decoder (MLM): DeBERTa's enhanced mask decoder (section
3.3; microsoft/DeBERTa's EnhancedMaskDecoder). The MLM head reads, instead of the last layer's
output, the last layer run twice more on the states below it with its queries (and residual)
first those states + the absolute position embeddings (`bert/embeddings/position_embeddings`,
made for it under positions='none', v3's), then its own output. The pooled state stays the last
layer's; fine-tuning builds the encoder without the decoder. transformers' DebertaV2ForMaskedLM
has none: an export keeps the backbone exact and its MLM logits read the last layer.

DeBERTa-v3's replaced-token detection is objectives/rtd.py on this encoder (config.objectives=
'rtd'): DebertaGenerator, as wide as the discriminator and model.generator_layer_fraction (v3:
half) as deep, and model.embedding_sharing='gdes' (models/sharing.py).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import models
from bert_jax.models import bert
from bert_jax.models import layers
from bert_jax.models import sharing
from bert_jax.models.deberta import config as deberta_config
from bert_jax.models.deberta import hf as deberta_hf
from bert_jax.models.encoder import EncoderConfig
from bert_jax.ops import attention as attention_ops

RELATIVE_KINDS = ('c2p', 'p2c')
# The enhanced mask decoder's passes of the last layer (microsoft/DeBERTa: 2).
MASK_DECODER_PASSES = 2


@dataclasses.dataclass(frozen=True)
class DebertaConfig(deberta_config.DebertaKeys, EncoderConfig):
  """BERT's encoder config and DeBERTa's keys (config.py)."""


def config_from(config) -> DebertaConfig:
  """The run's ConfigDict -> the encoder's config (no segment table, no pooler: the released
  DeBERTa models have neither)."""
  return dataclasses.replace(DebertaConfig.from_config(config), token_types=False, pooler=False)


def relative_kinds(cfg) -> tuple[str, ...]:
  """The relative terms of model.relative_attention ('c2p|p2c'), in RELATIVE_KINDS order."""
  named = {k.strip() for k in str(cfg.relative_attention).split('|') if k.strip()}
  return tuple(k for k in RELATIVE_KINDS if k in named)


def span(cfg) -> int:
  """Relative distances kept each way: the buckets, else model.relative_positions (0: the
  position rows)."""
  if cfg.relative_buckets > 0:
    return cfg.relative_buckets
  return cfg.relative_positions if cfg.relative_positions > 0 else cfg.max_position_embeddings


def log_buckets(relative: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
  """DeBERTa's bucketed distances: exact within buckets // 2, logarithmic beyond (up to
  max_position), computed in float32 as transformers does."""
  sign = np.sign(relative)
  mid = buckets // 2
  absolute = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative))
  ratio = np.log(absolute.astype(np.float32) / np.float32(mid)) / np.log(
      np.float32((max_position - 1) / mid))
  log_position = np.ceil(ratio * np.float32(mid - 1)) + np.float32(mid)
  return np.where(absolute <= mid, relative, log_position * sign).astype(np.int32)


def table_row(cfg, relative: np.ndarray) -> np.ndarray:
  """int32: the row of the relative table (2 x span rows) for each distance query - key."""
  max_position = (cfg.relative_positions if cfg.relative_positions > 0
                  else cfg.max_position_embeddings)
  if cfg.relative_buckets > 0 and max_position > 0:
    relative = log_buckets(relative, cfg.relative_buckets, max_position)
  k = span(cfg)
  return np.clip(relative + k, 0, 2 * k - 1).astype(np.int32)


def relative_index(cfg, length: int) -> np.ndarray:
  """[length, length] int32: the row of the relative table that query i reads for key j."""
  positions = np.arange(length)
  return table_row(cfg, positions[:, None] - positions[None, :])


def shift_into_place(scores):
  """[..., n, 2n - 1] scores of each row i against distances n - 1 down to -(n - 1) ->
  [..., n, n] whose [i, j] is row i's score at distance i - j. Row i's scores start n - 1 - i
  columns in, so read as one flat run the rows step 2n - 2 apart (Transformer-XL's relative
  shift): slices and reshapes only, whose gradients are pads and reshapes."""
  *lead, n, columns = scores.shape
  if n == 1:  # One distance: nothing to shift (the rows would step 0 apart).
    return scores
  flat = scores.reshape(*lead, n * columns)[..., n - 1:n - 1 + n * (columns - 1)]
  return flat.reshape(*lead, n, columns - 1)[..., :n]


def relative_scores(cfg, content, rows, from_key: bool = False):
  """[batch, H, n, n]: each token's content [batch, n, H, kv] scored against the projected
  relative table [2 span, H, kv]; [i, j] reads the row of distance i - j (c2p), or with
  `from_key` that of j - i (p2c, [key, query] until swapped). Scored against one table row per
  distance, then shifted into place: scoring the whole table and gathering, as transformers
  does, has a scatter into [batch, H, n, 2 span] for gradient where the shift has a copy."""
  n = content.shape[1]
  distance = n - 1 - np.arange(2 * n - 1)  # The rows shift_into_place reads, in its order.
  rows = jnp.take(rows, table_row(cfg, -distance if from_key else distance), axis=0)
  return shift_into_place(jnp.einsum('bqhd,rhd->bhqr', content, rows))


class DisentangledSelfAttention(nn.Module):
  """Content-to-content, content-to-position and position-to-content attention; returns
  [batch, length, heads, kv]."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, x, bias, relative, deterministic, query_states=None):
    # x: [batch, length, embed]; bias: [batch, 1, 1 or length, length] additive; relative: the
    # relative table [2 span, embed] or None; query_states [batch, length, embed]: the queries'
    # input where it is not x (the enhanced mask decoder's).
    cfg = self.config
    dense = lambda name: layers.DenseGeneral(  # pylint: disable=g-long-lambda
        (cfg.num_heads, cfg.head_dim), ('embed', 'heads', 'kv'), dtype=cfg.dtype,
        param_dtype=cfg.param_dtype, kernel_init=cfg.init, name=name)
    query_dense, key_dense = dense('query'), dense('key')
    queries = x if query_states is None else query_states
    # [batch, length, H, kv] each.
    query, key, value = query_dense(queries), key_dense(x), dense('value')(x)
    kinds = relative_kinds(cfg) if relative is not None else ()
    factor = 1 + len(kinds)
    if kinds:
      table = nn.Dropout(cfg.hidden_dropout_rate)(relative, deterministic=deterministic)
      scale = 1.0 / np.sqrt(cfg.head_dim * factor)
      scores = 0.0
      if 'c2p' in kinds:
        pos_key = (key_dense if cfg.share_relative_key else dense('pos_key'))(table)  # [2s, H, kv]
        scores = scores + relative_scores(cfg, query, pos_key)
      if 'p2c' in kinds:
        pos_query = (query_dense if cfg.share_relative_key else dense('pos_query'))(table)
        scores = scores + jnp.swapaxes(
            relative_scores(cfg, key, pos_query, from_key=True), -1, -2)
      bias = bias.astype(jnp.float32) + (scores * scale).astype(jnp.float32)  # [b, H, q, k]
    dropout_rng = None
    if not deterministic and cfg.attention_dropout_rate > 0:
      dropout_rng = self.make_rng('dropout')
    # q k^T / sqrt(kv x factor): the query scaled, then the einsum path's 1 / sqrt(kv).
    query = query / jnp.asarray(np.sqrt(factor), query.dtype)
    return attention_ops.dot_product_attention(query, key, value, bias, dropout_rng,
                                               cfg.attention_dropout_rate, deterministic,
                                               cfg.dtype)


class DebertaAttention(nn.Module):
  """`self` (disentangled) then `output` (dense, dropout, residual, LayerNorm), as BERT's."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, x, bias, relative, deterministic, query_states=None):
    context = DisentangledSelfAttention(self.config, name='self')(x, bias, relative,
                                                                  deterministic, query_states)
    residual = x if query_states is None else query_states
    return bert.BertResidualOutput(self.config, ('heads', 'kv'), name='output')(
        context, residual, deterministic)


class DebertaLayer(nn.Module):
  """One post-LN layer: disentangled attention, then BERT's feed-forward."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, x, bias, relative, deterministic, query_states=None):
    cfg = self.config
    x = DebertaAttention(cfg, name='attention')(x, bias, relative, deterministic, query_states)
    return bert.feed_forward(cfg, x, deterministic)


class ScannedDebertaLayer(DebertaLayer):
  """DebertaLayer with nn.scan's (carry, output) signature; emits its output when asked. With
  keep_below the carry is (states, the states below them): after the stack, the last layer's
  input, which the enhanced mask decoder reads."""
  emit: bool = False
  keep_below: bool = False

  def __call__(self, x, bias, relative, deterministic):
    below = x[0] if self.keep_below else x
    out = super().__call__(below, bias, relative, deterministic)
    return (out, below) if self.keep_below else out, (out if self.emit else None)


class DebertaEncoder(nn.Module):
  """The relative table, then num_layers DebertaLayers (scanned or unrolled); returns the last
  layer's output, or with return_all_layers every layer's stacked."""
  config: DebertaConfig
  return_all_layers: bool = False

  @nn.compact
  def __call__(self, x, bias, deterministic, decoder_positions=None):
    # decoder_positions [batch, length, embed]: the enhanced mask decoder's absolute positions;
    # with them the result is (last layer's output, the decoder's).
    cfg = self.config
    relative = None
    if relative_kinds(cfg):
      relative = self.param('rel_embeddings', nn.with_logical_partitioning(cfg.init,
                                                                           (None, 'embed')),
                            (2 * span(cfg), cfg.hidden_size), cfg.param_dtype)
      relative = jnp.asarray(relative, cfg.dtype)
      if cfg.relative_norm:
        relative = layers.layer_norm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype,
                                     name='rel_LayerNorm')(relative)
    policy = bert.REMAT_POLICIES[cfg.remat_policy]
    if cfg.scan_layers:
      layer_cls = ScannedDebertaLayer
      if cfg.remat_policy != 'none':
        layer_cls = nn.remat(layer_cls, policy=policy, prevent_cse=False, static_argnums=(4,))
      stack = nn.scan(
          layer_cls, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
          in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
          unroll=cfg.scan_unroll, metadata_params={nn.PARTITION_NAME: 'layers'})
      decoder = decoder_positions is not None
      carry, outputs = stack(cfg, emit=self.return_all_layers, keep_below=decoder,
                             name='layer')((x, x) if decoder else x, bias, relative,
                                           deterministic)
      if not decoder:
        return outputs if self.return_all_layers else carry
      (x, below), stacked = carry, self.variables['params']['layer']
      # The decoder's passes run the last layer, its parameters the stack's last slice.
      last = jax.tree.map(lambda p: p[-1], nn.meta.unbox(stacked))
      rngs = {} if deterministic else {'dropout': self.make_rng('dropout')}
      layer = lambda states, query: DebertaLayer(cfg).apply(  # pylint: disable=g-long-lambda
          {'params': last}, states, bias, relative, deterministic, query, rngs=rngs)
      return x, self.mask_decoder(layer, below, decoder_positions)
    layer_cls = DebertaLayer
    if cfg.remat_policy != 'none':
      layer_cls = nn.remat(layer_cls, policy=policy, static_argnums=(4,))
    outputs, below = [], x
    for i in range(cfg.num_layers):
      layer = layer_cls(cfg, name=f'layer_{i}')
      below, x = x, layer(x, bias, relative, deterministic)
      outputs.append(x)
    if self.return_all_layers:
      return jnp.stack(outputs)
    if decoder_positions is None:
      return x
    return x, self.mask_decoder(
        lambda states, query: layer(states, bias, relative, deterministic, query), below,
        decoder_positions)

  @staticmethod
  def mask_decoder(layer, below, decoder_positions):
    """The enhanced mask decoder (microsoft/DeBERTa's EnhancedMaskDecoder): the last layer
    (`layer(states, query)`) again, twice, on the layer below's states, its queries first those
    states + the absolute positions, then its own output."""
    query = decoder_positions.astype(below.dtype) + below
    for _ in range(MASK_DECODER_PASSES):
      query = layer(below, query)
    return query


class DebertaEmbeddings(nn.Module):
  """Word (+ learned positions with positions='absolute') embeddings, LayerNorm, padding
  zeroed, dropout: [batch, length, embed]."""
  config: DebertaConfig

  def setup(self):
    cfg = self.config
    table = lambda name, rows, axis: self.param(  # pylint: disable=g-long-lambda
        name, nn.with_logical_partitioning(cfg.init, (axis, 'embed')), (rows, cfg.hidden_size),
        cfg.param_dtype)
    self.word_embeddings = table('word_embeddings', cfg.vocab_size, 'vocab')
    if cfg.positions == 'absolute' or cfg.enhanced_mask_decoder:
      self.position_embeddings = table('position_embeddings', cfg.max_position_embeddings, None)
    self.layer_norm = layers.layer_norm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)
    self.dropout = nn.Dropout(cfg.hidden_dropout_rate)

  def __call__(self, input_ids, input_mask, position_ids, deterministic):
    return self.embed(self.tables(), self.layer_norm, input_ids, input_mask, position_ids,
                      deterministic)

  def tables(self) -> dict:
    """{parameter name: table}: the word table and, with positions='absolute', the positions'."""
    tables = {'word_embeddings': self.word_embeddings}
    if self.config.positions == 'absolute':
      tables['position_embeddings'] = self.position_embeddings
    return tables

  def embed(self, tables, layer_norm, input_ids, input_mask, position_ids, deterministic):
    """__call__ with the tables and the LayerNorm given (models/sharing.py's 'gdes')."""
    cfg = self.config
    whole = lambda t: nn.with_logical_constraint(t, (None, None))  # noqa: E731
    x = jnp.take(nn.with_logical_constraint(tables['word_embeddings'], ('vocab', None)),
                 input_ids, axis=0)
    if cfg.positions == 'absolute':
      x = x + jnp.take(whole(tables['position_embeddings']), position_ids, axis=0)
    x = layer_norm(x.astype(cfg.dtype)) * input_mask[..., None].astype(cfg.dtype)
    return self.dropout(x, deterministic=deterministic)

  def attend(self, x):
    """Logits against the (tied) word embeddings: [..., embed] -> [..., vocab]."""
    return layers.tied_logits(x, self.word_embeddings, self.config.dtype)

  def absolute_positions(self, position_ids):
    """The position table's rows (the enhanced mask decoder's input): [batch, length, embed]."""
    table = nn.with_logical_constraint(self.position_embeddings, (None, None))
    return jnp.take(table, position_ids, axis=0).astype(self.config.dtype)


# DeBERTa's embeddings under gradient-disentangled sharing (model.embedding_sharing='gdes').
GDES_EMBEDDINGS = sharing.gdes(DebertaEmbeddings)


class DebertaModel(nn.Module):
  """Embeddings and encoder: (sequence_output, pooled_output), pooled the first token's state
  (or each packed pair's, at cls_positions); the registry's encoder signature. With 'rtd'
  (DeBERTa-v3's replaced-token detection) it is the discriminator: `generator_embed` and
  `generator_attend` are the embeddings its generator reads and its tied output."""
  config: DebertaConfig
  return_all_layers: bool = False

  def setup(self):
    cfg = self.config
    self.embeddings = (GDES_EMBEDDINGS if cfg.embedding_sharing == 'gdes'
                       else DebertaEmbeddings)(cfg)
    self.encoder = DebertaEncoder(cfg, self.return_all_layers)

  def __call__(self, input_ids, segment_ids, input_mask, deterministic=True, position_ids=None,
               pair_ids=None, cls_positions=None):
    cfg = self.config
    if position_ids is None:
      position_ids = layers.row_positions(input_ids)
    del segment_ids  # No segment table.
    x = self.embeddings(input_ids, input_mask, position_ids, deterministic)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    bias = layers.row_attention_bias(input_mask, pair_ids, cfg.dtype)
    if cfg.enhanced_mask_decoder and not self.return_all_layers:
      # The sequence output is the decoder's, which the MLM head reads; pooled, the last layer's.
      last, decoded = self.encoder(x, bias, deterministic,
                                   self.embeddings.absolute_positions(position_ids))
      return decoded, layers.first_or_gathered(last, cls_positions)
    x = self.encoder(x, bias, deterministic)
    last = x[-1] if self.return_all_layers else x
    return x, layers.first_or_gathered(last, cls_positions)

  def attend(self, x):
    return self.embeddings.attend(x)

  def generator_embed(self, input_ids, segment_ids, deterministic, position_ids=None,
                      input_mask=None):
    """The generator's embedded inputs [batch, length, H] (model.embedding_sharing)."""
    del segment_ids  # No segment table.
    if position_ids is None:
      position_ids = layers.row_positions(input_ids)
    embed = getattr(self.embeddings, 'generator_embed', self.embeddings)
    return embed(input_ids, input_mask, position_ids, deterministic)

  def generator_attend(self, x):
    """The generator's tied output: logits against the word table it reads."""
    return getattr(self.embeddings, 'generator_attend', self.embeddings.attend)(x)


class DebertaGenerator(nn.Module):
  """DeBERTa-v3's generator: DeBERTa's layers (with the relative table of its own) at the
  generator's depth on the embeddings the discriminator's `generator_embed` gives; as wide as
  the discriminator (v3's), so no projection. config is electra.generator_config's."""
  config: DebertaConfig

  @nn.compact
  def __call__(self, embedded, input_mask, deterministic, pair_ids=None):
    # embedded: [batch, length, H] -> [batch, length, H].
    cfg = self.config
    bias = layers.row_attention_bias(input_mask, pair_ids, cfg.dtype)
    return DebertaEncoder(cfg, name='encoder')(embedded, bias, deterministic)


mask_decoder_only = deberta_config.mask_decoder_only


def encoder_flops(model, length: int) -> float:
  """Forward FLOPs of one sequence of `length` tokens: BERT's encoder without the pooler, plus
  per layer and relative term the scores of every token against the 2 x span table rows
  (2 x length x 2 span x H), as transformers computes them (relative_scores scores 2 x length
  - 1 rows). The table's projection by each layer's denses runs once per batch, not per
  sequence, and is left out (table_projection_flops)."""
  h = model.hidden_size
  extra = len(relative_kinds(model)) * 2 * length * (2 * span(model)) * h
  return bert.encoder_flops(model, length) - 2 * h * h + model.num_layers * extra


def table_projection_flops(model) -> float:
  """The relative table's projections in one forward of a whole batch: per layer and term,
  2 span rows through an H x H dense."""
  h = model.hidden_size
  return model.num_layers * len(relative_kinds(model)) * 2 * (2 * span(model)) * h * h


FAMILY = models.register(models.Family(name='deberta', config_from=config_from,
                                       encoder=DebertaModel, flops=encoder_flops,
                                       generator=DebertaGenerator, config=DebertaConfig,
                                       hf=deberta_hf.LAYOUT,
                                       pretraining_only=mask_decoder_only))

"""BERT's encoder in flax.linen (models registry name 'bert'): embeddings, post-LN encoder, pooler.

The pretraining heads are the objectives' (bert_jax/objectives: mlm, nsp), the fine-tuning heads
models/heads.py's. Attention, the feed-forward block and the LayerNorm after each sublayer go
through bert_jax.ops, which picks XLA or a kernel from static config values.

Parameter names follow the original TF BERT (`bert/embeddings/word_embeddings`,
`bert/encoder/layer_N/attention/self/query/kernel`, `cls/predictions/output_bias`, ...), with
flax's `kernel`/`scale` leaf names, so real checkpoints map in by a table.
"""


import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import models
from bert_jax.models import layers
from bert_jax.models.bert import hf as bert_hf
from bert_jax.models.encoder import EncoderConfig
from bert_jax.ops import attention as attention_ops
from bert_jax.ops import ffn as ffn_ops
from bert_jax.ops import norm as norm_ops
from bert_jax.ops import per_device

REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.dots_saveable,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class BertEmbeddings(nn.Module):
  """Token + segment + position embeddings, then LayerNorm and dropout: [..., embed_width]."""
  config: EncoderConfig

  def setup(self):
    cfg = self.config
    embed = lambda name, rows: self.param(  # pylint: disable=g-long-lambda
        name, nn.with_logical_partitioning(cfg.init, (name_axis(name), 'embed')),
        (rows, cfg.embed_width), cfg.param_dtype)
    self.word_embeddings = embed('word_embeddings', cfg.vocab_size)
    if cfg.token_types:
      self.token_type_embeddings = embed('token_type_embeddings', cfg.type_vocab_size)
    self.position_embeddings = embed('position_embeddings', cfg.max_position_embeddings)
    if cfg.num_languages:
      self.language_embeddings = embed('language_embeddings', cfg.num_languages)
    self.layer_norm = layers.layer_norm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)
    self.dropout = nn.Dropout(cfg.hidden_dropout_rate)

  def __call__(self, input_ids, segment_ids, deterministic, position_ids=None, input_mask=None,
               language_ids=None):
    # input_ids, segment_ids: [batch, length]; position_ids (packed rows, translation pairs):
    # [batch, length]; input_mask [batch, length] (read with config.position_offset only);
    # language_ids [batch, length] (read with config.num_languages only).
    return self.embed(self.tables(), self.layer_norm, input_ids, segment_ids, deterministic,
                      position_ids, input_mask, language_ids)

  def tables(self) -> dict:
    """{parameter name: table} of the word, position and (with token_types) segment tables."""
    tables = {'word_embeddings': self.word_embeddings,
              'position_embeddings': self.position_embeddings}
    if self.config.token_types:
      tables['token_type_embeddings'] = self.token_type_embeddings
    return tables

  def embed(self, tables, layer_norm, input_ids, segment_ids, deterministic, position_ids=None,
            input_mask=None, language_ids=None):
    """__call__ with the tables (as `tables()` names them) and the LayerNorm given: the
    gradient-disentangled sharing of models/sharing.py looks up tables of its own making."""
    cfg = self.config
    length = input_ids.shape[1]
    if cfg.position_offset:
      real = input_mask > 0
      if position_ids is None:
        position_ids = jnp.cumsum(real, axis=1, dtype=jnp.int32) - 1
      position_ids = jnp.where(real, position_ids + cfg.position_offset, cfg.position_offset - 1)
    # Gather the tables' embed dim (sharded under fsdp) before the lookups: rows looked up in
    # an embed-split table would have to be fully rematerialised to be split by batch instead.
    whole = lambda table, rows: nn.with_logical_constraint(table, (rows, None))  # noqa: E731
    positions = whole(tables['position_embeddings'], None)
    positions = (positions[None, :length] if position_ids is None
                 else jnp.take(positions, position_ids, axis=0))
    if not cfg.token_types:
      x = jnp.take(whole(tables['word_embeddings'], 'vocab'), input_ids, axis=0) + positions
      x = layer_norm(x.astype(self.config.dtype))  # [batch, length, embed]
      return self.dropout(x, deterministic=deterministic)
    segments = whole(tables['token_type_embeddings'], None)
    if cfg.type_vocab_size == 1:
      # One row (RoBERTa has no segments) serves every token: a pair's segment ids of 1 would
      # index past the table, which jnp.take fills with NaN.
      segments = segments[None]  # [1, 1, embed]
    else:
      segments = jnp.take(segments, segment_ids, axis=0)
    x = (jnp.take(whole(tables['word_embeddings'], 'vocab'), input_ids, axis=0)
         + segments + positions)  # [batch, length, embed]
    if cfg.num_languages and language_ids is not None:
      # Without language ids (fine-tuning) no language row is added, as transformers' XLM.
      x = x + jnp.take(whole(self.language_embeddings, None), language_ids, axis=0)
    x = layer_norm(x.astype(self.config.dtype))
    return self.dropout(x, deterministic=deterministic)

  def attend(self, x):
    """Logits against the (tied) word embeddings: [..., embed] -> [..., vocab]."""
    return layers.tied_logits(x, self.word_embeddings, self.config.dtype)


def name_axis(embedding_name: str) -> str:
  """Logical name of an embedding table's row axis."""
  return 'vocab' if embedding_name == 'word_embeddings' else None


class BertSelfAttention(nn.Module):
  """Multi-head self-attention with a padding mask; returns [batch, length, heads, kv].

  bias: the additive attention bias [batch, 1, 1 or length, length]; with attention_impl 'pallas'
  or 'tpu' on rows their kernels take, the segment ids [batch, length] instead (BertModel
  decides).
  """
  config: EncoderConfig
  layer_index: int = 0  # Seeds cuDNN's attention dropout per layer.

  @nn.compact
  def __call__(self, x, bias, deterministic):
    cfg = self.config
    rate = 0.0 if deterministic else cfg.attention_dropout_rate
    heads = (cfg.num_heads, cfg.head_dim)
    if bias.ndim == 2 and attention_ops.packs_qkv(cfg.attention_impl):
      # Segment ids [batch, length]: rows the GPU fused kernels take.
      # One matmul for the three projections (the same parameters as the path below).
      kernels, biases = zip(*(layers.DenseParams(
          (x.shape[-1],), heads, ('embed', 'heads', 'kv'), cfg.param_dtype, cfg.init,
          name=name)() for name in ('query', 'key', 'value')))
      kernel = jnp.stack([jnp.asarray(k, cfg.dtype) for k in kernels], axis=1)  # [embed, 3, H, kv]
      x = jnp.asarray(x, cfg.dtype)
      if per_device.splits_heads():  # [embed, 3 * H * kv] would not tile over heads.
        qkv = jnp.einsum('ble,ejhd->bljhd', x, kernel)
      else:  # One 2-d matmul: faster on GPUs than the n-d dot (docs/performance.md).
        qkv = (x.reshape(-1, x.shape[-1]) @ kernel.reshape(x.shape[-1], -1)).reshape(
            x.shape[:2] + kernel.shape[1:])
      qkv = nn.with_logical_constraint(qkv, ('batch', 'length', None, 'heads', 'kv'))
      keys = None
      if attention_ops.wants_dropout_keys(rate):
        keys = attention_ops.dropout_keys(self.make_rng('dropout'), x.shape[0], cfg.num_heads)
      return attention_ops.packed_qkv_attention(
          qkv, jnp.stack(biases), bias, keys, rate=rate,
          long_backward=cfg.long_attention_backward,
          short_backward=cfg.short_attention_backward)
    project = lambda name: layers.DenseGeneral(  # pylint: disable=g-long-lambda
        heads, ('embed', 'heads', 'kv'), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=cfg.init, flatten=cfg.flat_matmuls, name=name)(x)
    query, key, value = project('query'), project('key'), project('value')
    dropout_rng = None
    if (attention_ops.draws_dropout_rng(cfg.attention_impl) and not deterministic
        and cfg.attention_dropout_rate > 0):
      dropout_rng = self.make_rng('dropout')
    return attention_ops.attention(
        cfg.attention_impl, query, key, value, bias, rate=cfg.attention_dropout_rate,
        deterministic=deterministic, dropout_rng=dropout_rng, dtype=cfg.dtype,
        cudnn_seed=attention_ops.cudnn_dropout_seed(cfg.seed, self.layer_index),
        causal=cfg.causal)


class BertResidualOutput(nn.Module):
  """Dense back to embed, dropout, residual add, LayerNorm (post-LN)."""
  config: EncoderConfig
  in_axes: tuple[str, ...]  # Logical names of the contracted input axes.
  # x is (the block's input, the up-projection's kernel and bias) and the dense computes the whole
  # feed-forward block in fused_ffn.ffn (model.ffn_impl='pallas'; in_axes ('mlp',)).
  whole_ffn: bool = False

  @nn.compact
  def __call__(self, x, residual, deterministic):
    cfg = self.config
    contracted = tuple(range(-len(self.in_axes), 0))
    fused = cfg.layer_norm_impl == 'pallas'
    if self.whole_ffn:
      x, up_kernel, up_bias = x  # [batch, length, embed], [embed, mlp], [mlp]
      kernel, bias = layers.DenseParams(
          (up_kernel.shape[-1],), (cfg.hidden_size,), self.in_axes + ('embed',),
          param_dtype=cfg.param_dtype, kernel_init=cfg.init, name='dense')()
      y = ffn_ops.fused_ffn(jnp.asarray(x, cfg.dtype), up_kernel, up_bias, kernel)
      if not fused:
        y = y + jnp.asarray(bias, cfg.dtype)
    else:
      # With the fused kernel this matmul's bias goes to the kernel, and it keeps the n-d dot:
      # flattening it too measured slower on an H100 (docs/performance.md).
      y = layers.DenseGeneral(cfg.hidden_size, self.in_axes + ('embed',), axis=contracted,
                              dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                              kernel_init=cfg.init, bias_apart=fused,
                              flatten=cfg.flat_matmuls and not fused, name='dense')(x)
    if fused:
      if not self.whole_ffn:
        y, bias = y
      y = FusedLayerNorm(cfg, name='LayerNorm')(y, bias, residual, deterministic)
    else:
      y = nn.Dropout(cfg.hidden_dropout_rate)(y, deterministic=deterministic)
      y = layers.layer_norm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)(y + residual)
    return nn.with_logical_constraint(y, ('batch', 'length', 'embed'))


class FusedLayerNorm(nn.Module):
  """LayerNorm(dropout(y + bias) + residual) in one Pallas kernel each way; the parameters of
  layers.layer_norm (`scale`, `bias`), so checkpoints are the same as with the XLA path. On a
  mesh of several devices the kernels run per device on its rows, under shard_map."""
  config: EncoderConfig

  @nn.compact
  def __call__(self, y, dense_bias, residual, deterministic):
    # y, residual: [batch, length, embed]; dense_bias: [embed]
    cfg = self.config
    scale, offset = (self.param(name, init, (cfg.hidden_size,), cfg.param_dtype)
                     for name, init in layers.layer_norm_inits().items())
    rate = cfg.hidden_dropout_rate
    keys = None
    if not deterministic and norm_ops.wants_dropout_keys(rate):
      keys = norm_ops.dropout_keys(self.make_rng('dropout'), y.shape[:-1])
    return norm_ops.fused_dropout_add_layer_norm(y, dense_bias, residual, keys, scale, offset,
                                                 rate=rate, eps=cfg.layer_norm_eps)


class BertAttention(nn.Module):
  """Self-attention block: `self` then `output` (dense, dropout, residual, LayerNorm)."""
  config: EncoderConfig
  layer_index: int = 0

  @nn.compact
  def __call__(self, x, bias, deterministic):
    context = BertSelfAttention(self.config, self.layer_index, name='self')(x, bias, deterministic)
    return BertResidualOutput(self.config, ('heads', 'kv'), name='output')(
        context, x, deterministic)


class BertLayer(nn.Module):
  """One post-LN Transformer encoder layer."""
  config: EncoderConfig
  layer_index: int = 0  # Position in the stack (unrolled layers only; scanned layers share 0).

  @nn.compact
  def __call__(self, x, bias, deterministic):
    cfg = self.config
    # x: [batch, length, embed]
    x = BertAttention(cfg, self.layer_index, name='attention')(x, bias, deterministic)
    return feed_forward(cfg, x, deterministic)


def feed_forward(cfg: EncoderConfig, x, deterministic):
  """A post-LN layer's feed-forward block, `intermediate` then `output` (dense, dropout,
  residual, LayerNorm), built in the calling layer's compact __call__; with ffn_impl='pallas'
  one fused kernel computes it whole."""
  # [batch, length, mlp]; with ffn_impl='pallas' x and the dense's parameters.
  h = BertIntermediate(cfg, name='intermediate')(x)
  return BertResidualOutput(cfg, ('mlp',), whole_ffn=cfg.ffn_impl == 'pallas',
                            name='output')(h, x, deterministic)


class BertIntermediate(nn.Module):
  """Dense to the feed-forward width, then GELU (exact erf, or the original code's tanh). With
  model.ffn_impl='pallas' its parameters only, (x, kernel, bias), for BertResidualOutput's
  fused_ffn.ffn to compute the whole block."""
  config: EncoderConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    if cfg.ffn_impl == 'pallas':
      kernel, bias = layers.DenseParams((x.shape[-1],), (cfg.intermediate_size,),
                                        ('embed', 'mlp'), param_dtype=cfg.param_dtype,
                                        kernel_init=cfg.init, name='dense')()
      return x, kernel, bias
    h = layers.DenseGeneral(cfg.intermediate_size, ('embed', 'mlp'), dtype=cfg.dtype,
                            param_dtype=cfg.param_dtype, kernel_init=cfg.init,
                            flatten=cfg.flat_matmuls, name='dense')(x)
    h = layers.gelu(h, cfg.gelu)
    return nn.with_logical_constraint(h, ('batch', 'length', 'mlp'))


class ScannedBertLayer(BertLayer):
  """BertLayer with the (carry, output) signature nn.scan needs; emits its output when asked."""
  emit: bool = False  # Also return each layer's output (stacked by the scan).

  def __call__(self, x, bias, deterministic):
    x = super().__call__(x, bias, deterministic)
    return x, (x if self.emit else None)


class BertEncoder(nn.Module):
  """num_layers BertLayers, stacked under nn.scan (+ nn.remat) or unrolled.

  Returns the last layer's output, or with return_all_layers every layer's output stacked:
  [layers, batch, length, embed] (the feature-based mode reads the last few).
  """
  config: EncoderConfig
  return_all_layers: bool = False

  @nn.compact
  def __call__(self, x, bias, deterministic):
    cfg = self.config
    policy = REMAT_POLICIES[cfg.remat_policy]
    if cfg.scan_layers:
      layer_cls = ScannedBertLayer
      if cfg.remat_policy != 'none':
        layer_cls = nn.remat(layer_cls, policy=policy, prevent_cse=False,
                             static_argnums=(3,))
      stack = nn.scan(
          layer_cls, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
          in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_layers, unroll=cfg.scan_unroll,
          metadata_params={nn.PARTITION_NAME: 'layers'})
      x, outputs = stack(cfg, emit=self.return_all_layers, name='layer')(x, bias, deterministic)
      return outputs if self.return_all_layers else x
    layer_cls = BertLayer
    if cfg.remat_policy != 'none':
      layer_cls = nn.remat(layer_cls, policy=policy, static_argnums=(3,))
    outputs = []
    for i in range(cfg.num_layers):
      x = layer_cls(cfg, layer_index=i, name=f'layer_{i}')(x, bias, deterministic)
      outputs.append(x)
    return jnp.stack(outputs) if self.return_all_layers else x


class BertPooler(nn.Module):
  """tanh Dense on final hidden states of [CLS]: [..., embed] -> [..., embed]."""
  config: EncoderConfig

  @nn.compact
  def __call__(self, cls_state):
    cfg = self.config
    return jnp.tanh(layers.DenseGeneral(
        cfg.hidden_size, ('embed', 'embed_out'), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=cfg.init, name='dense')(cls_state))


class BertModel(nn.Module):
  """Embeddings, encoder and pooler: (sequence_output, pooled_output).

  The pooler reads [CLS] (position 0), or with config.causal each row's last real token.
  With return_all_layers: (every layer's output [layers, batch, length, embed], pooled_output).
  """
  config: EncoderConfig
  return_all_layers: bool = False

  def setup(self):
    cfg = self.config
    if cfg.embed_width != cfg.hidden_size:
      raise ValueError(f'model.embedding_size={cfg.embedding_size} with hidden_size='
                       f'{cfg.hidden_size}: only ALBERT\'s encoder (model.name=\'albert\') '
                       'projects factorised embeddings; set model.embedding_size=0.')
    self.embeddings = BertEmbeddings(cfg)
    self.encoder = BertEncoder(cfg, self.return_all_layers)
    # Without a pooler the pooled output is the selected state as it is.
    self.pooler = BertPooler(cfg) if cfg.pooler else (lambda state: state)

  def __call__(self, input_ids, segment_ids, input_mask, deterministic=True, position_ids=None,
               pair_ids=None, cls_positions=None, language_ids=None):
    # input_ids, segment_ids, input_mask: [batch, length]. Packed rows also give position_ids
    # and pair_ids [batch, length] (attention stays within a pair) and cls_positions
    # [batch, pairs]: then pooled_output is [batch, pairs, embed]. Cross-lingual rows give
    # language_ids [batch, length] (XLM's, with config.num_languages).
    x = self.embeddings(input_ids, segment_ids, deterministic, position_ids, input_mask,
                        language_ids)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    cfg = self.config
    segment_ids_taken = attention_ops.takes_segment_ids(cfg.attention_impl, input_ids.shape[1],
                                                        cfg.head_dim, cfg.causal)
    if cfg.causal and pair_ids is not None:
      raise ValueError('Causal attention over packed rows is not supported (config '
                       'validation refuses config.data.packing with config.model.causal).')
    if cfg.causal and not segment_ids_taken:
      # [batch, 1, length, length]: the 'xla' attention's bias; config validation keeps causal
      # runs off the GPU fused kernels, which take no causal mask (the TPU kernels apply it).
      bias = layers.causal_attention_bias(input_mask, cfg.dtype)
    elif segment_ids_taken:
      # The fused kernels take segment ids: 1 real / 0 padding, or the pairs' ids.
      bias = (input_mask if pair_ids is None else pair_ids).astype(jnp.int32)
    else:
      bias = layers.row_attention_bias(input_mask, pair_ids, cfg.dtype)
    x = self.encoder(x, bias, deterministic)
    last = x[-1] if self.return_all_layers else x
    if cls_positions is None and cfg.causal:
      # A causal [CLS] has seen only itself; the last real token has seen the whole row.
      ends = layers.last_positions(input_mask)[:, None]  # [batch, 1]
      return x, self.pooler(layers.gather_positions(last, ends)[:, 0])
    return x, self.pooler(layers.first_or_gathered(last, cls_positions))

  def attend(self, x):
    return self.embeddings.attend(x)


def encoder_flops(model, length: int) -> float:
  """DESIGN.md's formula for the encoder and pooler: forward FLOPs of one sequence of `length`
  tokens (attention counted in full)."""
  h, f, layers_ = model.hidden_size, model.intermediate_size, model.num_layers
  return layers_ * (length * (8 * h * h + 4 * h * f) + 4 * length * length * h) + 2 * h * h


FAMILY = models.register(models.Family(name='bert', config_from=EncoderConfig.from_config,
                                       encoder=BertModel, flops=encoder_flops,
                                       hf=bert_hf.LAYOUT))

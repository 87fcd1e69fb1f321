"""BERT in flax.linen: embeddings, post-LN encoder, pooler, MLM and NSP heads.

Parameter names follow the original TF BERT (`bert/embeddings/word_embeddings`,
`bert/encoder/layer_N/attention/self/query/kernel`, `cls/predictions/output_bias`, ...), with
flax's `kernel`/`scale` leaf names, so real checkpoints map in by a table.
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.kernels.gpu import fused_attention
from bert_jax.kernels.gpu import fused_ffn
from bert_jax.kernels.gpu import fused_norm
from bert_jax.models import layers
from bert_jax import sharding

REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.dots_saveable,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16, 'float16': jnp.float16}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Model hyperparameters; see configs/base.py for what each means."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  scan_layers: bool = True
  scan_unroll: int = 1  # Layers per scan iteration (num_layers: fully unrolled, still stacked).
  remat_policy: str = 'none'
  gelu: str = 'erf'  # 'erf' (exact, as HF) or 'tanh' (the original TF code's approximation).
  # 'xla' (einsum softmax, dropout), 'cudnn' (fused, GPU) or 'pallas' (fused_attention's Triton
  # kernels for rows of 16-512 tokens, powers of two, packed or not; cuDNN for others; GPU).
  attention_impl: str = 'xla'
  # The backward of rows over 128 tokens with attention_impl='pallas': 'triton' or 'mosaic'
  # (fused_attention.MOSAIC_LONG_BLOCKS: bert_jax/kernels/gpu/flash_backward.py, Hopper GPUs).
  long_attention_backward: str = 'triton'
  # The backward of rows up to 128 tokens with attention_impl='pallas': 'triton' (one program per
  # row and head) or 'mosaic' (flash_backward.row_backward: rows of 64 or 128, nothing
  # recomputed; Hopper GPUs).
  short_attention_backward: str = 'triton'
  dropout_rng_impl: str = 'threefry'  # PRNG of the dropout masks: 'threefry' or 'rbg'.
  # Bias + dropout + residual + LayerNorm after each sublayer: 'xla' or 'pallas' (fused_norm).
  layer_norm_impl: str = 'xla'
  # The feed-forward block: 'xla' or 'pallas' (fused_ffn's Mosaic GPU kernels on both sides of
  # the GELU; tanh GELU; NVIDIA Hopper GPUs).
  ffn_impl: str = 'xla'
  flat_matmuls: bool = False  # Encoder dense layers as 2-d matmuls (layers.DenseGeneral.flatten).
  nsp: bool = True  # Whether the NSP head exists.
  seed: int = 0  # The run's seed (config.seed); seeds cuDNN's in-kernel attention dropout.

  @classmethod
  def from_config(cls, config) -> 'BertConfig':
    """Builds from a full ConfigDict (reads config.model and config.data.nsp)."""
    fields = dict(config.model)
    fields['dtype'] = DTYPES[fields['dtype']]
    fields['param_dtype'] = DTYPES[fields['param_dtype']]
    return cls(nsp=config.data.get('nsp', False), seed=config.get('seed', 0), **fields)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def init(self):
    return layers.truncated_normal(self.initializer_range)


class BertEmbeddings(nn.Module):
  """Token + segment + position embeddings, then LayerNorm and dropout."""
  config: BertConfig

  def setup(self):
    cfg = self.config
    embed = lambda name, rows: self.param(  # pylint: disable=g-long-lambda
        name, nn.with_logical_partitioning(cfg.init, (name_axis(name), 'embed')),
        (rows, cfg.hidden_size), cfg.param_dtype)
    self.word_embeddings = embed('word_embeddings', cfg.vocab_size)
    self.token_type_embeddings = embed('token_type_embeddings', cfg.type_vocab_size)
    self.position_embeddings = embed('position_embeddings', cfg.max_position_embeddings)
    self.layer_norm = layers.layer_norm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)
    self.dropout = nn.Dropout(cfg.hidden_dropout_rate)

  def __call__(self, input_ids, segment_ids, deterministic, position_ids=None):
    # input_ids, segment_ids: [batch, length]; position_ids (packed rows): [batch, length]
    length = input_ids.shape[1]
    # Gather the tables' embed dim (sharded under fsdp) before the lookups: rows looked up in
    # an embed-split table would have to be fully rematerialised to be split by batch instead.
    whole = lambda table, rows: nn.with_logical_constraint(table, (rows, None))  # noqa: E731
    positions = whole(self.position_embeddings, None)
    positions = (positions[None, :length] if position_ids is None
                 else jnp.take(positions, position_ids, axis=0))
    x = (jnp.take(whole(self.word_embeddings, 'vocab'), input_ids, axis=0)
         + jnp.take(whole(self.token_type_embeddings, None), segment_ids, axis=0)
         + positions)  # [batch, length, embed]
    x = self.layer_norm(x.astype(self.config.dtype))
    return self.dropout(x, deterministic=deterministic)

  def attend(self, x):
    """Logits against the (tied) word embeddings: [..., embed] -> [..., vocab]."""
    table = jnp.asarray(self.word_embeddings, self.config.dtype)
    return jnp.einsum('...e,ve->...v', x.astype(self.config.dtype), table)


def name_axis(embedding_name: str) -> str:
  """Logical name of an embedding table's row axis."""
  return 'vocab' if embedding_name == 'word_embeddings' else None


class BertSelfAttention(nn.Module):
  """Multi-head self-attention with a padding mask; returns [batch, length, heads, kv].

  bias: the additive attention bias [batch, 1, 1 or length, length]; with attention_impl='pallas'
  on rows fused_attention takes, the segment ids [batch, length] instead (BertModel decides).
  """
  config: BertConfig
  layer_index: int = 0  # Seeds cuDNN's attention dropout per layer.

  @nn.compact
  def __call__(self, x, bias, deterministic):
    cfg = self.config
    rate = 0.0 if deterministic else cfg.attention_dropout_rate
    heads = (cfg.num_heads, cfg.head_dim)
    if bias.ndim == 2:  # Segment ids [batch, length]: rows fused_attention takes.
      # One matmul for the three projections (the same parameters as the path below).
      kernels, biases = zip(*(layers.DenseParams(
          (x.shape[-1],), heads, ('embed', 'heads', 'kv'), cfg.param_dtype, cfg.init,
          name=name)() for name in ('query', 'key', 'value')))
      kernel = jnp.stack([jnp.asarray(k, cfg.dtype) for k in kernels], axis=1)  # [embed, 3, H, kv]
      x = jnp.asarray(x, cfg.dtype)
      if _splits_heads():  # [embed, 3 * H * kv] would not tile over heads: keep the n-d dot.
        qkv = jnp.einsum('ble,ejhd->bljhd', x, kernel)
      else:  # One 2-d matmul, measured on an H100 (experiments/perf_notes.md).
        qkv = (x.reshape(-1, x.shape[-1]) @ kernel.reshape(x.shape[-1], -1)).reshape(
            x.shape[:2] + kernel.shape[1:])
      qkv = nn.with_logical_constraint(qkv, ('batch', 'length', None, 'heads', 'kv'))
      keys = None
      if fused_attention.dropout_threshold(rate) > 0:
        keys = fused_attention.tile_keys(self.make_rng('dropout'), x.shape[0], cfg.num_heads)
      return kernel_attention(qkv, jnp.stack(biases), bias, keys, rate=rate,
                              long_blocks=fused_attention.long_blocks(cfg.long_attention_backward),
                              short_backward=cfg.short_attention_backward)
    project = lambda name: layers.DenseGeneral(  # pylint: disable=g-long-lambda
        heads, ('embed', 'heads', 'kv'), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=cfg.init, flatten=cfg.flat_matmuls, name=name)(x)
    query, key, value = project('query'), project('key'), project('value')
    if cfg.attention_impl in ('cudnn', 'pallas'):
      return layers.cudnn_attention(query, key, value, bias, rate,
                                    layers.cudnn_dropout_seed(cfg.seed, self.layer_index))
    dropout_rng = None
    if not deterministic and cfg.attention_dropout_rate > 0:
      dropout_rng = self.make_rng('dropout')
    return layers.dot_product_attention(query, key, value, bias, dropout_rng,
                                        cfg.attention_dropout_rate, deterministic, cfg.dtype)


def _splits_heads() -> bool:
  """Whether the current mesh splits the 'heads' logical axis over several devices."""
  mesh = jax.sharding.get_abstract_mesh()
  return not mesh.empty and sharding.ways(mesh, nn.logical_to_mesh_axes(('heads',))[0]) > 1


def _splitting_mesh(x, spec):
  """The mesh when it splits activation x (PartitionSpec spec) over several devices, for a
  kernel to run per device under shard_map; None on one device or when the mesh cannot split x
  (init's batch of 1): then the kernel runs on the whole array."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or sharding.indivisible(
      jax.ShapeDtypeStruct(x.shape, x.dtype), jax.sharding.NamedSharding(mesh, spec)):
    return None
  return mesh


def _on_each_device(kernel, args, in_specs, out_specs, *, whole: dict, setting: str):
  """kernel(*args), on a mesh of several devices under shard_map: each device runs it on its
  block of the activations (in_specs, out_specs: PartitionSpecs of args and the result, args[0]
  the activation that decides; parameters whole, their gradients summed by shard_map's
  transpose). On one device, or where the mesh cannot split args[0] (init's batch of 1), kernel
  runs on the whole arrays. whole: {what: mesh axes the rules map it to} for what the kernels
  need unsplit; a ValueError naming `setting` when the rules split one."""
  mesh = _splitting_mesh(args[0], in_specs[0])
  if mesh is None:
    return kernel(*args)
  split = {what: axes for what, axes in whole.items() if axes is not None}
  if split:
    raise ValueError(f"{setting} needs whole {' and '.join(split)}; the mesh rules split them "
                     f"over {' / '.join(map(repr, split.values()))}.")
  return jax.shard_map(kernel, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=False)(*args)


def kernel_attention(qkv, qkv_bias, segment_ids, keys, *, rate: float,
                     long_blocks: fused_attention.LongBlocks | None = None,
                     short_backward: str = 'triton'):
  """fused_attention.attention_qkv (interpreted off GPUs, for tests); on a mesh of several
  devices each runs the kernels on its rows and heads, under shard_map.

  qkv: [batch, length, 3, heads, head_dim] before the bias; qkv_bias: [3, heads, head_dim] (the
  parameters, in their dtype: the kernels' float32 sums give their gradient); segment_ids:
  [batch, length]; keys: fused_attention.tile_keys for the whole batch (so the masks do not
  depend on the mesh); long_blocks: the tiling of rows over 128 (fused_attention's default);
  short_backward: the kernel of the backward of rows up to 128 (fused_attention.KERNELS).
  """
  attend = functools.partial(fused_attention.attention_qkv, rate=rate, long_blocks=long_blocks,
                             short_backward=short_backward,
                             interpret=jax.default_backend() != 'gpu')
  heads = nn.logical_to_mesh_axes(('batch', 'length', None, 'heads', 'kv'))
  spec = jax.sharding.PartitionSpec
  keys_spec = None if keys is None else spec(heads[0], heads[3], None)
  # The bias is replicated over the batch axes; shard_map's transpose sums its gradient there.
  return _on_each_device(
      attend, (qkv, qkv_bias, segment_ids, keys),
      (heads, spec(None, heads[3], None), spec(heads[0], None), keys_spec),
      spec(heads[0], None, heads[3], None), whole={'rows': heads[1], 'heads': heads[4]},
      setting="attention_impl='pallas'")


class BertResidualOutput(nn.Module):
  """Dense back to embed, dropout, residual add, LayerNorm (post-LN)."""
  config: BertConfig
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
      y = kernel_ffn(jnp.asarray(x, cfg.dtype), up_kernel, up_bias, kernel)
      if not fused:
        y = y + jnp.asarray(bias, cfg.dtype)
    else:
      # With the fused kernel this matmul's bias goes to the kernel; flattening every encoder
      # dense layer measured 1.7% slower on an H100 than flattening all but this one (bool keep
      # masks, before the 16-bit draws; experiments/perf_notes.md), so it keeps the n-d dot there.
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
  config: BertConfig

  @nn.compact
  def __call__(self, y, dense_bias, residual, deterministic):
    # y, residual: [batch, length, embed]; dense_bias: [embed]
    cfg = self.config
    scale, offset = (self.param(name, init, (cfg.hidden_size,), cfg.param_dtype)
                     for name, init in layers.layer_norm_inits().items())
    rate = cfg.hidden_dropout_rate
    keys = None
    if not deterministic and fused_norm.dropout_threshold(rate) > 0:
      # Drawn for the whole batch, so the masks do not depend on the mesh.
      keys = fused_norm.row_keys(self.make_rng('dropout'), y.size // y.shape[-1]).reshape(
          y.shape[:-1])
    norm = functools.partial(_fused_norm_rows, rate=rate, eps=cfg.layer_norm_eps,
                             interpret=jax.default_backend() != 'gpu')
    args = (y, dense_bias, residual.astype(y.dtype), keys, scale, offset)
    rows = nn.logical_to_mesh_axes(('batch', 'length', 'embed'))
    replicated = jax.sharding.PartitionSpec()
    keys_spec = None if keys is None else jax.sharding.PartitionSpec(*rows[:-1])
    return _on_each_device(norm, args,
                           (rows, replicated, rows, keys_spec, replicated, replicated), rows,
                           whole={'embed rows': rows[2]}, setting="layer_norm_impl='pallas'")


def kernel_ffn(x, up_kernel, up_bias, kernel):
  """fused_ffn.ffn over [batch, length, embed] rows (its kernels on Hopper GPUs; elsewhere the
  same custom VJP the XLA way): on a mesh of several devices each runs it on its rows, under
  shard_map (the parameters gathered, their gradients summed by shard_map's transpose). Returns
  [batch, length, embed]."""
  rows = nn.logical_to_mesh_axes(('batch', 'length', 'embed'))
  mlp = nn.logical_to_mesh_axes(('mlp',))[0]
  spec = jax.sharding.PartitionSpec
  return _on_each_device(_ffn_rows, (x, up_kernel, up_bias, kernel),
                         (rows, spec(), spec(), spec()), spec(rows[0], None, None),
                         whole={'rows': rows[1], 'embed rows': rows[2], 'feed-forward rows': mlp},
                         setting="ffn_impl='pallas'")


def _ffn_rows(x, up_kernel, up_bias, kernel):
  """fused_ffn.ffn on [..., embed] rows."""
  y = fused_ffn.ffn(x.reshape(-1, x.shape[-1]), up_kernel, up_bias, kernel)
  return y.reshape(x.shape)


def _fused_norm_rows(y, bias, residual, keys, scale, offset, *, rate, eps, interpret):
  """fused_norm.dropout_add_layer_norm on [..., embed] rows; keys [...] (one per row)."""
  if keys is not None:
    keys = keys.reshape(-1)
  return fused_norm.dropout_add_layer_norm(y, bias, residual, keys, scale, offset, rate=rate,
                                           eps=eps, impl='pallas', interpret=interpret)


class BertAttention(nn.Module):
  """Self-attention block: `self` then `output` (dense, dropout, residual, LayerNorm)."""
  config: BertConfig
  layer_index: int = 0

  @nn.compact
  def __call__(self, x, bias, deterministic):
    context = BertSelfAttention(self.config, self.layer_index, name='self')(x, bias, deterministic)
    return BertResidualOutput(self.config, ('heads', 'kv'), name='output')(
        context, x, deterministic)


class BertLayer(nn.Module):
  """One post-LN Transformer encoder layer."""
  config: BertConfig
  layer_index: int = 0  # Position in the stack (unrolled layers only; scanned layers share 0).

  @nn.compact
  def __call__(self, x, bias, deterministic):
    cfg = self.config
    # x: [batch, length, embed]
    x = BertAttention(cfg, self.layer_index, name='attention')(x, bias, deterministic)
    # [batch, length, mlp]; with ffn_impl='pallas' x and the dense's parameters.
    h = BertIntermediate(cfg, name='intermediate')(x)
    return BertResidualOutput(cfg, ('mlp',), whole_ffn=cfg.ffn_impl == 'pallas',
                              name='output')(h, x, deterministic)


class BertIntermediate(nn.Module):
  """Dense to the feed-forward width, then GELU (exact erf, or the original code's tanh). With
  model.ffn_impl='pallas' its parameters only, (x, kernel, bias), for BertResidualOutput's
  fused_ffn.ffn to compute the whole block."""
  config: BertConfig

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
  config: BertConfig
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
  config: BertConfig

  @nn.compact
  def __call__(self, cls_state):
    cfg = self.config
    return jnp.tanh(layers.DenseGeneral(
        cfg.hidden_size, ('embed', 'embed_out'), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
        kernel_init=cfg.init, name='dense')(cls_state))


class BertModel(nn.Module):
  """Embeddings, encoder and pooler: (sequence_output, pooled_output).

  With return_all_layers: (every layer's output [layers, batch, length, embed], pooled_output).
  """
  config: BertConfig
  return_all_layers: bool = False

  def setup(self):
    cfg = self.config
    self.embeddings = BertEmbeddings(cfg)
    self.encoder = BertEncoder(cfg, self.return_all_layers)
    self.pooler = BertPooler(cfg)

  def __call__(self, input_ids, segment_ids, input_mask, deterministic=True, position_ids=None,
               pair_ids=None, cls_positions=None):
    # input_ids, segment_ids, input_mask: [batch, length]. Packed rows also give position_ids
    # and pair_ids [batch, length] (attention stays within a pair) and cls_positions
    # [batch, pairs]: then pooled_output is [batch, pairs, embed].
    x = self.embeddings(input_ids, segment_ids, deterministic, position_ids)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    cfg = self.config
    if cfg.attention_impl == 'pallas' and fused_attention.supported(input_ids.shape[1],
                                                                    cfg.head_dim):
      # fused_attention's kernels take segment ids: 1 real / 0 padding, or the pairs' ids.
      bias = (input_mask if pair_ids is None else pair_ids).astype(jnp.int32)
    else:
      bias = (layers.attention_bias(input_mask, cfg.dtype) if pair_ids is None
              else layers.pair_attention_bias(pair_ids, cfg.dtype))
    x = self.encoder(x, bias, deterministic)
    last = x[-1] if self.return_all_layers else x
    if cls_positions is None:
      return x, self.pooler(last[:, 0])
    return x, self.pooler(layers.gather_positions(last, cls_positions))

  def attend(self, x):
    return self.embeddings.attend(x)


class MaskedLmHead(nn.Module):
  """`cls/predictions`: Dense(gelu) -> LayerNorm -> tied-embedding logits + output bias."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, attend):
    cfg = self.config
    # x: [batch, predictions, embed], already gathered at the masked positions.
    x = layers.DenseGeneral(cfg.hidden_size, ('embed', 'embed_out'), dtype=cfg.dtype,
                            param_dtype=cfg.param_dtype, kernel_init=cfg.init,
                            name='transform_dense')(x)
    x = layers.gelu(x, cfg.gelu)
    x = layers.layer_norm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype,
                          name='transform_LayerNorm')(x)
    bias = self.param('output_bias', nn.with_logical_partitioning(nn.initializers.zeros,
                                                                   ('vocab',)),
                      (cfg.vocab_size,), cfg.param_dtype)
    logits = attend(x).astype(jnp.float32) + bias.astype(jnp.float32)
    return logits  # [batch, predictions, vocab]


class BertForPreTraining(nn.Module):
  """BERT with the MLM head and (when config.nsp) the NSP head."""
  config: BertConfig

  def setup(self):
    cfg = self.config
    self.bert = BertModel(cfg)
    self.predictions = MaskedLmHead(cfg)
    if cfg.nsp:
      self.seq_relationship = layers.DenseGeneral(
          2, ('embed', 'classes'), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
          kernel_init=cfg.init)

  def __call__(self, input_ids, segment_ids, input_mask, masked_lm_positions,
               deterministic=True, position_ids=None, pair_ids=None, nsp_positions=None):
    """Returns {'mlm_logits': [batch, predictions, vocab], 'nsp_logits': [batch, 2]}.

    Packed rows (several pairs per row) pass position_ids, pair_ids and nsp_positions (each
    pair's [CLS]); 'nsp_logits' is then [batch, pairs, 2].
    """
    sequence, pooled = self.bert(input_ids, segment_ids, input_mask, deterministic,
                                 position_ids, pair_ids, nsp_positions)
    gathered = layers.gather_positions(sequence, masked_lm_positions)
    outputs = {'mlm_logits': self.predictions(gathered, self.bert.attend)}
    if self.config.nsp:
      outputs['nsp_logits'] = self.seq_relationship(pooled).astype(jnp.float32)
    return outputs

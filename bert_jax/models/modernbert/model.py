"""The modern encoder (models registry name 'modernbert'): pre-norm layers, rotary positions, a
gated feed-forward, no biases, alternating local and global attention.

Warner et al. (2024), "Smarter, Better, Faster, Longer" (ModernBERT), change BERT's block rather
than its objective: the norm comes before each sublayer (the first layer's attention reads the
embeddings' norm directly) and once more after the last layer; queries and keys are rotated by
their positions instead of adding a learned position table; the feed-forward is GeGLU
(gelu(x W_in) * (x W_gate), then W_out); no dense layer or norm has a bias; every
model.global_every-th layer attends globally and the others within a window of
model.local_window tokens. Each is a config value (configs/base.py) so that an ablation can turn
one back to BERT's: model.norm, use_bias, feed_forward, positions, local_window, global_every.
There are no segment embeddings and no pooler: the pooled output is the first token's final
state. The MLM head is `predictions` (dense, GELU, norm, logits against the tied embeddings plus
a bias), without biases in the dense and the norm when model.use_bias is False.

Parameters, under `bert/` as every family's (hf.py maps them to transformers'
ModernBertForMaskedLM): embeddings/word_embeddings [vocab, embed] (and position_embeddings with
positions='absolute'), embeddings/norm; encoder/layer_N/attn_norm (N > 0), attention/qkv
[embed, 3, heads, kv], attention/output [heads, kv, embed], mlp_norm, mlp/wi [embed, 2, mlp]
(gated; [embed, mlp] for 'gelu'), mlp/wo [mlp, embed]; encoder/final_norm. With
model.scan_layers the layers are stacked under nn.scan (encoder/layer/..., each leaf [L, ...]):
every layer then has an attn_norm and reads per layer whether it is the first (whose norm it
skips) and whether it is global (which mask and rotation it selects), so one traced layer serves
all of them; the first layer's attn_norm is never read (interop/param_tree.py fills it with the
identity on import and drops it on export).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import models
from bert_jax.models import bert
from bert_jax.models import layers
from bert_jax.models.encoder import EncoderConfig
from bert_jax.models.modernbert import config as modernbert_config
from bert_jax.models.modernbert import hf as modernbert_hf
from bert_jax.ops import attention as attention_ops
from bert_jax.ops import positions as positions_ops


@dataclasses.dataclass(frozen=True)
class ModernbertConfig(modernbert_config.ModernbertKeys, EncoderConfig):
  """BERT's encoder config and ModernBERT's keys (config.py)."""


def config_from(config) -> ModernbertConfig:
  """The run's ConfigDict -> the encoder's config (no segment table, no pooler)."""
  return dataclasses.replace(ModernbertConfig.from_config(config), token_types=False,
                             pooler=False)


is_global = modernbert_config.is_global


def _norm(cfg, name: str) -> nn.Module:
  return layers.norm(cfg.norm, cfg.layer_norm_eps, cfg.use_bias, cfg.dtype, cfg.param_dtype, name)


class ModernEmbeddings(nn.Module):
  """Word embeddings (+ learned positions with positions='absolute'), norm, dropout."""
  config: ModernbertConfig

  def setup(self):
    cfg = self.config
    table = lambda name, rows, axis: self.param(  # pylint: disable=g-long-lambda
        name, nn.with_logical_partitioning(cfg.init, (axis, 'embed')), (rows, cfg.hidden_size),
        cfg.param_dtype)
    self.word_embeddings = table('word_embeddings', cfg.vocab_size, 'vocab')
    if cfg.positions == 'absolute':
      self.position_embeddings = table('position_embeddings', cfg.max_position_embeddings, None)
    self.norm = _norm(cfg, 'norm')
    self.dropout = nn.Dropout(cfg.hidden_dropout_rate)

  def __call__(self, input_ids, position_ids, deterministic):
    # input_ids, position_ids: [batch, length] -> [batch, length, embed]
    cfg = self.config
    words = nn.with_logical_constraint(self.word_embeddings, ('vocab', None))
    x = jnp.take(words, input_ids, axis=0)
    if cfg.positions == 'absolute':
      x = x + jnp.take(nn.with_logical_constraint(self.position_embeddings, (None, None)),
                       position_ids, axis=0)
    x = self.norm(x.astype(cfg.dtype))
    return self.dropout(x, deterministic=deterministic)

  def attend(self, x):
    """Logits against the (tied) word embeddings: [..., embed] -> [..., vocab]."""
    return layers.tied_logits(x, self.word_embeddings, self.config.dtype)


class ModernAttention(nn.Module):
  """One projection to queries, keys and values, rotary positions, attention, output dense."""
  config: ModernbertConfig
  window: int = 0  # Keys each side a query sees with attention_impl='splash' (0: the whole row).

  @nn.compact
  def __call__(self, x, bias, rotation, deterministic, is_global=None):
    # x: [batch, length, embed]; bias: [batch, 1, 1 or length, length] additive, or with
    # attention_impl='splash' the segment ids [batch, length]; rotation: (cos, sin) [batch or 1,
    # length, kv] or None; is_global: in a scanned stack, a traced bool that picks the splash
    # kernels' window (the whole row, or local_window // 2 each side) in place of `window`.
    cfg = self.config
    qkv = layers.DenseGeneral((3, cfg.num_heads, cfg.head_dim), ('embed', None, 'heads', 'kv'),
                              use_bias=cfg.use_bias, dtype=cfg.dtype,
                              param_dtype=cfg.param_dtype, kernel_init=cfg.init, name='qkv')(x)
    qkv = nn.with_logical_constraint(qkv, ('batch', 'length', None, 'heads', 'kv'))
    query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [batch, length, heads, kv]
    if rotation is not None:
      query, key = (positions_ops.rotate(t, *rotation) for t in (query, key))
    dropout_rng = None
    if not deterministic and cfg.attention_dropout_rate > 0:
      dropout_rng = self.make_rng('dropout')
    attend = lambda window: lambda q, k, v, b: attention_ops.attention(  # pylint: disable=g-long-lambda
        cfg.attention_impl, q, k, v, b, rate=cfg.attention_dropout_rate,
        deterministic=deterministic, dropout_rng=dropout_rng, dtype=cfg.dtype, window=window)
    if is_global is not None and attention_ops.takes_segment_ids(
        cfg.attention_impl, x.shape[1], cfg.head_dim):
      # A kernel is built for its window: both layer kinds' are compiled, the layer runs its own.
      context = jax.lax.cond(is_global, attend(0), attend(cfg.local_window // 2),
                             query, key, value, bias)
    else:
      context = attend(self.window)(query, key, value, bias)
    return layers.DenseGeneral(cfg.hidden_size, ('heads', 'kv', 'embed'), axis=(-2, -1),
                               use_bias=cfg.use_bias, dtype=cfg.dtype,
                               param_dtype=cfg.param_dtype, kernel_init=cfg.init,
                               name='output')(context)


class ModernFeedForward(nn.Module):
  """'geglu' / 'swiglu': act(x W_in) * (x W_gate) -> W_out, the two input halves one kernel
  [embed, 2, mlp]; 'gelu': BERT's gelu(x W_in) -> W_out."""
  config: ModernbertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    dense = lambda features, axes, name, axis=-1: layers.DenseGeneral(  # pylint: disable=g-long-lambda
        features, axes, axis=axis, use_bias=cfg.use_bias, dtype=cfg.dtype,
        param_dtype=cfg.param_dtype, kernel_init=cfg.init, name=name)
    f = cfg.intermediate_size
    if cfg.feed_forward == 'gelu':
      h = layers.gelu(dense(f, ('embed', 'mlp'), 'wi')(x), cfg.gelu)
    else:
      both = dense((2, f), ('embed', None, 'mlp'), 'wi')(x)  # [batch, length, 2, mlp]
      act = (layers.gelu(both[..., 0, :], cfg.gelu) if cfg.feed_forward == 'geglu'
             else nn.silu(both[..., 0, :]))
      h = act * both[..., 1, :]
    h = nn.with_logical_constraint(h, ('batch', 'length', 'mlp'))
    return dense(cfg.hidden_size, ('mlp', 'embed'), 'wo')(h)


class ModernLayer(nn.Module):
  """x + attention(norm(x)), then x + feed_forward(norm(x)); the first layer's attention reads
  x itself (the embeddings' norm is its norm)."""
  config: ModernbertConfig
  layer_index: int = 0

  @nn.compact
  def __call__(self, x, bias, rotation, deterministic, first=None, is_global_layer=None):
    # first, is_global_layer: in a scanned stack, traced bools (every layer has attn_norm, the
    # first skips it; the attention kernels' window follows the layer's kind).
    cfg = self.config
    drop = lambda y: nn.Dropout(cfg.hidden_dropout_rate)(y, deterministic=deterministic)  # noqa: E731
    if first is None:
      h = x if self.layer_index == 0 else _norm(cfg, 'attn_norm')(x)
    else:
      h = jnp.where(first, x, _norm(cfg, 'attn_norm')(x))
    window = 0 if is_global(cfg, self.layer_index) else cfg.local_window // 2
    x = x + drop(ModernAttention(cfg, window, name='attention')(h, bias, rotation, deterministic,
                                                               is_global_layer))
    x = x + drop(ModernFeedForward(cfg, name='mlp')(_norm(cfg, 'mlp_norm')(x)))
    return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))


class ScannedModernLayer(ModernLayer):
  """ModernLayer with the (carry, output) signature nn.scan needs: `flags` (first, global) are
  this layer's slice of the stack's; it selects its mask and rotation from both kinds'."""
  emit: bool = False  # Also return each layer's output (stacked by the scan).

  def __call__(self, x, flags, biases, rotations, deterministic):
    first, is_global_layer = flags
    pick = lambda g, l: jnp.where(is_global_layer, g, l)  # noqa: E731
    rotation = (None if rotations['global'] is None
                else jax.tree.map(pick, rotations['global'], rotations['local']))
    x = super().__call__(x, pick(biases['global'], biases['local']), rotation, deterministic,
                         first, is_global_layer)
    return x, (x if self.emit else None)


def layer_flags(cfg) -> tuple[np.ndarray, np.ndarray]:
  """([L] whether each layer is the first, [L] whether it attends globally): a scanned stack's
  per-layer inputs."""
  index = np.arange(cfg.num_layers)
  return index == 0, np.array([is_global(cfg, i) for i in index])


class ModernEncoder(nn.Module):
  """num_layers ModernLayers, stacked under nn.scan or unrolled (remat per layer), then the
  final norm. Returns the final states, or with return_all_layers every layer's output stacked
  (the last one normed): [layers, batch, length, embed]."""
  config: ModernbertConfig
  return_all_layers: bool = False

  @nn.compact
  def __call__(self, x, biases, rotations, deterministic):
    # biases, rotations: {'global': ..., 'local': ...} (rotations: None without rotary).
    cfg = self.config
    if cfg.scan_layers:
      layer_cls = ScannedModernLayer
      if cfg.remat_policy != 'none':
        layer_cls = nn.remat(layer_cls, policy=bert.REMAT_POLICIES[cfg.remat_policy],
                             prevent_cse=False, static_argnums=(5,))
      stack = nn.scan(
          layer_cls, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
          in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
          unroll=cfg.scan_unroll, metadata_params={nn.PARTITION_NAME: 'layers'})
      x, outputs = stack(cfg, emit=self.return_all_layers, name='layer')(
          x, layer_flags(cfg), biases, rotations, deterministic)
      x = _norm(cfg, 'final_norm')(x)
      return outputs.at[-1].set(x) if self.return_all_layers else x
    layer_cls = ModernLayer
    if cfg.remat_policy != 'none':
      layer_cls = nn.remat(layer_cls, policy=bert.REMAT_POLICIES[cfg.remat_policy],
                           static_argnums=(4,))
    outputs = []
    for i in range(cfg.num_layers):
      kind = 'global' if is_global(cfg, i) else 'local'
      x = layer_cls(cfg, layer_index=i, name=f'layer_{i}')(
          x, biases[kind], rotations[kind], deterministic)
      outputs.append(x)
    outputs[-1] = _norm(cfg, 'final_norm')(outputs[-1])
    return jnp.stack(outputs) if self.return_all_layers else outputs[-1]


class ModernBertModel(nn.Module):
  """Embeddings and encoder: (sequence_output, pooled_output), pooled the first token's state
  (or each packed pair's, at cls_positions). The registry's encoder signature; segment ids are
  not read."""
  config: ModernbertConfig
  return_all_layers: bool = False

  def setup(self):
    self.embeddings = ModernEmbeddings(self.config)
    self.encoder = ModernEncoder(self.config, self.return_all_layers)

  def __call__(self, input_ids, segment_ids, input_mask, deterministic=True, position_ids=None,
               pair_ids=None, cls_positions=None):
    # input_ids, input_mask: [batch, length]; packed rows also give position_ids (from 0 in each
    # sequence) and pair_ids [batch, length], and cls_positions [batch, pairs].
    del segment_ids
    cfg = self.config
    length = input_ids.shape[1]
    if position_ids is None:
      position_ids = layers.row_positions(input_ids)
    x = self.embeddings(input_ids, position_ids, deterministic)
    x = nn.with_logical_constraint(x, ('batch', 'length', 'embed'))
    if attention_ops.takes_segment_ids(cfg.attention_impl, length, cfg.head_dim):
      # The kernel masks segments (pair ids, or the input mask) and each layer's window itself.
      segments = input_mask if pair_ids is None else pair_ids
      biases = {'global': segments, 'local': segments}
    else:
      biases = self._biases(input_mask, pair_ids, length)
    rotations = {'global': None, 'local': None}
    if cfg.positions == 'rotary':
      rotations = {kind: positions_ops.cos_sin(position_ids, cfg.head_dim, theta)
                   for kind, theta in (('global', cfg.rope_theta),
                                       ('local', cfg.local_rope_theta))}
    x = self.encoder(x, biases, rotations, deterministic)
    last = x[-1] if self.return_all_layers else x
    return x, layers.first_or_gathered(last, cls_positions)

  def _biases(self, input_mask, pair_ids, length) -> dict:
    """{'global': the rows' additive mask, 'local': it within each layer's window}: [batch, 1,
    1 or length, length]."""
    cfg = self.config
    full = layers.row_attention_bias(input_mask, pair_ids, cfg.dtype)
    biases = {'global': full, 'local': full}
    if cfg.local_window > 0:
      window = positions_ops.sliding_window_mask(length, cfg.local_window // 2)
      biases['local'] = jnp.where(window[None, None], full, jnp.finfo(cfg.dtype).min).astype(
          cfg.dtype)  # [batch, 1, length, length]
    return biases

  def attend(self, x):
    return self.embeddings.attend(x)


def encoder_flops(model, length: int) -> float:
  """Forward FLOPs of one sequence of `length` tokens: the projections (8 H^2 per token), the
  feed-forward (4 H F, 6 H F gated) and attention counted over the whole row in every layer, as
  the dense masked computation does it (DESIGN.md's formula, without a pooler)."""
  h, f = model.hidden_size, model.intermediate_size
  ffn = (6 if getattr(model, 'feed_forward', 'gelu') in ('geglu', 'swiglu') else 4) * h * f
  return model.num_layers * (length * (8 * h * h + ffn) + 4 * length * length * h)


FAMILY = models.register(models.Family(name='modernbert', config_from=config_from,
                                       encoder=ModernBertModel, flops=encoder_flops,
                                       config=ModernbertConfig, hf=modernbert_hf.LAYOUT))

"""The shared encoder's config: config.model's common keys, each declared once with its default,
valid range or choices, whether it describes the architecture, and, where shared code reads a key
that one unit sets, that owner.

Every family's encoder config is this class (BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA, XLM) or
a subclass adding its unit's keys (models/<family>/config.py: DeBERTa, ModernBERT). config_lib
composes RANGES and CHOICES; models/architecture.py derives the architecture keys. No jax here:
validation loads this module without the encoders (the dtypes become jnp's on construction).
"""

import dataclasses
from typing import Any

from bert_jax import ops
from bert_jax.core import schema
from bert_jax.core.errors import ConfigError

# The compute and storage dtypes by name (config.model.dtype, param_dtype).
DTYPE_NAMES = ('float32', 'bfloat16', 'float16')


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """The encoder's hyperparameters: config.model's common keys (configs/base.py says what each
  means at length), and the family's and the run's settings that are no config key."""
  vocab_size: int = schema.field(30522, range=schema.POSITIVE, architecture='shape',
                                 doc='Rows of the word embedding table.')
  hidden_size: int = schema.field(768, range=schema.POSITIVE, architecture='shape',
                                  doc='H, the width of the hidden states.')
  num_layers: int = schema.field(12, range=schema.POSITIVE, architecture='shape', doc='L.')
  num_heads: int = schema.field(12, range=schema.POSITIVE, architecture='shape',
                                doc='A, the attention heads; must divide hidden_size.')
  intermediate_size: int = schema.field(3072, range=schema.POSITIVE, architecture='shape',
                                        doc='The feed-forward width (4H).')
  max_position_embeddings: int = schema.field(512, range=schema.POSITIVE, architecture='shape',
                                              doc='Rows of the learned position table.')
  type_vocab_size: int = schema.field(2, range=schema.POSITIVE, architecture='shape',
                                      doc='Rows of the segment (token type) table.')
  hidden_dropout_rate: float = schema.field(0.1, range=schema.BELOW_ONE,
                                            doc='Dropout on embeddings and hidden states.')
  attention_dropout_rate: float = schema.field(0.1, range=schema.BELOW_ONE,
                                               doc='Dropout on attention probabilities.')
  initializer_range: float = schema.field(0.02, range=schema.POSITIVE,
                                          doc='Stddev of the truncated-normal init.')
  layer_norm_eps: float = schema.field(1e-12, range=schema.POSITIVE, architecture='shape',
                                       doc="The LayerNorms' epsilon.")
  embedding_size: int = schema.field(
      0, range=schema.NON_NEGATIVE, architecture='switch', owner='albert',
      doc="E, the embedding tables' width, projected to H (ALBERT's, ELECTRA's); 0: H.")
  generator_fraction: float = schema.field(
      0.25, range=schema.POSITIVE, owner='rtd',
      doc="Replaced-token detection: the generator's width as a fraction of H.")
  generator_layer_fraction: float = schema.field(
      1.0, range=schema.POSITIVE, owner='rtd',
      doc="Replaced-token detection: the generator's layers as a fraction of num_layers.")
  disc_weight: float = schema.field(
      50.0, range=schema.NON_NEGATIVE, owner='rtd',
      doc="Replaced-token detection: the weight of the discriminator's loss.")
  embedding_sharing: str = schema.field(
      'shared', choices=('shared', 'gdes'), owner='rtd', pretraining_only=True,
      doc="How the generator and the discriminator share the embedding tables: 'shared' "
      "(ELECTRA) or 'gdes' (DeBERTa-v3's gradient-disentangled sharing).")
  # Not a config key: the family's. > 0 numbers real tokens from this position and gives padding
  # the row before it (RoBERTa's fairseq positions: padding_idx 1, real tokens from 2).
  position_offset: int = 0
  # Not a config key: the family's. False: no segment table, segment ids are not read
  # (DistilBERT).
  token_types: bool = True
  # Not a config key: the family's. False: no pooler parameters; the pooled output is the [CLS]
  # state itself (DistilBERT, and a distillation teacher, which pools nothing).
  pooler: bool = True
  # Named in the config; jnp's dtype once constructed.
  dtype: Any = schema.field(
      'float32', choices=DTYPE_NAMES,
      doc="The compute dtype ('bfloat16' for speed); softmax and loss stay float32.")
  param_dtype: Any = schema.field('float32', choices=DTYPE_NAMES[:2],
                                  doc='The storage dtype of parameters and optimizer state.')
  scan_layers: bool = schema.field(True, doc='Run the layers under nn.scan (one compiled layer).')
  scan_unroll: int = schema.field(
      1, range=schema.POSITIVE,
      doc='Layers per scan iteration (num_layers: fully unrolled, still stacked).')
  remat_policy: str = schema.field('none', choices=('none', 'full', 'dots', 'dots_no_batch'),
                                   doc='What the backward recomputes.')
  gelu: str = schema.field(
      'erf', choices=('erf', 'tanh'),
      doc="'erf' (exact, as HF) or 'tanh' (the original TF code's approximation).")
  causal: bool = schema.field(
      False, architecture='switch', owner='clm',
      doc='Each token attends to itself and earlier tokens; the pooler reads the last real token.')
  attention_impl: str = schema.field(
      'xla', choices=ops.attention_impls,
      doc="'xla', 'cudnn', 'pallas' (GPU), 'tpu' or 'splash' (TPU), or a registered kernel "
      '(ops.register_attention): how attention is computed.')
  long_attention_backward: str = schema.field(
      'triton', choices=ops.ATTENTION_BACKWARDS,
      doc="The backward of rows over 128 tokens with attention_impl='pallas'.")
  short_attention_backward: str = schema.field(
      'triton', choices=ops.ATTENTION_BACKWARDS,
      doc="The backward of rows up to 128 tokens with attention_impl='pallas'.")
  dropout_rng_impl: str = schema.field('threefry', choices=('threefry', 'rbg'),
                                       doc='The PRNG of the dropout masks.')
  layer_norm_impl: str = schema.field(
      'xla', choices=ops.NORM_IMPLS,
      doc='Bias + dropout + residual + LayerNorm after each sublayer: XLA or one kernel.')
  ffn_impl: str = schema.field('xla', choices=ops.FFN_IMPLS,
                               doc='The feed-forward block: XLA or the GPU kernels.')
  flat_matmuls: bool = schema.field(
      False, doc="The encoder's dense layers as 2-d matmuls (layers.DenseGeneral.flatten).")
  # The modern encoder's switches that shared code reads: the MLM head reads norm and use_bias,
  # the embeddings positions, the layers feed_forward; the other families refuse anything but
  # these defaults (DeBERTa takes positions='none'). ModernBERT's own keys (windows, rotary
  # thetas) are its unit's (models/modernbert/config.py).
  norm: str = schema.field('layer_norm', choices=('layer_norm', 'rms_norm'),
                           architecture='switch', owner='modernbert',
                           doc="The norms: 'layer_norm' or 'rms_norm'.")
  use_bias: bool = schema.field(True, architecture='switch', owner='modernbert',
                                doc="False drops the dense layers' and norms' biases.")
  feed_forward: str = schema.field('gelu', choices=('gelu', 'geglu', 'swiglu'),
                                   architecture='switch', owner='modernbert',
                                   doc="The feed-forward block: 'gelu' (BERT's) or gated.")
  positions: str = schema.field('absolute', choices=('absolute', 'rotary', 'none'),
                                architecture='switch', owner='modernbert',
                                doc="'absolute' (learned), 'rotary' or 'none'.")
  num_languages: int = schema.field(
      0, range=schema.NON_NEGATIVE, architecture='switch', owner='xlm',
      doc="XLM's language embeddings: rows of the table added to each token's embedding by its "
      'language id; 0: none (XLM-R, and every other family).')
  seed: int = 0  # The run's init seed (config.init_seed or seed); seeds cuDNN's attention dropout.

  def __post_init__(self):
    for name in ('dtype', 'param_dtype'):
      value = getattr(self, name)
      if isinstance(value, str):
        import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
        object.__setattr__(self, name, getattr(jnp, value))

  @classmethod
  def from_config(cls, config) -> 'EncoderConfig':
    """Builds from a full ConfigDict (reads config.seed and the keys of config.model that are
    this class's fields: a family's own keys are its config class's, models/<family>/)."""
    own = {f.name for f in dataclasses.fields(cls)}
    fields = {k: v for k, v in config.model.items() if k in own}
    seed = config.get('init_seed', -1)  # -1: config.seed (configs/base.py).
    return cls(seed=config.get('seed', 0) if seed < 0 else seed, **fields)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def embed_width(self) -> int:
    """Width of the embedding tables and of what the tied output embedding reads."""
    return self.embedding_size or self.hidden_size

  @property
  def init(self):
    from bert_jax.models import layers  # pylint: disable=g-import-not-at-top
    return layers.truncated_normal(self.initializer_range)


KEYS = schema.keys(EncoderConfig)  # The fields that are config.model keys.
schema.declare(KEYS, 'model.')
RANGES = schema.ranges(KEYS, 'model.')
CHOICES = schema.choices(KEYS, 'model.')


def check_shape(model) -> None:
  """The heads split the hidden state evenly (config.model; the ranges are RANGES')."""
  if model.hidden_size % model.num_heads:
    raise ConfigError(
        f'config.model.hidden_size={model.hidden_size} is not divisible by '
        f'config.model.num_heads={model.num_heads}; valid head counts divide it, e.g. '
        f'{[h for h in range(1, 33) if model.hidden_size % h == 0]}.')

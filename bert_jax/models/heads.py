"""BERT with a fine-tuning head (paper section 4): [CLS], per-token or start/end span outputs.

The encoder (config.model.name in the models registry) sits under its scope, `bert/` as in the
pretraining model, so pretrained encoder weights (ours, HF, TF) drop in; the head is freshly
initialised. The feature-based mode (paper 5.3)
freezes the encoder, concatenates its last layers and tags tokens with a BiLSTM.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import layers
from bert_jax import models
from bert_jax.tasks import base


class BertForFineTuning(nn.Module):
  """BERT + one task head; returns {'logits'} or {'start_logits', 'end_logits'} in float32."""
  config: Any  # The encoder's frozen config (its family's config_from).
  head: str  # One of tasks.base.HEADS.
  num_outputs: int  # Classes (1: regression; 2: span start and end).
  feature_layers: int = 0  # > 0: feature-based, frozen encoder, concat of the last N layers.
  lstm_units: int = 384  # Feature-based: units per direction of each BiLSTM layer.
  lstm_layers: int = 2  # Feature-based: stacked BiLSTM layers (the paper: two).
  model: str = 'bert'  # The encoder's name in the models registry.

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic=True):
    # input_ids, segment_ids, input_mask: [batch, length]
    cfg = self.config
    if self.head not in base.HEADS:
      raise ValueError(f'head={self.head!r}; valid heads are {base.HEADS}.')
    dense = lambda n, axes, name: layers.DenseGeneral(  # noqa: E731
        n, axes, dtype=cfg.dtype, param_dtype=cfg.param_dtype, kernel_init=cfg.init, name=name)
    dropout = nn.Dropout(cfg.hidden_dropout_rate)
    if self.feature_layers:
      return {'logits': self._feature_based(input_ids, segment_ids, input_mask, deterministic)}
    family = models.get(self.model)
    sequence, pooled = family.encoder(cfg, name=family.scope)(
        input_ids, segment_ids, input_mask, deterministic)  # [batch, length, embed], [batch, embed]
    if self.head in ('classification', 'regression'):
      x = dropout(pooled, deterministic=deterministic)
      return {'logits': dense(self.num_outputs, ('embed', 'classes'), 'classifier')(x)
                        .astype(jnp.float32)}  # [batch, classes]
    if self.head == 'token':
      x = dropout(sequence, deterministic=deterministic)
      return {'logits': dense(self.num_outputs, ('embed', 'classes'), 'classifier')(x)
                        .astype(jnp.float32)}  # [batch, length, classes]
    # Span: a start and an end vector dotted with every final hidden state (no dropout, as the
    # original run_squad.py).
    logits = dense(2, ('embed', 'classes'), 'qa_outputs')(sequence).astype(jnp.float32)
    return {'start_logits': logits[..., 0], 'end_logits': logits[..., 1]}  # [batch, length] each

  def _feature_based(self, input_ids, segment_ids, input_mask, deterministic):
    """Token logits from a BiLSTM over the frozen encoder's last feature_layers layers."""
    cfg = self.config
    if self.head != 'token':
      raise ValueError(f'The feature-based mode tags tokens; head={self.head!r} needs '
                       'feature_layers=0 (fine-tuning).')
    # The encoder runs without dropout and passes no gradient: its weights stay as loaded.
    family = models.get(self.model)
    all_layers, _ = family.encoder(cfg, return_all_layers=True, name=family.scope)(
        input_ids, segment_ids, input_mask, True)  # [layers, batch, length, embed]
    last = all_layers[-self.feature_layers:]
    x = jax.lax.stop_gradient(jnp.concatenate(list(last), axis=-1)).astype(jnp.float32)
    lengths = jnp.sum(input_mask, axis=-1).astype(jnp.int32)  # [batch]
    for i in range(self.lstm_layers):
      x = BiLstm(self.lstm_units, name=f'bilstm_{i}')(x, lengths)
      x = nn.Dropout(cfg.hidden_dropout_rate)(x, deterministic=deterministic)
    # x: [batch, length, 2 * lstm_units]
    return layers.DenseGeneral(self.num_outputs, ('mlp', 'classes'), kernel_init=cfg.init,
                               name='classifier')(x).astype(jnp.float32)


class BiLstm(nn.Module):
  """One bidirectional LSTM layer over the real (unpadded) tokens of each row."""
  units: int  # Per direction.

  @nn.compact
  def __call__(self, x, lengths):
    # x: [batch, length, features]; lengths: [batch] -> [batch, length, 2 * units]
    return nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(self.units), name='forward'),
                            nn.RNN(nn.OptimizedLSTMCell(self.units), name='backward'))(
                                x, seq_lengths=lengths)

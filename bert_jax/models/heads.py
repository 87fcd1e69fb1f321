"""BERT with a fine-tuning head (paper section 4): [CLS], per-token, start/end span or
multiple-choice outputs.

The encoder (config.model.name in the models registry) sits under its scope, `bert/` as in the
pretraining model, so pretrained encoder weights (ours, HF, TF) drop in; the head is freshly
initialised. With lstm_layers, a freshly initialised BiLSTM sits between the fine-tuned encoder
and the head (the paper's Table 5, "+ BiLSTM"). The feature-based mode (paper 5.3) freezes the
encoder, concatenates its last layers and tags tokens with a BiLSTM. The multiple-choice head
(SWAG) scores each choice's row from its pooled [CLS] state with one Dense(1), as transformers'
BertForMultipleChoice; the choices' scores are the logits.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import models
from bert_jax.models import layers

# The fine-tuning heads, each with the batch keys it trains on (a task's `head` names one).
TARGETS = {'classification': ('label',), 'regression': ('label',),
           'token': ('labels', 'label_weights'), 'span': ('start_positions', 'end_positions'),
           'multiple_choice': ('label',)}
HEADS = tuple(TARGETS)


class BertForFineTuning(nn.Module):
  """BERT + one task head; returns {'logits'} or {'start_logits', 'end_logits'} in float32."""
  config: Any  # The encoder's frozen config (its family's config_from).
  head: str  # One of HEADS.
  num_outputs: int  # Classes (1: regression; 2: span start and end; multiple choice: choices).
  feature_layers: int = 0  # > 0: feature-based, frozen encoder, concat of the last N layers.
  feature_lstm_units: int = 384  # Feature-based: units per direction of each BiLSTM layer.
  feature_lstm_layers: int = 2  # Feature-based: stacked BiLSTM layers (the paper: two).
  lstm_layers: int = 0  # Fine-tuning: BiLSTM layers between the encoder and the head (0: none).
  lstm_units: int = 384  # Fine-tuning: units per direction of each of those BiLSTM layers.
  model: str = 'bert'  # The encoder's name in the models registry.

  @nn.compact
  def __call__(self, input_ids, segment_ids, input_mask, deterministic=True):
    # input_ids, segment_ids, input_mask: [batch, length]; multiple choice [batch, choices, length]
    cfg = self.config
    if self.head not in HEADS:
      raise ValueError(f'head={self.head!r}; valid heads are {HEADS}.')
    if self.feature_layers:
      if self.lstm_layers:
        raise ValueError(f'lstm_layers={self.lstm_layers} with feature_layers='
                         f'{self.feature_layers}: the feature-based mode has its own BiLSTM '
                         '(feature_lstm_layers); set one of them to 0.')
      return {'logits': self._feature_based(input_ids, segment_ids, input_mask, deterministic)}
    if self.head in ('classification', 'regression'):
      return {'logits': self._classify(input_ids, segment_ids, input_mask, self.num_outputs,
                                       deterministic)}  # [batch, classes]
    if self.head == 'multiple_choice':
      if input_ids.ndim != 3:
        raise ValueError(f'The multiple-choice head reads [batch, choices, length] inputs; got '
                         f'shape {input_ids.shape}.')
      batch, choices, length = input_ids.shape
      rows = lambda x: x.reshape(batch * choices, length)  # noqa: E731
      # Each choice is a row of its own through the encoder and the [CLS] path, one score each.
      scores = self._classify(rows(input_ids), rows(segment_ids), rows(input_mask), 1,
                              deterministic)  # [batch * choices, 1]
      return {'logits': scores.reshape(batch, choices)}  # [batch, choices]
    sequence, _, width = self._encode(input_ids, segment_ids, input_mask, deterministic)
    if self.head == 'token':
      x = nn.Dropout(cfg.hidden_dropout_rate)(sequence, deterministic=deterministic)
      return {'logits': self._dense(self.num_outputs, (width, 'classes'), 'classifier')(x)
                        .astype(jnp.float32)}  # [batch, length, classes]
    # Span: a start and an end vector dotted with every final hidden state (no dropout, as the
    # original run_squad.py).
    logits = self._dense(2, (width, 'classes'), 'qa_outputs')(sequence).astype(jnp.float32)
    return {'start_logits': logits[..., 0], 'end_logits': logits[..., 1]}  # [batch, length] each

  def _dense(self, features, axes, name):
    """A head's DenseGeneral in the encoder's dtypes and initialiser."""
    cfg = self.config
    return layers.DenseGeneral(features, axes, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                               kernel_init=cfg.init, name=name)

  def _encode(self, input_ids, segment_ids, input_mask, deterministic):
    """(per-token outputs, sentence summary, their logical width axis): the encoder's sequence
    and pooled [CLS] state, or with lstm_layers the BiLSTM's outputs and bilstm_summary."""
    family = models.get(self.model)
    sequence, pooled = family.encoder(self.config, name=family.scope)(
        input_ids, segment_ids, input_mask, deterministic)  # [batch, length, embed], [batch, embed]
    if not self.lstm_layers:
      return sequence, pooled, 'embed'
    # [batch, length, 2 * lstm_units], [batch, 2 * lstm_units]
    sequence, pooled = self._bilstm(sequence, input_mask, deterministic)
    return sequence, pooled, 'mlp'

  def _classify(self, input_ids, segment_ids, input_mask, outputs, deterministic):
    """`outputs` float32 logits per row from its summary (pooled [CLS]): [batch, outputs]."""
    cfg = self.config
    _, pooled, width = self._encode(input_ids, segment_ids, input_mask, deterministic)
    if models.get(self.model).pre_classifier and not self.lstm_layers:
      # DistilBERT pools nothing: its classification head's own dense and ReLU on [CLS].
      pre_classifier = self._dense(cfg.hidden_size, ('embed', 'embed_out'), 'pre_classifier')
      pooled = nn.relu(pre_classifier(pooled))
    x = nn.Dropout(cfg.hidden_dropout_rate)(pooled, deterministic=deterministic)
    return self._dense(outputs, (width, 'classes'), 'classifier')(x).astype(jnp.float32)

  def _bilstm(self, sequence, input_mask, deterministic):
    """The encoder's output through lstm_layers BiLSTM layers over each row's real tokens: the
    per-token outputs and a sentence summary (bilstm_summary) in place of the pooled [CLS]."""
    lengths = jnp.sum(input_mask, axis=-1).astype(jnp.int32)  # [batch]
    # The recurrence runs in float32: a bfloat16 carry loses precision step after step.
    x = sequence.astype(jnp.float32)  # [batch, length, embed]
    for i in range(self.lstm_layers):
      if i:  # Between layers; the head's own dropout follows the last.
        x = nn.Dropout(self.config.hidden_dropout_rate)(x, deterministic=deterministic)
      x = BiLstm(self.lstm_units, name=f'bilstm_{i}')(x, lengths)
    # x: [batch, length, 2 * lstm_units]
    return x, bilstm_summary(x, lengths)

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
    for i in range(self.feature_lstm_layers):
      x = BiLstm(self.feature_lstm_units, name=f'bilstm_{i}')(x, lengths)
      x = nn.Dropout(cfg.hidden_dropout_rate)(x, deterministic=deterministic)
    # x: [batch, length, 2 * feature_lstm_units]
    return layers.DenseGeneral(self.num_outputs, ('mlp', 'classes'), kernel_init=cfg.init,
                               name='classifier')(x).astype(jnp.float32)


def bilstm_summary(outputs, lengths):
  """A sentence from a BiLSTM: the forward direction's output at the last real token joined to
  the backward direction's at the first token, the two outputs that have each read the whole row.

  outputs: [batch, length, 2 * units], forward half first (BiLstm's layout); lengths: [batch].
  Returns [batch, 2 * units].
  """
  units = outputs.shape[-1] // 2
  last = jnp.maximum(lengths - 1, 0)[:, None, None]  # [batch, 1, 1]
  forward = jnp.take_along_axis(outputs[..., :units], last, axis=1)[:, 0]  # [batch, units]
  return jnp.concatenate([forward, outputs[:, 0, units:]], axis=-1)


class BiLstm(nn.Module):
  """One bidirectional LSTM layer over the real (unpadded) tokens of each row.

  With seq_lengths, flax's backward RNN reverses only the first `length` steps of each row
  (padding stays at the end), so no direction reads padding before a real token: outputs at
  real tokens are the same whatever padding follows.
  """
  units: int  # Per direction.

  @nn.compact
  def __call__(self, x, lengths):
    # x: [batch, length, features]; lengths: [batch] -> [batch, length, 2 * units]
    return nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(self.units), name='forward'),
                            nn.RNN(nn.OptimizedLSTMCell(self.units), name='backward'))(
                                x, seq_lengths=lengths)


def input_shape(head: str, num_outputs: int, rows: int, length: int) -> tuple[int, ...]:
  """The shape of the model's inputs for `rows` examples of `length` tokens under `head`."""
  return (rows, num_outputs, length) if head == 'multiple_choice' else (rows, length)

"""Rows of pretraining instances -> masked, fixed-shape batches: pure numpy, no I/O.

A row holds one instance ([CLS] A [SEP] B [SEP], or the tokenizer's layout) or, packed,
several, each with its own positions and NSP label. Masking is data/masking.py's, for a whole batch at once: dynamic (one generator
per batch, vectorised) or static (one generator per instance, so a pass over the corpus repeats
its masks as the paper's dupe_factor copies did).
"""

import dataclasses

import numpy as np

from bert_jax.data import masking
from bert_jax.data import pretraining



@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamSettings(pretraining.MaskingSettings):
  """The masking settings plus the batch layout a pretraining batch stream needs."""
  batch_size: int  # Rows per batch of this process.
  packing: bool = False  # Several instances per row.
  max_pairs_per_row: int = 1  # With packing: instances per row at most (NSP labels per row).
  dupe_factor: int = 0  # 0: dynamic masking; N > 0: N fixed masks per document, cycled.


def row_length(instance: pretraining.Instance, special: pretraining.SpecialIds) -> int:
  """Tokens of the instance laid out: [CLS] A [SEP] (B [SEP])."""
  return (len(instance.tokens_a) + len(instance.tokens_b)
          + special.overhead(bool(len(instance.tokens_b))))


def make_batch(rows: list[list], rng: np.random.Generator, settings: StreamSettings,
               seed: int = 0) -> dict:
  """Rows of (instance, (generation, doc id), index in document) -> masked fixed-shape features
  (objectives.batch_spec's keys, plus the packing keys when settings.packing)."""
  s, k = settings, settings.max_pairs_per_row
  b, length = len(rows), settings.max_seq_length
  ids = np.full((b, length), s.special.pad, np.int32)
  segments = np.zeros((b, length), np.int32)
  pair_of = np.zeros((b, length), np.int32)  # 1 + index of the pair in its row; 0: padding.
  positions = np.zeros((b, length), np.int32)
  nsp_labels = np.zeros((b, k), np.int32)
  nsp_positions = np.zeros((b, k), np.int32)
  for r, row in enumerate(rows):
    start = 0
    for j, (instance, _, _) in enumerate(row):
      pair_ids, pair_segments = pretraining.assemble(instance, s.special)
      end = start + len(pair_ids)
      ids[r, start:end] = pair_ids
      segments[r, start:end] = pair_segments
      pair_of[r, start:end] = j + 1
      positions[r, start:end] = np.arange(end - start)
      nsp_labels[r, j] = int(instance.is_random_next)
      nsp_positions[r, j] = start
      start = end
  if s.dupe_factor:
    masked_ids, mlm_positions, mlm_ids, mlm_weights = masking.static_masks(ids, pair_of, rows, s,
                                                                          seed)
  else:
    masked_ids, mlm_positions, mlm_ids, mlm_weights = masking.mask_batch(ids, pair_of, rng, s)
  batch = {
      'input_ids': masked_ids,  # [b, length]
      'input_mask': (pair_of > 0).astype(np.int32),
      'segment_ids': segments,
      'masked_lm_positions': mlm_positions,  # [b, predictions]
      'masked_lm_ids': mlm_ids,
      'masked_lm_weights': mlm_weights,
  }
  if s.span_keys:
    batch.update(masking.span_boundaries(mlm_positions, mlm_weights))  # [b, predictions] each
  if not s.packing:
    batch['next_sentence_labels'] = nsp_labels[:, 0]  # [b]
    return batch
  num_pairs = np.array([len(row) for row in rows])
  batch.update({
      'next_sentence_labels': nsp_labels,  # [b, k]
      'nsp_positions': nsp_positions,  # [b, k]: each pair's [CLS]
      'nsp_weights': (np.arange(k)[None] < num_pairs[:, None]).astype(np.float32),
      'pair_ids': pair_of,  # [b, length]: attention stays within a pair
      'position_ids': positions,  # [b, length]: positions restart at each pair
  })
  return batch

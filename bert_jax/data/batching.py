"""Rows of pretraining instances -> masked, fixed-shape batches: pure numpy, no I/O.

A row holds one instance ([CLS] A [SEP] B [SEP]) or, packed, several, each with its own positions
and NSP label. Masking follows the paper (data/pretraining.py's rules) for a whole batch at once:
dynamic (one generator per batch, vectorised) or static (one generator per instance, so a pass
over the corpus repeats its masks as the paper's dupe_factor copies did).
"""

import dataclasses

import numpy as np

from bert_jax.data import pretraining

_STATIC_MASK_STREAM = 14  # Seeds static masks; streaming.py's streams use 11-15 too, apart.


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamSettings(pretraining.MaskingSettings):
  """The masking settings plus the batch layout a pretraining batch stream needs."""
  batch_size: int  # Rows per batch of this process.
  packing: bool = False  # Several instances per row.
  max_pairs_per_row: int = 1  # With packing: instances per row at most (NSP labels per row).
  dupe_factor: int = 0  # 0: dynamic masking; N > 0: N fixed masks per document, cycled.


def row_length(instance: pretraining.Instance) -> int:
  """Tokens of the instance laid out: [CLS] A [SEP] (B [SEP])."""
  return len(instance.tokens_a) + len(instance.tokens_b) + (3 if len(instance.tokens_b) else 2)


def make_batch(rows: list[list], rng: np.random.Generator, settings: StreamSettings,
               seed: int = 0) -> dict:
  """Rows of (instance, (generation, doc id), index in document) -> masked fixed-shape features
  (steps.BATCH_KEYS, plus the packing keys when settings.packing)."""
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
    masked_ids, mlm_positions, mlm_ids, mlm_weights = _static_masks(ids, pair_of, rows, s, seed)
  else:
    masked_ids, mlm_positions, mlm_ids, mlm_weights = mask_batch(ids, pair_of, rng, s)
  batch = {
      'input_ids': masked_ids,  # [b, length]
      'input_mask': (pair_of > 0).astype(np.int32),
      'segment_ids': segments,
      'masked_lm_positions': mlm_positions,  # [b, predictions]
      'masked_lm_ids': mlm_ids,
      'masked_lm_weights': mlm_weights,
  }
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


def mask_batch(ids, pair_of, rng, settings: StreamSettings):
  """The paper's masking of every pair of every row at once.

  Each pair gets min(max_predictions, max(1, round(len(pair) * mask_rate))) predictions (the
  original counts [CLS] and [SEP] in the length), chosen uniformly among its non-special tokens;
  a row's predictions are capped at max_predictions, later pairs losing out. Chosen tokens become
  [MASK] (mask_token_fraction), a random id (random_token_fraction) or stay.
  Returns (masked ids [b, s], positions [b, p], labels [b, p], weights [b, p]).
  """
  s = settings
  b, length = ids.shape
  special = np.isin(ids, [s.special.cls, s.special.sep, s.special.pad])
  candidate = (~special) & (pair_of > 0)
  k = s.max_pairs_per_row
  pair_lengths = np.stack([(pair_of == j + 1).sum(1) for j in range(k)], 1)  # [b, k]
  wanted = np.where(pair_lengths > 0, np.minimum(
      s.max_predictions, np.maximum(1, np.round(pair_lengths * s.mask_rate).astype(np.int64))), 0)
  before = np.cumsum(wanted, 1) - wanted
  wanted = np.clip(s.max_predictions - before, 0, wanted)  # [b, k]
  if s.is_continuation is not None:
    chosen = _choose_whole_words(ids, pair_of, candidate, wanted, rng, s.is_continuation)
  elif k == 1:  # One pair per row: the wanted smallest keys of each row, in O(length).
    keys = np.where(candidate, rng.random((b, length)), 2.0)
    most = int(min(s.max_predictions, length))
    smallest = np.argpartition(keys, most - 1, axis=1)[:, :most]  # [b, most], unordered
    order = np.argsort(np.take_along_axis(keys, smallest, 1), axis=1)
    smallest = np.take_along_axis(smallest, order, 1)
    chosen = np.zeros((b, length), bool)
    keep = np.arange(most)[None] < wanted[:, :1]
    np.put_along_axis(chosen, smallest, keep, 1)
    chosen &= candidate
  else:
    keys = np.where(candidate, rng.random((b, length)), 2.0)
    # Rank of each token's key within its pair: sort by (row, pair, key).
    row_of = np.broadcast_to(np.arange(b)[:, None], (b, length))
    order = np.lexsort((keys.ravel(), pair_of.ravel(), row_of.ravel()))
    group = (row_of.ravel() * (k + 1) + pair_of.ravel())[order]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    rank = np.arange(b * length) - np.repeat(starts, np.diff(np.r_[starts, b * length]))
    ranks = np.empty(b * length, np.int64)
    ranks[order] = rank
    ranks = ranks.reshape(b, length)
    limit = np.concatenate([np.zeros((b, 1), np.int64), wanted], 1)  # pair 0 (padding): none
    chosen = candidate & (ranks < np.take_along_axis(limit, pair_of, 1))
  p = s.max_predictions
  slots = np.sort(np.where(chosen, np.arange(length)[None], length), 1)[:, :p]  # [b, p]
  weights = (slots < length).astype(np.float32)
  positions = np.where(slots < length, slots, 0).astype(np.int32)
  labels = np.where(slots < length, np.take_along_axis(ids, positions, 1), s.special.pad)
  u = rng.random((b, p))
  random_ids = rng.integers(0, s.vocab_size, (b, p), dtype=np.int32)
  replaced = np.where(u < s.mask_token_fraction, s.special.mask,
                      np.where(u < s.mask_token_fraction + s.random_token_fraction, random_ids,
                               labels))
  masked = ids.copy()
  rows = np.repeat(np.arange(b), p)[weights.ravel() > 0]
  masked[rows, positions.ravel()[weights.ravel() > 0]] = replaced.ravel()[weights.ravel() > 0]
  return masked, positions, labels.astype(np.int32), weights


def _choose_whole_words(ids, pair_of, candidate, wanted, rng, is_continuation):
  """Whole-word masking, pair by pair, with the original's word-skipping rule."""
  chosen = np.zeros_like(candidate)
  for r in range(ids.shape[0]):
    for j in range(wanted.shape[1]):
      in_pair = pair_of[r] == j + 1
      if not in_pair.any() or not wanted[r, j]:
        continue
      span = np.flatnonzero(in_pair)
      picked = pretraining._choose_whole_words(  # pylint: disable=protected-access
          ids[r, span], candidate[r, span], is_continuation, int(wanted[r, j]), rng)
      chosen[r, span[np.asarray(picked, np.int64)]] = True
  return chosen


def _static_masks(ids, pair_of, rows, settings: StreamSettings, seed: int):
  """Static masking: each instance's mask is fixed by (seed, pass, document, index), so a pass
  over the corpus repeats its masks, as the paper's dupe_factor copies did."""
  s = settings
  b, p = ids.shape[0], s.max_predictions
  masked = ids.copy()
  positions = np.zeros((b, p), np.int32)
  labels = np.full((b, p), s.special.pad, np.int32)
  weights = np.zeros((b, p), np.float32)
  for r, row in enumerate(rows):
    filled = 0
    for j, (_, (generation, doc_id), index) in enumerate(row):
      span = np.flatnonzero(pair_of[r] == j + 1)
      rng = np.random.default_rng([seed, _STATIC_MASK_STREAM, generation, doc_id, index])
      pair_masked, pair_positions, pair_labels = pretraining.mask_tokens(
          ids[r, span], rng, special=s.special, vocab_size=s.vocab_size, mask_rate=s.mask_rate,
          max_predictions=p - filled, mask_token_fraction=s.mask_token_fraction,
          random_token_fraction=s.random_token_fraction, keep_fraction=s.keep_fraction,
          is_continuation=s.is_continuation)
      masked[r, span] = pair_masked
      count = len(pair_positions)
      positions[r, filled:filled + count] = span[pair_positions]
      labels[r, filled:filled + count] = pair_labels
      weights[r, filled:filled + count] = 1.0
      filled += count
  return masked, positions, labels, weights

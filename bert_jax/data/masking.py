"""Masked-LM corruption, the one masking module of both input paths.

The paper's rules (BERT's create_pretraining_data): [CLS] and [SEP] are never chosen;
num_to_predict = min(max_predictions, max(1, round(n_tokens * mask_rate))), [CLS] and [SEP]
counted in n_tokens; of the chosen tokens mask_token_fraction become [MASK],
random_token_fraction a random id (any id, as the original, or with a tokenizer whose
SpecialIds.draws_specials is False no special one, as RoBERTa's), the rest stay; whole-word
masking chooses all pieces of a word together; n-gram masking (ALBERT, max_ngram > 1) chooses runs of up to max_ngram tokens (words,
with whole-word masking) together; span masking (SpanBERT, spans='geometric') chooses
contiguous spans of Geometric(span_p) words, clipped at max_span, and gives each span one
80/10/10 decision; a mask_rate of 0 chooses nothing (the unmasked rows of a run
whose objectives read clean inputs, e.g. clm). mask_tokens masks one sequence (the in-memory
path, data/pipeline.py, and static masks), mask_parts each part of one on its own (translation-LM
rows, data/crosslingual.py); mask_batch masks every pair of a batch of (packed)
rows at once (the streaming path, data/batching.py). A new masking scheme is a new chooser here.
span_boundaries gives each prediction its span's boundary positions and its offset in the span
(the span boundary objective's batch keys), from the chosen positions alone.
"""

import functools

import numpy as np

_STATIC_MASK_STREAM = 14  # Seeds static masks; streaming.py's streams use 11-15 too, apart.
# Span masking: draws in a row that find no place for their span before the chooser gives up
# (a short row has no room for long spans; a full one none for any).
_SPAN_TRIES = 10
# Batch keys of span_boundaries, per prediction.
SPAN_KEYS = ('span_left_positions', 'span_right_positions', 'span_offsets')


def mask_tokens(input_ids, rng, *, special, vocab_size, mask_rate,
                max_predictions, mask_token_fraction, random_token_fraction,
                keep_fraction, is_continuation=None, max_ngram=1, spans='', span_p=0.2,
                max_span=10):
  """Chooses positions to predict and corrupts them: (masked_ids, positions, labels)."""
  del keep_fraction  # The remainder of the other two; the config validates it.
  input_ids = np.asarray(input_ids, np.int32)
  if mask_rate == 0:
    return input_ids.copy(), np.zeros(0, np.int32), np.zeros(0, np.int32)
  # Counts the special tokens too, as the original does.
  num_to_predict = min(max_predictions,
                       max(1, int(round(len(input_ids) * mask_rate))))
  is_candidate = ~np.isin(input_ids, [special.cls, special.sep, special.pad])
  if spans:
    positions = _choose_spans(input_ids, is_candidate, is_continuation, num_to_predict, rng,
                              span_p=span_p, max_span=max_span)
  elif max_ngram > 1:
    positions = _choose_ngrams(input_ids, is_candidate, is_continuation, num_to_predict,
                               max_ngram, rng)
  elif is_continuation is None:
    positions = rng.permutation(np.flatnonzero(is_candidate))[:num_to_predict]
  else:
    positions = _choose_whole_words(
        input_ids, is_candidate, is_continuation, num_to_predict, rng)
  positions = np.sort(positions).astype(np.int32)
  labels = input_ids[positions]
  masked_ids = input_ids.copy()
  masked_ids[positions] = _corrupt(
      labels, rng, special, vocab_size, mask_token_fraction,
      random_token_fraction, _run_starts(positions) if spans else None)
  return masked_ids, positions, labels


def mask_parts(input_ids, bounds, rng, *, max_predictions, **settings):
  """mask_tokens on each part of a row on its own, the row split at `bounds` (the first index of
  each part but the first): every part gets its own min(remaining, max(1, round(its length x
  mask_rate))) predictions, later parts losing out when max_predictions runs out, so that a
  translation pair's two sentences are both masked. `settings`: mask_tokens' other keywords.
  Returns (masked_ids, positions, labels) over the whole row."""
  input_ids = np.asarray(input_ids, np.int32)
  masked, positions, labels = [], [], []
  starts = [0, *bounds]
  for start, end in zip(starts, [*bounds, len(input_ids)]):
    part_masked, part_positions, part_labels = mask_tokens(
        input_ids[start:end], rng, max_predictions=max_predictions - sum(map(len, positions)),
        **settings)
    masked.append(part_masked)
    positions.append(part_positions + start)
    labels.append(part_labels)
  return (np.concatenate(masked), np.concatenate(positions).astype(np.int32),
          np.concatenate(labels).astype(np.int32))


def _choose_whole_words(input_ids, is_candidate, is_continuation,
                        num_to_predict, rng):
  """Returns the positions of random whole words, num_to_predict pieces at most."""
  words = _words(input_ids, is_candidate, is_continuation)
  chosen, num_chosen = [], 0
  for k in rng.permutation(len(words)):
    if num_chosen >= num_to_predict:
      break
    # A word that would overshoot is skipped, as in the original; a shorter
    # one later may still fit.
    if num_chosen + len(words[k]) > num_to_predict:
      continue
    chosen.append(words[k])
    num_chosen += len(words[k])
  if not chosen:
    return np.zeros(0, np.int64)
  return np.concatenate(chosen)


def _words(input_ids, is_candidate, is_continuation):
  """Splits candidate positions into words: a piece and the '##' pieces after it."""
  positions = np.flatnonzero(is_candidate)
  if not len(positions):
    return []
  return np.split(positions, _word_heads(input_ids, positions, is_continuation)[1:])


def _word_heads(input_ids, positions, is_continuation):
  """Indices into `positions` (candidates) where each word begins."""
  continues = np.asarray(is_continuation)[input_ids[positions]]
  # Unlike the original, a '##' piece right after [SEP] does not join the
  # last word of A: that piece lost its head to truncation.
  follows_candidate = np.diff(positions, prepend=-2) == 1
  return np.flatnonzero(~(continues & follows_candidate))


def _choose_ngrams(input_ids, is_candidate, is_continuation, num_to_predict, max_ngram, rng):
  """The positions of _ngram_spans' spans, num_to_predict at most."""
  spans = _ngram_spans(input_ids, is_candidate, is_continuation, num_to_predict, max_ngram, rng)
  if not spans:
    return np.zeros(0, np.int64)
  return np.concatenate(spans)


def _ngram_spans(input_ids, is_candidate, is_continuation, num_to_predict, max_ngram, rng):
  """ALBERT's n-gram masking (google-research/albert, create_pretraining_data.py,
  create_masked_lm_predictions): the words (tokens without whole-word masking) are visited in a
  random order; at each, n is drawn with p(n) proportional to 1/n among the n-grams starting
  there; an n-gram over the budget falls back to shorter ones, then is skipped, and one that
  overlaps a chosen word is skipped. Returns the chosen n-grams, each the positions of its
  words, num_to_predict positions at most in all."""
  positions = np.flatnonzero(is_candidate)
  if not len(positions):
    return []
  if is_continuation is None:
    heads = np.arange(len(positions))
  else:
    heads = _word_heads(input_ids, positions, is_continuation)
  bounds = np.append(heads, len(positions))  # Word k: positions[bounds[k]:bounds[k + 1]].
  num_words = len(heads)
  # An n-gram is n adjacent words; unlike ALBERT's, it never spans [SEP] (or a packed row's
  # next pair), so every masked span is a run of text.
  joined = positions[bounds[1:-1]] == positions[bounds[1:-1] - 1] + 1  # Word k + 1 follows k.
  longest = np.ones(num_words, np.int64)  # Words of the longest n-gram starting at each.
  reaches = np.ones(num_words, bool)
  for j in range(1, max_ngram):
    reaches[num_words - j:] = False
    reaches[:num_words - j] &= joined[j - 1:]
    longest += reaches
  # n of the n-gram at each word: p(n) proportional to 1/n for n up to its longest.
  weights = np.cumsum(1.0 / np.arange(1, max_ngram + 1))
  tables = np.stack([np.where(np.arange(max_ngram) < m, weights / weights[m - 1], 1.0)
                     for m in range(1, max_ngram + 1)])  # [longest - 1, n - 1]: P(draw <= n)
  draws = rng.random(num_words)
  drawn = 1 + (draws[:, None] >= tables[longest - 1]).sum(1)
  drawn, bounds = drawn.tolist(), bounds.tolist()
  covered = np.zeros(num_words, bool)
  chosen, num_chosen = [], 0
  for k in rng.permutation(num_words).tolist():
    if num_chosen >= num_to_predict:
      break
    n = drawn[k]
    while n > 1 and num_chosen + bounds[k + n] - bounds[k] > num_to_predict:
      n -= 1
    size = bounds[k + n] - bounds[k]
    if num_chosen + size > num_to_predict or covered[k:k + n].any():
      continue
    covered[k:k + n] = True
    chosen.append(positions[bounds[k]:bounds[k + n]])
    num_chosen += size
  return chosen


def span_length_probabilities(span_p: float, max_span: int) -> np.ndarray:
  """P(length = 1..max_span) of a span, in words: Geometric(span_p) clipped at max_span and
  renormalised, as SpanBERT's PairWithSpanMaskingScheme draws it (p=0.2, 10: mean 3.8)."""
  lengths = np.arange(1, max_span + 1)
  weights = span_p * (1.0 - span_p) ** (lengths - 1)
  return weights / weights.sum()


def _choose_spans(input_ids, is_candidate, is_continuation, num_to_predict, rng, *, span_p,
                  max_span):
  """The positions of _geometric_spans' spans, num_to_predict at most."""
  spans = _geometric_spans(input_ids, is_candidate, is_continuation, num_to_predict, rng,
                           span_p=span_p, max_span=max_span)
  if not spans:
    return np.zeros(0, np.int64)
  return np.concatenate([span for span, _ in spans])


def _geometric_spans(input_ids, is_candidate, is_continuation, num_to_predict, rng, *, span_p,
                     max_span):
  """SpanBERT's span masking (Joshi et al., 2020, section 3.1): until num_to_predict tokens
  are chosen, a length of n words is drawn (span_length_probabilities) and the span starts at a
  word drawn uniformly among those where n words fit. Words are whole words with
  is_continuation (tokens without), every piece of a chosen word is masked.

  Unlike SpanBERT's code, whose spans may overlap and then merge, a span here never overlaps
  or touches another (nor crosses [SEP]): each span's boundary tokens stay unmasked, and the
  drawn lengths are the masked spans' lengths. A draw that finds no place is drawn again,
  _SPAN_TRIES times in a row at most; the span that reaches the budget keeps the whole words
  that fit, and ends the choosing.
  Returns [(positions of the span, its drawn length in words)] in the order chosen."""
  positions = np.flatnonzero(is_candidate)
  if not len(positions):
    return []
  if is_continuation is None:
    heads = np.arange(len(positions))
  else:
    heads = _word_heads(input_ids, positions, is_continuation)
  bounds = np.append(heads, len(positions))  # Word k: positions[bounds[k]:bounds[k + 1]].
  num_words = len(heads)
  # Runs of text: a word that does not follow the one before (after [SEP]) starts a new run.
  starts_run = np.ones(num_words, bool)
  starts_run[1:] = positions[bounds[1:-1]] != positions[bounds[1:-1] - 1] + 1
  run = np.cumsum(starts_run)  # [words]
  cdf = np.cumsum(span_length_probabilities(span_p, max_span))
  blocked = np.zeros(num_words, bool)  # Words of a chosen span and their neighbours.
  chosen, num_chosen, failures = [], 0, 0
  while num_chosen < num_to_predict and failures < _SPAN_TRIES:
    drawn = min(max_span, 1 + int(np.searchsorted(cdf, rng.random(), side='right')))
    starts = np.zeros(0, np.int64)
    if drawn <= num_words:
      free = np.concatenate([[0], np.cumsum(~blocked)])
      fits = (free[drawn:] - free[:-drawn] == drawn) & (run[drawn - 1:] == run[:1 - drawn or None])
      starts = np.flatnonzero(fits)
    if not len(starts):
      failures += 1
      continue
    failures = 0
    k = int(starts[rng.integers(len(starts))])
    room = num_to_predict - num_chosen
    # The whole words of the span that fit the budget: all n, unless it is the last span.
    n = int(np.searchsorted(bounds[k:k + drawn + 1] - bounds[k], room, side='right')) - 1
    if n == 0:
      break
    chosen.append((positions[bounds[k]:bounds[k + n]], drawn))
    num_chosen += bounds[k + n] - bounds[k]
    lo = k - 1 if k > 0 and run[k - 1] == run[k] else k
    hi = k + n if k + n < num_words and run[k + n] == run[k] else k + n - 1
    blocked[lo:hi + 1] = True
    if n < drawn:
      break
  return chosen


def _run_starts(positions, weights=None):
  """For chosen positions sorted along the last axis ([..., p]; weights 0.0: padding), the index
  of the first position of each one's run of consecutive positions: its span's first token
  (spans never touch, so a run is one span)."""
  positions = np.asarray(positions)
  index = np.broadcast_to(np.arange(positions.shape[-1]), positions.shape)
  starts = np.ones(positions.shape, bool)
  starts[..., 1:] = positions[..., 1:] != positions[..., :-1] + 1
  if weights is not None:
    starts |= np.asarray(weights) <= 0
  return np.maximum.accumulate(np.where(starts, index, 0), axis=-1)


def span_boundaries(positions, weights) -> dict:
  """The span boundary objective's keys of chosen positions ([..., p], sorted along the last
  axis, padding weighted 0.0): each prediction's span is its run of consecutive positions;
  span_left_positions its first position - 1, span_right_positions its last + 1 (the tokens just
  outside it: text, or [CLS] / [SEP]), span_offsets the prediction's index in it (0 first);
  padding gets zeros. Any masking's positions have them; with span masking a run is a span."""
  positions = np.asarray(positions, np.int64)
  real = np.asarray(weights) > 0
  p = positions.shape[-1]
  index = np.broadcast_to(np.arange(p), positions.shape)
  first = _run_starts(positions, weights)
  ends = np.ones(positions.shape, bool)
  ends[..., :-1] = (positions[..., 1:] != positions[..., :-1] + 1) | ~real[..., 1:]
  # The index of each one's run's last position: the smallest run end at or after it.
  last = np.flip(np.minimum.accumulate(np.flip(np.where(ends, index, p), -1), axis=-1), -1)
  left = np.take_along_axis(positions, first, -1) - 1
  right = np.take_along_axis(positions, last, -1) + 1
  return {'span_left_positions': np.where(real, left, 0).astype(np.int32),
          'span_right_positions': np.where(real, right, 0).astype(np.int32),
          'span_offsets': np.where(real, index - first, 0).astype(np.int32)}


def _corrupt(labels, rng, special, vocab_size, mask_token_fraction,
             random_token_fraction, run_starts=None):
  """Returns the replacement of each chosen token (labels of any shape): [MASK], a random id,
  or itself. run_starts (span masking; the shape of labels): the index along the last axis of
  each token's span's first token, whose draw decides for the whole span (SpanBERT's
  replacement per span); a random replacement is still drawn per token."""
  u = rng.random(labels.shape)
  if run_starts is not None:
    u = np.take_along_axis(u, run_starts, -1)
  random_ids = random_tokens(rng, labels.shape, special, vocab_size)
  replacements = np.where(
      u < mask_token_fraction + random_token_fraction, random_ids, labels)
  return np.where(u < mask_token_fraction, special.mask, replacements).astype(np.int32)


def random_tokens(rng, shape, special, vocab_size) -> np.ndarray:
  """Uniform int32 ids in [0, vocab_size): any id, or with special.draws_specials False none of
  the special ids."""
  if special.draws_specials:
    return rng.integers(0, vocab_size, size=shape, dtype=np.int32)
  excluded = special.ids()
  excluded = excluded[excluded < vocab_size]
  k = rng.integers(0, vocab_size - len(excluded), size=shape, dtype=np.int64)
  # The k-th ordinary id is k plus the special ids below it: those whose id - rank is <= k.
  below = np.searchsorted(excluded - np.arange(len(excluded)), k, side='right')
  return (k + below).astype(np.int32)


def mask_batch(ids, pair_of, rng, settings):
  """The paper's masking of every pair of every row at once.

  Each pair gets min(max_predictions, max(1, round(len(pair) * mask_rate))) predictions (the
  original counts [CLS] and [SEP] in the length), chosen uniformly among its non-special tokens;
  a row's predictions are capped at max_predictions, later pairs losing out. Chosen tokens become
  [MASK] (mask_token_fraction), a random id (random_token_fraction) or stay.
  Returns (masked ids [b, s], positions [b, p], labels [b, p], weights [b, p]).
  """
  s = settings
  b, length = ids.shape
  if s.mask_rate == 0:
    p = s.max_predictions
    return (ids.copy(), np.zeros((b, p), np.int32), np.full((b, p), s.special.pad, np.int32),
            np.zeros((b, p), np.float32))
  special = np.isin(ids, [s.special.cls, s.special.sep, s.special.pad])
  candidate = (~special) & (pair_of > 0)
  k = s.max_pairs_per_row
  pair_lengths = np.stack([(pair_of == j + 1).sum(1) for j in range(k)], 1)  # [b, k]
  wanted = np.where(pair_lengths > 0, np.minimum(
      s.max_predictions, np.maximum(1, np.round(pair_lengths * s.mask_rate).astype(np.int64))), 0)
  before = np.cumsum(wanted, 1) - wanted
  wanted = np.clip(s.max_predictions - before, 0, wanted)  # [b, k]
  if s.spans:
    chosen = _choose_per_pair(ids, pair_of, candidate, wanted, rng, functools.partial(
        _choose_spans, is_continuation=s.is_continuation, span_p=s.span_p,
        max_span=s.max_span))
  elif s.max_ngram > 1:
    chosen = _choose_per_pair(ids, pair_of, candidate, wanted, rng, functools.partial(
        _choose_ngrams, is_continuation=s.is_continuation, max_ngram=s.max_ngram))
  elif s.is_continuation is not None:
    chosen = _choose_per_pair(ids, pair_of, candidate, wanted, rng, functools.partial(
        _choose_whole_words, is_continuation=s.is_continuation))
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
  replaced = _corrupt(labels, rng, s.special, s.vocab_size, s.mask_token_fraction,
                      s.random_token_fraction,
                      _run_starts(positions, weights) if s.spans else None)  # [b, p]
  masked = ids.copy()
  rows = np.repeat(np.arange(b), p)[weights.ravel() > 0]
  masked[rows, positions.ravel()[weights.ravel() > 0]] = replaced.ravel()[weights.ravel() > 0]
  return masked, positions, labels.astype(np.int32), weights


def _choose_per_pair(ids, pair_of, candidate, wanted, rng, choose):
  """Whole-word, n-gram or span masking, pair by pair: choose(input_ids, is_candidate,
  num_to_predict=, rng=) -> positions, mask_tokens' chooser."""
  chosen = np.zeros_like(candidate)
  for r in range(ids.shape[0]):
    for j in range(wanted.shape[1]):
      in_pair = pair_of[r] == j + 1
      if not in_pair.any() or not wanted[r, j]:
        continue
      span = np.flatnonzero(in_pair)
      picked = choose(ids[r, span], candidate[r, span], num_to_predict=int(wanted[r, j]),
                      rng=rng)
      chosen[r, span[np.asarray(picked, np.int64)]] = True
  return chosen


def static_masks(ids, pair_of, rows, settings, seed: int):
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
      pair_masked, pair_positions, pair_labels = mask_tokens(
          ids[r, span], rng, special=s.special, vocab_size=s.vocab_size, mask_rate=s.mask_rate,
          max_predictions=p - filled, mask_token_fraction=s.mask_token_fraction,
          random_token_fraction=s.random_token_fraction, keep_fraction=s.keep_fraction,
          is_continuation=s.is_continuation, max_ngram=s.max_ngram, spans=s.spans,
          span_p=s.span_p, max_span=s.max_span)
      masked[r, span] = pair_masked
      count = len(pair_positions)
      positions[r, filled:filled + count] = span[pair_positions]
      labels[r, filled:filled + count] = pair_labels
      weights[r, filled:filled + count] = 1.0
      filled += count
  return masked, positions, labels, weights

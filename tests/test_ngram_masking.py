"""ALBERT's n-gram masking (masking.max_ngram): span lengths, the budget, whole words, both
input paths, and max_ngram=1 leaving today's masks exactly as they are."""

import hashlib

import numpy as np
import pytest

from conftest import assert_refused

from bert_jax.data import batching
from bert_jax.data import masking
from bert_jax.data import pretraining
from configs import base

SPECIAL = pretraining.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 101
# The chooser's spans and words, to see what a span holds.
ngram_spans = masking._ngram_spans  # pylint: disable=protected-access
words_of = masking._words  # pylint: disable=protected-access


def continuation():
  """Ids 60 and up are '##' pieces."""
  is_continuation = np.zeros(VOCAB, bool)
  is_continuation[60:] = True
  return is_continuation


def mask_settings(**overrides):
  values = dict(vocab_size=VOCAB, mask_rate=0.15, mask_token_fraction=0.8,
                random_token_fraction=0.1, keep_fraction=0.1)
  values.update(overrides)
  return values


def pairs(seed, count=50):
  """[CLS] A [SEP] B [SEP] of random ids."""
  rng = np.random.default_rng(seed)
  return [np.concatenate([[2], rng.integers(5, VOCAB, rng.integers(1, 30)), [3],
                          rng.integers(5, VOCAB, rng.integers(1, 30)), [3]]).astype(np.int32)
          for _ in range(count)]


def stream_settings(k, **overrides):
  values = dict(special=SPECIAL, vocab_size=VOCAB, max_seq_length=64, max_predictions=9,
                nsp=True, short_seq_prob=0.1, mask_rate=0.15, mask_token_fraction=0.8,
                random_token_fraction=0.1, batch_size=16, packing=k > 1, max_pairs_per_row=k)
  values.update(overrides)
  return batching.StreamSettings(**values)


def packed_rows(k, seed=3):
  """(ids [16, 64], pair_of [16, 64]): k pairs a row, each [CLS] ... [SEP], then padding."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (16, 64)).astype(np.int32)
  pair_of = np.zeros((16, 64), np.int32)
  for r in range(16):
    start = 0
    for j in range(k):
      n = int(rng.integers(5, 64 // k))
      pair_of[r, start:start + n] = j + 1
      ids[r, start], ids[r, start + n - 1] = SPECIAL.cls, SPECIAL.sep
      start += n
    ids[r, start:] = SPECIAL.pad
  return ids, pair_of


def digest(arrays):
  h = hashlib.sha256()
  for array in arrays:
    h.update(np.ascontiguousarray(array).astype(np.int64).tobytes())
  return h.hexdigest()[:16]


# The unigram choosers' masks of these inputs and seeds, pinned: max_ngram=1 must keep them.
UNIGRAM_MASKS = {
    ('mask_tokens', False): '55547c7d33afb1a3', ('mask_tokens', True): '10666fa01e5456ee',
    ('mask_batch', False, 1): '002ee957b8198ba5', ('mask_batch', False, 3): '0a033ed70717c773',
    ('mask_batch', True, 1): '656581bfd89c3cb9', ('mask_batch', True, 3): '7ec4d62007558178',
}


@pytest.mark.parametrize('whole_word', [False, True])
def test_max_ngram_one_gives_the_unigram_masks(whole_word):
  is_continuation = continuation() if whole_word else None
  rng = np.random.default_rng(7)
  outputs = []
  for ids in pairs(1):
    outputs += masking.mask_tokens(ids, rng, special=SPECIAL, max_predictions=7,
                                   is_continuation=is_continuation, max_ngram=1,
                                   **mask_settings())
  assert digest(outputs) == UNIGRAM_MASKS[('mask_tokens', whole_word)]
  for k in (1, 3):
    ids, pair_of = packed_rows(k)
    settings = stream_settings(k, is_continuation=is_continuation, max_ngram=1)
    masked = masking.mask_batch(ids, pair_of, np.random.default_rng(5), settings)
    assert digest(masked) == UNIGRAM_MASKS[('mask_batch', whole_word, k)]


def test_span_lengths_follow_inverse_n_weights():
  # Long rows and a small budget: few spans overlap (a skipped overlap favours short n-grams),
  # and only spans chosen with room for 3 more tokens count (over the budget n falls back).
  length, budget = 2000, 20
  ids = np.arange(5, 5 + length).astype(np.int32)
  candidate = np.ones(length, bool)
  rng = np.random.default_rng(0)
  counts = np.zeros(4)
  for _ in range(1000):
    used = 0
    for span in ngram_spans(ids, candidate, None, budget, 3, rng):
      assert (np.diff(span) == 1).all()
      if budget - used >= 3:
        counts[len(span)] += 1
      used += len(span)
  n = counts.sum()
  observed = counts[1:] / n
  expected = (1 / np.arange(1, 4)) / (1 / np.arange(1, 4)).sum()  # 6/11, 3/11, 2/11
  bound = 4 * np.sqrt(expected * (1 - expected) / n)
  assert (np.abs(observed - expected) < bound + 0.003).all(), (observed, expected)


@pytest.mark.parametrize('whole_word', [False, True])
def test_ngram_masks_keep_the_budget_whole_words_and_specials(whole_word):
  is_continuation = continuation() if whole_word else None
  rng = np.random.default_rng(2)
  shortfall, total = 0, 0
  for ids in pairs(4, count=400):
    masked, positions, labels = masking.mask_tokens(
        ids, rng, special=SPECIAL, max_predictions=7, is_continuation=is_continuation,
        max_ngram=3, **mask_settings())
    wanted = min(7, max(1, round(len(ids) * 0.15)))
    assert len(positions) <= wanted
    shortfall, total = shortfall + wanted - len(positions), total + wanted
    assert not np.isin(ids[positions], [SPECIAL.cls, SPECIAL.sep]).any()
    np.testing.assert_array_equal(labels, ids[positions])
    assert (np.diff(positions) > 0).all()
    if whole_word:  # A word is chosen with all its pieces or not at all.
      chosen = np.zeros(len(ids), bool)
      chosen[positions] = True
      for word in words_of(ids, ~np.isin(ids, [2, 3]), is_continuation):
        assert chosen[word].all() or not chosen[word].any()
    unchanged = np.delete(np.arange(len(ids)), positions)
    np.testing.assert_array_equal(masked[unchanged], ids[unchanged])
  # The budget is met but for skipped overlaps and, with whole words, words that do not fit.
  assert shortfall <= (0.05 if whole_word else 0.01) * total


def test_spans_join_tokens_and_replace_80_10_10_per_token():
  ids = np.concatenate([[2], np.arange(5, 95), [3]]).astype(np.int32)
  rng = np.random.default_rng(0)
  runs, replaced, originals = [], [], []
  for _ in range(300):
    masked, positions, labels = masking.mask_tokens(
        ids, rng, special=SPECIAL, max_predictions=14, max_ngram=3, **mask_settings())
    runs.append(np.sum(np.diff(positions) == 1) / max(len(positions) - 1, 1))
    replaced.append(masked[positions])
    originals.append(labels)
  # Unigrams chosen at random would neighbour each other about 15% of the time.
  assert np.mean(runs) > 0.4
  replaced, originals = np.concatenate(replaced), np.concatenate(originals)
  n = len(replaced)
  assert abs(np.mean(replaced == SPECIAL.mask) - 0.8) < 4 * np.sqrt(0.16 / n)
  assert abs(np.mean(replaced == originals) - 0.1) < 4 * np.sqrt(0.09 / n) + 0.002


@pytest.mark.parametrize('whole_word', [False, True])
def test_mask_batch_ngrams_stay_within_each_pair_and_its_budget(whole_word):
  ids, pair_of = packed_rows(3)
  settings = stream_settings(3, is_continuation=continuation() if whole_word else None,
                             max_ngram=3, max_predictions=12)
  masked, positions, labels, weights = masking.mask_batch(ids, pair_of, np.random.default_rng(1),
                                                          settings)
  for r in range(len(ids)):
    real = positions[r][weights[r] > 0]
    assert not np.isin(ids[r, real], [SPECIAL.cls, SPECIAL.sep, SPECIAL.pad]).any()
    np.testing.assert_array_equal(labels[r][weights[r] > 0], ids[r, real])
    lengths = np.bincount(pair_of[r], minlength=4)[1:]
    wanted = np.minimum(12, np.maximum(1, np.round(lengths * 0.15))).astype(int)
    wanted = np.clip(12 - (np.cumsum(wanted) - wanted), 0, wanted)
    per_pair = np.bincount(pair_of[r, real], minlength=4)[1:]
    assert (per_pair <= wanted).all()
    # An n-gram never runs across a pair's [SEP] into the next pair: runs of masked positions
    # stay in one pair.
    for a, b in zip(real[:-1], real[1:]):
      if b == a + 1:
        assert pair_of[r, a] == pair_of[r, b]


def test_reference_evaluation_masks_unigrams():
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = base.get_config()
  config.masking.max_ngram = 3
  settings = pretraining.MaskingSettings(
      special=SPECIAL, vocab_size=VOCAB, max_seq_length=64, max_predictions=9, nsp=False,
      short_seq_prob=0.1, mask_rate=0.3, mask_token_fraction=1.0, random_token_fraction=0.0,
      max_ngram=3)
  config.masking.eval = 'reference'
  assert pretrain.eval_masking(settings, config).max_ngram == 1
  config.masking.eval = 'train'
  assert pretrain.eval_masking(settings, config).max_ngram == 3


def test_max_ngram_below_one_is_refused():
  config = base.get_config()
  config.masking.max_ngram = 0
  assert_refused(config, 'masking.max_ngram')

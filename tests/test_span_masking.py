"""SpanBERT's span masking (masking.spans='geometric'): the length law, the budget on real text,
whole words, one 80/10/10 decision per span, the boundary keys, and every input path."""

import numpy as np
import pytest

from bert_jax.data import batching
from bert_jax.data import corpus
from bert_jax.data import masking
from bert_jax.data import pretraining
from bert_jax.data import tokenizer as tokenizer_lib
from conftest import shared_data_dir

SPECIAL = pretraining.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 1009
geometric_spans = masking._geometric_spans  # pylint: disable=protected-access


def continuation():
  """Ids 700 and up are '##' pieces."""
  is_continuation = np.zeros(VOCAB, bool)
  is_continuation[700:] = True
  return is_continuation


def span_settings(**overrides):
  values = dict(vocab_size=VOCAB, mask_rate=0.15, mask_token_fraction=0.8,
                random_token_fraction=0.1, keep_fraction=0.1, spans='geometric', span_p=0.2,
                max_span=10)
  values.update(overrides)
  return values


def random_row(rng, length=126):
  """[CLS] random ids, about one in four a '##' piece, [SEP]."""
  return np.concatenate([[SPECIAL.cls], rng.integers(5, VOCAB, length),
                         [SPECIAL.sep]]).astype(np.int32)


@pytest.fixture(scope='module', name='wiki')
def fixture_wiki():
  """(rows of 512 real WordPiece tokens, [CLS] ... [SEP], from Wikipedia; the tokenizer)."""
  root = shared_data_dir()
  tokenizer = tokenizer_lib.WordPieceTokenizer(
      str(root / 'vocab' / 'bert-base-uncased-vocab.txt'), lowercase=True)
  documents = corpus.read_corpus(
      str(root / 'corpus' / 'enwiki-2015-wikiextractor' / 'wiki_00.txt.xz'), 'auto', 60)
  tokens = np.concatenate([ids for document in documents
                           for ids in tokenizer.encode_sentences(document)])
  special = tokenizer.special
  rows = [np.concatenate([[special.cls], tokens[start:start + 510], [special.sep]])
          for start in range(0, len(tokens) - 510, 510)]
  return np.stack(rows).astype(np.int32), tokenizer


def test_length_probabilities_are_the_clipped_renormalised_geometric():
  probabilities = masking.span_length_probabilities(0.2, 10)
  assert probabilities.sum() == pytest.approx(1.0)
  np.testing.assert_allclose(probabilities[1:] / probabilities[:-1], 0.8)
  # The paper's mean span length, 3.8 words.
  assert np.dot(np.arange(1, 11), probabilities) == pytest.approx(3.8, abs=0.05)
  assert masking.span_length_probabilities(1.0, 10)[0] == 1.0  # Every span one word.


@pytest.mark.slow
def test_span_lengths_follow_the_clipped_geometric_law_on_real_text(wiki):
  scipy_stats = pytest.importorskip('scipy.stats')
  rows, tokenizer = wiki
  is_continuation = tokenizer.is_continuation()
  drawn, masked_words = [], []
  seed = 0
  while len(drawn) < 100_000:
    rng = np.random.default_rng(seed)
    for row in rows:
      candidate = ~np.isin(row, [tokenizer.special.cls, tokenizer.special.sep])
      spans = geometric_spans(row, candidate, is_continuation, 77, rng, span_p=0.2, max_span=10)
      for index, (positions, length) in enumerate(spans):
        words = 1 + int(np.sum(~is_continuation[row[positions[1:]]]))
        masked_words.append(words)
        drawn.append(length)
        # Only the span that reaches the budget, the last, is cut to the words that fit.
        if index < len(spans) - 1:
          assert words == length
        else:
          assert words <= length
    seed += 1
  counts = np.bincount(drawn, minlength=11)[1:]
  expected = masking.span_length_probabilities(0.2, 10) * len(drawn)
  statistic, p_value = scipy_stats.chisquare(counts, expected)
  print(f'chi-square over {len(drawn)} spans: {statistic:.2f} (9 dof), p = {p_value:.3f}; '
        f'mean drawn length {np.mean(drawn):.3f}, masked {np.mean(masked_words):.3f} words')
  # 9 degrees of freedom: a fair sampler exceeds 27.88 once in a thousand runs (p = 0.001).
  assert statistic < scipy_stats.chi2.ppf(0.999, 9)
  # A sampler off by 2 points in the first length's share would be rejected at this size.
  tilted = expected.copy()
  tilted[0] *= 1.1
  tilted[1:] *= (len(drawn) - tilted[0]) / tilted[1:].sum()
  assert scipy_stats.chisquare(counts, tilted)[0] > scipy_stats.chi2.ppf(0.999, 9)


def test_fifteen_percent_of_real_tokens_are_masked(wiki):
  rows, tokenizer = wiki
  rng = np.random.default_rng(0)
  masked = 0
  for row in rows[:200]:
    _, positions, _ = masking.mask_tokens(
        row, rng, special=tokenizer.special, max_predictions=80,
        is_continuation=tokenizer.is_continuation(), **span_settings(vocab_size=30522))
    masked += len(positions)
  share = masked / rows[:200].size
  print(f'masked share over {rows[:200].size} tokens: {share:.4f}')
  assert abs(share - 0.15) <= 0.005


def test_spans_are_whole_words_that_neither_overlap_nor_touch(wiki):
  rows, tokenizer = wiki
  is_continuation = tokenizer.is_continuation()
  rng = np.random.default_rng(1)
  for row in rows[:50]:
    candidate = ~np.isin(row, [tokenizer.special.cls, tokenizer.special.sep])
    spans = geometric_spans(row, candidate, is_continuation, 77, rng, span_p=0.2, max_span=10)
    chosen = np.zeros(len(row), int)
    for positions, _ in spans:
      np.testing.assert_array_equal(positions, np.arange(positions[0], positions[-1] + 1))
      assert not is_continuation[row[positions[0]]]  # Starts at a word's first piece...
      assert not is_continuation[row[positions[-1] + 1]]  # ...and ends with the word's last.
      chosen[positions] += 1
      # The tokens just outside are no other span's.
      assert chosen[positions[0] - 1] == 0 and chosen[positions[-1] + 1] == 0
    assert chosen.max() <= 1
    assert chosen[0] == chosen[-1] == 0  # Never [CLS] or [SEP].
    assert chosen.sum() <= 77


def test_spans_count_tokens_without_whole_words():
  rng = np.random.default_rng(2)
  row = random_row(rng, 400)
  spans = geometric_spans(row, np.isin(row, [2, 3], invert=True), None, 60, rng, span_p=0.2,
                          max_span=10)
  for positions, length in spans[:-1]:
    assert len(positions) == length


def test_each_span_gets_one_replacement_decision():
  rng = np.random.default_rng(3)
  # Random ids never [MASK] here, so a random span is told from a masked one.
  special = pretraining.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4, draws_specials=False)
  outcomes = {'mask': 0, 'random': 0, 'keep': 0}
  for _ in range(400):
    row = random_row(rng)
    masked, positions, labels = masking.mask_tokens(
        row, rng, special=special, max_predictions=20, is_continuation=continuation(),
        **span_settings())
    starts = masking._run_starts(positions)  # pylint: disable=protected-access
    for start in np.unique(starts):
      replaced, original = masked[positions[starts == start]], labels[starts == start]
      if (replaced == SPECIAL.mask).all():
        outcomes['mask'] += 1
      elif (replaced == original).all():
        outcomes['keep'] += 1
      else:
        # A random span: no token of it became [MASK] (a random id may equal the original).
        assert not (replaced == SPECIAL.mask).any()
        outcomes['random'] += 1
  n = sum(outcomes.values())
  assert abs(outcomes['mask'] / n - 0.8) < 4 * np.sqrt(0.16 / n)
  assert abs(outcomes['random'] / n - 0.1) < 4 * np.sqrt(0.09 / n)
  assert abs(outcomes['keep'] / n - 0.1) < 4 * np.sqrt(0.09 / n) + 0.01


def test_span_boundaries_are_the_tokens_just_outside_each_run():
  positions = np.array([[3, 4, 5, 9, 12, 13, 0, 0], [1, 2, 7, 8, 9, 10, 11, 0]])
  weights = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]], np.float32)
  keys = masking.span_boundaries(positions, weights)
  np.testing.assert_array_equal(keys['span_left_positions'],
                                [[2, 2, 2, 8, 11, 11, 0, 0], [0, 0, 6, 6, 6, 6, 6, 0]])
  np.testing.assert_array_equal(keys['span_right_positions'],
                                [[6, 6, 6, 10, 14, 14, 0, 0], [3, 3, 12, 12, 12, 12, 12, 0]])
  np.testing.assert_array_equal(keys['span_offsets'],
                                [[0, 1, 2, 0, 0, 1, 0, 0], [0, 1, 0, 1, 2, 3, 4, 0]])


def check_boundaries(batch, ids):
  """Every real prediction's boundaries lie just outside its span, on unmasked tokens."""
  for r in range(len(ids)):
    real = batch['masked_lm_weights'][r] > 0
    positions = batch['masked_lm_positions'][r][real]
    left = batch['span_left_positions'][r][real]
    right = batch['span_right_positions'][r][real]
    offsets = batch['span_offsets'][r][real]
    np.testing.assert_array_equal(positions - offsets, left + 1)
    assert (right > positions).all()
    for p, lo, hi in zip(positions, left, right):
      inside = np.arange(lo + 1, hi)
      assert np.isin(inside, positions).all() and p in inside
      assert lo not in positions and hi not in positions
    assert ids[r, left[offsets == 0]].size == len(np.unique(left))


@pytest.mark.parametrize('dupe_factor,k', [(0, 1), (0, 3), (2, 3)])
def test_streamed_batches_carry_span_keys_within_each_pair(dupe_factor, k):
  rng = np.random.default_rng(4)
  rows = []
  for r in range(6):
    row = []
    for j in range(k):
      tokens = rng.integers(5, VOCAB, int(rng.integers(8, 120 // k))).astype(np.int32)
      row.append((pretraining.Instance(tokens, np.zeros(0, np.int32), False), (0, r), j))
    rows.append(row)
  settings = batching.StreamSettings(
      special=SPECIAL, vocab_size=VOCAB, max_seq_length=128, max_predictions=20, nsp=False,
      short_seq_prob=0.0, mask_rate=0.15, mask_token_fraction=0.8, random_token_fraction=0.1,
      is_continuation=continuation(), spans='geometric', span_keys=True, batch_size=6,
      packing=k > 1, max_pairs_per_row=k, dupe_factor=dupe_factor)
  batch = batching.make_batch(rows, np.random.default_rng(5), settings, seed=6)
  assert batch['span_offsets'].shape == batch['masked_lm_positions'].shape
  ids = np.where(batch['input_mask'] > 0, 5, 0)
  check_boundaries(batch, ids)
  if k > 1:  # A span's boundaries are in its own pair ([CLS] or [SEP] at the pair's edges).
    pair_ids = batch['pair_ids']
    for r in range(len(rows)):
      real = batch['masked_lm_weights'][r] > 0
      pairs = pair_ids[r, batch['masked_lm_positions'][r][real]]
      np.testing.assert_array_equal(pair_ids[r, batch['span_left_positions'][r][real]], pairs)
      np.testing.assert_array_equal(pair_ids[r, batch['span_right_positions'][r][real]], pairs)


def test_in_memory_features_carry_span_keys_only_when_asked():
  rng = np.random.default_rng(8)
  instance = pretraining.Instance(rng.integers(5, VOCAB, 100).astype(np.int32),
                                  np.zeros(0, np.int32), False)
  common = dict(special=SPECIAL, max_seq_length=128, max_predictions=20,
                is_continuation=continuation(), **span_settings())
  features = pretraining.make_features(instance, np.random.default_rng(9), span_keys=True,
                                       **common)
  check_boundaries({k: v[None] for k, v in features.items()}, features['input_ids'][None])
  plain = pretraining.make_features(instance, np.random.default_rng(9), **common)
  assert not set(masking.SPAN_KEYS) & set(plain)
  for key, value in plain.items():
    np.testing.assert_array_equal(features[key], value)

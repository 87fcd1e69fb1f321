"""Behaviour tests of the pretraining data semantics (bert_jax.data.pretraining)."""

import dataclasses

import numpy as np
import pytest

from bert_jax.data import masking as masking_lib
from bert_jax.data import pretraining

SPECIAL = pretraining.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 99
SEQ = 37  # max_num_tokens 34 > the longest sentence, so first chunks hold 2+ sentences.
FIRST_ID = 100  # Corpus ids start above the special ids.
MASKING = dict(mask_rate=0.15, mask_token_fraction=0.8,
               random_token_fraction=0.1, keep_fraction=0.1)


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Documents whose token id is FIRST_ID + the token's position in the corpus."""
  documents: list
  doc_of: np.ndarray  # [num_tokens] document of each token.
  sentence_of: np.ndarray  # [num_tokens] sentence (within its document).
  starts_sentence: np.ndarray  # [num_tokens] first token of a sentence.
  ends_sentence: np.ndarray  # [num_tokens] last token of a sentence.

  def docs(self, ids):
    return self.doc_of[np.asarray(ids) - FIRST_ID]

  def sentences(self, ids):
    return self.sentence_of[np.asarray(ids) - FIRST_ID]


def make_corpus(seed, num_docs=200, num_sentences=(5, 30), lengths=(5, 25)):
  """Returns a synthetic Corpus; sentence counts and lengths are inclusive ranges."""
  rng = np.random.default_rng(seed)
  documents, doc_of, sentence_of, starts, ends = [], [], [], [], []
  next_id = FIRST_ID
  for d in range(num_docs):
    document = []
    for s in range(rng.integers(num_sentences[0], num_sentences[1] + 1)):
      n = int(rng.integers(lengths[0], lengths[1] + 1))
      document.append(np.arange(next_id, next_id + n, dtype=np.int32))
      next_id += n
      doc_of += [d] * n
      sentence_of += [s] * n
      starts += [True] + [False] * (n - 1)
      ends += [False] * (n - 1) + [True]
    documents.append(document)
  return Corpus(documents, np.array(doc_of), np.array(sentence_of),
                np.array(starts), np.array(ends))


@pytest.fixture(scope='module')
def corpus():
  return make_corpus(seed=0)


def one_pass(corpus, seed, *, max_seq_length=SEQ, short_seq_prob=0.1, nsp=True):
  return pretraining.create_instances(
      corpus.documents, np.random.default_rng(seed),
      max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, nsp=nsp)


def is_run(ids):
  """True when ids are consecutive corpus positions."""
  return bool(np.all(np.diff(ids) == 1))


def instance(a, b=(), is_random_next=False):
  return pretraining.Instance(np.array(a, np.int32), np.array(b, np.int32),
                              is_random_next)


# Layout and features.


def test_assemble_lays_out_cls_a_sep_b_sep_with_segment_ids():
  input_ids, segment_ids = pretraining.assemble(
      instance([10, 11, 12], [13, 14]), SPECIAL)
  np.testing.assert_array_equal(input_ids, [2, 10, 11, 12, 3, 13, 14, 3])
  np.testing.assert_array_equal(segment_ids, [0, 0, 0, 0, 0, 1, 1, 1])
  assert input_ids.dtype == segment_ids.dtype == np.int32


def test_assemble_without_b_is_one_segment():
  input_ids, segment_ids = pretraining.assemble(instance([10, 11]), SPECIAL)
  np.testing.assert_array_equal(input_ids, [2, 10, 11, 3])
  np.testing.assert_array_equal(segment_ids, [0, 0, 0, 0])


def test_make_features_pads_to_fixed_shapes_with_zero_weights():
  features = pretraining.make_features(
      instance([10, 11, 12], [13, 14], is_random_next=True),
      np.random.default_rng(0), special=SPECIAL, vocab_size=VOCAB,
      max_seq_length=13, max_predictions=5, mask_rate=0.15,
      mask_token_fraction=1.0, random_token_fraction=0.0, keep_fraction=0.0)
  unmasked = np.array([2, 10, 11, 12, 3, 13, 14, 3, 0, 0, 0, 0, 0])
  position = features['masked_lm_positions'][0]  # round(8 * 0.15) = 1.
  assert position in (1, 2, 3, 5, 6)
  expected_ids = unmasked.copy()
  expected_ids[position] = SPECIAL.mask
  np.testing.assert_array_equal(features['input_ids'], expected_ids)
  np.testing.assert_array_equal(features['input_mask'], [1] * 8 + [0] * 5)
  np.testing.assert_array_equal(features['segment_ids'],
                                [0] * 5 + [1] * 3 + [0] * 5)
  np.testing.assert_array_equal(features['masked_lm_positions'][1:], [0] * 4)
  np.testing.assert_array_equal(features['masked_lm_ids'],
                                [unmasked[position], 0, 0, 0, 0])
  np.testing.assert_array_equal(features['masked_lm_weights'], [1, 0, 0, 0, 0])
  assert features['next_sentence_labels'].shape == ()
  assert features['next_sentence_labels'] == 1
  assert features['masked_lm_weights'].dtype == np.float32
  for key in ('input_ids', 'input_mask', 'segment_ids', 'masked_lm_positions',
              'masked_lm_ids', 'next_sentence_labels'):
    assert features[key].dtype == np.int32, key


def test_make_features_rejects_an_instance_longer_than_max_seq_length():
  with pytest.raises(ValueError, match='max_seq_length'):
    pretraining.make_features(
        instance(range(10, 20), [30]), np.random.default_rng(0),
        special=SPECIAL, vocab_size=VOCAB, max_seq_length=13,
        max_predictions=5, **MASKING)


def test_stack_features_adds_a_leading_batch_axis():
  rng = np.random.default_rng(0)
  features = [pretraining.make_features(
      instance([10, 11, 12], [13]), rng, special=SPECIAL, vocab_size=VOCAB,
      max_seq_length=13, max_predictions=5, **MASKING) for _ in range(3)]
  batch = pretraining.stack_features(features)
  assert batch['input_ids'].shape == (3, 13)
  assert batch['masked_lm_weights'].shape == (3, 5)
  assert batch['next_sentence_labels'].shape == (3,)


# Truncation.


def original_truncation_counts(len_a, len_b, max_num_tokens):
  """How many tokens the original's one-at-a-time loop cuts from A and from B."""
  cut_a = cut_b = 0
  while len_a + len_b > max_num_tokens:
    if len_a > len_b:
      len_a, cut_a = len_a - 1, cut_a + 1
    else:
      len_b, cut_b = len_b - 1, cut_b + 1
  return cut_a, cut_b


def test_truncate_seq_pair_cuts_as_many_from_each_side_as_the_original_loop():
  rng = np.random.default_rng(0)
  for _ in range(500):
    len_a, len_b = rng.integers(0, 40, size=2)
    max_num_tokens = int(rng.integers(1, 60))
    a, b = pretraining.truncate_seq_pair(
        np.arange(len_a), np.arange(len_b), max_num_tokens, rng)
    cut_a, cut_b = original_truncation_counts(len_a, len_b, max_num_tokens)
    assert (len(a), len(b)) == (len_a - cut_a, len_b - cut_b)
    assert len(a) + len(b) <= max_num_tokens


def test_truncate_seq_pair_trims_the_longer_one_and_b_on_a_tie():
  rng = np.random.default_rng(0)
  a, b = pretraining.truncate_seq_pair(np.arange(9), np.arange(4), 7, rng)
  assert (len(a), len(b)) == (4, 3)  # A shrinks to 4, then the tie cuts B.
  a, b = pretraining.truncate_seq_pair(np.arange(3), np.arange(11), 9, rng)
  assert (len(a), len(b)) == (3, 6)


def test_truncate_seq_pair_trims_from_both_front_and_back_over_seeds():
  tokens_a = np.arange(100, 121, dtype=np.int32)
  front_cuts = []
  for seed in range(200):
    a, _ = pretraining.truncate_seq_pair(
        tokens_a, np.zeros(0, np.int32), 13, np.random.default_rng(seed))
    start = int(a[0] - 100)
    np.testing.assert_array_equal(a, tokens_a[start:start + 13])
    front_cuts.append(start)
  front_cuts = np.array(front_cuts)
  assert np.mean(front_cuts > 0) > 0.9  # Some cuts at the front...
  assert np.mean(front_cuts < 8) > 0.9  # ...and some at the back.
  assert abs(np.mean(front_cuts) - 4) < 0.5  # Each cut's side is a fair coin.


def test_truncate_seq_pair_does_not_mutate_or_alias_its_inputs():
  tokens_a = np.arange(20, dtype=np.int32)
  tokens_b = np.arange(7, dtype=np.int32)
  a, b = pretraining.truncate_seq_pair(
      tokens_a, tokens_b, 11, np.random.default_rng(0))
  np.testing.assert_array_equal(tokens_a, np.arange(20))
  np.testing.assert_array_equal(tokens_b, np.arange(7))
  assert not np.shares_memory(a, tokens_a)
  assert not np.shares_memory(b, tokens_b)


# Instances.


@pytest.mark.parametrize('nsp', [True, False])
def test_every_instance_fits_max_seq_length(corpus, nsp):
  for seed in range(2):
    for max_seq_length in (SEQ, 19):
      for inst in one_pass(corpus, seed, max_seq_length=max_seq_length,
                           short_seq_prob=0.5, nsp=nsp):
        input_ids, _ = pretraining.assemble(inst, SPECIAL)
        assert len(input_ids) <= max_seq_length
        assert len(inst.tokens_a) >= 1
        assert (len(inst.tokens_b) >= 1) == nsp


@pytest.mark.slow
def test_nsp_labels_are_balanced_when_the_chunk_has_several_sentences(corpus):
  # A document's first chunk always holds 2+ sentences here (sentences are
  # shorter than the target); later chunks of one sentence are NotNext by
  # rule, which tilts a whole pass towards NotNext.
  labels = []
  for seed in range(100):
    rng = np.random.default_rng(seed)
    for doc_index in range(len(corpus.documents)):
      first = pretraining.create_instances_from_document(
          corpus.documents, doc_index, rng, max_seq_length=SEQ,
          short_seq_prob=0.0, nsp=True)[0]
      labels.append(first.is_random_next)
  assert len(labels) >= 20_000
  assert abs(np.mean(labels) - 0.5) < 0.02


def test_a_chunk_of_one_sentence_is_always_not_next(corpus):
  documents = corpus.documents + [[np.arange(5, 45, dtype=np.int32)]]
  for seed in range(20):
    instances = pretraining.create_instances_from_document(
        documents, len(documents) - 1, np.random.default_rng(seed),
        max_seq_length=SEQ, short_seq_prob=0.1, nsp=True)
    assert [inst.is_random_next for inst in instances] == [True]


def test_is_next_b_continues_a_in_the_same_document(corpus):
  max_num_tokens = SEQ - 3
  num_untruncated = 0
  for seed in range(3):
    for inst in one_pass(corpus, seed, short_seq_prob=0.5):
      if inst.is_random_next:
        continue
      a, b = inst.tokens_a, inst.tokens_b
      assert is_run(a) and is_run(b)
      assert len(set(corpus.docs(a)) | set(corpus.docs(b))) == 1
      assert b[0] > a[-1]
      # A pair shorter than max_num_tokens was not truncated, so nothing lies
      # between A and B and both are whole sentences.
      if len(a) + len(b) < max_num_tokens:
        num_untruncated += 1
        assert b[0] == a[-1] + 1
        assert corpus.starts_sentence[a[0] - FIRST_ID]
        assert corpus.ends_sentence[b[-1] - FIRST_ID]
  assert num_untruncated > 300


def test_not_next_b_is_a_run_of_another_document(corpus):
  num_not_next = 0
  for seed in range(3):
    for inst in one_pass(corpus, seed, short_seq_prob=0.5):
      if not inst.is_random_next:
        continue
      num_not_next += 1
      a, b = inst.tokens_a, inst.tokens_b
      assert is_run(a) and is_run(b)
      assert len(set(corpus.docs(a))) == len(set(corpus.docs(b))) == 1
      assert corpus.docs(a)[0] != corpus.docs(b)[0]
  assert num_not_next > 1000


def test_unused_sentences_of_a_not_next_chunk_are_put_back():
  # Sentences of 4 tokens and a target of 12 make every chunk 3 sentences and
  # never truncate, so each of a document's own sentences (A, and B when
  # IsNext) must be used exactly once and in order; dropping the chunk's tail
  # after a NotNext A would leave gaps.
  corpus = make_corpus(seed=1, num_docs=100, lengths=(4, 4))
  num_put_back = 0
  for seed in range(3):
    rng = np.random.default_rng(seed)
    for doc_index, document in enumerate(corpus.documents):
      own = []
      for inst in pretraining.create_instances_from_document(
          corpus.documents, doc_index, rng, max_seq_length=15,
          short_seq_prob=0.0, nsp=True):
        assert len(inst.tokens_a) + len(inst.tokens_b) <= 12
        sentences_a = corpus.sentences(inst.tokens_a)
        own += sorted(set(sentences_a))
        if inst.is_random_next:
          num_put_back += sentences_a[-1] < len(document) - 1
        else:
          own += sorted(set(corpus.sentences(inst.tokens_b)))
      assert own == list(range(len(document)))
  assert num_put_back > 500


def test_short_seq_prob_shortens_instances(corpus):
  # Longer sequences than SEQ, so that a short target is not lost to the
  # whole sentences that A and B each need.
  max_seq_length = 67
  max_num_tokens = max_seq_length - 3
  def lengths(short_seq_prob):
    instances = one_pass(corpus, 0, max_seq_length=max_seq_length,
                         short_seq_prob=short_seq_prob)
    return np.array([len(i.tokens_a) + len(i.tokens_b) for i in instances])
  full, short = lengths(0.0), lengths(1.0)
  assert np.mean(full == max_num_tokens) > 0.7
  assert np.mean(short == max_num_tokens) < 0.2
  assert np.mean(full < max_num_tokens / 2) < 0.1
  assert np.mean(short < max_num_tokens / 2) > 0.2


def test_without_nsp_a_is_a_run_of_whole_sentences_of_one_document(corpus):
  max_num_tokens = SEQ - 2
  num_untruncated = 0
  for inst in one_pass(corpus, 0, short_seq_prob=0.5, nsp=False):
    a = inst.tokens_a
    assert len(inst.tokens_b) == 0 and not inst.is_random_next
    assert is_run(a) and len(set(corpus.docs(a))) == 1
    if len(a) < max_num_tokens:
      num_untruncated += 1
      assert corpus.starts_sentence[a[0] - FIRST_ID]
      assert corpus.ends_sentence[a[-1] - FIRST_ID]
  assert num_untruncated > 500


def test_without_nsp_next_sentence_label_is_zero(corpus):
  rng = np.random.default_rng(0)
  labels = [pretraining.make_features(
      inst, rng, special=SPECIAL, vocab_size=VOCAB,
      max_seq_length=SEQ, max_predictions=7, **MASKING
  )['next_sentence_labels'] for inst in one_pass(corpus, 0, nsp=False)[:200]]
  assert not np.any(labels)


def test_a_one_document_corpus_falls_back_to_is_next():
  documents = [[np.arange(10 * s, 10 * s + 9, dtype=np.int32)
                for s in range(1, 9)]]
  instances = pretraining.create_instances(
      documents, np.random.default_rng(0), max_seq_length=SEQ,
      short_seq_prob=0.0, nsp=True)
  assert instances
  assert not any(inst.is_random_next for inst in instances)
  one_sentence = pretraining.create_instances(
      [documents[0][:1]], np.random.default_rng(0), max_seq_length=SEQ,
      short_seq_prob=0.0, nsp=True)
  assert one_sentence == []


# Masking.


def random_sequences(rng, count, length):
  """[CLS] tokens [SEP] tokens [SEP] of the given length, ids above the specials."""
  sequences = rng.integers(5, VOCAB, size=(count, length), dtype=np.int32)
  sequences[:, 0] = SPECIAL.cls
  sequences[:, length // 2] = SPECIAL.sep
  sequences[:, -1] = SPECIAL.sep
  return sequences


def mask(input_ids, rng, vocab_size=VOCAB, max_predictions=20,
         is_continuation=None, **masking):
  return masking_lib.mask_tokens(
      input_ids, rng, special=SPECIAL, vocab_size=vocab_size,
      max_predictions=max_predictions, is_continuation=is_continuation,
      **{**MASKING, **masking})


@pytest.mark.parametrize('fractions', [(0.8, 0.1, 0.1), (0.5, 0.3, 0.2)])
def test_chosen_tokens_become_mask_random_or_stay_in_configured_shares(
    fractions):
  mask_share, random_share, keep_share = fractions
  # A large vocabulary, so that a random id rarely equals the original.
  vocab_size = 30_011
  rng = np.random.default_rng(0)
  sequences = rng.integers(5, vocab_size, size=(5_300, 127), dtype=np.int32)
  sequences[:, [0, 63, 126]] = [SPECIAL.cls, SPECIAL.sep, SPECIAL.sep]
  counts = np.zeros(3)
  for input_ids in sequences:
    masked_ids, positions, labels = mask(
        input_ids, rng, vocab_size=vocab_size, mask_token_fraction=mask_share,
        random_token_fraction=random_share, keep_fraction=keep_share)
    chosen = masked_ids[positions]
    is_mask = chosen == SPECIAL.mask
    is_kept = chosen == labels
    counts += [is_mask.sum(), (~is_mask & ~is_kept).sum(), is_kept.sum()]
  assert counts.sum() >= 100_000
  np.testing.assert_allclose(counts / counts.sum(), fractions, atol=0.01)


@pytest.mark.parametrize('length,mask_rate,max_predictions,expected', [
    (17, 0.15, 20, 3),  # round(2.55)
    (7, 0.15, 20, 1),  # round(1.05)
    (3, 0.15, 20, 1),  # round(0.45) = 0, but at least one.
    (10, 0.25, 20, 2),  # round(2.5) = 2: Python rounds half to even.
    (99, 0.15, 5, 5),  # Capped by max_predictions.
])
def test_number_of_predictions_follows_the_original_formula(
    length, mask_rate, max_predictions, expected):
  input_ids = np.full(length, 7, np.int32)
  input_ids[[0, -1]] = [SPECIAL.cls, SPECIAL.sep]
  _, positions, labels = mask(input_ids, np.random.default_rng(1),
                              max_predictions=max_predictions,
                              mask_rate=mask_rate)
  assert len(positions) == len(labels) == expected


def test_special_tokens_are_never_chosen_and_the_rest_is_untouched():
  rng = np.random.default_rng(0)
  for input_ids in random_sequences(rng, 2000, 11):
    input_ids[-3:] = SPECIAL.pad
    masked_ids, positions, labels = mask(input_ids, rng, mask_rate=0.5)
    assert not np.isin(input_ids[positions],
                       [SPECIAL.cls, SPECIAL.sep, SPECIAL.pad]).any()
    assert np.all(np.diff(positions) > 0)
    np.testing.assert_array_equal(labels, input_ids[positions])
    unchosen = np.setdiff1d(np.arange(len(input_ids)), positions)
    np.testing.assert_array_equal(masked_ids[unchosen], input_ids[unchosen])


def test_share_of_chosen_tokens_is_close_to_mask_rate():
  rng = np.random.default_rng(0)
  num_chosen = num_tokens = 0
  for length in rng.integers(21, 120, size=3000):
    input_ids = random_sequences(rng, 1, length)[0]
    _, positions, _ = mask(input_ids, rng, max_predictions=100, mask_rate=0.15)
    num_chosen += len(positions)
    num_tokens += length
  assert abs(num_chosen / num_tokens - 0.15) < 0.005


def test_whole_word_masking_chooses_complete_words():
  # Ids 50..98 are '##' pieces; a word is a head id (5..49) and the '##'
  # pieces that follow it, never across a special token.
  is_continuation = np.arange(VOCAB) >= 50
  rng = np.random.default_rng(0)
  num_chosen = 0
  for input_ids in random_sequences(rng, 2000, 29):
    masked_ids, positions, _ = mask(
        input_ids, rng, is_continuation=is_continuation, mask_rate=0.3)
    assert len(positions) <= round(29 * 0.3)
    is_special = np.isin(input_ids, [SPECIAL.cls, SPECIAL.sep])
    word_of = np.cumsum(is_special | ~is_continuation[input_ids])
    chosen_words = np.unique(word_of[positions])
    whole = np.flatnonzero(np.isin(word_of, chosen_words) & ~is_special)
    np.testing.assert_array_equal(positions, whole)
    num_chosen += len(positions)
  assert num_chosen > 2000 * 5


def test_whole_word_masking_does_not_join_a_piece_across_sep():
  # B starts with a '##' piece (its head truncated away): its own word, not
  # part of A's last word. Two predictions fit exactly one of the two words.
  is_continuation = np.arange(VOCAB) >= 50
  input_ids = np.array([2, 10, 60, 3, 61, 62, 3], np.int32)
  for seed in range(20):
    _, positions, _ = mask(input_ids, np.random.default_rng(seed),
                           is_continuation=is_continuation, mask_rate=0.3)
    assert positions.tolist() in ([1, 2], [4, 5])


# Determinism.


def test_create_instances_is_deterministic_per_seed(corpus):
  def flat(instances):
    return [(i.tokens_a.tolist(), i.tokens_b.tolist(), i.is_random_next)
            for i in instances]
  assert flat(one_pass(corpus, 7)) == flat(one_pass(corpus, 7))
  assert flat(one_pass(corpus, 7)) != flat(one_pass(corpus, 8))


def test_make_features_is_deterministic_per_seed():
  inst = instance(range(10, 30), range(40, 50))
  def features(seed):
    return pretraining.make_features(
        inst, np.random.default_rng(seed), special=SPECIAL, vocab_size=VOCAB,
        max_seq_length=37, max_predictions=7, **MASKING)
  same, again, other = features(3), features(3), features(4)
  for key in same:
    np.testing.assert_array_equal(same[key], again[key])
  assert not np.array_equal(same['masked_lm_positions'],
                            other['masked_lm_positions'])

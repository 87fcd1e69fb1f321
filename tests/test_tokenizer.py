"""Tests for bert_jax.data.tokenizer."""

import hashlib
import os
import re

from conftest import shared_data_dir
import numpy as np
import pytest

from bert_jax.data import tokenizer as tokenizer_lib

_WORDS = ('the quick brown fox jumps over lazy dog and runs into forest where '
          'many animals live together happily jumping running sleeping').split()


def make_documents():
  """A small deterministic corpus whose words repeat often enough to be learned."""
  rng = np.random.default_rng(0)
  return [[' '.join(rng.choice(_WORDS, size=8)) + '.' for _ in range(20)] for _ in range(10)]


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A tokenizer trained once on the small corpus, lowercased."""
  output_dir = tmp_path_factory.mktemp('trained')
  return tokenizer_lib.train_tokenizer(make_documents(), 200, True, str(output_dir))


def write_vocab(tmp_path, tokens):
  """Writes a vocab.txt of `tokens`; returns its path."""
  path = tmp_path / 'vocab.txt'
  path.write_text(''.join(token + '\n' for token in tokens), encoding='utf-8')
  return str(path)


def test_trained_vocab_starts_with_specials(trained):
  with open(trained.vocab_file, encoding='utf-8') as f:
    first = [next(f).rstrip('\n') for _ in range(5)]
  assert first == ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
  assert trained.special == tokenizer_lib.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def test_trained_vocab_respects_vocab_size(tmp_path):
  tokenizer = tokenizer_lib.train_tokenizer(make_documents(), 120, True, str(tmp_path))
  assert 60 < tokenizer.vocab_size <= 120


def test_trained_vocab_is_written_to_output_dir(trained):
  assert os.path.basename(trained.vocab_file) == 'vocab.txt'
  with open(trained.vocab_file, encoding='utf-8') as f:
    assert len(f.read().splitlines()) == trained.vocab_size


def test_load_or_train_caches_in_workdir(tmp_path):
  first = tokenizer_lib.load_or_train_tokenizer('', make_documents(), 200, True, str(tmp_path))
  mtime = os.stat(first.vocab_file).st_mtime_ns
  # Different documents: a retrain would give another vocab, a cache hit the same one.
  second = tokenizer_lib.load_or_train_tokenizer(
      '', [['zebra yak zebra yak.'] * 5], 200, True, str(tmp_path))
  assert second.vocab_file == first.vocab_file
  assert os.stat(second.vocab_file).st_mtime_ns == mtime
  assert second.vocab_hash() == first.vocab_hash()


def test_load_or_train_prefers_vocab_file(tmp_path, trained):
  tokenizer = tokenizer_lib.load_or_train_tokenizer(
      trained.vocab_file, [], 200, True, str(tmp_path))
  assert tokenizer.vocab_hash() == trained.vocab_hash()
  assert not (tmp_path / 'vocab.txt').exists()


def test_missing_vocab_file_is_named(tmp_path):
  path = str(tmp_path / 'nope' / 'vocab.txt')
  with pytest.raises(FileNotFoundError, match=re.escape(path)):
    tokenizer_lib.load_or_train_tokenizer(path, [], 200, True, str(tmp_path))


def test_is_continuation_marks_hash_pieces(trained):
  with open(trained.vocab_file, encoding='utf-8') as f:
    tokens = f.read().splitlines()
  continuation = trained.is_continuation()
  assert continuation.dtype == bool and continuation.shape == (trained.vocab_size,)
  assert continuation.tolist() == [token.startswith('##') for token in tokens]
  assert continuation.any()


def test_encode_decode_round_trips_lowercase_text(trained):
  sentence = 'the quick brown fox jumps over the lazy dog.'
  [ids] = trained.encode_sentences([sentence])
  assert ids.dtype == np.int32
  assert trained.special.unk not in ids
  assert trained.decode(ids) == sentence


def test_encode_adds_no_special_tokens(trained):
  [ids] = trained.encode_sentences(['the fox'])
  assert not set(ids.tolist()) & set(trained.special.__dict__.values())


def test_lowercase_folds_case_and_accents(trained):
  upper, lower = trained.encode_sentences(['The QUICK Fóx', 'the quick fox'])
  np.testing.assert_array_equal(upper, lower)


def test_encode_documents_drops_empty_sentences_and_documents(trained):
  documents = [['the fox.', '', '  '], [''], ['lazy dog.', 'the dog.']]
  encoded = tokenizer_lib.encode_documents(trained, documents)
  assert [len(document) for document in encoded] == [1, 2]
  assert trained.decode(encoded[1][0]) == 'lazy dog.'


def test_missing_special_tokens_are_named(tmp_path):
  path = write_vocab(tmp_path, ['[PAD]', '[UNK]', '[CLS]', '[SEP]', 'the', '##s'])
  with pytest.raises(ValueError, match=re.escape(path) + r".*\[MASK\]"):
    tokenizer_lib.WordPieceTokenizer(path, lowercase=True)


def test_vocab_hash_is_sha256_of_file(tmp_path):
  path = write_vocab(tmp_path, ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'a'])
  tokenizer = tokenizer_lib.WordPieceTokenizer(path, lowercase=True)
  with open(path, 'rb') as f:
    assert tokenizer.vocab_hash() == hashlib.sha256(f.read()).hexdigest()


def test_shared_uncased_vocab_has_bert_layout():
  path = shared_data_dir() / 'vocab' / 'bert-base-uncased-vocab.txt'
  tokenizer = tokenizer_lib.WordPieceTokenizer(str(path), lowercase=True)
  assert tokenizer.vocab_size == 30522
  assert tokenizer.special == tokenizer_lib.SpecialIds(
      pad=0, unk=100, cls=101, sep=102, mask=103)
  [ids] = tokenizer.encode_sentences(['Hello, World!'])
  assert tokenizer.decode(ids) == 'hello, world!'


def test_runs_on_the_same_corpus_share_one_trained_vocab(tmp_path):
  cache = str(tmp_path / 'cache')
  first = tokenizer_lib.load_or_train_tokenizer('', make_documents(), 200, True,
                                                str(tmp_path / 'run1'), cache)
  shared = [p for p in (tmp_path / 'cache').rglob('vocab.txt')]
  assert len(shared) == 1
  mtime = os.stat(shared[0]).st_mtime_ns
  second = tokenizer_lib.load_or_train_tokenizer('', make_documents(), 200, True,
                                                 str(tmp_path / 'run2'), cache)
  assert second.vocab_file != first.vocab_file
  assert second.vocab_hash() == first.vocab_hash()
  assert os.stat(shared[0]).st_mtime_ns == mtime  # Not trained again.
  other = tokenizer_lib.load_or_train_tokenizer('', make_documents()[:3], 200, True,
                                                str(tmp_path / 'run3'), cache)
  assert other.vocab_file.endswith('run3/vocab.txt')
  assert len(list((tmp_path / 'cache').rglob('vocab.txt'))) == 2  # Another corpus, another key.

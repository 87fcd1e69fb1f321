"""A prepared corpus carries its vocab: a run streaming it needs no data.vocab_file."""

import dataclasses
import os

import pytest

from bert_jax.data import prepare
from bert_jax.data import records
from bert_jax.data import tokenizer as tokenizer_lib
from configs import base

WORDS = 'the cat sat on a mat and it was a sunny day'.split()


@pytest.fixture(name='prepared')
def fixture_prepared(tmp_path):
  """(prepared dir, the vocab given to prepare) for a two-document corpus."""
  vocab = tmp_path / 'given' / 'vocab.txt'
  vocab.parent.mkdir()
  letters = [chr(c) for c in range(ord('a'), ord('z') + 1)]
  tokens = list(tokenizer_lib.SPECIAL_TOKENS) + ['.'] + letters + ['##' + c for c in letters]
  vocab.write_text('\n'.join(dict.fromkeys(tokens + WORDS)) + '\n', encoding='utf-8')
  text = tmp_path / 'corpus.txt'
  text.write_text('The cat sat.\nIt was a sunny day.\n\nA mat.\nThe day.\n', encoding='utf-8')
  config = base.get_config()
  config.data.update(corpus=str(text), vocab_file=str(vocab), tokenizer_cache_dir='')
  output = tmp_path / 'prepared'
  prepare.prepare(config, str(output), workers=1)
  return str(output), str(vocab)


def test_prepare_keeps_a_copy_of_the_given_vocab(prepared):
  directory, vocab = prepared
  kept = os.path.join(directory, 'vocab.txt')
  with open(kept, 'rb') as a, open(vocab, 'rb') as b:
    assert a.read() == b.read()
  assert prepare.prepared_vocab_file(directory, records.read_metadata(directory)) == kept


def test_a_directory_without_the_copy_falls_back_to_the_metadatas_vocab(prepared):
  directory, vocab = prepared
  os.unlink(os.path.join(directory, 'vocab.txt'))
  metadata = records.read_metadata(directory)
  assert prepare.prepared_vocab_file(directory, metadata) == os.path.abspath(vocab)
  gone = dataclasses.replace(metadata, vocab_file=os.path.join(directory, 'missing.txt'))
  with pytest.raises(prepare.PrepareError, match=r'has no vocab.txt.*missing.txt.*vocab_file'):
    prepare.prepared_vocab_file(directory, gone)

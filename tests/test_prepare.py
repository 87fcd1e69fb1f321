"""Tests for bert_jax.data.prepare: shards, determinism, resume, bad input, the CLI."""

import gzip
import json
import lzma
import os
import pathlib
import subprocess
import sys

from conftest import shared_data_dir
import grain
import numpy as np
import pytest

from bert_jax.data import chunk_encoder
from bert_jax.data import corpus
from bert_jax.data import prepare
from bert_jax.data import records
from bert_jax.data import tokenizer as tokenizer_lib
from configs import base

REPO = pathlib.Path(__file__).resolve().parent.parent

BERT_TEXT = """The cat sat on the mat.
It was a sunny day, and the cat was happy.

Only sentence of the second document.

A third document starts here.
Its second sentence ends here!
"""

PROSE_TEXT = """<doc id="1" url="http://example.org/?curid=1" title="Alpha">
Alpha

Alpha is the first letter. It comes before beta, which is the second one. Mr. Smith agreed.
</doc>
<doc id="2" url="http://example.org/?curid=2" title="Beta">
Beta

Beta is the second letter. Does it end? Yes, here.
</doc>
"""

GUTENBERG_TEXT = (
    '\ufeffThe Project Gutenberg EBook of A Test\r\n\r\n'
    '*** START OF THIS PROJECT GUTENBERG EBOOK A TEST ***\r\n\r\n'
    'The book begins here, and the line is wrapped\r\n'
    'in the middle of a sentence. It ends here.\r\n\r\n'
    'Second paragraph of the book, with naïve café words.\r\n\r\n'
    '*** END OF THIS PROJECT GUTENBERG EBOOK A TEST ***\r\n'
    'License text.\r\n')

LETTERS = 'abcdefghijklmnopqrstuvwxyz0123456789'
WORDS = 'the cat sat on mat it was a sunny day and happy only sentence of second document'.split()


@pytest.fixture(scope='module')
def vocab_file(tmp_path_factory):
  """A hand-written vocab: specials, punctuation, characters, their '##' forms, a few words."""
  path = tmp_path_factory.mktemp('vocab') / 'vocab.txt'
  tokens = (list(tokenizer_lib.SPECIAL_TOKENS) + list('.,!?;:\'"()-') + list(LETTERS) +
            ['##' + c for c in LETTERS] + WORDS)
  path.write_text('\n'.join(dict.fromkeys(tokens)) + '\n', encoding='utf-8')
  return str(path)


def make_config(spec, vocab, **data):
  """configs/base.py with the corpus and vocab set; the trained-vocab cache off."""
  config = base.get_config()
  config.data.corpus = spec
  config.data.vocab_file = vocab
  config.data.tokenizer_cache_dir = ''
  for key, value in data.items():
    setattr(config.data, key, value)
  return config


def write(directory, name, text, opener=open):
  """Writes `text` (str, or bytes written as is) to directory/name; returns the path."""
  path = directory / name
  path.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(text, bytes):
    path.write_bytes(text)
  else:
    with opener(path, 'wt', encoding='utf-8', newline='') as f:
      f.write(text)
  return str(path)


def read_back(directory):
  """Every document of a prepared directory, in shard order, as lists of int32 arrays."""
  metadata = records.read_metadata(directory)
  paths = metadata.shard_paths(str(directory))
  if not paths:
    return metadata, []
  source = grain.sources.ArrayRecordDataSource(paths)
  return metadata, [records.decode_document(source[i], metadata.token_dtype)
                    for i in range(len(source))]


def expected_documents(spec, vocab, corpus_format='auto', lowercase=True):
  """What corpus.py and the tokenizer make of `spec`: the reference for the shards."""
  tokenizer = tokenizer_lib.WordPieceTokenizer(vocab, lowercase)
  return tokenizer_lib.encode_documents(tokenizer, corpus.read_corpus(spec, corpus_format))


def assert_same_documents(actual, expected):
  assert len(actual) == len(expected)
  for got, want in zip(actual, expected):
    assert len(got) == len(want)
    for got_sentence, want_sentence in zip(got, want):
      np.testing.assert_array_equal(got_sentence, want_sentence)


def shard_bytes(directory):
  """{shard name: its bytes} of a prepared directory."""
  return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
          if name.endswith('.array_record')}


def test_round_trip_keeps_documents_sentences_and_counts(tmp_path, vocab_file):
  inputs = tmp_path / 'in'
  paths = [write(inputs, 'a.txt', BERT_TEXT), write(inputs, 'b.txt.xz', PROSE_TEXT, lzma.open),
           write(inputs, 'c.txt.gz', GUTENBERG_TEXT, gzip.open)]
  spec = ','.join(paths)
  metadata = prepare.prepare(make_config(spec, vocab_file), tmp_path / 'out', workers=1)
  read_metadata, documents = read_back(tmp_path / 'out')
  assert read_metadata == metadata
  expected = expected_documents(spec, vocab_file)
  assert_same_documents(documents, expected)
  assert len(expected) == 6  # 3 + 2 + 1: the boundaries of every format are kept.
  assert metadata.num_documents == len(expected)
  assert metadata.num_sentences == sum(len(d) for d in expected)
  assert metadata.num_tokens == sum(len(s) for d in expected for s in d)
  assert sum(shard['documents'] for shard in metadata.shards) == metadata.num_documents
  assert metadata.sources == paths
  assert metadata.raw_bytes == sum(len(text.encode('utf-8'))
                                   for text in (BERT_TEXT, PROSE_TEXT, GUTENBERG_TEXT))
  assert metadata.vocab_sha256 == tokenizer_lib.WordPieceTokenizer(vocab_file, True).vocab_hash()
  assert metadata.token_dtype == 'uint16' and metadata.lowercase
  assert metadata.bad_input['one_sentence_documents'] == 1


def test_forced_formats_match_corpus_reader(tmp_path, vocab_file):
  path = write(tmp_path / 'in', 'a.txt', BERT_TEXT)
  for corpus_format in ('bert', 'prose'):
    output = tmp_path / corpus_format
    prepare.prepare(make_config(path, vocab_file, corpus_format=corpus_format), output,
                    workers=1)
    assert_same_documents(read_back(output)[1],
                          expected_documents(path, vocab_file, corpus_format))


def test_chunk_encoder_equals_the_tokenizer(vocab_file):
  sentences = [
      'The cat sat.', 'Café naïve RÉSUMÉ', 'a \u0301b', "x'\u0301y", '中文 test', 'A\x01B', '\x01',
      '', 'x' * 150 + ',y', 'İstanbul ΣΊΣΥΦΟΣ', 'ﬁne ½ ²', '(hello), [world]! "q"', 'ß ẞ 😀',
      'the the the cat,cat']
  vocabs = [vocab_file]
  if os.environ.get('BERT_JAX_DATA'):
    vocabs.append(str(shared_data_dir() / 'vocab' / 'bert-base-uncased-vocab.txt'))
  for vocab in vocabs:
    for lowercase in (True, False):
      tokenizer = tokenizer_lib.WordPieceTokenizer(vocab, lowercase)
      for max_entries in (4, 1000):  # Generations dropped at every call, or none.
        encoder = chunk_encoder.ChunkEncoder(tokenizer, 'int32', max_entries=max_entries)
        for batch in (sentences, sentences[::2], sentences, ['the cat', '']):
          ids, lengths = encoder.encode(batch)
          expected = tokenizer.encode_sentences(batch)
          np.testing.assert_array_equal(lengths, [len(e) for e in expected])
          np.testing.assert_array_equal(ids, np.concatenate(expected))


def test_two_workers_write_identical_shards(tmp_path, vocab_file):
  inputs = tmp_path / 'in'
  for i in range(5):
    write(inputs, f'{i}.txt', BERT_TEXT.replace('cat', f'cat{i}') * (i + 1))
  config = make_config(str(inputs / '*.txt'), vocab_file)
  one = prepare.prepare(config, tmp_path / 'one', workers=1, shard_mb=0.0002)
  two = prepare.prepare(config, tmp_path / 'two', workers=2, shard_mb=0.0002)
  assert len(one.shards) > 2
  assert one == two
  assert shard_bytes(tmp_path / 'one') == shard_bytes(tmp_path / 'two')


@pytest.mark.slow
def test_rerun_redoes_only_the_missing_unit(tmp_path, vocab_file):
  inputs = tmp_path / 'in'
  for i in range(4):
    write(inputs, f'{i}.txt', BERT_TEXT.replace('cat', f'cat{i}'))
  output = tmp_path / 'out'
  config = make_config(str(inputs / '*.txt'), vocab_file)
  first = prepare.prepare(config, output, workers=1, shard_mb=0.0001)
  assert len(first.shards) == 4
  before = shard_bytes(output)
  mtimes = {name: os.stat(output / name).st_mtime_ns for name in before}
  # What a run killed while writing unit 1 leaves: its shard missing, a temporary half-shard.
  os.unlink(output / 'documents-00001.array_record')
  (output / 'documents-00001.array_record.999.tmp').write_bytes(b'half')
  (output / records.METADATA_FILENAME).unlink()
  # And a shard cut short after its sidecar was written.
  with open(output / 'documents-00002.array_record', 'r+b') as f:
    f.truncate(100)
  second = prepare.prepare(config, output, workers=1, shard_mb=0.0001)
  assert second == first
  assert shard_bytes(output) == before
  redone = {name for name in before if os.stat(output / name).st_mtime_ns != mtimes[name]}
  assert redone == {'documents-00001.array_record', 'documents-00002.array_record'}
  assert not [name for name in os.listdir(output) if name.endswith('.tmp')]
  # A changed input redoes its own unit only.
  os.utime(inputs / '3.txt', ns=(0, 0))
  mtimes = {name: os.stat(output / name).st_mtime_ns for name in before}
  assert prepare.prepare(config, output, workers=1, shard_mb=0.0001) == first
  redone = {name for name in before if os.stat(output / name).st_mtime_ns != mtimes[name]}
  assert redone == {'documents-00003.array_record'}


def test_other_vocab_or_casing_into_the_same_output_is_refused(tmp_path, vocab_file):
  path = write(tmp_path / 'in', 'a.txt', BERT_TEXT)
  output = tmp_path / 'out'
  prepare.prepare(make_config(path, vocab_file), output, workers=1)
  other = tmp_path / 'other-vocab.txt'
  other.write_text(pathlib.Path(vocab_file).read_text(encoding='utf-8') + 'extra\n',
                   encoding='utf-8')
  old_hash = tokenizer_lib.WordPieceTokenizer(vocab_file, True).vocab_hash()
  new_hash = tokenizer_lib.WordPieceTokenizer(str(other), True).vocab_hash()
  with pytest.raises(prepare.PrepareError, match='another --output') as error:
    prepare.prepare(make_config(path, str(other)), output, workers=1)
  assert old_hash in str(error.value) and new_hash in str(error.value)
  with pytest.raises(prepare.PrepareError, match='data.lowercase True.*False'):
    prepare.prepare(make_config(path, vocab_file, lowercase=False), output, workers=1)
  with pytest.raises(prepare.PrepareError, match="data.corpus_format 'auto'.*'bert'"):
    prepare.prepare(make_config(path, vocab_file, corpus_format='bert'), output, workers=1)


def test_bad_input_is_counted_never_lost(tmp_path, vocab_file):
  inputs = tmp_path / 'in'
  long_sentence = ' '.join(['cat'] * 600) + '.'
  paths = [
      write(inputs, '0-empty.txt', ''),
      write(inputs, '1-blank.txt', 'The cat sat.\nIt was happy.\n   \n\t\nA new document.\n'
                                   'It is here.\n'),
      write(inputs, '2-latin1.txt', b'The caf\xe9 sat.\nIt was happy.\n\nThe mat.\nIt was '
                                    b'a mat.\n\nOne more.\nAnd more.\n\nLast one.\nReally.\n'),
      write(inputs, '3-one.txt', 'Only sentence of this document.\n'),
      write(inputs, '4-long.txt', f'{long_sentence}\nShort one.\n'),
      write(inputs, '5-control.txt', 'The cat sat.\n\x01\nIt was happy.\n\n\x02\n'),
  ]
  metadata = prepare.prepare(make_config(','.join(paths), vocab_file, corpus_format='bert'),
                             tmp_path / 'out', workers=1)
  assert metadata.bad_input == {
      'empty_files': 1, 'whitespace_only_lines': 2, 'non_utf8_lines': 1,
      'one_sentence_documents': 1, 'empty_sentences': 2, 'empty_documents': 1,
      'long_sentences': 1}
  documents = read_back(tmp_path / 'out')[1]
  assert len(documents) == 2 + 4 + 1 + 1 + 1
  assert max(len(s) for d in documents for s in d) > prepare.LONG_SENTENCE_PIECES  # Kept whole.


def test_a_file_that_is_not_utf8_is_named(tmp_path, vocab_file):
  good = write(tmp_path / 'in', 'good.txt', BERT_TEXT)
  bad = write(tmp_path / 'in', 'utf16.txt', BERT_TEXT.encode('utf-16'))
  with pytest.raises(ValueError, match='utf16.txt.*not UTF-8'):
    prepare.prepare(make_config(f'{good},{bad}', vocab_file), tmp_path / 'out', workers=1)
  assert not (tmp_path / 'out' / records.METADATA_FILENAME).exists()


def test_tfds_without_tensorflow_datasets_is_a_clear_error(tmp_path, vocab_file, monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # Import fails, installed or not.
  with pytest.raises(prepare.PrepareError, match='tensorflow_datasets'):
    prepare.prepare(make_config('tfds:wikipedia/20230601.en', vocab_file), tmp_path / 'out')


def test_sources_are_split_in_order():
  assert prepare.parse_sources('a/*.txt, builtin ,tfds:wiki/1.en:train,') == [
      ('files', 'a/*.txt'), ('builtin', ''), ('tfds', 'wiki/1.en:train')]
  with pytest.raises(prepare.PrepareError, match='empty'):
    prepare.parse_sources(' , ')


def test_raw_size_reads_xz_indexes_and_gz_trailers(tmp_path):
  text = (BERT_TEXT * 50).encode()
  two_streams = lzma.compress(text[:100]) + b'\0' * 8 + lzma.compress(text)
  assert prepare.raw_size(write(tmp_path, 'a.xz', two_streams)) == len(text) + 100
  assert prepare.raw_size(write(tmp_path, 'a.gz', gzip.compress(text))) == len(text)
  assert prepare.raw_size(write(tmp_path, 'a.txt', text)) == len(text)


def test_max_documents_keeps_whole_units_in_order(tmp_path, vocab_file):
  inputs = tmp_path / 'in'
  for i in range(4):
    write(inputs, f'{i}.txt', BERT_TEXT)  # 3 documents each.
  config = make_config(str(inputs / '*.txt'), vocab_file, max_documents=5)
  metadata = prepare.prepare(config, tmp_path / 'out', workers=2, shard_mb=0.0001)
  assert metadata.num_documents == 6  # Units 0 and 1: the limit is reached within unit 1.
  assert [shard['file'] for shard in metadata.shards] == [
      'documents-00000.array_record', 'documents-00001.array_record']
  assert sorted(name for name in os.listdir(tmp_path / 'out') if 'documents' in name) == [
      'documents-00000.array_record', 'documents-00000.json',
      'documents-00001.array_record', 'documents-00001.json']


def test_trained_vocab_is_written_and_reused(tmp_path):
  path = write(tmp_path / 'in', 'a.txt', BERT_TEXT * 20)
  config = make_config(path, '', tokenizer_vocab_size=80)
  output = tmp_path / 'out'
  first = prepare.prepare(config, output, workers=1)
  vocab = output / 'vocab.txt'
  assert first.vocab_file == str(vocab)
  mtime = os.stat(vocab).st_mtime_ns
  assert prepare.prepare(config, output, workers=1) == first
  assert os.stat(vocab).st_mtime_ns == mtime
  assert_same_documents(read_back(output)[1], expected_documents(path, str(vocab)))


def test_shared_corpus_file_matches_reader_and_tokenizer(tmp_path):
  data = shared_data_dir()
  path = str(data / 'corpus' / 'wikitext-2' / 'wiki.valid.tokens')
  vocab = str(data / 'vocab' / 'bert-base-uncased-vocab.txt')
  metadata = prepare.prepare(make_config(path, vocab), tmp_path / 'out', workers=1)
  assert_same_documents(read_back(tmp_path / 'out')[1], expected_documents(path, vocab))
  assert metadata.num_documents == 60 and metadata.raw_bytes == 1121681


@pytest.mark.slow
def test_cli_prepares_builtin(tmp_path, vocab_file):
  output = tmp_path / 'out'
  result = subprocess.run(
      [sys.executable, '-m', 'bert_jax.data.prepare', '--config=configs/base.py',
       f'--output={output}', '--workers=1', '--config.data.corpus=builtin',
       '--config.data.max_documents=4', f'--config.data.vocab_file={vocab_file}'],
      cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Units 1/1' in result.stderr
  metadata = records.read_metadata(output)
  assert metadata.num_documents == 4 and metadata.sources == ['builtin']
  with open(output / prepare.PLAN_FILENAME, encoding='utf-8') as f:
    assert json.load(f)['config']['max_documents'] == 4


def test_cli_names_a_bad_corpus(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'bert_jax.data.prepare', '--config=configs/base.py',
       f'--output={tmp_path}', f'--config.data.corpus={tmp_path}/nothing-*.txt'],
      cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode != 0
  assert 'Prepare failed' in result.stderr and 'nothing-*.txt' in result.stderr

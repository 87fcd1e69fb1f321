"""Tests for bert_jax.data.corpus."""

import gzip
import json
import lzma
import re

from conftest import shared_data_dir
import pytest

from bert_jax.data import corpus

BERT_TEXT = """First sentence of one.
Second sentence of one.

Only sentence of two.


First of three.
Second of three.
"""

PROSE_TEXT = """It was a dark night. The wind, e.g. from the north, blew hard.
Mr. Smith went home.

A new paragraph starts here! Does it end?
"""

GUTENBERG_TEXT = (
    '\ufeffThe Project Gutenberg EBook of A Test, by Someone\r\n'
    'License header text that must go.\r\n'
    '\r\n'
    '*** START OF THIS PROJECT GUTENBERG EBOOK A TEST ***\r\n'
    '\r\n'
    'The book begins here, and the line is wrapped\r\n'
    'in the middle of a sentence. It ends here.\r\n'
    '\r\n'
    'Second paragraph of the book.\r\n'
    '\r\n'
    'End of the Project Gutenberg EBook of A Test, by Someone\r\n'
    '\r\n'
    '*** END OF THIS PROJECT GUTENBERG EBOOK A TEST ***\r\n'
    '\r\n'
    'Full license text that must go.\r\n')

WIKIEXTRACTOR_TEXT = """<doc id="1" url="http://example.org/?curid=1" title="Alpha">
Alpha

Alpha is the first letter. It comes before beta in the Greek alphabet, which has twenty-four letters in all.
History.
The letter dates back a long way.
</doc>
<doc id="2" url="http://example.org/?curid=2" title="Beta">
Beta

Beta is the second letter.
</doc>
<doc id="3" url="http://example.org/?curid=3" title="Empty">
Empty

</doc>
"""

WIKITEXT_TEXT = """ 
 = Lobster = 
 
 The lobster is large . It lives in the sea @-@ bed . 
 
 = = Description = = 
 
 It weighs 0 @.@ 7 kg . 
 
 = Crab = 
 
 The crab walks sideways . 
"""


def write(tmp_path, name, text, opener=open):
  """Writes `text` to tmp_path/name with `opener`; returns the path as str."""
  path = tmp_path / name
  with opener(path, 'wt', encoding='utf-8', newline='') as f:
    f.write(text)
  return str(path)


@pytest.fixture(scope='module')
def builtin_documents():
  """The built-in corpus, built once for the module (it takes a few seconds)."""
  return corpus.builtin_corpus()


def test_bert_format_splits_documents_at_blank_lines(tmp_path):
  path = write(tmp_path, 'c.txt', BERT_TEXT)
  assert corpus.read_corpus(path, 'bert') == [
      ['First sentence of one.', 'Second sentence of one.'],
      ['Only sentence of two.'],
      ['First of three.', 'Second of three.'],
  ]


def test_auto_detects_bert_format(tmp_path):
  path = write(tmp_path, 'c.txt', BERT_TEXT)
  assert corpus.read_corpus(path) == corpus.read_corpus(path, 'bert')


def test_prose_file_is_one_document_split_into_sentences(tmp_path):
  path = write(tmp_path, 'c.txt', PROSE_TEXT)
  assert corpus.read_corpus(path, 'prose') == [[
      'It was a dark night.', 'The wind, e.g. from the north, blew hard.',
      'Mr. Smith went home.', 'A new paragraph starts here!', 'Does it end?',
  ]]


def test_auto_detects_wrapped_prose(tmp_path):
  text = ('the wind blew hard across the open\nmoor, and nobody went out that\n'
          'night at all. Then the rain came\ndown in sheets and the rivers rose.\n')
  path = write(tmp_path, 'c.txt', text)
  assert corpus.read_corpus(path) == [[
      'the wind blew hard across the open moor, and nobody went out that night at all.',
      'Then the rain came down in sheets and the rivers rose.',
  ]]


@pytest.mark.parametrize('text, sentences', [
    ('Mr. Smith went to Washington. He arrived at 5 p.m. on Monday.',
     ['Mr. Smith went to Washington.', 'He arrived at 5 p.m. on Monday.']),
    ('Dr. Watson lives in the U.S. and works there. Really?  Yes!',
     ['Dr. Watson lives in the U.S. and works there.', 'Really?', 'Yes!']),
    ('Use a tool, i.e. Python, daily. It helps.',
     ['Use a tool, i.e. Python, daily.', 'It helps.']),
    ('"Stop." Then she left. "Why?" he asked.',
     ['"Stop."', 'Then she left.', '"Why?" he asked.']),
    ('She said \u201cGo home.\u201d He went.', ['She said \u201cGo home.\u201d', 'He went.']),
    ('Written by H. G. Wells in 1895. It sold well.',
     ['Written by H. G. Wells in 1895.', 'It sold well.']),
    ('Pi is 3.14 today.\n\tNext   line here', ['Pi is 3.14 today.', 'Next line here']),
    ('', []),
])
def test_split_sentences_golden(text, sentences):
  assert corpus.split_sentences(text) == sentences


def test_wikiextractor_docs_become_documents_without_titles(tmp_path):
  path = write(tmp_path, 'wiki_00', WIKIEXTRACTOR_TEXT)
  assert corpus.read_corpus(path) == [
      ['Alpha is the first letter.',
       'It comes before beta in the Greek alphabet, which has twenty-four letters in all.',
       'History.', 'The letter dates back a long way.'],
      ['Beta is the second letter.'],
  ]


def test_gutenberg_keeps_only_text_between_markers_with_crlf(tmp_path):
  path = write(tmp_path, 'book.txt', GUTENBERG_TEXT)
  documents = corpus.read_corpus(path)
  assert documents == [[
      'The book begins here, and the line is wrapped in the middle of a sentence.',
      'It ends here.', 'Second paragraph of the book.',
  ]]
  assert not any('\r' in sentence for sentence in documents[0])


def test_gutenberg_end_line_outside_a_book_keeps_the_text(tmp_path):
  text = 'End of Project Gutenberg talk came first.\n\nThe essay goes on after it.\n'
  path = write(tmp_path, 'essay.txt', text)
  assert corpus.read_corpus(path, 'prose') == [
      ['End of Project Gutenberg talk came first.', 'The essay goes on after it.']]


def test_wikitext_headings_start_documents(tmp_path):
  path = write(tmp_path, 'wiki.valid.tokens', WIKITEXT_TEXT)
  assert corpus.read_corpus(path) == [
      ['The lobster is large .', 'It lives in the sea-bed .', 'It weighs 0.7 kg .'],
      ['The crab walks sideways .'],
  ]


@pytest.mark.parametrize(
    'name, opener', [('c.txt.xz', lzma.open), ('c.txt.gz', gzip.open)], ids=['xz', 'gz'])
def test_reads_compressed_files(tmp_path, name, opener):
  path = write(tmp_path, name, BERT_TEXT, opener)
  assert corpus.read_corpus(path) == corpus.read_corpus(write(tmp_path, 'c.txt', BERT_TEXT))


def test_spec_expands_sorted_globs_and_comma_lists(tmp_path):
  for name in ('b.txt', 'a.txt', 'c.txt'):
    write(tmp_path, name, f'Sentence from {name}.\n')
  spec = f'{tmp_path}/[ab].txt, {tmp_path}/c.txt'
  assert corpus.read_corpus(spec) == [
      ['Sentence from a.txt.'], ['Sentence from b.txt.'], ['Sentence from c.txt.']]


def test_max_documents_stops_early(tmp_path):
  path = write(tmp_path, 'c.txt', BERT_TEXT)
  assert len(corpus.read_corpus(path, max_documents=2)) == 2


def test_write_then_read_round_trips(tmp_path):
  documents = [['One sentence.', 'Two  sentences\there.'], ['Another document.']]
  path = str(tmp_path / 'out' / 'corpus.txt')
  corpus.write_bert_format(documents, path)
  assert corpus.read_corpus(path, 'bert') == [
      ['One sentence.', 'Two sentences here.'], ['Another document.']]


def test_unmatched_pattern_is_named(tmp_path):
  pattern = str(tmp_path / 'missing-*.txt')
  with pytest.raises(FileNotFoundError, match=re.escape(pattern)):
    corpus.read_corpus(pattern)


def test_directory_only_pattern_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match='only directories'):
    corpus.read_corpus(str(tmp_path))


def test_unreadable_file_is_named(tmp_path):
  path = tmp_path / 'broken.txt.xz'
  path.write_bytes(b'this is not xz data')
  with pytest.raises(ValueError, match=re.escape(str(path))):
    corpus.read_corpus(str(path))


def test_a_few_non_utf8_bytes_are_read_as_replacement_and_reported(tmp_path, caplog):
  path = tmp_path / 'latin1.txt'
  lines = [f'Sentence number {i} is plain.' for i in range(40)]
  lines[7] = 'The caf\xe9 opened at noon.'  # Latin-1 e-acute: not UTF-8.
  path.write_bytes(('\n'.join(lines) + '\n').encode('latin-1'))
  with caplog.at_level('WARNING'):
    documents = corpus.read_corpus(str(path), 'bert')
  assert documents[0][7] == 'The caf\ufffd opened at noon.'
  assert len(documents[0]) == 40
  assert any(str(path) in r.getMessage() and '1 of 40 lines' in r.getMessage()
             and 'line 8' in r.getMessage() for r in caplog.records), caplog.text


def test_a_file_in_another_encoding_is_named(tmp_path):
  path = tmp_path / 'utf16.txt'
  path.write_bytes('One sentence here.\nAnother one there.\n'.encode('utf-16'))
  with pytest.raises(ValueError, match=re.escape(str(path)) + '.* is not UTF-8 text'):
    corpus.read_corpus(str(path))


def test_unknown_format_lists_valid_ones(tmp_path):
  path = write(tmp_path, 'c.txt', BERT_TEXT)
  with pytest.raises(ValueError, match=r"'markdown'.*auto, bert, prose"):
    corpus.read_corpus(path, 'markdown')


def test_corpus_without_sentences_is_named(tmp_path):
  path = write(tmp_path, 'blank.txt', '\n  \n\n')
  with pytest.raises(ValueError, match=re.escape(path) + '.*no documents'):
    corpus.read_corpus(path)


def test_empty_spec_is_rejected():
  with pytest.raises(ValueError, match='empty'):
    corpus.read_corpus(' , ')


@pytest.mark.slow
def test_builtin_corpus_is_substantial(builtin_documents):
  sentences = [sentence for document in builtin_documents for sentence in document]
  assert len(builtin_documents) > 300
  assert len(sentences) > 10_000
  assert sum(map(len, sentences)) > 1_000_000
  assert not any(sentence.startswith('>>>') for sentence in sentences)


@pytest.mark.slow
def test_builtin_corpus_is_deterministic(builtin_documents):
  assert corpus.builtin_corpus() == builtin_documents


def test_builtin_spec_reads_builtin_corpus(monkeypatch):
  documents = [['Doc one has a sentence.'], ['Doc two.'], ['Doc three.']]
  monkeypatch.setattr(corpus, 'builtin_corpus', lambda: documents)
  assert corpus.read_corpus('builtin', max_documents=2) == documents[:2]


def test_shared_wikiextractor_file_gives_articles():
  path = shared_data_dir() / 'corpus/enwiki-2015-wikiextractor/wiki_00.txt.xz'
  documents = corpus.read_corpus(str(path))
  assert 20 <= len(documents) <= 200
  assert documents[0][0].startswith('Anarchism is a political philosophy')
  assert not any(s.startswith('<doc') or s == '</doc>' for d in documents for s in d)


def test_shared_gutenberg_book_is_one_document_without_license():
  path = shared_data_dir() / 'corpus/gutenberg/11-0.txt.xz'
  documents = corpus.read_corpus(str(path))
  assert len(documents) == 1
  text = ' '.join(documents[0])
  assert 'Down the Rabbit-Hole' in text
  assert 'Project Gutenberg' not in text
  assert len(documents[0]) > 1000


@pytest.mark.slow
def test_the_builtin_corpus_is_parsed_once_and_then_read_from_the_cache(tmp_path, monkeypatch):
  monkeypatch.setenv('BERT_JAX_CACHE', str(tmp_path))
  monkeypatch.setattr(corpus, '_BUILTIN_MEMO', {})
  documents = corpus.builtin_corpus()
  assert documents == corpus._parse_builtin_corpus(corpus.stdlib_files())
  [cached] = tmp_path.glob('builtin_corpus-*.json')
  # Another process (an empty memo) reads the file: a marker written there comes back.
  cached.write_text(json.dumps([['a cached sentence .']]))
  corpus._BUILTIN_MEMO.clear()
  assert corpus.builtin_corpus() == [['a cached sentence .']]
  # The memo hands out copies: a caller's edits do not reach the next caller.
  corpus.builtin_corpus()[0].append('an edit')
  assert corpus.builtin_corpus() == [['a cached sentence .']]


@pytest.mark.slow
def test_an_unwritable_cache_only_costs_the_parse(tmp_path, monkeypatch):
  blocked = tmp_path / 'file'
  blocked.write_text('')
  monkeypatch.setenv('BERT_JAX_CACHE', str(blocked / 'cache'))  # Under a file: unwritable.
  monkeypatch.setattr(corpus, '_BUILTIN_MEMO', {})
  assert corpus.builtin_corpus() == corpus._parse_builtin_corpus(corpus.stdlib_files())

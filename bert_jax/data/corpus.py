"""Reads text into documents: a document is a list of sentences (`list[list[str]]`).

Sources: text files ('bert' = one sentence per line, blank line between documents; 'prose' = raw
text, with wikiextractor `<doc>` tags, Project Gutenberg markers and WikiText headings understood),
plain or `.xz`/`.gz`; or 'builtin', the docstrings of the Python standard library.
"""

import ast
import glob
import gzip
import hashlib
import itertools
import json
import lzma
import os
import re
import sys
import sysconfig

from absl import logging

CORPUS_FORMATS = ('auto', 'bert', 'prose')

# Lines read from the start of a file to choose its format under 'auto'.
_SNIFF_LINES = 2000
# More lines than this share with undecodable bytes: the file is not UTF-8 (binary, UTF-16...).
_MAX_UNDECODABLE_SHARE = 0.1
# A blank-line block whose lines are all this short is one hard-wrapped paragraph.
_WRAP_WIDTH = 100

_GUTENBERG_START = re.compile(r'^\*{3}\s*START OF\b', re.IGNORECASE)
# The END marker, or the 'End of the Project Gutenberg EBook of ...' line just before it.
_GUTENBERG_END = re.compile(r'^(?:\*{3}\s*END OF\b|End of (?:the )?Project Gutenberg)',
                            re.IGNORECASE)
_DOC_OPEN = re.compile(r'^<doc[\s>]')
# WikiText headings: ` = Title = ` starts an article, ` = = Section = = ` does not.
_WIKITEXT_HEADING = re.compile(r'^((?:= )+)\S.*?(?: =)+$')  # Matched on stripped lines.
# WikiText's tokenised `3 @.@ 5`, `well @-@ known`, `1 @,@ 000`.
_WIKITEXT_JOINER = re.compile(r' @([-,.])@ ')

# Words that end in a period without ending a sentence (compared lowercased, period removed).
_ABBREVIATIONS = frozenset("""
    mr mrs ms dr prof sr jr st mt messrs mme mlle rev hon gov gen col capt lt sgt cmdr adm
    vs cf al approx ca fig figs no nos vol vols pp ch sec eq dept est inc ltd co corp bros
    jan feb apr jun jul aug sep sept oct nov dec
    """.split())
# A sentence-ending run, with closing quotes and brackets, before whitespace.
_TERMINATOR = re.compile(r'[.!?]+["\'\u201d\u2019)\]]*(?=\s)')
_OPENERS = '"\'\u201c\u2018(['
# What ' '.join(text.split()) would change in ASCII text: runs of spaces, other whitespace.
_ODD_WHITESPACE = re.compile(r'[\t\n\r\x0b\x0c\x1c-\x1f]|  ')
_INITIALISM = re.compile(r'(?:[^\W\d_]\.)+[^\W\d_]')  # 'U.S', 'e.g' (before the final '.').
_FOLLOWING = re.compile('[' + re.escape(_OPENERS) + ']*(.)', re.DOTALL)
_ENDS_SENTENCE = re.compile(r'[.!?]["\'\u201d\u2019)\]]*$')


def read_corpus(spec: str, corpus_format: str = 'auto',
                max_documents: int = 0) -> list[list[str]]:
  """Returns the documents of `spec`: 'builtin' or comma-separated files and globs."""
  if corpus_format not in CORPUS_FORMATS:
    raise ValueError(f'Unknown corpus_format {corpus_format!r}; valid formats are '
                     f'{", ".join(CORPUS_FORMATS)}.')
  if max_documents < 0:
    raise ValueError(f'max_documents={max_documents} must be >= 0 (0 reads all).')
  if spec.strip() == 'builtin':
    documents = builtin_corpus()
  else:
    paths = corpus_files(spec)
    for path in paths:
      _check_readable(path)
    documents = itertools.chain.from_iterable(
        _read_file(path, corpus_format) for path in paths)
  documents = list(itertools.islice(documents, max_documents or None))
  if not documents:
    raise ValueError(f'Corpus {spec!r} yielded no documents (format {corpus_format!r}); '
                     'is it empty, or only headers and markup?')
  return documents


def corpus_files(spec: str) -> list[str]:
  """Expands comma-separated paths and globs, each sorted, in the order given."""
  patterns = [pattern.strip() for pattern in spec.split(',') if pattern.strip()]
  if not patterns:
    raise ValueError(f'Corpus spec {spec!r} is empty; give "builtin" or comma-separated '
                     'file paths or globs.')
  paths, seen = [], set()
  for pattern in patterns:
    matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
    files = [path for path in matches if os.path.isfile(path)]
    if not files:
      what = 'only directories' if matches else 'no file'
      raise FileNotFoundError(f'Corpus pattern {pattern!r} matches {what}; give files or '
                              'a glob such as "dir/*.txt".')
    paths += [path for path in files if path not in seen]  # Overlapping globs read once.
    seen.update(files)
  return paths


def open_text(path):
  """Opens plain, .xz or .gz text; 'utf-8-sig' because Gutenberg books start with a BOM."""
  opener = {'.xz': lzma.open, '.gz': gzip.open}.get(os.path.splitext(path)[1], open)
  return opener(path, 'rt', encoding='utf-8-sig', errors='replace')


def _check_readable(path):
  """Raises ValueError naming `path` unless its first characters decode."""
  try:
    with open_text(path) as f:
      f.read(1)
  except (OSError, EOFError, lzma.LZMAError) as error:
    raise ValueError(f'Cannot read corpus file {path!r}: {error}') from error


class _UndecodableCounter:
  """Counts lines where bytes were not UTF-8 (decoded as U+FFFD) while passing them through."""

  def __init__(self):
    self.lines = 0
    self.bad_lines = 0
    self.first_bad = 0
    self.whitespace_only = 0  # Lines of only spaces or tabs: read as blank lines.

  def count(self, blocks):
    """Yields the lines of `blocks` (lists of lines), counting them a block at a time."""
    for block in blocks:
      joined = '\n'.join(block)  # One scan in C finds the (rare) blocks with bad bytes.
      if '\ufffd' in joined or '\x00' in joined:
        for number, line in enumerate(block, self.lines + 1):
          if '\ufffd' in line or '\x00' in line:
            self.bad_lines += 1
            self.first_bad = self.first_bad or number
      self.whitespace_only += sum(map(str.isspace, block))  # ''.isspace() is False.
      self.lines += len(block)
      yield from block


def _line_blocks(f, block_bytes: int = 1 << 20):
  """The file's lines without line ends, about block_bytes at a time."""
  while True:
    block = f.readlines(block_bytes)
    if not block:
      return
    yield [line.rstrip('\r\n') for line in block]


def _check_encoding(path, counter, whole_file: bool):
  """Raises ValueError if the file does not look like UTF-8 text; warns of a few bad bytes."""
  if counter.bad_lines and counter.bad_lines > _MAX_UNDECODABLE_SHARE * counter.lines:
    raise ValueError(
        f'Corpus file {path!r} is not UTF-8 text: {counter.bad_lines} of its first '
        f'{counter.lines} lines hold undecodable bytes or NULs (first at line '
        f'{counter.first_bad}). Convert it (e.g. iconv -f LATIN1 -t UTF-8) or leave it out.')
  if whole_file and counter.bad_lines:
    logging.warning('Corpus file %s: %d of %d lines hold bytes that are not UTF-8 (first at line '
                    '%d); they were read as U+FFFD.', path, counter.bad_lines, counter.lines,
                    counter.first_bad)


def check_file(path: str) -> None:
  """Raises ValueError naming `path` unless it opens and its head reads as UTF-8 text."""
  counter = _UndecodableCounter()
  try:
    with open_text(path) as f:
      head = [line.rstrip('\r\n') for line in itertools.islice(f, _SNIFF_LINES)]
      for _ in counter.count([head]):
        pass
  except (OSError, EOFError, lzma.LZMAError) as error:
    raise ValueError(f'Cannot read corpus file {path!r}: {error}') from error
  _check_encoding(path, counter, whole_file=False)


def read_file(path: str, corpus_format: str = 'auto', counts: dict | None = None):
  """Yields the documents of one file as read_corpus does; fills `counts` with its line counts.

  `counts` gets 'lines' and 'bytes' (decompressed) read so far, 'non_utf8_lines' (holding bytes
  read as U+FFFD, the first at 'first_non_utf8_line') and 'whitespace_only_lines' (read as blank
  lines).
  """
  return _read_file(path, corpus_format, counts)


def _read_file(path, corpus_format, counts=None):
  """Yields the documents of one file, choosing its format from its head under 'auto'."""
  counter = _UndecodableCounter()
  try:
    with open_text(path) as f:
      try:
        lines = counter.count(_line_blocks(f))
        head = list(itertools.islice(lines, _SNIFF_LINES))
        _check_encoding(path, counter, whole_file=False)
        if corpus_format == 'auto':
          corpus_format = detect_format(head)
        parse = parse_bert if corpus_format == 'bert' else parse_prose
        yield from parse(itertools.chain(head, lines))
      finally:  # Also when the reader stops early (a document limit, a sample).
        if counts is not None:
          counts.update(lines=counter.lines, non_utf8_lines=counter.bad_lines,
                        first_non_utf8_line=counter.first_bad,
                        whitespace_only_lines=counter.whitespace_only,
                        bytes=f.buffer.tell())  # Decompressed bytes, read-ahead included.
  except (OSError, EOFError, lzma.LZMAError) as error:
    raise ValueError(f'Cannot read corpus file {path!r}: {error}') from error
  _check_encoding(path, counter, whole_file=True)


def detect_format(lines: list[str]) -> str:
  """Returns 'bert' when the lines look like one sentence each, else 'prose'."""
  texts = [line.strip() for line in lines if line.strip()]
  if any(_GUTENBERG_START.match(text) or _is_document_boundary(text) for text in texts):
    return 'prose'
  if not texts:
    return 'bert'
  median_length = sorted(len(text) for text in texts)[len(texts) // 2]
  ended = sum(bool(_ENDS_SENTENCE.search(text)) for text in texts) / len(texts)
  several = sum(len(split_sentences(text)) > 1 for text in texts) / len(texts)
  return 'bert' if median_length < 300 and ended >= 0.5 and several <= 0.3 else 'prose'


def parse_bert(lines):
  """Yields documents from sentence-per-line text with blank lines between documents."""
  document = []
  for line in lines:
    sentence = ' '.join(line.split())
    if sentence:
      document.append(sentence)
    elif document:
      yield document
      document = []
  if document:
    yield document


def parse_prose(lines):
  """Yields documents from raw text; `<doc>`, Gutenberg and WikiText boundaries respected."""
  document, block = [], []
  book = ''  # Gutenberg: '' before any START marker, 'in' a book, 'out' after its END.
  marker_open = False  # Some START markers wrap onto the next line, up to the closing '***'.
  title_pending = False  # Wikiextractor repeats the title as the first line of a <doc>.
  for line in lines:
    text = line.strip()
    # Cheap first-character tests guard the regexes: most lines are plain prose.
    if text.startswith('***') and _GUTENBERG_START.match(text):
      document, block, book = [], [], 'in'  # What came before is the PG header.
      marker_open = not text.endswith('***')
      continue
    if marker_open:
      marker_open = False
      if text.endswith('***'):
        continue
    if book == 'out':  # License text, until another book starts.
      continue
    # END only counts inside a book: elsewhere such a line must not drop the rest of a file.
    book_ends = book == 'in' and _GUTENBERG_END.match(text)
    if book_ends or _is_document_boundary(text):
      yield from _nonempty(document + _block_sentences(block))
      document, block = [], []
      book = 'out' if book_ends else book
      title_pending = bool(_DOC_OPEN.match(text))
    elif not text or (text[0] == '=' and _WIKITEXT_HEADING.match(text)):
      document += _block_sentences(block)
      block = []
    elif title_pending:
      title_pending = False
    else:
      block.append(_WIKITEXT_JOINER.sub(r'\1', text) if '@' in text else text)
  yield from _nonempty(document + _block_sentences(block))


def _is_document_boundary(text):
  """Whether a stripped line is `<doc ...>`, `</doc>` or a WikiText title '= Title ='."""
  if not text or text[0] not in '<=':
    return False
  heading = _WIKITEXT_HEADING.match(text)
  return (bool(_DOC_OPEN.match(text)) or text == '</doc>' or
          (heading is not None and heading.group(1) == '= '))


def _nonempty(document):
  """Yields `document` unless it has no sentences."""
  if document:
    yield document


def _block_sentences(block):
  """Splits a blank-line block: short lines are one wrapped paragraph, long lines one each."""
  if not block:
    return []
  if max(len(line) for line in block) <= _WRAP_WIDTH:
    paragraphs = [' '.join(block)]
  else:
    paragraphs = block
  return [sentence for paragraph in paragraphs for sentence in split_sentences(paragraph)]


def split_sentences(text: str) -> list[str]:
  """Splits text into sentences at . ! ? before a capital or digit, skipping abbreviations."""
  if not text.isascii() or _ODD_WHITESPACE.search(text) or text != text.strip():
    text = ' '.join(text.split())  # Else it is already single-spaced: skip the copy.
  sentences, start = [], 0
  for match in _TERMINATOR.finditer(text):
    # The first character after the space and any opening quotes or brackets (found in place:
    # slicing off the rest of a long paragraph at every terminator would be quadratic).
    following = _FOLLOWING.match(text, match.end() + 1)
    if following is None or not (following.group(1).isupper() or following.group(1).isdigit()):
      continue
    if match.group().startswith('.'):
      space = text.rfind(' ', start, match.start())
      if _is_abbreviation(text[space + 1 if space >= 0 else start:match.start()]):
        continue
    sentences.append(text[start:match.end()])
    start = match.end() + 1
  if start < len(text):
    sentences.append(text[start:])
  return sentences


def _is_abbreviation(before):
  """Whether the word a period follows is an abbreviation, an initial ('H.') or like 'U.S'."""
  word = before.rsplit(' ', 1)[-1].lstrip(_OPENERS)
  return (word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isupper()) or
          _INITIALISM.fullmatch(word) is not None)


def write_bert_format(documents: list[list[str]], path: str) -> None:
  """Writes one sentence per line, a blank line between documents (.xz/.gz by extension)."""
  path = os.path.expanduser(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  opener = {'.xz': lzma.open, '.gz': gzip.open}.get(os.path.splitext(path)[1], open)
  # Written beside the target and renamed, so a crash never leaves a half-written cache.
  temporary = f'{path}.{os.getpid()}.tmp'
  try:
    with opener(temporary, 'wt', encoding='utf-8') as f:
      separator = ''
      for document in documents:
        sentences = [' '.join(sentence.split()) for sentence in document]
        sentences = [sentence for sentence in sentences if sentence]
        if sentences:
          f.write(separator + '\n'.join(sentences) + '\n')
          separator = '\n'
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.unlink(temporary)
    raise


# ---- The built-in corpus: documentation that ships with Python itself. ----

# Standard-library folders that hold tests, GUIs, vendored or third-party code.
_STDLIB_SKIP = frozenset({'test', 'tests', 'idle_test', 'idlelib', 'tkinter', 'lib2to3',
                          'site-packages', 'dist-packages', '__pycache__', 'ensurepip'})
_MIN_SENTENCE_WORDS = 3
_MIN_PARAGRAPH_WORDS = 4
_UNDERLINE = re.compile(r'^([=\-~^*#+"\'`])\1{2,}$')
_SIGNATURE = re.compile(r'^[\w.]+\(.*\)\s*(->.*)?$')
_MARKUP = (
    (re.compile(r':[\w:+-]+:`~?([^`<]*?)\s*(?:<[^`]*>)?`'), r'\1'),  # :func:`~a.b` -> a.b
    (re.compile(r'``([^`]*)``'), r'\1'),
    (re.compile(r'`([^`]*)`_{0,2}'), r'\1'),
    (re.compile(r'\*{1,2}(\w[^*\s]*)\*{1,2}'), r'\1'),  # *s*, **bold**; not *args.
    (re.compile(r'\s?\[\d+\]_?'), ''),  # Footnote references.
)
_BULLET = re.compile(r'^(?:[-*\u2022]|\d+[.)]|\(\d+\))\s+')
_PROSE_CHARS = re.compile(r'[A-Za-z ,.;:\'"()-]')


def builtin_corpus() -> list[list[str]]:
  """Returns the stdlib's docstrings (a document per module) and pydoc topics (one each).

  Parsing the stdlib takes seconds; the result is kept per process and, keyed by the Python
  build and every source file's size and modification time, in a JSON file under the user's
  cache directory ($BERT_JAX_CACHE, else $XDG_CACHE_HOME/bert_jax, else ~/.cache/bert_jax), so
  later runs and processes read it in milliseconds. An unwritable cache only costs the parse.
  """
  paths = stdlib_files()
  key = _builtin_key(paths)
  if key not in _BUILTIN_MEMO:
    _BUILTIN_MEMO.clear()
    _BUILTIN_MEMO[key] = _read_builtin_cache(key) or _write_builtin_cache(
        key, _parse_builtin_corpus(paths))
  return [list(document) for document in _BUILTIN_MEMO[key]]


_BUILTIN_MEMO = {}  # {key: documents}: this process's built-in corpus.


def _builtin_key(paths) -> str:
  """A fingerprint of the stdlib sources the built-in corpus is made of (and of its recipe)."""
  digest = hashlib.sha256(f'{sys.version}\n{_BUILTIN_RECIPE}\n'.encode())
  for path in paths:
    stat = os.stat(path)
    digest.update(f'{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n'.encode())
  return digest.hexdigest()[:24]


# Bumped when what builtin_corpus extracts changes, so that cached corpora are not reused.
_BUILTIN_RECIPE = 1


def _builtin_cache_path(key: str) -> str:
  root = (os.environ.get('BERT_JAX_CACHE') or os.path.join(
      os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'), 'bert_jax'))
  return os.path.join(root, f'builtin_corpus-{key}.json')


def _read_builtin_cache(key: str):
  try:
    with open(_builtin_cache_path(key), encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _write_builtin_cache(key: str, documents):
  path = _builtin_cache_path(key)
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = f'{path}.{os.getpid()}.tmp'
    with open(temporary, 'w', encoding='utf-8') as f:
      json.dump(documents, f)
    os.replace(temporary, path)  # Whole or absent: concurrent processes never read half.
  except OSError as e:
    logging.info('Built-in corpus not cached (%s); it is parsed again next time.', e)
  return documents


def _parse_builtin_corpus(paths) -> list[list[str]]:
  documents = []
  for path in paths:
    document = [sentence for docstring in _docstrings_of(path)
                for sentence in _doc_sentences(docstring)]
    if document:
      documents.append(document)
  for name, text in sorted(_pydoc_topics().items()):
    document = _doc_sentences(text)
    if document:
      documents.append(document)
  return documents


def _pydoc_topics():
  """Returns the language reference texts that `help()` shows, or {} where not shipped."""
  try:
    from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  except ImportError:  # Some distributions strip pydoc_data; the docstrings still suffice.
    return {}
  return topics.topics


def stdlib_files() -> list[str]:
  """Returns the standard library's own .py files, sorted, tests and GUIs excluded."""
  root = sysconfig.get_paths()['stdlib']
  paths = []
  for directory, subdirectories, filenames in os.walk(root):
    subdirectories[:] = [name for name in subdirectories if name not in _STDLIB_SKIP]
    paths.extend(os.path.join(directory, name) for name in filenames if name.endswith('.py'))
  return sorted(paths)


def _docstrings_of(path):
  """Returns the module, class and function docstrings of a source file, in source order."""
  try:
    with open(path, 'rb') as f:
      tree = ast.parse(f.read(), filename=path)
  except (SyntaxError, ValueError, OSError):  # Never imported, so a bad file just yields nothing.
    return []
  docstrings = []
  nodes = [tree]
  while nodes:
    node = nodes.pop()
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      docstring = ast.get_docstring(node, clean=True)
      if docstring:
        docstrings.append(docstring)
    children = [child for child in ast.iter_child_nodes(node)
                if isinstance(child, (ast.stmt, ast.excepthandler))]
    nodes.extend(reversed(children))
  return docstrings


def _doc_sentences(text):
  """Returns the prose sentences of a docstring or pydoc topic, code and markup removed."""
  sentences = []
  for block in re.split(r'\n\s*\n', text):
    lines = block.splitlines()
    indented = lines[0][:1].isspace()
    for paragraph in _paragraphs(lines):
      for pattern, replacement in _MARKUP:
        paragraph = pattern.sub(replacement, paragraph)
      if len(paragraph.split()) < _MIN_PARAGRAPH_WORDS:
        continue
      # Indented blocks are either code or described prose (pydoc indents method docs).
      if indented and not _looks_like_prose(paragraph):
        continue
      sentences += [sentence for sentence in split_sentences(paragraph)
                    if len(sentence.split()) >= _MIN_SENTENCE_WORDS]
  return sentences


def _paragraphs(lines):
  """Joins a block's lines into paragraphs; drops doctest, heading, table and signature lines."""
  paragraphs = [[]]
  for line in lines:
    text = line.strip()
    if _UNDERLINE.match(text):
      if paragraphs[-1]:
        paragraphs[-1].pop()  # The heading this line underlines.
      continue
    if (not text or text.startswith(('>>>', '...', '.. ', '+', '|')) or
        _SIGNATURE.match(text)):
      continue
    bullet = _BULLET.match(text)
    if bullet:  # A list item is a paragraph of its own.
      paragraphs.append([])
      text = text[bullet.end():]
    paragraphs[-1].append(text)
  return [' '.join(paragraph) for paragraph in paragraphs if paragraph]


def _looks_like_prose(paragraph):
  """Whether a paragraph ends like a sentence and is mostly letters, not code symbols."""
  letters = len(_PROSE_CHARS.findall(paragraph))
  return bool(_ENDS_SENTENCE.search(paragraph)) and letters >= 0.95 * len(paragraph)

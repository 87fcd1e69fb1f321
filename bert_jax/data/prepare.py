"""Prepares a corpus once, as ArrayRecord shards of tokenised documents that training streams.

  python -m bert_jax.data.prepare --config=configs/base.py --output=DIR \
      [--workers=N] [--shard_mb=64] [--vocab_sample_mb=200] [--config.data.corpus=...]

Sources (`config.data.corpus`, comma separated, in order): text files and globs read as
`corpus.read_corpus` reads them (`data.corpus_format`; .xz/.gz ok), 'builtin', and
`tfds:NAME[:SPLIT]` (each example's 'text' is a document; needs tensorflow_datasets).

With `config.data.languages` (`{lang}` in data.corpus naming each language's files) every
language is prepared into DIR/{lang} with one vocab shared by all of them (prepare_languages).

The tokenizer is `data.tokenizer`'s (wordpiece, bpe or sentencepiece); its vocab is
`data.vocab_file`, else the one DIR keeps (vocab.txt; vocab.json + merges.txt; spiece.model),
trained on the first `--vocab_sample_mb` MB of the corpus (and kept there, so a rerun reuses it).
A given vocab is copied into DIR too, so the directory holds everything a run streaming it needs
(`prepared_vocab_file`), wherever it is moved; metadata.json records the tokenizer kind and the
vocab's sha256.

The plan (DIR/plan.json) groups the input files into work units of about `--shard_mb` MB of raw
text (a file is never split; 'builtin' and each TFDS range are units of their own). A pool of
worker processes turns unit i into `documents-{i:05d}.array_record`, written under a temporary name
and renamed when complete, then a sidecar `documents-{i:05d}.json` with its counts. A rerun skips
units whose shard and sidecar match the plan, so an interrupted run resumes where it stopped; a
rerun with another tokenizer, vocab, casing, format or max_documents into the same DIR is an error.

`data.max_documents` > 0 is approximate: each unit stops after that many documents, and whole
units are kept in plan order until the total reaches it (so the total may overshoot by up to one
unit's documents).

Bad input is counted by kind in `Metadata.bad_input` and logged with its file, never dropped in
silence: 'empty_files' (yielding no documents), 'whitespace_only_lines' (read as blank lines),
'non_utf8_lines' (bytes read as U+FFFD), 'one_sentence_documents' (kept; the pipeline pairs them
with a random next sentence), 'empty_sentences' and 'empty_documents' (no token left; dropped),
'long_sentences' (over 512 pieces; kept, the pipeline truncates). A file that is not UTF-8 at all
is an error naming it.
"""

import concurrent.futures
import dataclasses
import json
import math
import multiprocessing
import os
import re
import sys
import sysconfig
import time

from absl import logging
from array_record.python import array_record_module
import ml_collections
import numpy as np

from bert_jax.data import chunk_encoder
from bert_jax.data import corpus
from bert_jax.data import records
from bert_jax.data import tokenizer as tokenizer_lib

PLAN_FILENAME = 'plan.json'
# A cross-lingual corpus's directory: its languages (a prepared corpus each, in DIR/{lang}).
LANGUAGES_FILENAME = 'languages.json'
PLAN_VERSION = 1
SIDECAR_PATTERN = 'documents-{index:05d}.json'
BAD_INPUT_KINDS = ('empty_files', 'whitespace_only_lines', 'non_utf8_lines',
                   'one_sentence_documents', 'empty_sentences', 'empty_documents',
                   'long_sentences')
# Kinds that lose or corrupt text: logged as warnings, the others as information.
_LOSSY_KINDS = ('empty_files', 'non_utf8_lines', 'empty_sentences', 'empty_documents')
LONG_SENTENCE_PIECES = 512  # BERT's longest input; a longer sentence is truncated downstream.

_MB = 1_000_000
_PROGRESS_SECONDS = 5.0
# Sentences tokenised per call: bounds a worker's memory on long files.
_BATCH_SENTENCES = 20_000
_TEMPORARY = re.compile(r'^documents-\d{5}\.(?:array_record|json)\.\d+\.tmp$')
_SHARD_OR_SIDECAR = re.compile(r'^documents-(\d{5})\.(?:array_record|json)$')
# What a plan.json or sidecar written before a config key existed means by its absence.
_PLAN_DEFAULTS = {'tokenizer': 'wordpiece'}


class PrepareError(ValueError):
  """A problem with the inputs or the output directory, explained for the user."""


# ---- Sources and the plan. ----


def parse_sources(spec: str) -> list[tuple[str, str]]:
  """Splits data.corpus into ('files', pattern), ('builtin', '') and ('tfds', 'NAME[:SPLIT]')."""
  parts = [part.strip() for part in spec.split(',') if part.strip()]
  if not parts:
    raise PrepareError(f'config.data.corpus={spec!r} is empty; give "builtin", "tfds:NAME" or '
                       'comma-separated file paths or globs.')
  sources = []
  for part in parts:
    if part == 'builtin':
      sources.append(('builtin', ''))
    elif part.startswith('tfds:'):
      sources.append(('tfds', part[len('tfds:'):]))
    else:
      sources.append(('files', part))
  return sources


def make_plan(spec: str, shard_mb: float) -> list[dict]:
  """Groups the sources into units of about `shard_mb` MB of raw text, in the order given."""
  if shard_mb <= 0:
    raise PrepareError(f'--shard_mb={shard_mb} must be > 0.')
  units, current, seen = [], [], set()
  current_size = 0

  def close_current():
    nonlocal current_size
    if current:
      units.append(list(current))
      current.clear()
      current_size = 0

  for kind, value in parse_sources(spec):
    if kind == 'files':
      try:
        paths = corpus.corpus_files(value)
      except FileNotFoundError as error:
        raise PrepareError(str(error)) from error
      for path in paths:
        path = os.path.abspath(path)
        if path in seen:  # Overlapping globs read a file once.
          continue
        seen.add(path)
        source = _file_source(path)
        if current and current_size + source['raw_size'] > shard_mb * _MB:
          close_current()
        current.append(source)
        current_size += source['raw_size']
    elif kind == 'builtin':
      close_current()
      units.append([_builtin_source()])
    else:
      close_current()
      units.extend([source] for source in _tfds_sources(value, shard_mb))
  close_current()
  return [{'index': index, 'shard': records.SHARD_PATTERN.format(index=index),
           'raw_size': sum(source['raw_size'] for source in sources), 'sources': sources}
          for index, sources in enumerate(units)]


def _file_source(path: str) -> dict:
  """A file's plan entry: what identifies its version, and its raw text size."""
  stat = os.stat(path)
  return {'file': path, 'size': stat.st_size, 'mtime_ns': stat.st_mtime_ns,
          'raw_size': raw_size(path)}


def _builtin_source() -> dict:
  """The 'builtin' corpus is the docstrings of this Python's standard library."""
  return {'builtin': f'python {sys.version.split()[0]} {sysconfig.get_paths()["stdlib"]}',
          'raw_size': sum(os.path.getsize(path) for path in corpus.stdlib_files())}


def source_name(source: dict) -> str:
  """How metadata names a source: its path, 'builtin' or tfds:NAME:SPLIT[START:END]."""
  if 'file' in source:
    return source['file']
  if 'builtin' in source:
    return 'builtin'
  return f'tfds:{source["tfds"]}:{source["split"]}[{source["start"]}:{source["end"]}]'


def raw_size(path: str) -> int:
  """Bytes of text in a file: its size, or the decompressed size its .xz index or .gz trailer says."""
  size = os.path.getsize(path)
  extension = os.path.splitext(path)[1]
  try:
    if extension == '.xz':
      return _xz_size(path, size)
    if extension == '.gz':
      with open(path, 'rb') as f:
        f.seek(-4, os.SEEK_END)
        isize = int.from_bytes(f.read(4), 'little')
      while isize < size:  # ISIZE is modulo 2**32; text never compresses to more than its size.
        isize += 1 << 32
      return isize
  except (OSError, ValueError, IndexError):
    return 4 * size  # A planning estimate only: workers count the bytes they actually read.
  return size


def _xz_size(path: str, size: int) -> int:
  """Sums the uncompressed sizes that the indexes of an .xz file's streams record."""
  total, end = 0, size
  with open(path, 'rb') as f:
    while end > 0:
      f.seek(end - 4)
      while end >= 4 and f.read(4) == b'\0\0\0\0':  # Stream padding.
        end -= 4
        f.seek(end - 4)
      f.seek(end - 12)
      footer = f.read(12)
      if len(footer) != 12 or footer[10:] != b'YZ':
        raise ValueError(f'{path}: no xz stream footer')
      index_size = (int.from_bytes(footer[4:8], 'little') + 1) * 4
      index_start = end - 12 - index_size
      f.seek(index_start)
      index = f.read(index_size)
      if index[0] != 0:
        raise ValueError(f'{path}: no xz index')
      count, position = _varint(index, 1)
      blocks = 0
      for _ in range(count):
        unpadded, position = _varint(index, position)
        uncompressed, position = _varint(index, position)
        total += uncompressed
        blocks += (unpadded + 3) // 4 * 4
      end = index_start - blocks - 12  # Before this stream's blocks and 12-byte header.
  return total


def _varint(data: bytes, position: int) -> tuple[int, int]:
  """An xz multibyte integer at `position` -> (value, position after it)."""
  value = shift = 0
  while True:
    byte = data[position]
    position += 1
    value |= (byte & 0x7F) << shift
    shift += 7
    if not byte & 0x80:
      return value, position


def _import_tfds():
  """tensorflow_datasets, imported only when a tfds: source is used."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise PrepareError(
        'config.data.corpus names a tfds: source, but tensorflow_datasets cannot be imported '
        f'({error}); pip install tensorflow-datasets tensorflow, or give text files.') from error
  return tfds


def _split_tfds(value: str) -> tuple[str, str]:
  """'NAME[:SPLIT]' -> (name, split), split 'train' by default."""
  name, _, split = value.partition(':')
  if not name:
    raise PrepareError(f'tfds:{value} names no dataset; write tfds:NAME[:SPLIT].')
  return name, split or 'train'


def _tfds_sources(value: str, shard_mb: float) -> list[dict]:
  """A TFDS split as example ranges of about `shard_mb` MB each (one range if already sliced)."""
  name, split = _split_tfds(value)
  tfds = _import_tfds()
  builder = tfds.builder(name)
  builder.download_and_prepare()
  if '[' in split:  # A slice such as 'train[:1%]' is taken whole.
    return [{'tfds': name, 'split': split, 'start': '', 'end': '', 'raw_size': 0}]
  info = builder.info.splits[split]
  examples, size = int(info.num_examples), int(info.num_bytes)
  count = max(1, min(examples, math.ceil(size / (shard_mb * _MB))))
  bounds = [examples * i // count for i in range(count + 1)]
  return [{'tfds': name, 'split': split, 'start': start, 'end': end,
           'raw_size': size * (end - start) // max(examples, 1)}
          for start, end in zip(bounds, bounds[1:])]


def _check_heads(units: list[dict]) -> None:
  """Reads the head of every file, so one that is not UTF-8 fails the run before any work."""
  for unit in units:
    for source in unit['sources']:
      if 'file' in source:
        corpus.check_file(source['file'])


# ---- Reading and tokenising (in the workers). ----


def source_documents(source: dict, corpus_format: str, counts: dict):
  """Yields the documents (lists of sentences) of one plan source; fills `counts` as it reads."""
  if 'file' in source:
    yield from corpus.read_file(source['file'], corpus_format, counts)
  elif 'builtin' in source:
    counts['bytes'] = source['raw_size']
    yield from corpus.builtin_corpus()
  else:
    yield from _tfds_documents(source, counts)


def _tfds_documents(source: dict, counts: dict):
  """Yields each example's 'text', its lines split into sentences."""
  tfds = _import_tfds()
  split = source['split']
  if source['start'] != '':
    split = f'{split}[{source["start"]}:{source["end"]}]'
  dataset = tfds.load(source['tfds'], split=split, shuffle_files=False)
  counts.setdefault('bytes', 0)
  counts.setdefault('non_utf8_lines', 0)
  for example in tfds.as_numpy(dataset):
    text = example['text']
    if isinstance(text, bytes):
      counts['bytes'] += len(text)
      text = text.decode('utf-8', errors='replace')
    lines = text.splitlines()
    counts['non_utf8_lines'] += sum('\ufffd' in line for line in lines)
    yield [sentence for line in lines for sentence in corpus.split_sentences(line)]


@dataclasses.dataclass
class _Settings:
  """What a worker needs besides its unit: plain values, pickled to the worker processes."""
  output_dir: str
  tokenizer: str  # config.data.tokenizer
  vocab_file: str
  lowercase: bool
  corpus_format: str
  max_documents: int
  token_dtype: str
  config: dict  # The plan's config values, copied into each sidecar.


_WORKER_STATE = {}  # Per worker process: the encoder, reused across units.


def _init_worker():
  """Worker set-up: one tokenizer thread (the pool is the parallelism), the parent logs."""
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'
  logging.set_verbosity(logging.ERROR)


def _encoder(settings: _Settings):
  """This process's encoder for the settings' vocab (chunk_encoder.make_encoder)."""
  key = (settings.tokenizer, settings.vocab_file, settings.lowercase, settings.token_dtype)
  if _WORKER_STATE.get('key') != key:
    tokenizer = tokenizer_lib.load_tokenizer(settings.tokenizer, settings.vocab_file,
                                             settings.lowercase)
    _WORKER_STATE.update(key=key,
                         encoder=chunk_encoder.make_encoder(tokenizer, settings.token_dtype))
  return _WORKER_STATE['encoder']


def process_unit(unit: dict, settings: _Settings) -> dict:
  """Writes one unit's shard (renamed into place when complete) and sidecar; returns the sidecar."""
  shard = os.path.join(settings.output_dir, unit['shard'])
  sidecar = os.path.join(settings.output_dir, SIDECAR_PATTERN.format(index=unit['index']))
  if os.path.exists(sidecar):  # A stale sidecar must never vouch for the shard written next.
    os.unlink(sidecar)
  encoder = _encoder(settings)
  temporary = f'{shard}.{os.getpid()}.tmp'
  writer = array_record_module.ArrayRecordWriter(temporary, 'group_size:1')
  totals = {'documents': 0, 'sentences': 0, 'tokens': 0, 'raw_bytes': 0}
  bad_input = dict.fromkeys(BAD_INPUT_KINDS, 0)
  files = []
  try:
    for source in unit['sources']:
      report = _write_source(source, settings, encoder, writer, totals)
      for kind in BAD_INPUT_KINDS:
        bad_input[kind] += report['bad_input'].get(kind, 0)
      files.append(report)
      if settings.max_documents and totals['documents'] >= settings.max_documents:
        break
    writer.close()
    _fsync(temporary)
    os.replace(temporary, shard)
  except BaseException:
    if os.path.exists(temporary):
      os.unlink(temporary)
    raise
  result = {'unit': unit, 'config': settings.config, **totals, 'bad_input': bad_input,
            'files': files, 'shard_bytes': os.path.getsize(shard)}
  _write_json(sidecar, result)
  return result


def _write_source(source: dict, settings: _Settings, encoder, writer, totals: dict) -> dict:
  """Tokenises and writes one source's documents; returns its counts and bad input."""
  counts, bad = {}, dict.fromkeys(BAD_INPUT_KINDS, 0)
  documents = source_documents(source, settings.corpus_format, counts)
  start = totals['documents']
  batch, batch_sentences, done = [], 0, False
  try:
    for document in documents:
      batch.append(document)
      batch_sentences += len(document)
      if batch_sentences >= _BATCH_SENTENCES:
        done = _write_batch(batch, settings, encoder, writer, totals, bad)
        batch, batch_sentences = [], 0
        if done:
          break
    if batch and not done:
      _write_batch(batch, settings, encoder, writer, totals, bad)
  finally:
    documents.close()  # Fills `counts` when a document limit stopped the reading early.
  bad['whitespace_only_lines'] = counts.get('whitespace_only_lines', 0)
  bad['non_utf8_lines'] = counts.get('non_utf8_lines', 0)
  documents_written = totals['documents'] - start
  if not documents_written and not bad['empty_documents']:
    bad['empty_files'] = 1
  totals['raw_bytes'] += counts.get('bytes', 0)
  return {'source': source_name(source), 'documents': documents_written,
          'raw_bytes': counts.get('bytes', 0), 'bad_input': bad,
          'first_non_utf8_line': counts.get('first_non_utf8_line', 0)}


def _write_batch(batch: list[list[str]], settings: _Settings, encoder, writer, totals: dict,
                 bad: dict) -> bool:
  """Encodes and writes a batch of documents; True once max_documents is reached."""
  ids, lengths = encoder.encode([sentence for document in batch for sentence in document])
  ends = np.cumsum(lengths)
  sentence = 0
  for document in batch:
    first, sentence = sentence, sentence + len(document)
    start = ends[first - 1] if first else 0
    document_lengths = lengths[first:sentence]
    kept = document_lengths[document_lengths > 0]
    bad['empty_sentences'] += len(document) - len(kept)
    if not len(kept):
      bad['empty_documents'] += 1
      continue
    bad['one_sentence_documents'] += int(len(kept) == 1)
    bad['long_sentences'] += int(np.sum(kept > LONG_SENTENCE_PIECES))
    # Empty sentences hold no ids, so the kept ones lie back to back from `start`.
    start = int(start)
    writer.write(records.encode_flat(ids[start:start + int(kept.sum())], kept,
                                     settings.token_dtype))
    totals['documents'] += 1
    totals['sentences'] += len(kept)
    totals['tokens'] += int(kept.sum())
    if settings.max_documents and totals['documents'] >= settings.max_documents:
      return True
  return False


def _fsync(path: str) -> None:
  """Flushes a finished file to disk before the rename that marks it complete."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _write_json(path: str, value) -> None:
  """Writes JSON through a renamed temporary, so readers never see half a file."""
  temporary = f'{path}.{os.getpid()}.tmp'
  with open(temporary, 'w', encoding='utf-8') as f:
    json.dump(value, f, indent=1)
  os.replace(temporary, path)


def _read_json(path: str):
  """The JSON in `path`, or None when it is missing or unreadable (e.g. cut short)."""
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


# ---- The driver. ----


def prepare(config, output_dir: str, workers: int | None = None, shard_mb: float = 64,
            vocab_sample_mb: float = 200) -> records.Metadata:
  """Prepares `config.data.corpus` into `output_dir` (resuming a run there); returns its metadata
  (with config.data.languages, prepare_languages: the last language's)."""
  data = config.data
  if data.get('languages', ''):
    return prepare_languages(config, output_dir, workers, shard_mb, vocab_sample_mb)[-1]
  if data.corpus_format not in corpus.CORPUS_FORMATS:
    raise PrepareError(f'config.data.corpus_format={data.corpus_format!r} is not one of '
                       f'{", ".join(corpus.CORPUS_FORMATS)}.')
  if data.max_documents < 0:
    raise PrepareError(f'config.data.max_documents={data.max_documents} must be >= 0.')
  if workers is not None and workers < 0:
    raise PrepareError(f'--workers={workers} must be >= 1 (0 or None: one per CPU).')
  workers = workers or os.cpu_count() or 1
  output_dir = os.path.abspath(os.path.expanduser(output_dir))
  os.makedirs(output_dir, exist_ok=True)
  units = make_plan(data.corpus, shard_mb)
  _check_heads(units)
  kind = data.get('tokenizer', 'wordpiece')
  plan_config = {'tokenizer': kind, 'lowercase': bool(data.lowercase),
                 'corpus_format': data.corpus_format, 'max_documents': int(data.max_documents)}
  _check_plan_config(output_dir, plan_config, '')  # Before a vocab may be trained in vain.
  tokenizer = _load_vocab(config, output_dir, lambda: _sample_documents(
      units, data.corpus_format, vocab_sample_mb * _MB, data.max_documents))
  vocab_file = os.path.abspath(tokenizer.vocab_file)
  plan_config = {'vocab_sha256': tokenizer.vocab_hash(), **plan_config}
  _check_plan_config(output_dir, plan_config, vocab_file)
  tokenizer_lib.keep(tokenizer, output_dir)
  _write_json(os.path.join(output_dir, PLAN_FILENAME),
              {'version': PLAN_VERSION, 'config': plan_config, 'corpus': data.corpus,
               'shard_mb': shard_mb, 'vocab_file': vocab_file, 'units': units})
  _remove_leftovers(output_dir, len(units))
  settings = _Settings(output_dir=output_dir, tokenizer=kind, vocab_file=vocab_file,
                       lowercase=bool(data.lowercase), corpus_format=data.corpus_format,
                       max_documents=int(data.max_documents),
                       token_dtype=records.token_dtype(tokenizer.vocab_size), config=plan_config)
  results = _run_units(units, settings, workers)
  metadata = _metadata(units, results, settings, tokenizer)
  records.write_metadata(output_dir, metadata)
  logging.info('Prepared %s: %d documents, %d sentences, %d tokens in %d shards; bad input %s.',
               output_dir, metadata.num_documents, metadata.num_sentences, metadata.num_tokens,
               len(metadata.shards), {k: v for k, v in metadata.bad_input.items() if v})
  return metadata


def prepare_languages(config, output_dir: str, workers: int | None = None, shard_mb: float = 64,
                      vocab_sample_mb: float = 200) -> list[records.Metadata]:
  """A cross-lingual corpus (config.data.languages; data.corpus names each language's files with
  '{lang}'): one vocab shared by the languages (data.vocab_file, else the one output_dir keeps,
  else trained on vocab_sample_mb MB drawn evenly from the languages' first documents), kept in
  output_dir, then each language prepared with it into output_dir/{lang}; LANGUAGES_FILENAME
  lists them. Returns each language's metadata."""
  from bert_jax.data import crosslingual  # pylint: disable=g-import-not-at-top
  data = config.data
  try:
    languages = crosslingual.parse_languages(data.languages)
  except ValueError as e:
    raise PrepareError(str(e)) from e
  if crosslingual.LANGUAGE_FIELD not in data.corpus:
    raise PrepareError(f'config.data.corpus={data.corpus!r} has no '
                       f'{crosslingual.LANGUAGE_FIELD!r}: with config.data.languages it names '
                       "each language's files, e.g. 'wiki.{lang}.txt'.")
  if data.get('parallel', ''):
    raise PrepareError(f'config.data.parallel={data.parallel!r}: translation pairs are read in '
                       "memory, not prepared; prepare the monolingual text with parallel=''.")
  output_dir = os.path.abspath(os.path.expanduser(output_dir))
  os.makedirs(output_dir, exist_ok=True)
  language_config = ml_collections.ConfigDict(config.to_dict())
  language_config.data.update(languages='', parallel='')
  corpora = {code: data.corpus.replace(crosslingual.LANGUAGE_FIELD, code) for code in languages}
  # Each language's first documents, an equal share of the sample each.
  tokenizer = _load_vocab(config, output_dir, lambda: [
      document for code in languages for document in _sample_documents(
          make_plan(corpora[code], shard_mb), data.corpus_format,
          vocab_sample_mb * _MB / len(languages), data.max_documents)])
  language_config.data.vocab_file = os.path.abspath(tokenizer.vocab_file)
  out = []
  for code in languages:
    language_config.data.corpus = corpora[code]
    out.append(prepare(language_config, os.path.join(output_dir, code), workers, shard_mb,
                       vocab_sample_mb))
  _write_json(os.path.join(output_dir, LANGUAGES_FILENAME),
              {'languages': list(languages), 'vocab_sha256': out[0].vocab_sha256})
  return out


def read_languages(directory: str) -> list[str]:
  """The languages a cross-lingual prepared corpus holds (prepare_languages), in id order; []
  for a corpus of one language."""
  found = _read_json(os.path.join(os.path.expanduser(directory), LANGUAGES_FILENAME))
  return list(found['languages']) if found else []


def _load_vocab(config, output_dir: str, draw_sample):
  """data.vocab_file, else the vocab output_dir keeps, else one trained on `draw_sample()`'s
  documents (the corpus's first MBs), kept in output_dir."""
  data = config.data
  kind = data.get('tokenizer', 'wordpiece')
  try:
    if data.vocab_file:
      return tokenizer_lib.load_tokenizer(kind, data.vocab_file, data.lowercase)
  except (ValueError, OSError) as e:
    raise PrepareError(f'config.data.vocab_file={data.vocab_file!r}: {e}') from e
  trained = tokenizer_lib.kept_vocab(kind, output_dir)
  if trained:  # HF's trainer is not deterministic: a rerun must reuse it.
    logging.info('Using the vocab trained by an earlier run: %s', trained)
    return tokenizer_lib.load_tokenizer(kind, trained, data.lowercase)
  sample = draw_sample()
  logging.info('Training a %d-token %s vocab on %d documents (%.1f MB) of the corpus.',
               data.tokenizer_vocab_size, kind, len(sample),
               sum(len(s) for d in sample for s in d) / _MB)
  return tokenizer_lib.load_or_train_tokenizer(
      '', sample, data.tokenizer_vocab_size, data.lowercase, output_dir,
      data.get('tokenizer_cache_dir', ''), kind)


def prepared_vocab_file(directory: str, metadata: records.Metadata) -> str:
  """The vocab a prepared corpus was tokenised with: the one DIR keeps (vocab.txt, vocab.json +
  merges.txt or spiece.model, by metadata.tokenizer), else (a directory prepared before the vocab
  was copied there) the file its metadata names."""
  kept = tokenizer_lib.kept_vocab(metadata.tokenizer, directory)
  if kept:
    return kept
  if metadata.vocab_file and os.path.isfile(metadata.vocab_file):
    return metadata.vocab_file
  names = ' + '.join(tokenizer_lib.KEPT_FILES[metadata.tokenizer])
  raise PrepareError(
      f'config.data.prepared={directory!r} has no {names} and the vocab it was prepared with '
      f'({metadata.vocab_file!r}) is not there; set config.data.vocab_file to that vocab.')


def _sample_documents(units: list[dict], corpus_format: str, max_chars: float,
                      max_documents: int) -> list[list[str]]:
  """The corpus's first documents, up to `max_chars` characters (and max_documents)."""
  sample, chars = [], 0
  for unit in units:
    for source in unit['sources']:
      documents = source_documents(source, corpus_format, {})
      try:
        for document in documents:
          sample.append(document)
          chars += sum(len(sentence) for sentence in document)
          if chars >= max_chars or len(sample) == max_documents:
            return sample
      finally:
        documents.close()
  return sample


def _check_plan_config(output_dir: str, plan_config: dict, vocab_file: str) -> None:
  """Refuses to mix shards of another vocab, casing, format or document limit into one dir."""
  previous = _read_json(os.path.join(output_dir, PLAN_FILENAME))
  if not previous:
    return
  for key, value in plan_config.items():
    before = previous.get('config', {}).get(key, _PLAN_DEFAULTS.get(key))
    if before != value:
      what = {'vocab_sha256': 'vocab sha256'}.get(key, f'data.{key}')
      extra = (f' (vocab {previous.get("vocab_file")!r} then, {vocab_file!r} now)'
               if key == 'vocab_sha256' else '')
      raise PrepareError(
          f'{output_dir} was prepared with {what} {before!r}; this run has {value!r}{extra}. '
          'Give another --output (or delete that directory).')


def _remove_leftovers(output_dir: str, num_units: int) -> None:
  """Deletes temporaries of interrupted runs and shards beyond the plan (from a larger plan)."""
  for name in os.listdir(output_dir):
    match = _SHARD_OR_SIDECAR.match(name)
    if _TEMPORARY.match(name) or (match and int(match.group(1)) >= num_units):
      os.unlink(os.path.join(output_dir, name))


def _done(unit: dict, settings: _Settings):
  """The unit's sidecar when its shard is complete and matches the plan, else None."""
  sidecar = _read_json(os.path.join(settings.output_dir,
                                    SIDECAR_PATTERN.format(index=unit['index'])))
  shard = os.path.join(settings.output_dir, unit['shard'])
  if (sidecar and sidecar.get('unit') == unit
      and {**_PLAN_DEFAULTS, **(sidecar.get('config') or {})} == settings.config and
      os.path.isfile(shard) and os.path.getsize(shard) == sidecar.get('shard_bytes')):
    return sidecar
  return None


def _run_units(units: list[dict], settings: _Settings, workers: int) -> dict:
  """Runs the units not done yet on a process pool; returns {index: sidecar} of those kept."""
  results = {}
  for unit in units:
    sidecar = _done(unit, settings)
    if sidecar:
      results[unit['index']] = sidecar
  todo = [unit for unit in units if unit['index'] not in results]
  total_mb = sum(unit['raw_size'] for unit in units) / _MB
  logging.info('Plan: %d units, %.1f MB of raw text; %d done earlier, %d to do on %d workers.',
               len(units), total_mb, len(results), len(todo), min(workers, len(todo)))
  if _cutoff(units, results, settings.max_documents) is not None or not todo:
    return _kept(units, results, settings)
  metadata_path = os.path.join(settings.output_dir, records.METADATA_FILENAME)
  if os.path.exists(metadata_path):  # It describes shards about to change.
    os.unlink(metadata_path)
  progress = _Progress(units, results)
  context = multiprocessing.get_context('spawn')  # Safe whatever threads the parent runs.
  window = 2 * workers  # Units in flight: a document limit stops the run without waste.
  pending, queue = {}, list(reversed(todo))
  with concurrent.futures.ProcessPoolExecutor(
      max_workers=min(workers, len(todo)), mp_context=context,
      initializer=_init_worker) as executor:
    try:
      while queue or pending:
        while queue and len(pending) < window:
          unit = queue.pop()
          pending[executor.submit(process_unit, unit, settings)] = unit
        finished, _ = concurrent.futures.wait(
            pending, timeout=_PROGRESS_SECONDS,
            return_when=concurrent.futures.FIRST_COMPLETED)
        for future in finished:
          unit = pending.pop(future)
          sidecar = future.result()
          results[unit['index']] = sidecar
          progress.unit_done(sidecar)
          _log_bad_input(sidecar)
        progress.maybe_log()
        if _cutoff(units, results, settings.max_documents) is not None:
          queue.clear()
    except concurrent.futures.process.BrokenProcessPool as error:
      raise PrepareError(f'A worker process died ({error}): killed, or out of memory? Rerun the '
                         'same command to resume.') from error
    except BaseException:
      executor.shutdown(wait=True, cancel_futures=True)
      raise
  progress.log()
  return _kept(units, results, settings)


def _cutoff(units: list[dict], results: dict, max_documents: int):
  """The number of leading units that reach max_documents, once they are all done; else None."""
  if not max_documents:
    return None
  documents = 0
  for count, unit in enumerate(units, 1):
    if unit['index'] not in results:
      return None
    documents += results[unit['index']]['documents']
    if documents >= max_documents:
      return count
  return None


def _kept(units: list[dict], results: dict, settings: _Settings) -> dict:
  """The results of the units that make the corpus; shards past a document limit are deleted."""
  count = _cutoff(units, results, settings.max_documents) or len(units)
  for unit in units[count:]:
    for name in (unit['shard'], SIDECAR_PATTERN.format(index=unit['index'])):
      path = os.path.join(settings.output_dir, name)
      if os.path.exists(path):
        os.unlink(path)
  missing = [unit['index'] for unit in units[:count] if unit['index'] not in results]
  if missing:
    raise RuntimeError(f'Units {missing} finished without results.')
  return {unit['index']: results[unit['index']] for unit in units[:count]}


def _log_bad_input(sidecar: dict) -> None:
  """Logs each file's bad input: a warning when text was lost or corrupted."""
  for report in sidecar['files']:
    found = {kind: count for kind, count in report['bad_input'].items() if count}
    if not found:
      continue
    lossy = any(kind in found for kind in _LOSSY_KINDS)
    where = (f' (first at line {report["first_non_utf8_line"]})'
             if found.get('non_utf8_lines') else '')
    text = ', '.join(f'{kind}={count}' for kind, count in found.items())
    (logging.warning if lossy else logging.info)('Bad input in %s: %s%s.', report['source'],
                                                 text, where)


class _Progress:
  """Logs units and MB of raw text done, the rate of this run and an ETA."""

  def __init__(self, units: list[dict], results: dict):
    self._units = len(units)
    self._total = sum(unit['raw_size'] for unit in units)
    self._done_units = len(results)
    self._done = sum(unit['raw_size'] for unit in units if unit['index'] in results)
    self._this_run = 0
    self._start = self._last = time.monotonic()

  def unit_done(self, sidecar: dict) -> None:
    self._done_units += 1
    self._done += sidecar['unit']['raw_size']
    self._this_run += sidecar['unit']['raw_size']

  def maybe_log(self) -> None:
    if time.monotonic() - self._last >= _PROGRESS_SECONDS:
      self.log()

  def log(self) -> None:
    self._last = time.monotonic()
    elapsed = max(self._last - self._start, 1e-9)
    rate = self._this_run / elapsed
    eta = f'{(self._total - self._done) / rate:.0f} s' if rate else '?'
    logging.info('Units %d/%d, raw text %.1f/%.1f MB, %.2f MB/s, ETA %s (%.0f s so far).',
                 self._done_units, self._units, self._done / _MB, self._total / _MB,
                 rate / _MB, eta, elapsed)


def _metadata(units: list[dict], results: dict, settings: _Settings,
              tokenizer) -> records.Metadata:
  """Totals of the kept units; shards without documents are left out of the shard list."""
  shards, sources = [], []
  bad_input = dict.fromkeys(BAD_INPUT_KINDS, 0)
  for unit in units:
    result = results.get(unit['index'])
    if result is None:
      continue
    names = [report['source'] for report in result['files']]
    sources += names
    for kind in BAD_INPUT_KINDS:
      bad_input[kind] += result['bad_input'][kind]
    if result['documents']:
      shards.append({'file': unit['shard'], 'documents': result['documents'],
                     'sentences': result['sentences'], 'tokens': result['tokens'],
                     'sources': names})
  kept = list(results.values())
  return records.Metadata(
      format_version=records.FORMAT_VERSION, tokenizer=settings.tokenizer,
      vocab_sha256=settings.config['vocab_sha256'], vocab_file=settings.vocab_file,
      vocab_size=tokenizer.vocab_size,
      lowercase=settings.lowercase, token_dtype=settings.token_dtype, shards=shards,
      num_documents=sum(r['documents'] for r in kept),
      num_sentences=sum(r['sentences'] for r in kept),
      num_tokens=sum(r['tokens'] for r in kept), sources=sources, bad_input=bad_input,
      raw_bytes=sum(r['raw_bytes'] for r in kept))


# ---- Command line. ----


def _define_flags():
  """The CLI's flags; defined only when run as a program, so importing this module adds none."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file('config', None, 'Config file, e.g. configs/base.py.')
  flags.DEFINE_string('output', None, 'Directory of the prepared corpus; a rerun resumes it.')
  flags.DEFINE_integer('workers', None, 'Worker processes (default: os.cpu_count()).')
  flags.DEFINE_float('shard_mb', 64, 'MB of raw text per work unit and shard (files unsplit).')
  flags.DEFINE_float('vocab_sample_mb', 200,
                     'MB of text to train a vocab on when data.vocab_file is empty.')
  flags.mark_flags_as_required(['config', 'output'])


def main(argv):
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  values = flags.FLAGS
  try:
    prepare(values.config, values.output, values.workers, values.shard_mb,
            values.vocab_sample_mb)
  except (ValueError, OSError) as error:
    logging.error('Prepare failed: %s', error)
    sys.exit(f'Prepare failed: {error}')


if __name__ == '__main__':
  # Config files import `configs.base`: make the repository root importable from anywhere.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  from absl import app  # pylint: disable=g-import-not-at-top
  from bert_jax.core import chips  # pylint: disable=g-import-not-at-top
  from bert_jax.core import cli  # pylint: disable=g-import-not-at-top
  chips.quiet_absent_tpu()  # Before JAX starts (workers inherit it).
  _define_flags()
  app.run(main, flags_parser=cli.flags_parser(__name__))

"""Streaming pretraining input over a prepared corpus, as a Grain pipeline.

  Grain MapDataset of document ids (shuffled afresh each epoch, this process's slice)
  -> PretrainingBatches: pairs (NSP, SOP) or single segments per document, the paper's semantics
     (data/pretraining.py; each document's rng is seeded by (seed, epoch or static pass, document))
  -> rows: one instance per row, or several packed into one row (first-fit within the batch, at
     most max_pairs_per_row), each pair keeping its own positions and attending only to itself;
     or, with data.rows='full_sentences', RoBERTa's rows: the documents' sentences in stream
     order, filling each row across document boundaries
  -> batches of rows, masked at once per batch by data/batching.py (vectorised 80/10/10;
     dynamic: a fresh mask every time a document comes round; static: `dupe_factor` fixed masks)
  -> optional worker processes (Grain mp_prefetch).

A mixture (data.mixture: a prepared corpus a source) streams through SourceDocuments: each
epoch draws the sources to their weights' shares of its tokens (SourceOrder). A cross-lingual
corpus (a prepared corpus a language) streams through LanguageDocuments: each epoch draws the
languages to their smoothed shares in runs of one language, and every row is one language's,
with position_ids and language_ids.

The iterator's state (Grain's get_state) is a small JSON dict saved in each checkpoint, so a
resumed run sees exactly the batches an uninterrupted run would have.
"""

import collections
import dataclasses
import json
import os

import grain
import numpy as np

from bert_jax.data import batching
from bert_jax.data import pretraining
from bert_jax.data import records
from bert_jax.data.batching import StreamSettings

_DOC_STREAM, _MASK_STREAM, _SPLIT_STREAM, _ORDER_STREAM = 11, 12, 13, 15


class DocumentStore:
  """Random access to the documents of a prepared corpus: store[i] -> list of int32 sentences."""

  def __init__(self, directory: str, metadata: records.Metadata | None = None):
    self.metadata = metadata or records.read_metadata(directory)
    self._directory = directory
    self._paths = self.metadata.shard_paths(directory)
    for path, shard in zip(self._paths, self.metadata.shards):
      _check_shard(path, shard['documents'], directory)
    self._ends = np.cumsum([shard['documents'] for shard in self.metadata.shards])
    self._source = grain.sources.ArrayRecordDataSource(self._paths)
    self._dtype = self.metadata.token_dtype

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> 'Sentences':
    try:
      return Sentences(*records.decode_flat(self._source[int(index)], self._dtype))
    # RuntimeError: ArrayRecord's reader (a chunk that fails its checksum, a shard cut short or
    # deleted since it was checked); ValueError: a record that does not decode.
    except (RuntimeError, OSError, ValueError) as e:
      shard = int(np.searchsorted(self._ends, index, side='right'))
      raise records.PreparedCorpusError(
          f'Document {index} in shard {self._paths[shard]} cannot be read '
          f'({_first_line(e)}): the shard is truncated or corrupt; delete it and '
          f'{records.redo_hint(self._directory)}.') from e


def _first_line(error: Exception) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


class Sentences:
  """A document's sentences as views into its token array: splitting a long document into
  arrays up front costs more than the pairs drawn from it (NotNext reads random documents)."""

  def __init__(self, tokens: np.ndarray, starts: np.ndarray, first: int = 0, stop: int = -1):
    # tokens: [n] int32; starts: [num_sentences + 1] offsets of each sentence, then n.
    self._tokens, self._starts = tokens, starts
    self._first, self._stop = first, len(starts) - 1 if stop < 0 else stop

  def __len__(self) -> int:
    return self._stop - self._first

  def __getitem__(self, index):
    if isinstance(index, slice):
      first, stop, _ = index.indices(len(self))
      return Sentences(self._tokens, self._starts, self._first + first, self._first + stop)
    if not -len(self) <= index < len(self):
      raise IndexError(index)
    i = self._first + (index % len(self))
    return self._tokens[self._starts[i]:self._starts[i + 1]]

  def __iter__(self):
    for i in range(self._first, self._stop):
      yield self._tokens[self._starts[i]:self._starts[i + 1]]


def _check_shard(path: str, documents: int, directory: str) -> None:
  """A shard must exist and hold the documents metadata.json counts (a truncated or corrupt
  ArrayRecord file opens with fewer records)."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(path):
    raise records.PreparedCorpusError(f'Shard {path} is missing; {records.redo_hint(directory)}.')
  try:
    reader = array_record_module.ArrayRecordReader(path)
    found = reader.num_records()
    reader.close()
  except RuntimeError as e:
    raise records.PreparedCorpusError(
        f'Shard {path} cannot be read ({_first_line(e)}): the file is truncated or corrupt; '
        f'delete it and {records.redo_hint(directory)}.') from e
  if found != documents:
    raise records.PreparedCorpusError(
        f'Shard {path} holds {found} records, but metadata.json counts {documents} documents: '
        f'the file is truncated or corrupt; delete it and {records.redo_hint(directory)}.')


class SubsetDocuments:
  """A view of some documents of a store (e.g. the training split), indexable from 0."""

  def __init__(self, store, ids: np.ndarray):
    self.store, self.ids = store, np.asarray(ids)

  def __len__(self) -> int:
    return len(self.ids)

  def __getitem__(self, index: int):
    return self.store[self.ids[int(index)]]


class SourceDocuments:
  """Several sources' documents as one collection (a prepared corpus a source: a mixture's, or
  a cross-lingual corpus's languages): source 0's documents from index 0, then source 1's, ...;
  source_of(i) is document i's source."""

  def __init__(self, parts, tokens_per_document=None):
    # tokens_per_document: each source's mean document length (its share of an epoch's tokens
    # sets how many of its documents the epoch draws); None: all equal.
    self.parts = list(parts)
    self.counts = [len(part) for part in self.parts]
    self.tokens_per_document = list(tokens_per_document or [1.0] * len(self.parts))
    self._ends = np.cumsum(self.counts)

  def __len__(self) -> int:
    return int(self._ends[-1]) if len(self._ends) else 0

  def source_of(self, index: int) -> int:
    return int(np.searchsorted(self._ends, int(index), side='right'))

  def __getitem__(self, index: int):
    source = self.source_of(index)
    return self.parts[source][int(index) - int(self._ends[source] - self.counts[source])]


class LanguageDocuments(SourceDocuments):
  """A cross-lingual corpus's languages as sources: language_of(i), document i's language id,
  goes into its rows (a mixture's sources give the model nothing)."""

  def language_of(self, index: int) -> int:
    return self.source_of(index)


# A cross-lingual epoch's order is runs of this many documents of one language per input shard.
LANGUAGE_RUN = 16


class SourceOrder:
  """Stream index -> (epoch, document id) over SourceDocuments: every epoch, each source's
  documents drawn to its share of the epoch's tokens (`shares`; a source over its share of the
  corpus draws a fresh subset each epoch, one under it all its documents and then some again),
  in runs of `run` documents of one source shuffled together (a cross-lingual corpus's: so that
  FULL-SENTENCES rows, which end where a run does, keep to one language)."""

  def __init__(self, documents: SourceDocuments, shares, seed: int, run: int):
    counts = np.asarray(documents.counts, np.int64)
    tokens = counts * np.asarray(documents.tokens_per_document, np.float64)
    mean = np.divide(tokens, counts, out=np.ones_like(tokens), where=counts > 0)
    wanted = np.round(np.asarray(shares, np.float64) * tokens.sum() / mean)
    self.wanted = np.where(counts > 0, wanted, 0).astype(np.int64)
    self.counts, self.seed, self.run = counts, seed, run
    self.length = max(int(self.wanted.sum()), 1)
    self._epoch, self._order = None, None

  @classmethod
  def smoothed(cls, documents: SourceDocuments, alpha: float, seed: int, run: int):
    """Languages drawn as XLM draws them: q_i = p_i^alpha / sum_j p_j^alpha, p_i a language's
    share of the corpus's tokens (alpha 1: an epoch is a permutation in runs)."""
    from bert_jax.data import crosslingual  # pylint: disable=g-import-not-at-top
    tokens = (np.asarray(documents.counts, np.float64)
              * np.asarray(documents.tokens_per_document, np.float64))
    return cls(documents, crosslingual.language_shares(tokens.tolist(), alpha), seed, run)

  def epoch_order(self, epoch: int) -> np.ndarray:
    """[length] document ids of one epoch."""
    rng = np.random.default_rng([self.seed, _ORDER_STREAM, epoch])
    runs, start = [], 0
    for count, wanted in zip(self.counts.tolist(), self.wanted.tolist()):
      if count and wanted:
        draws = -(-wanted // count)  # Permutations enough to cover the source's share.
        ids = start + np.concatenate([rng.permutation(count) for _ in range(draws)])[:wanted]
        runs += [ids[k:k + self.run] for k in range(0, wanted, self.run)]
      start += count
    return np.concatenate([runs[k] for k in rng.permutation(len(runs))])

  def __call__(self, index: int) -> tuple[int, int]:
    epoch, within = divmod(int(index), self.length)
    if epoch != self._epoch:
      self._order, self._epoch = self.epoch_order(epoch), epoch
    return epoch, int(self._order[within])


def split_ids(num_documents: int, eval_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
  """(train ids, held-out ids) of the documents; the held-out ones never train."""
  order = np.random.default_rng([seed, _SPLIT_STREAM]).permutation(num_documents)
  num_eval = int(round(eval_fraction * num_documents))
  if eval_fraction > 0:
    num_eval = min(max(num_eval, 2), num_documents - 1)
  return np.sort(order[num_eval:]), np.sort(order[:num_eval])


def document_order(num_documents: int, seed: int, process_index: int = 0,
                   process_count: int = 1, order=None) -> grain.MapDataset:
  """(epoch, document id) forever, reshuffled every epoch (or as `order` maps a stream index);
  this process's every process_count-th."""
  ds = grain.MapDataset.range(2**62).map(order or EpochPermutation(num_documents, seed))
  return ds[process_index::process_count]


class EpochPermutation:
  """Stream index -> (epoch, document id): a fresh seeded permutation of the documents per epoch.

  (Grain's index_shuffle costs ~90 us per element; a cached numpy permutation costs nothing.)
  """

  def __init__(self, num_documents: int, seed: int):
    self.num_documents, self.seed = num_documents, seed
    self._epoch, self._order = None, None

  def __call__(self, index: int) -> tuple[int, int]:
    epoch, within = divmod(int(index), self.num_documents)
    if epoch != self._epoch:
      self._order = np.random.default_rng([self.seed, _ORDER_STREAM, epoch]).permutation(
          self.num_documents)
      self._epoch = epoch
    return epoch, int(self._order[within])


def read_options() -> grain.ReadOptions:
  """The document-id stream is trivial to compute: no read-ahead threads for it."""
  return grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


class PretrainingBatches(grain.IterDataset):
  """Masked, fixed-shape pretraining batches from a dataset of document ids."""

  def __init__(self, parent: grain.IterDataset, documents, settings: StreamSettings, seed: int):
    super().__init__(parent)
    self.documents, self.settings, self.seed = documents, settings, seed

  def __iter__(self):
    return _BatchIterator(self._parent.__iter__(), self.documents, self.settings, self.seed)

  def __str__(self) -> str:
    return 'PretrainingBatches'


class _BatchIterator(grain.DatasetIterator):
  """See PretrainingBatches. State: where the oldest unfinished document began in the parent,
  how many of its instances are used, and the number of batches made (the masking rng)."""

  def __init__(self, parent, documents, settings, seed):
    super().__init__(parent)
    self._documents, self._settings, self._seed = documents, settings, seed
    # A cross-lingual collection's document -> language id (LanguageDocuments), else None.
    self._language_of = getattr(documents, 'language_of', None)
    # Pending documents: [parent state before it, stream position, its instances, next unused].
    self._pending = collections.deque()
    self._position = 0  # Stream position of the next document pulled from the parent.
    self._batches = 0

  def _pull(self) -> None:
    state = self._parent.get_state()
    epoch, doc_id = (int(x) for x in next(self._parent))
    # Dynamic: fresh pairs every epoch. Static: dupe_factor fixed passes, cycled.
    generation = epoch % self._settings.dupe_factor if self._settings.dupe_factor else epoch
    if self._settings.rows == 'full_sentences':  # Its rows are filled in _full_sentence_rows.
      made = pretraining.sentence_pieces(self._documents[doc_id],
                                         self._settings.max_seq_length - 2)
    else:
      rng = np.random.default_rng([self._seed, _DOC_STREAM, generation, doc_id])
      made = pretraining.create_instances_from_document(
          self._documents, doc_id, rng, max_seq_length=self._settings.max_seq_length,
          short_seq_prob=self._settings.short_seq_prob, nsp=self._settings.nsp,
          separators=self._settings.special.separators, pair_kind=self._settings.pair_kind)
    self._pending.append([state, self._position, (generation, doc_id), made, 0])
    self._position += 1

  def _peek(self):
    """(instance, (generation, doc id), its index in the document) of the next unused one."""
    self._drop_finished()
    while not self._pending:
      self._pull()
      self._drop_finished()  # A document may make no instance.
    first = self._pending[0]
    return first[3][first[4]], first[2], first[4]

  def _take(self) -> None:
    self._pending[0][4] += 1

  def __next__(self):
    rows = self._next_rows()
    generation, doc_id = rows[0][0][1]
    rng = np.random.default_rng([self._seed, _MASK_STREAM, generation, doc_id, self._batches])
    self._batches += 1
    batch = batching.make_batch(rows, rng, self._settings, self._seed)
    if self._language_of:
      # Cross-lingual rows (data/crosslingual.py's keys): positions from 0, each token its row's
      # language (padding 0); a row is one instance of one language.
      mask = batch['input_mask']  # [b, length]
      languages = np.array([self._language_of(row[0][1][1]) for row in rows], np.int32)  # [b]
      batch['position_ids'] = np.where(mask > 0, np.arange(mask.shape[1])[None], 0).astype(
          np.int32)
      batch['language_ids'] = (mask * languages[:, None]).astype(np.int32)
    return batch

  def _next_rows(self) -> list[list]:
    """A batch of rows: one instance each, or with packing first-fit: each instance goes to the
    first row with room for it (at most max_pairs_per_row), a new row when none has; the batch
    is complete when all rows are open and the next instance fits none (it waits)."""
    s = self._settings
    if s.rows == 'full_sentences':
      return self._full_sentence_rows()
    rows = []
    used = np.zeros(s.batch_size, np.int64)  # Tokens per row.
    pairs = np.zeros(s.batch_size, np.int64)
    while True:
      item = self._peek()
      length = batching.row_length(item[0], s.special)
      room = np.flatnonzero((used[:len(rows)] + length <= s.max_seq_length)
                            & (pairs[:len(rows)] < s.max_pairs_per_row)) if s.packing else ()
      if len(room):
        row = int(room[0])
        rows[row].append(item)
      elif len(rows) < s.batch_size:
        row = len(rows)
        rows.append([item])
      else:
        return rows
      used[row] += length
      pairs[row] += 1
      self._take()

  def _full_sentence_rows(self) -> list[list]:
    """A batch of FULL-SENTENCES rows, each one instance: the next sentences in stream order; a
    row is complete when the next sentence does not fit it, which then opens the next row (or
    waits for the next batch, so that a batch's state is a position among the sentences)."""
    s = self._settings
    rows, first = [], None
    row = pretraining.FullSentenceRow(s.max_seq_length, s.special.sep)
    while True:
      piece, key, index = self._peek()
      # A cross-lingual row ends where its language does.
      other_language = (self._language_of and first is not None
                        and self._language_of(key[1]) != self._language_of(first[0][1]))
      if other_language or not row.add(piece, starts_document=index == 0):
        rows.append([(row.instance(), *first)])
        if len(rows) == s.batch_size:
          return rows
        row, first = pretraining.FullSentenceRow(s.max_seq_length, s.special.sep), None
        continue
      first = first or (key, index)  # A row is named by its first sentence.
      self._take()

  def get_state(self):
    self._drop_finished()
    if self._pending:
      first = self._pending[0]
      return {'parent': first[0], 'position': first[1], 'used': first[4],
              'batches': self._batches}
    return {'parent': self._parent.get_state(), 'position': self._position, 'used': 0,
            'batches': self._batches}

  def _drop_finished(self):
    while self._pending and self._pending[0][4] >= len(self._pending[0][3]):
      self._pending.popleft()

  def set_state(self, state):
    self._parent.set_state(state['parent'])
    self._pending.clear()
    self._position = int(state['position'])
    self._batches = int(state['batches'])
    if state['used']:
      self._pull()
      self._pending[0][4] = int(state['used'])


def shard_block(shards: int, process_index: int, process_count: int,
                rows: int) -> tuple[list[int], int]:
  """(this process's input shards, rows of each shard's batches) for `rows` rows per process;
  ValueError when the shards or rows do not split evenly."""
  if shards % process_count:
    raise ValueError(f'config.data.input_shards={shards} is not divisible by the '
                     f'{process_count} processes; use a multiple of {process_count}.')
  per_process = shards // process_count
  if rows % per_process:
    raise ValueError(f'The {rows} rows of a batch per process cannot be split among its '
                     f'{per_process} input shards; make the batch size a multiple of '
                     f'config.data.input_shards={shards}.')
  return list(range(process_index * per_process, (process_index + 1) * per_process)), (
      rows // per_process)


class TrainStream:
  """This process's rows of each global training batch, resumable through checkpoints.

  The training documents are read by `shards` input streams: shard s takes every s-th document of
  each epoch's order and makes batch_size / shards rows of every global batch, which is shard 0's
  rows, then shard 1's, and so on. Process p of P streams the contiguous block of shards
  [p S/P, (p+1) S/P), so every process count that divides S sees the same global batches: a run
  can resume on another number of hosts. `checkpoint_state()` gathers every shard's iterator
  state for the checkpoint (a collective: all processes call it together).
  """
  # identity.digest of the prepared corpus, set by the mode that opens it; saved with each
  # checkpoint so that a resume on another prepared corpus is refused.
  data_sha256 = ''

  def __init__(self, documents, settings: StreamSettings, seed: int, workers: int = 0,
               process_index: int = 0, process_count: int = 1, shards: int = 0,
               language_alpha: float = 1.0, shares=None):
    # documents: a store's (SubsetDocuments), or SourceDocuments: each epoch then draws the
    # sources to `shares` of its tokens (a mixture's), document by document; LanguageDocuments
    # the languages smoothed by language_alpha, in runs of one language (SourceOrder).
    self.shards = shards or process_count
    self.shard_ids, rows = shard_block(self.shards, process_index, process_count,
                                       settings.batch_size)
    self.process_count, self.workers = process_count, workers
    shard_settings = dataclasses.replace(settings, batch_size=rows)
    if workers > 0:
      from absl import flags  # pylint: disable=g-import-not-at-top
      if not flags.FLAGS.is_parsed():  # Grain's workers read absl flags (defaults suffice).
        flags.FLAGS.mark_as_parsed()
    self._datasets = []
    for shard in self.shard_ids:
      if isinstance(documents, LanguageDocuments):
        sources = SourceOrder.smoothed(documents, language_alpha, seed,
                                       LANGUAGE_RUN * self.shards)
      elif isinstance(documents, SourceDocuments):
        sources = SourceOrder(documents, shares, seed, self.shards)
      else:
        sources = None
      order = document_order(len(documents), seed, shard, self.shards, sources)
      dataset = PretrainingBatches(order.to_iter_dataset(read_options()), documents,
                                   shard_settings, seed)
      if workers > 0:
        dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers))
      self._datasets.append(dataset)
    self._iterators = []

  def batches(self, position: dict):
    """Yields (batch, position) from `position` ({'epoch', 'batch'[, 'stream']}) on."""
    self._iterators = [iter(dataset) for dataset in self._datasets]
    states = position.get('stream')
    if states:
      if len(states) != self.shards:
        raise ValueError(
            f'The checkpoint holds {len(states)} input streams, this run makes {self.shards} '
            f'(config.data.input_shards, 0: one per process); set '
            f'--config.data.input_shards={len(states)} (any process count that divides it '
            'resumes), or start a new --workdir.')
      for iterator, shard in zip(self._iterators, self.shard_ids):
        iterator.set_state(json.loads(states[shard]))
    index = int(position.get('batch', 0))
    while True:
      parts = [next(iterator) for iterator in self._iterators]
      batch = parts[0] if len(parts) == 1 else {
          k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
      index += 1
      yield batch, {'epoch': 0, 'batch': index}

  def close(self) -> None:
    """Stops the worker processes, if any."""
    for iterator in self._iterators:
      if hasattr(iterator, 'close'):
        iterator.close()

  def checkpoint_state(self) -> dict:
    """{'stream': [state of shard 0, 1, ...] as JSON strings, 'stream_workers': workers}."""
    mine = [json.dumps(iterator.get_state()) for iterator in self._iterators]
    if self.process_count == 1:
      return {'stream': mine, 'stream_workers': self.workers}
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    encoded = np.frombuffer(json.dumps(mine).encode(), np.uint8)
    longest = int(np.max(multihost_utils.process_allgather(np.int32(len(encoded)))))
    padded = np.zeros(longest, np.uint8)
    padded[:len(encoded)] = encoded
    gathered = multihost_utils.process_allgather(padded)  # [processes, longest]
    # Processes hold contiguous blocks of shards, so process order is shard order.
    states = [s for row in np.asarray(gathered) for s in json.loads(bytes(row).rstrip(b'\0'))]
    return {'stream': states, 'stream_workers': self.workers}


def eval_batches(documents, settings: StreamSettings, num_batches: int, seed: int) -> list[dict]:
  """A fixed held-out set: unpacked rows of the held-out documents, the same at every eval."""
  settings = dataclasses.replace(settings, packing=False, max_pairs_per_row=1, dupe_factor=0)
  order = document_order(len(documents), seed + 1)
  iterator = iter(PretrainingBatches(order.to_iter_dataset(read_options()), documents, settings,
                                     seed + 1))
  return [next(iterator) for _ in range(num_batches)]


def check_languages(directory: str, languages: tuple[str, ...]) -> list[str]:
  """The languages of a prepared corpus, which must be config.data.languages (in order: a
  language's id is its index); ValueError naming both and how to prepare it otherwise."""
  from bert_jax.data import prepare  # pylint: disable=g-import-not-at-top
  found = prepare.read_languages(directory)
  if list(found) != list(languages):
    hint = ('prepare it with them: python -m bert_jax.data.prepare --config=... '
            f"--config.data.languages={','.join(languages)} --config.data.corpus='...{{lang}}...' "
            f'--output={directory}' if languages else
            f"set --config.data.languages={','.join(found)}")
    raise ValueError(
        f'config.data.prepared={directory!r} holds '
        f'{"the languages " + ",".join(found) if found else "one corpus, no languages"}, but '
        f'config.data.languages={",".join(languages)!r}; {hint}.')
  return list(found)


def prepared_tokenizer(metadata: records.Metadata, directory: str, config):
  """The tokenizer a run streaming a prepared corpus uses: config.data.vocab_file, else the vocab
  the directory keeps; ValueError when the corpus was tokenised with another kind, vocab or
  casing."""
  check_kind(metadata, directory, config)
  from bert_jax.data import prepare  # pylint: disable=g-import-not-at-top
  from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  vocab_file = config.data.vocab_file or prepare.prepared_vocab_file(directory, metadata)
  tokenizer = tokenizer_lib.load_tokenizer(metadata.tokenizer, vocab_file, config.data.lowercase)
  check_prepared(metadata, directory, tokenizer, config)
  return tokenizer


def check_kind(metadata: records.Metadata, directory: str, config) -> None:
  """The prepared corpus must come from this run's tokenizer kind; ValueError names both."""
  kind = config.data.get('tokenizer', 'wordpiece')
  if metadata.tokenizer != kind:
    raise ValueError(
        f'config.data.prepared={directory!r} was tokenised with data.tokenizer='
        f'{metadata.tokenizer!r}, but config.data.tokenizer={kind!r}; set '
        f'--config.data.tokenizer={metadata.tokenizer}, or prepare the corpus again with '
        f'{kind}.')


def check_prepared(metadata: records.Metadata, directory: str, tokenizer, config) -> None:
  """The prepared corpus must belong to this run's tokenizer, vocab and casing; ValueError names
  both."""
  check_kind(metadata, directory, config)
  vocab_hash = tokenizer.vocab_hash()
  if metadata.vocab_sha256 != vocab_hash:
    raise ValueError(
        f'config.data.prepared={directory!r} was tokenised with the vocab of sha256 '
        f'{metadata.vocab_sha256[:12]} ({metadata.vocab_file}), but this run uses '
        f'{tokenizer.vocab_file} (sha256 {vocab_hash[:12]}); leave config.data.vocab_file '
        'empty to use the vocab it was prepared with (kept in that directory), or prepare it '
        'again.')
  if metadata.lowercase != config.data.lowercase:
    raise ValueError(
        f'config.data.prepared={directory!r} was prepared with lowercase={metadata.lowercase}, '
        f'but config.data.lowercase={config.data.lowercase}.')
  if metadata.num_documents < 2:
    raise ValueError(f'config.data.prepared={directory!r} holds {metadata.num_documents} '
                     'document(s); pretraining needs at least 2 (one is held out).')

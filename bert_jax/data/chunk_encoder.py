"""Token ids of many sentences at once, prepare.py's tokeniser (`make_encoder`): for WordPiece each
distinct word tokenised once (the same ids as `WordPieceTokenizer.encode_sentences`, several times
faster on text); other tokenizers encode whole sentences."""

import itertools
import re

import numpy as np

from bert_jax.data import tokenizer as tokenizer_lib

# Cached tokenisations per worker and kind (chunks, parts; ~140 bytes each): bounds the caches
# (~300 MB at most) on any corpus; half of it holds the 370K distinct chunks of 40 MB of English.
_CACHE_ENTRIES = 1_000_000
# A chunk's parts: each ASCII punctuation mark (which BERT's pre-tokenizer makes a word of its
# own, as it does other punctuation) and the runs between them.
_PARTS = re.compile(r'[!-/:-@\[-`{-~]|[^!-/:-@\[-`{-~]+')


class _Cache:
  """A dict of about `max_entries` at most that keeps what is in use.

  Two generations: when the newer fills half the room, it becomes the older one and the older is
  dropped; an entry of the older generation that is used again moves to the newer.
  """

  def __init__(self, max_entries: int):
    self.current, self._older = {}, {}
    self._half = max(max_entries // 2, 1)

  def missing(self, keys: set) -> list:
    """Puts in `current` the keys the older generation holds; returns the others, to compute."""
    if len(self.current) > self._half:
      self._older, self.current = self.current, {}
    missing = []
    for key in keys.difference(self.current):
      value = self._older.get(key)
      if value is None:
        missing.append(key)
      else:
        self.current[key] = value
    return missing


def make_encoder(tokenizer, dtype: str):
  """The encoder prepare.py uses for `tokenizer`: `encode(sentences) -> (ids, lengths)`."""
  if tokenizer.kind == 'wordpiece':
    return ChunkEncoder(tokenizer, dtype)
  return SentenceEncoder(tokenizer, dtype)


class SentenceEncoder:
  """Ids of sentences through the tokenizer itself: byte-level BPE and SentencePiece see a space
  as part of the next piece, so a sentence is not the concatenation of its chunks' ids."""

  def __init__(self, tokenizer, dtype: str):
    self._tokenizer = tokenizer
    self._dtype = np.dtype(dtype).newbyteorder('<')

  def encode(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(every sentence's ids back to back in the token dtype, each sentence's length)."""
    ids = self._tokenizer.encode_sentences(sentences)
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
    return flat.astype(self._dtype), lengths


class ChunkEncoder:
  """WordPiece ids of sentences, tokenising each distinct word once and caching it.

  BERT's normalizer works character by character and its pre-tokenizer splits at every space and
  ASCII punctuation mark, so a sentence's ids are those of its space-separated chunks back to
  back, and a chunk's are those of its parts between punctuation marks (each mark a part of its
  own). Text repeats its chunks (a few percent are new after the first megabytes), and a dict
  lookup is ~50x cheaper than the tokenizer; the parts of new chunks, lowercased when the
  tokenizer lowercases anyway, are tokenised in turn only when new. Tests check the equality with
  `WordPieceTokenizer.encode_sentences`.
  """

  def __init__(self, tokenizer: tokenizer_lib.WordPieceTokenizer, dtype: str,
               max_entries: int = _CACHE_ENTRIES):
    self._tokenizer = tokenizer
    self._dtype = np.dtype(dtype).newbyteorder('<')
    self._chunks = _Cache(max_entries)  # Chunk -> its ids as bytes in the token dtype.
    self._parts = _Cache(max_entries)  # Part (lowercased if ASCII and lowercasing) -> id bytes.

  def encode(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(every sentence's ids back to back in the token dtype, each sentence's length)."""
    chunks = ' '.join(sentences).split(' ')
    self._add_chunks(self._chunks.missing(set(chunks)))
    values = list(map(self._chunks.current.__getitem__, chunks))
    ids = np.frombuffer(b''.join(values), self._dtype)
    chunk_ends = np.cumsum(np.fromiter(map(len, values), np.int64, len(values)))
    chunk_ends //= self._dtype.itemsize
    spaces = np.fromiter(map(str.count, sentences, itertools.repeat(' ')), np.int64,
                         len(sentences))
    ends = chunk_ends[np.cumsum(spaces + 1) - 1] if len(sentences) else np.zeros(0, np.int64)
    return ids, np.diff(ends, prepend=0)

  def _add_chunks(self, chunks: list[str]) -> None:
    """Puts new chunks in the cache, from their parts' ids."""
    lowercase = self._tokenizer.lowercase
    split = _PARTS.findall
    keys = []
    for chunk in chunks:
      if chunk.isascii():
        keys.append(split(chunk.lower() if lowercase else chunk))
      else:  # Python's lower() of other characters is not BERT's: leave them to the tokenizer.
        keys.append([part.lower() if lowercase and part.isascii() else part
                     for part in split(chunk)])
    self._add_parts(self._parts.missing(set(itertools.chain.from_iterable(keys))))
    parts, cache = self._parts.current, self._chunks.current
    for chunk, chunk_keys in zip(chunks, keys):
      # Most chunks are one part (no punctuation): no join needed.
      cache[chunk] = (parts[chunk_keys[0]] if len(chunk_keys) == 1
                      else b''.join(map(parts.__getitem__, chunk_keys)))

  def _add_parts(self, parts: list[str]) -> None:
    """Tokenises new parts into the cache, many per call (each as a word of its own)."""
    per_call = 512
    size = self._dtype.itemsize
    cache = self._parts.current
    groups = [parts[start:start + per_call] for start in range(0, len(parts), per_call)]
    for group, (ids, words) in zip(groups, self._tokenizer.encode_words(groups)):
      bounds = np.searchsorted(words, np.arange(len(group) + 1))  # Words come in order.
      data = ids.astype(self._dtype).tobytes()
      for part, start, end in zip(group, bounds[:-1].tolist(), bounds[1:].tolist()):
        cache[part] = data[start * size:end * size]

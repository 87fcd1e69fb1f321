"""The prepared corpus on disk: ArrayRecord shards of tokenised documents, and their metadata.

A prepared directory (written by `python -m bert_jax.data.prepare`) holds
  metadata.json                  what prepare.py wrote, see `Metadata`
  documents-SSSSS.array_record   one record per document
A record is a document's sentences: little-endian uint32 `num_sentences`, then uint32 lengths
of each sentence, then every sentence's token ids back to back (uint16 when the vocab has at
most 65,536 entries, else int32; `Metadata.token_dtype` says which).
"""

import dataclasses
import json
import os

import numpy as np

from bert_jax.core.errors import ConfigError
from bert_jax.data import tokenizer as tokenizer_lib

FORMAT_VERSION = 1
METADATA_FILENAME = 'metadata.json'
SHARD_PATTERN = 'documents-{index:05d}.array_record'


class PreparedCorpusError(ConfigError):
  """A prepared corpus (config.data.prepared) whose metadata or shards are missing, truncated or
  corrupt. A ConfigError, so a run stops with one line naming the file, whether the fault shows
  when the corpus is opened or at a read mid-run."""


def redo_hint(directory: str) -> str:
  """How to repair a prepared directory: prepare reruns only its missing shards."""
  return (f're-run `python -m bert_jax.data.prepare --config=... --output={directory}` with the '
          'config and corpus it was prepared with (metadata.json lists the sources); it rewrites '
          'only missing shards')


def token_dtype(vocab_size: int) -> str:
  """The narrowest dtype that holds every id: 'uint16' or 'int32'."""
  return 'uint16' if vocab_size <= 65536 else 'int32'


def encode_document(sentences: list[np.ndarray], dtype: str) -> bytes:
  """A document's sentences (1-D int arrays of ids) -> one record."""
  tokens = np.concatenate(sentences) if sentences else np.zeros(0)
  return encode_flat(tokens, np.asarray([len(s) for s in sentences]), dtype)


def encode_flat(tokens: np.ndarray, lengths: np.ndarray, dtype: str) -> bytes:
  """A document as its ids back to back and each sentence's length -> one record."""
  header = np.concatenate([np.asarray([len(lengths)]), lengths]).astype('<u4')
  return header.tobytes() + np.asarray(tokens).astype(np.dtype(dtype).newbyteorder('<'),
                                                      copy=False).tobytes()


def decode_document(record: bytes, dtype: str) -> list[np.ndarray]:
  """One record -> the document's sentences as int32 arrays."""
  tokens, starts = decode_flat(record, dtype)
  return np.split(tokens, starts[1:-1]) if len(starts) > 1 else []


def decode_flat(record: bytes, dtype: str) -> tuple[np.ndarray, np.ndarray]:
  """One record -> (tokens [n] int32, sentence start offsets [num_sentences + 1] int64)."""
  count = int(np.frombuffer(record, '<u4', count=1)[0])
  lengths = np.frombuffer(record, '<u4', count=count, offset=4).astype(np.int64)
  tokens = np.frombuffer(record, np.dtype(dtype).newbyteorder('<'),
                         offset=4 * (count + 1)).astype(np.int32)
  if len(tokens) != lengths.sum():
    raise ValueError(f'record holds {len(tokens)} tokens but its sentence lengths sum to '
                     f'{lengths.sum()}')
  return tokens, np.concatenate([[0], np.cumsum(lengths)])


@dataclasses.dataclass
class Metadata:
  """metadata.json of a prepared corpus."""
  format_version: int
  vocab_sha256: str  # sha256 of the vocab the ids come from (tokenizer.vocab_hash()).
  vocab_file: str  # Where that vocab was read (informative).
  vocab_size: int
  lowercase: bool
  token_dtype: str  # 'uint16' or 'int32'.
  shards: list  # [{'file': name, 'documents': n, 'sentences': n, 'tokens': n, 'sources': [...]}]
  num_documents: int = 0
  num_sentences: int = 0
  num_tokens: int = 0
  sources: list = dataclasses.field(default_factory=list)  # Input files (or 'builtin', tfds:...).
  bad_input: dict = dataclasses.field(default_factory=dict)  # Counts by kind, see prepare.py.
  raw_bytes: int = 0  # Bytes of raw text read.
  # config.data.tokenizer the ids come from; corpora prepared before it was recorded: WordPiece.
  tokenizer: str = 'wordpiece'

  def shard_paths(self, directory: str) -> list[str]:
    return [os.path.join(directory, shard['file']) for shard in self.shards]


def read_metadata(directory: str) -> Metadata:
  """The metadata of a prepared directory; PreparedCorpusError naming the path when it is absent,
  foreign, unreadable or lacks what the reader needs."""
  path = os.path.join(os.path.expanduser(directory), METADATA_FILENAME)
  if not os.path.isfile(path):
    raise PreparedCorpusError(
        f'{path} does not exist: {directory!r} is not a prepared corpus; run '
        '`python -m bert_jax.data.prepare --config=... --output=DIR` first.')
  try:
    with open(path, encoding='utf-8') as f:
      fields = json.load(f)
  except (OSError, ValueError) as e:  # ValueError: not JSON (a file cut short), not UTF-8.
    raise PreparedCorpusError(f'{path} cannot be read ({e}); delete it and '
                              f'{redo_hint(directory)}.') from e
  if not isinstance(fields, dict):
    raise PreparedCorpusError(f'{path} is not a JSON object; delete it and '
                              f'{redo_hint(directory)}.')
  if fields.get('format_version') != FORMAT_VERSION:
    raise PreparedCorpusError(
        f'{path}: format_version {fields.get("format_version")!r}, this code reads '
        f'{FORMAT_VERSION}; prepare the corpus again.')
  known = dataclasses.fields(Metadata)
  missing = [f.name for f in known if f.name not in fields
             and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  if missing:
    raise PreparedCorpusError(f'{path} lacks {", ".join(missing)}; delete it and '
                              f'{redo_hint(directory)}.')
  metadata = Metadata(**{f.name: fields[f.name] for f in known if f.name in fields})
  problem = _metadata_problem(metadata)
  if problem:
    raise PreparedCorpusError(f'{path}: {problem}; delete it and {redo_hint(directory)}.')
  return metadata


def _metadata_problem(metadata: Metadata) -> str:
  """What makes metadata unreadable for streaming ('' when nothing)."""
  if metadata.token_dtype not in ('uint16', 'int32'):
    return f"token_dtype {metadata.token_dtype!r} is not 'uint16' or 'int32'"
  kinds = tokenizer_lib.KINDS
  if metadata.tokenizer not in kinds:
    return f'tokenizer {metadata.tokenizer!r} is not one of {", ".join(kinds)}'
  if not isinstance(metadata.shards, list):
    return 'shards is not a list'
  for index, shard in enumerate(metadata.shards):
    if not isinstance(shard, dict) or not isinstance(shard.get('documents'), int):
      return f'shard entry {index} has no document count'
    name = shard.get('file')
    # A shard is a file of the directory itself: a path would read a file of something else.
    if not isinstance(name, str) or os.path.basename(name) != name or name in ('', '.', '..'):
      return f'shard entry {index} names {name!r}, not a file in the directory'
  return ''


def write_metadata(directory: str, metadata: Metadata) -> None:
  """Writes metadata.json through a renamed temporary (readers never see half a file)."""
  path = os.path.join(directory, METADATA_FILENAME)
  temporary = f'{path}.{os.getpid()}.tmp'
  with open(temporary, 'w', encoding='utf-8') as f:
    json.dump(dataclasses.asdict(metadata), f, indent=2)
  os.replace(temporary, path)

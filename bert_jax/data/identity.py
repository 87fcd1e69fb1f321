"""What a run's batches are drawn from, as one sha256: saved with each checkpoint, compared on
resume.

The config keys that name the data do not identify it: a corpus file can be rewritten in place
under the same name, and a corpus copied to another directory is the same data under another
name. So the digest is taken of what the batches are made of: an in-memory corpus's token ids
(another corpus, corpus format, casing or tokenizer gives other ids), or a prepared corpus's
metadata (its vocab's sha256, casing, tokenizer and each shard's counts: reading every record
would cost as much as an epoch). The held-out split follows from these and the layout keys
(data.eval_fraction, seed). Pure: numpy and hashlib only.
"""

import dataclasses
import hashlib

import numpy as np


def digest(*parts) -> str:
  """sha256 (hex) of nested lists, tuples, dicts, dataclasses, numpy arrays and scalars: equal
  values give equal digests, an array's dtype and shape included."""
  h = hashlib.sha256()
  for part in parts:
    _update(h, part)
  return h.hexdigest()


def _update(h, value) -> None:
  if isinstance(value, np.ndarray):
    h.update(f'a{value.dtype.str}{value.shape}'.encode())
    h.update(np.ascontiguousarray(value).tobytes())
  elif isinstance(value, dict):
    h.update(f'd{len(value)}'.encode())
    for key in sorted(value, key=str):
      _update(h, str(key))
      _update(h, value[key])
  elif dataclasses.is_dataclass(value) and not isinstance(value, type):
    _update(h, type(value).__name__)
    _update(h, {f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
  elif isinstance(value, (list, tuple)):
    if value and all(isinstance(v, np.ndarray) and v.ndim == 1 for v in value):
      # A document's sentences: one update for all of them (a corpus has millions).
      h.update(f's{len(value)}'.encode())
      h.update(np.array([v.size for v in value], np.int64).tobytes())
      h.update(np.concatenate([v.astype(value[0].dtype, copy=False) for v in value]).tobytes())
      h.update(str(sorted({v.dtype.str for v in value})).encode())
    else:
      h.update(f'l{len(value)}'.encode())
      for item in value:
        _update(h, item)
  elif value is None or isinstance(value, (str, bool, int, float, np.generic)):
    h.update(f'{type(value).__name__}:{value!r};'.encode())
  else:
    raise TypeError(f'identity.digest cannot hash a {type(value).__name__}.')


def prepared_metadata(metadata) -> dict:
  """A prepared corpus's metadata without where things were read from (vocab_file, sources):
  what its ids are, not where the corpus or its vocab lay when it was prepared."""
  fields = dataclasses.asdict(metadata)
  fields.pop('vocab_file', None)
  fields.pop('sources', None)
  fields['shards'] = [{k: v for k, v in shard.items() if k != 'sources'}
                      for shard in fields.get('shards', [])]
  return fields

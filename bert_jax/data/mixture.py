"""A corpus mixture (data.mixture): several sources, each prepared on its own into a directory
of data.prepared (DIR/NAME, one vocab for all), streamed together, each epoch drawing each
source's training documents to its weight's share of the epoch's tokens ('wiki:3,books:1': three
quarters wiki): continued pretraining on a new domain with some of the original text beside it,
or a corpus stated as shares, as recent encoders state theirs. Parsing and checks; the drawing
is streaming.SourceOrder's.

An epoch holds each source's mean document length x its documents drawn, so that its token
shares are the weights: a source above its natural share draws some of its documents again
within the epoch, one below draws a fresh subset each epoch. The held-out set is each source's
held-out documents (data.eval_fraction of each), in the proportion the sources have them.
"""

import dataclasses
import os

from bert_jax.core.errors import ConfigError
from bert_jax.data import records


@dataclasses.dataclass(frozen=True)
class Source:
  name: str  # Its directory under data.prepared.
  weight: float  # Relative: its share of an epoch's tokens is weight / the sum of the weights.


def parse(text: str) -> list[Source]:
  """'wiki:3,books:1' -> [Source('wiki', 3.0), Source('books', 1.0)] ([] for ''); ConfigError
  naming the item and what is valid."""
  where = f'config.data.mixture={text!r}'
  sources = []
  for item in (part.strip() for part in (text or '').split(',')):
    if not item:
      continue
    name, sep, weight = (part.strip() for part in item.rpartition(':'))
    try:
      value = float(weight) if sep else -1.0
    except ValueError:
      value = -1.0
    if not name or value <= 0 or value != value or value == float('inf'):
      raise ConfigError(f'{where}: {item!r} is not NAME:WEIGHT with a positive weight; a mixture '
                        "names each source's directory under config.data.prepared and its "
                        "weight, e.g. 'wiki:3,books:1' (three quarters of each epoch's tokens "
                        'from DIR/wiki).')
    if os.sep in name or name in ('.', '..'):
      raise ConfigError(f'{where}: {name!r} is not a directory name under config.data.prepared '
                        '(one level: DIR/NAME).')
    if name in [s.name for s in sources]:
      raise ConfigError(f'{where}: {name!r} is named twice; give each source once.')
    sources.append(Source(name, value))
  if len(sources) == 1:
    raise ConfigError(f'{where} names one source; a mixture needs two or more (one source: '
                      f'set config.data.prepared to DIR/{sources[0].name} and mixture=\'\').')
  return sources


def shares(sources: list[Source]) -> list[float]:
  """Each source's share of an epoch's tokens."""
  total = sum(s.weight for s in sources)
  return [s.weight / total for s in sources]


def check_config(config) -> None:
  """data.mixture reads, streams a prepared corpus and is not also a cross-lingual one: before
  anything is read (the sources' directories are checked where they are opened)."""
  data = config.data
  if not parse(data.get('mixture', '')):
    return
  if not data.prepared:
    raise ConfigError(f'config.data.mixture={data.mixture!r} mixes the sources of a prepared '
                      'corpus (config.data.prepared=DIR, each source prepared into DIR/NAME); '
                      'set config.data.prepared.')
  if data.get('languages', ''):
    raise ConfigError(f'config.data.mixture={data.mixture!r} with config.data.languages='
                      f'{data.languages!r}: a cross-lingual corpus draws its languages by '
                      "config.data.language_alpha; set mixture='' (or languages='').")


def directories(prepared: str, sources: list[Source]) -> list[str]:
  """DIR/NAME of each source; ConfigError naming one that holds no prepared corpus, and those
  that do."""
  root = os.path.expanduser(prepared)
  found = []
  for source in sources:
    path = os.path.join(root, source.name)
    if not os.path.isfile(os.path.join(path, records.METADATA_FILENAME)):
      there = sorted(n for n in os.listdir(root)
                     if os.path.isfile(os.path.join(root, n, records.METADATA_FILENAME)))
      raise ConfigError(
          f'config.data.mixture names {source.name!r}, but {path} holds no prepared corpus '
          f'(prepared corpora under {prepared}: {", ".join(there) or "none"}); prepare it with '
          f'`python -m bert_jax.data.prepare --config=... --output={path}` (the same vocab as the '
          'others: --config.data.vocab_file).')
    found.append(path)
  return found

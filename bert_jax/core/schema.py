"""Config keys as data: valid ranges and choices, flattening, and the checks every unit's keys
go through, with one wording for every message (`config.KEY=VALUE: must be ...`).

A unit (a family, later an objective or a task) declares its keys as fields of a frozen
dataclass, each with `field(default, range=..., choices=..., architecture=...)`; `defaults`,
`ranges` and `choices` read them back as the flat tables config_lib composes.
"""

import dataclasses
import difflib
import math
from typing import Any, Callable, NamedTuple

from bert_jax.core.errors import ConfigError


class Range(NamedTuple):
  """The valid values of a numeric key, beyond being a finite number: `test` and its wording."""
  test: Callable[[float], bool]
  text: str  # Completes 'must be a finite number ...' (an integer for integer keys).


POSITIVE = Range(lambda x: x > 0, '> 0')
NON_NEGATIVE = Range(lambda x: x >= 0, '>= 0')
PROBABILITY = Range(lambda x: 0 <= x <= 1, 'in [0, 1]')
# A rate of 1 drops every unit (dropout), keeps no running average (Adam's betas), or leaves
# nothing else to train or evaluate on (shares of data or steps).
BELOW_ONE = Range(lambda x: 0 <= x < 1, 'in [0, 1)')
OPEN_SHARE = Range(lambda x: 0 < x < 1, 'in (0, 1)')
ANY_SIGN = Range(lambda x: True, '')
MESH_AXIS = Range(lambda x: x == -1 or x >= 1, '>= 1, or -1 (the devices the other axes leave)')
# numpy's seeded generators take non-negative seeds; JAX's keys take them below 2**63.
SEED = Range(lambda x: 0 <= x < 2**63, 'in [0, 2**63)')
INIT_SEED = Range(lambda x: x == -1 or 0 <= x < 2**63, 'in [0, 2**63), or -1 (config.seed)')


def field(default, *, range: Range | None = None,  # pylint: disable=redefined-builtin
          choices: tuple | Callable[[], tuple] | None = None,
          architecture: bool | str = False, pretraining_only: bool = False, owner: str = '',
          doc: str = ''):
  """A unit's config key: its default, valid range or choices, whether it describes the
  architecture (taken from a source checkpoint: 'shape' for the sizes every checkpoint's config
  states, True or 'switch' for a key whose default a source that lacks it implies), whether
  only pretraining may set it (fine-tuning builds the encoder without it: its default there),
  the unit that sets it beyond its default where shared code reads it (the shared encoder's
  keys: 'albert', 'rtd', ...), and what it means. choices: the valid values, or a function
  returning them when validation runs (a registry's names, which grow after import)."""
  return dataclasses.field(default=default, metadata={
      'range': range, 'choices': choices, 'architecture': architecture,
      'pretraining_only': pretraining_only, 'owner': owner, 'doc': doc})


def keys(cls) -> list[dataclasses.Field]:
  """The fields of `cls` that are config keys (declared with `field`), in order."""
  return [f for f in dataclasses.fields(cls) if 'doc' in f.metadata]


# 'model.<key>' -> what it means: the docs of every unit's declared keys, which the
# commands' --help prints beside each key (core/cli.py); filled by `declare`.
DOCS: dict[str, str] = {}


def declare(fields, prefix: str) -> None:
  """Records the docs of a unit's `fields` (keys `prefix` + name) for --help."""
  DOCS.update({prefix + f.name: f.metadata['doc'] for f in fields if f.metadata.get('doc')})


def own_fields(cls, base=None) -> list[dataclasses.Field]:
  """The fields `cls` declares beyond those of `base` (a parent dataclass), in order."""
  inherited = {f.name for f in dataclasses.fields(base)} if base is not None else set()
  return [f for f in dataclasses.fields(cls) if f.name not in inherited]


def defaults(fields: list[dataclasses.Field]) -> dict[str, Any]:
  """{name: default} of `fields`."""
  return {f.name: f.default for f in fields}


def ranges(fields: list[dataclasses.Field], prefix: str) -> dict[str, Range]:
  """{prefix + name: Range} of the fields that declare one."""
  return {prefix + f.name: f.metadata['range'] for f in fields
          if f.metadata.get('range') is not None}


def choices(fields: list[dataclasses.Field], prefix: str) -> dict[str, tuple | Callable]:
  """{prefix + name: the valid values, or the function returning them} of the fields that
  declare them."""
  return {prefix + f.name: f.metadata['choices'] for f in fields
          if f.metadata.get('choices') is not None}


def architecture(fields: list[dataclasses.Field], kind: str = '') -> tuple[str, ...]:
  """The names of the fields that describe the architecture; with `kind`, those of that kind
  ('shape', or 'switch', which True is)."""
  def kind_of(f):
    value = f.metadata.get('architecture')
    return 'switch' if value is True else value
  return tuple(f.name for f in fields if kind_of(f) and kind in ('', kind_of(f)))


def pretraining_only(fields: list[dataclasses.Field]) -> tuple[str, ...]:
  """The names of the fields only pretraining may set."""
  return tuple(f.name for f in fields if f.metadata.get('pretraining_only'))


def flatten(config, prefix='') -> dict:
  """{'model.hidden_size': 768, ...} for a (nested) ConfigDict."""
  out = {}
  for key, value in config.items():
    name = f'{prefix}{key}'
    if hasattr(value, 'items'):
      out.update(flatten(value, name + '.'))
    else:
      out[name] = value
  return out


def check_ranges(flat: dict, choices_by_key: dict, ranges_by_key: dict) -> None:
  """Choices, then ranges, of the flattened config's keys; every number must be finite."""
  for key, valid in choices_by_key.items():
    if callable(valid):
      valid = valid()
    if key in flat and flat[key] not in valid:
      raise ConfigError(f'config.{key}={flat[key]!r} is not valid; choose one of {valid}.')
  for key, value in flat.items():
    if key not in ranges_by_key:
      continue
    valid = ranges_by_key[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    finite = number and (isinstance(value, int) or math.isfinite(value))
    if not (finite and valid.test(value)):
      kind = 'an integer' if isinstance(value, int) else 'a finite number'
      raise ConfigError(f'config.{key}={value!r}: must be {kind}'
                        + (f' {valid.text}.' if valid.text else '.'))


def check_known_keys(flat: dict, reference, reference_file: str, renamed: dict) -> None:
  """Every key of `flat` is one of `reference`'s (a close match or its replacement named
  otherwise), and `reference` has none that `flat` lacks."""
  known = flatten(reference)
  unknown = sorted(set(flat) - set(known))
  if unknown:
    hints = []
    for key in unknown:
      close = difflib.get_close_matches(key, known, n=1)
      if key in renamed:
        hints.append(f'config.{key} ({renamed[key]})')
        continue
      hints.append(f'config.{key}' + (f' (did you mean config.{close[0]}?)' if close else ''))
    raise ConfigError(f'Unknown config keys: {", ".join(hints)}.')
  missing = sorted(set(known) - set(flat))
  if missing:
    raise ConfigError(f'Config lacks keys: {", ".join(missing)}; start from {reference_file}.')

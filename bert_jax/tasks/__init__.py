"""Fine-tuning tasks, by kind: GLUE, SQuAD v1.1/v2.0, CoNLL-2003 NER, SWAG (readers, features,
decoding, metrics).

Each kind's module registers a TaskKind at its end: the checks of its settings, the Task it
builds (tasks/base.py is the contract with the trainer) and the config file a sweep fine-tunes
it with. config.task.kind picks one; `register` adds another (a test's, a user's) without an
edit here.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from bert_jax.core import registry

BUILTIN = ('glue', 'squad', 'ner', 'swag')


@dataclasses.dataclass(frozen=True)
class TaskKind:
  """One kind of fine-tuning task."""
  name: str  # config.task.kind.
  # The run's ConfigDict -> None; core.errors.ConfigError naming the key, before any file is read
  # beyond checking that the named ones exist.
  check: Callable[[Any], None]
  build: Callable[[Any], Any]  # The run's ConfigDict -> its tasks.base.Task.
  # {a name sweep.finetune.tasks takes: the config file (with arguments) that fine-tunes it}.
  sweep_configs: Callable[[], dict[str, str]] = dict
  # The config file a config of this kind starts from: configs/finetune.py's keys and the
  # kind's own config.task keys (configs/squad.py: doc_stride, ...), the keys validation
  # expects. '': configs/finetune.py's keys only.
  config_file: str = ''
  # The valid values of the config.task keys it reads ({'task.doc_stride': core.schema.Range},
  # {'task.version': ('1.1', '2.0')}), checked in every fine-tuning config by config_lib.
  ranges: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  choices: Mapping[str, tuple] = dataclasses.field(default_factory=dict)


REGISTRY = registry.Registry('task kind', __name__, BUILTIN)
register = REGISTRY.register
unregister = REGISTRY.unregister
get = REGISTRY.get
available = REGISTRY.available


def check(config) -> None:
  """What every kind shares (tasks/base.py: the head's settings), then config.task.kind's own
  check (its files exist, its settings fit together)."""
  from bert_jax.tasks import base  # pylint: disable=g-import-not-at-top
  base.check_head(config.task)
  get(config.task.kind).check(config)


def ranges() -> dict:
  """{key: Range} of the config.task keys: every kind's (TaskKind.ranges) and the ones every
  kind reads (tasks/base.py)."""
  from bert_jax.tasks import base  # pylint: disable=g-import-not-at-top
  return {**base.RANGES, **REGISTRY.merged('ranges')}


def choices() -> dict:
  """{key: valid values} of every kind's config.task keys (TaskKind.choices)."""
  return REGISTRY.merged('choices')


def config_file(kind: str) -> str:
  """The config file whose keys a config of `kind` holds (TaskKind.config_file); an unknown
  kind's, or one without its own file: configs/finetune.py."""
  return (kind in available() and get(kind).config_file) or 'configs/finetune.py'


def sweep_configs() -> dict[str, str]:
  """{task name: config file} over every kind: what a sweep's finetune.tasks may name."""
  configs = {}
  for name in available():
    configs.update(get(name).sweep_configs())
  return configs

"""Fine-tuning tasks, by kind: GLUE, SQuAD v1.1/v2.0, CoNLL-2003 NER, SWAG (readers, features,
decoding, metrics).

Each kind's module registers a TaskKind at its end: the checks of its settings, the Task it
builds (tasks/base.py is the contract with the trainer) and the config file a sweep fine-tunes
it with. config.task.kind picks one; `register` adds another (a test's, a user's) without an
edit here.
"""

import dataclasses
from collections.abc import Callable
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


REGISTRY = registry.Registry('task kind', __name__, BUILTIN)
register = REGISTRY.register
unregister = REGISTRY.unregister
get = REGISTRY.get
available = REGISTRY.available


def sweep_configs() -> dict[str, str]:
  """{task name: config file} over every kind: what a sweep's finetune.tasks may name."""
  configs = {}
  for name in available():
    configs.update(get(name).sweep_configs())
  return configs

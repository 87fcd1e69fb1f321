"""XLM's config rule: language embeddings (the shared encoder's num_languages, models/encoder.py,
read by the embeddings and the cross-lingual data) are this family's. XLM has no keys of its own;
the cross-lingual data keys are checked beside their reader (data/crosslingual.py). No jax here.
"""

from bert_jax.core.errors import ConfigError

DEFAULTS: dict = {}
RANGES: dict = {}
ARCHITECTURE: tuple = ()
PRETRAINING_ONLY: tuple = ()


def check(config, objective_names: list[str]) -> None:
  """Another family takes num_languages=0."""
  del objective_names
  name, count = config.model.get('name', 'bert'), config.model.get('num_languages', 0)
  if count and name != 'xlm':
    raise ConfigError(
        f'config.model.num_languages={count} with config.model.name={name!r}: language '
        f"embeddings are XLM's (model.name='xlm'); {name} takes num_languages=0.")

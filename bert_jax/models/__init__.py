"""Encoders, by name: each family member is one folder here (models/<name>/) whose model.py
registers a Family.

config.model.name picks the encoder; the pretraining model (objectives/pretraining.py) puts the
objectives' heads on it and the fine-tuning model (models/heads.py) a task head. A family's
encoder takes (input_ids, segment_ids, input_mask, deterministic, position_ids, pair_ids,
cls_positions), and by name the batch keys its Family lists in `inputs`; it returns (sequence
[batch, length, embed], pooled [batch, embed]); its `attend(x)` gives logits against the tied
word embeddings.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from bert_jax.core import registry

# The encoders shipped in this package (each registers itself on import), in the order the HF
# layouts are tried (models/hf_layout.py: RoBERTa's prefix before XLM-R's, which shares it).
BUILTIN = ('bert', 'roberta', 'albert', 'distilbert', 'electra', 'modernbert', 'deberta', 'xlm')


@dataclasses.dataclass(frozen=True)
class Family:
  """One encoder family."""
  name: str
  config_from: Callable[[Any], Any]  # The run's ConfigDict -> the encoder's frozen config.
  encoder: Callable[..., Any]  # (model config, name=...) -> the linen encoder module.
  # config.model -> the encoder's training FLOPs per sequence of `length` tokens / 3 (forward).
  flops: Callable[[Any, int], float]
  scope: str = 'bert'  # The encoder's parameter subtree ('bert/...', as the original BERT).
  # Fine-tuning classification reads the pooled state through `pre_classifier`, Dense(H) and
  # ReLU, before the dropout and the classifier (DistilBertForSequenceClassification's head).
  pre_classifier: bool = False
  # Batch keys beyond the common ones that the encoder reads, by keyword, when a batch has them
  # (XLM's language_ids).
  inputs: tuple[str, ...] = ()
  # Position rows before the first real token's (fairseq's 2: RoBERTa, XLM-R): a row holds at
  # most max_position_embeddings - position_offset tokens.
  position_offset: int = 0
  # Replaced-token detection ('rtd'): the generator's encoder module, built on the generator's
  # config (electra.generator_config) and run on the embeddings the encoder's `generator_embed`
  # gives; None: the family trains no generator.
  generator: Callable[..., Any] | None = None
  # The family's encoder config class when it has keys of its own (models/<name>/: BERT's
  # fields and its unit's; the unit, with its check, is listed in architecture.KEY_UNITS, which
  # config_lib reads without jax); None: BERT's keys only.
  config: type | None = None
  # Its Hugging Face layout (models/hf_layout.Layout, from the family's hf.py); None: the
  # family does not map onto a transformers class.
  hf: Any = None
  # config.model (or a dict of it) -> the encoder's parameter paths (under its scope) that only
  # pretraining reads (DeBERTa's mask decoder's position table): fine-tuning from a workdir and
  # the HF export leave them out. None: every parameter is the encoder's.
  pretraining_only: Callable[[Any], tuple[str, ...]] | None = None
  # '' when each layer has its own parameters; otherwise why a per-layer setting (layer-wise
  # learning-rate decay) is refused, said after the key and its value (ALBERT's shared layer).
  shared_layers: str = ''


REGISTRY = registry.Registry('model', __name__, BUILTIN)
register = REGISTRY.register
get = REGISTRY.get
available = REGISTRY.available


def pretraining_only_paths(model) -> tuple[str, ...]:
  """'scope/path' of each parameter of config.model's (or a dict's) encoder that only
  pretraining reads (Family.pretraining_only)."""
  family = get(model.get('name', 'bert'))
  if family.pretraining_only is None:
    return ()
  return tuple(f'{family.scope}/{path}' for path in family.pretraining_only(model))


def family_of(encoder) -> Family:
  """The registered family whose encoder module `encoder` is an instance of."""
  for name in available():
    family = get(name)
    if isinstance(encoder, family.encoder):
      return family
  raise ValueError(f'{type(encoder).__name__} is no registered family\'s encoder.')

"""What every family's Hugging Face layout is made of: the Layout record, the rows of BERT's
layer under another family's names, the config.json fields and problems all families share, and
the lookup of a family's layout (by our model.name, or by a config.json's model_type).

Each family's own table and config conversion lives in its folder (models/<name>/hf.py) and
reaches the lookup through its registration (Family.hf); interop/hf.py's import and export are
one engine over the layouts. No jax here: the built-in families' hf.py load without their
encoders.
"""

import dataclasses
import importlib
import re
from collections.abc import Callable

from bert_jax import models


class UnsupportedConfigError(ValueError):
  """An HF config uses a feature our model does not implement."""


# HF hidden_act -> our model.gelu ('erf' exact, 'tanh' approximation); export writes the first.
HF_GELU = {'gelu': 'erf', 'gelu_new': 'tanh', 'gelu_pytorch_tanh': 'tanh'}

_OUR_LAYER = 'bert/encoder/layer_{n}/'


def layer_rows(hf_layer: str, modules) -> tuple[tuple[str, str, str], ...]:
  """Rows of BERT's layer under another family's names: each (our module under
  bert/encoder/layer_{n}/, its HF module under `hf_layer`, the kernel's transform, the bias's)
  gives a kernel (a LayerNorm's scale) row and a bias row."""
  return tuple(
      (_OUR_LAYER + ours + leaf, hf_layer + theirs + hf_leaf, transform)
      for ours, theirs, kernel, bias in modules
      for leaf, hf_leaf, transform in (
          ('scale' if 'LayerNorm' in ours else 'kernel', 'weight', kernel),
          ('bias', 'bias', bias)))


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one family's parameters lie in transformers' state dicts and config.json."""
  family: str  # Our models registry name.
  model_type: str  # config.json's model_type.
  display: str  # The family's name in messages.
  prefix: str  # Backbone key prefix of the head models.
  base_class: str  # The backbone alone: keys without the prefix, no heads.
  # (transformers class, key prefix of a head only it has), most heads first: the first whose
  # prefix a checkpoint's keys show names its layout.
  head_classes: tuple[tuple[str, str], ...]
  table: tuple[tuple[str, str, str], ...]
  heads: dict[str, str]  # Our head subtree -> the objective it belongs to.
  ignored: re.Pattern  # Buffers older transformers saved; they carry nothing to import.
  # Head models that drop the pooler (RobertaForMaskedLM, AlbertForMaskedLM) may lack
  # `bert/pooler`, which a fresh init then fills.
  optional_pooler: bool
  to_overrides: Callable[[dict], dict]  # config.json -> config.model values.
  to_hf_config: Callable[..., dict]  # Our full config -> config.json.
  # Our full config -> whether the class it exports to holds the pooler.
  exports_pooler: Callable[..., bool]
  tokenizer: str  # config.data.tokenizer of the family's vocab: 'wordpiece', 'bpe', ...
  # (our fine-tuning path, HF key, transform) of the head of <family>ForSequenceClassification
  # (and of <family>ForMultipleChoice where it is a Linear on the pooler).
  classifier: tuple[tuple[str, str, str], ...] = ()
  # HF keys read on import (tied copies, checked equal) but not written on export.
  not_exported: frozenset[str] = frozenset()
  # Our full config -> what the export cannot carry over and the user should know (DeBERTa's
  # mask decoder), logged as a warning; None: nothing.
  export_note: Callable[..., str | None] = lambda config: None

  def group(self, path: str) -> str:
    """'backbone', 'pooler' (optional here) or the objective whose head holds `path`."""
    if path.startswith('bert/pooler/') and self.optional_pooler:
      return 'pooler'
    if path.startswith('bert/'):
      return 'backbone'
    return self.heads[path.split('/')[0]]

  @property
  def head_key_prefixes(self) -> tuple[str, ...]:
    """The first segment of every head key ('cls.', 'lm_head.', ...)."""
    return tuple(sorted({key.split('.')[0] + '.' for _, key, _ in self.table
                         if not key.startswith(self.prefix)}))


def common_problems(hf_config: dict, gelus) -> list[str]:
  """What none of our encoders implements."""
  problems = []
  act = hf_config.get('hidden_act', 'gelu')
  if act not in gelus:
    # 'relu' or others would change every activation.
    problems.append(f'hidden_act={act!r}; our model implements {sorted(gelus)}')
  if hf_config.get('position_embedding_type', 'absolute') != 'absolute':
    problems.append(f'position_embedding_type={hf_config["position_embedding_type"]!r}; '
                    'our model has learned absolute positions only')
  if hf_config.get('add_cross_attention'):
    problems.append('add_cross_attention=true; our model has no cross-attention')
  if hf_config.get('hidden_size', 768) % hf_config.get('num_attention_heads', 12):
    problems.append('hidden_size is not a multiple of num_attention_heads')
  return problems


NAMES = {'vocab_size': 'vocab_size', 'hidden_size': 'hidden_size',
          'num_hidden_layers': 'num_layers', 'num_attention_heads': 'num_heads',
          'intermediate_size': 'intermediate_size',
          'max_position_embeddings': 'max_position_embeddings',
          'type_vocab_size': 'type_vocab_size', 'layer_norm_eps': 'layer_norm_eps',
          'initializer_range': 'initializer_range',
          'hidden_dropout_prob': 'hidden_dropout_rate',
          'attention_probs_dropout_prob': 'attention_dropout_rate'}


def shape_overrides(hf_config: dict) -> dict:
  return {ours: hf_config[hf] for hf, ours in NAMES.items() if hf in hf_config}


def shape_fields(m) -> dict:
  """config.json fields every family writes alike."""
  return {
      'vocab_size': m.vocab_size, 'hidden_size': m.hidden_size,
      'num_hidden_layers': m.num_layers, 'num_attention_heads': m.num_heads,
      'intermediate_size': m.intermediate_size,
      'hidden_dropout_prob': m.hidden_dropout_rate,
      'attention_probs_dropout_prob': m.attention_dropout_rate,
      'max_position_embeddings': m.max_position_embeddings,
      'type_vocab_size': m.type_vocab_size, 'initializer_range': m.initializer_range,
      'layer_norm_eps': m.layer_norm_eps, 'tie_word_embeddings': True,
  }


def buffers(prefix: str) -> re.Pattern:
  return re.compile(rf'^({re.escape(prefix)})?embeddings\.(position_ids|token_type_ids)$')


def not_causal(hf_config: dict, display: str) -> list[str]:
  """The problem of a decoder config (is_decoder) for a family that is bidirectional only."""
  if hf_config.get('is_decoder'):
    return [f'is_decoder=true; our {display} is bidirectional (causal LMs: model.name=\'bert\')']
  return []


def objective_names(config) -> set[str]:
  """The objectives a (validated) run config trains, which pick the head class it exports to."""
  return {name.strip() for name in str(config.objectives).split(',') if name.strip()}


def layouts() -> list[Layout]:
  """Every family's layout: the built-in families' (their hf.py, without the encoders), then
  those of families registered from elsewhere (a test's) that carry one."""
  found = [importlib.import_module(f'bert_jax.models.{name}.hf').LAYOUT
           for name in models.BUILTIN]
  extra = [models.get(name).hf for name in models.available() if name not in models.BUILTIN]
  return found + [layout for layout in extra if layout is not None]


def for_family(name: str) -> Layout:
  """The layout of our family `name`; UnsupportedConfigError for a family without one."""
  for layout in layouts():
    if layout.family == name:
      return layout
  raise UnsupportedConfigError(
      f'model.name={name!r} has no Hugging Face layout; the families that map are '
      f'{", ".join(layout.family for layout in layouts())}.')


def for_config(config) -> Layout:
  """The layout of a run's config.model.name."""
  return for_family(config.model.get('name', 'bert'))


def for_hf_config(hf_config: dict) -> Layout:
  """The layout of a config.json's model_type (no model_type: BERT, as old BERT configs)."""
  model_type = hf_config.get('model_type', 'bert')
  for layout in layouts():
    if layout.model_type == model_type:
      return layout
  raise UnsupportedConfigError(
      f'Unsupported HF config: model_type={model_type!r}; the model types that map onto our '
      f'families are {", ".join(repr(l.model_type) for l in layouts())}.')

"""DeBERTa's config keys (config.model.*) and their check: the unit's settings, declared once.

configs/base.py takes these keys and their defaults from here (every config carries them, off);
config_lib composes their ranges into RANGES and runs `check` on every config, so that another
family given DeBERTa's switches is refused by name. No jax here: configs and validation load
this module without the encoder (model.py, whose DebertaConfig adds these fields to BERT's).
"""

import dataclasses

from bert_jax.core import schema
from bert_jax.core.errors import ConfigError
from bert_jax.models import checks


@dataclasses.dataclass(frozen=True)
class DebertaKeys:
  """DeBERTa's keys of config.model, each with its default, range and meaning."""
  enhanced_mask_decoder: bool = schema.field(
      False, pretraining_only=True,
      doc="The enhanced mask decoder (unrolled layers, the 'mlm' objective): the MLM head reads "
      'the last layer run twice more with absolute positions added to its queries (He et al., '
      '2021, section 3.3).')
  relative_attention: str = schema.field(
      '', architecture=True, doc="Disentangled attention's terms: 'c2p|p2c' (content-to-"
      "position and position-to-content); '' elsewhere.")
  relative_buckets: int = schema.field(
      0, range=schema.NON_NEGATIVE, architecture=True,
      doc='Log buckets of the relative distances (v3: 256; 0: exact distances).')
  relative_positions: int = schema.field(
      0, range=schema.NON_NEGATIVE, architecture=True,
      doc='The distances kept (0: the position rows).')
  share_relative_key: bool = schema.field(
      False, architecture=True,
      doc="The layer's query and key denses project the position table (v3).")
  relative_norm: bool = schema.field(
      False, architecture=True, doc='A LayerNorm on the position table (v3).')


FIELDS = dataclasses.fields(DebertaKeys)
schema.declare(FIELDS, 'model.')
DEFAULTS = schema.defaults(FIELDS)  # What every config carries: DeBERTa's switches off.
RANGES = schema.ranges(FIELDS, 'model.')
ARCHITECTURE = schema.architecture(FIELDS)  # Taken from a source checkpoint (init_from).
PRETRAINING_ONLY = schema.pretraining_only(FIELDS)  # Refused in fine-tuning configs.


def mask_decoder_only(model) -> tuple[str, ...]:
  """Paths under `bert/` that only the enhanced mask decoder reads (config.model or a dict):
  the position table it adds when positions='none'. Fine-tuning and HF export leave them out
  (Family.pretraining_only)."""
  get = model.get
  if get('name') == 'deberta' and get('enhanced_mask_decoder', False) and get(
      'positions', 'absolute') == 'none':
    return ('embeddings/position_embeddings',)
  return ()


def check(config, objective_names: list[str]) -> None:
  """Disentangled attention is model.name='deberta''s: 'c2p', 'p2c' or both, through the 'xla'
  attention; DeBERTa has no segments (no NSP or SOP) and no rotary positions."""
  model = config.model
  name = model.get('name', 'bert')
  terms = [t.strip() for t in str(model.get('relative_attention', '')).split('|') if t.strip()]
  decoder = bool(model.get('enhanced_mask_decoder', False))
  if name != 'deberta':
    if terms:
      raise ConfigError(
          f'config.model.relative_attention={model.relative_attention!r} with config.model.name='
          f"{name!r}: disentangled attention is DeBERTa's (model.name='deberta'); {name} takes "
          "relative_attention=''.")
    if decoder:
      raise ConfigError(
          f"config.model.enhanced_mask_decoder=True with config.model.name={name!r}: the "
          "enhanced mask decoder is DeBERTa's (model.name='deberta'); set it False.")
    return
  problems = checks.segmentless_xla_problems(config, objective_names)
  unknown = [t for t in terms if t not in ('c2p', 'p2c')]
  if unknown:
    problems.append(f'relative_attention={model.relative_attention!r}: the terms are \'c2p\' '
                    "and 'p2c', joined by '|' (DeBERTa: 'c2p|p2c'; '' for none)")
  if model.positions == 'rotary':
    problems.append("positions='rotary': DeBERTa's positions are relative; use 'none' (v3) or "
                    "'absolute' (v1)")
  if model.get('causal', False):
    problems.append('causal=True: DeBERTa is bidirectional')
  if decoder and ('mlm' not in objective_names or 'rtd' in objective_names):
    problems.append(f'enhanced_mask_decoder=True with objectives={config.objectives!r}: the '
                    "decoder feeds the MLM head; use 'mlm' (not 'rtd', whose generator has none)")
  if problems:
    raise ConfigError("config.model.name='deberta': " + '; '.join(problems) + '.')

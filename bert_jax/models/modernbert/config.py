"""ModernBERT's config keys (config.model.*) and their check, and its rule of which layers attend
globally: the unit's settings, declared once.

configs/base.py takes these keys and their defaults from here (every config carries them, off);
config_lib composes their ranges into RANGES and runs `check` on every config, so that another
family given ModernBERT's windows or rotary thetas is refused by name. The encoder (model.py)
and the HF layout (hf.py, which writes the layer pattern as config.json's layer_types) read them.
No jax here: configs and validation load this module without the encoder. The modern switches
that shared code reads (norm, use_bias, feed_forward, positions) are the shared encoder's
fields (models/encoder.py), owned here: `check` refuses them under another family.
"""

import dataclasses

from bert_jax import ops
from bert_jax.core import schema
from bert_jax.core.errors import ConfigError
from bert_jax.models import checks
from bert_jax.models import encoder


@dataclasses.dataclass(frozen=True)
class ModernbertKeys:
  """ModernBERT's keys of config.model, each with its default, range and meaning."""
  local_window: int = schema.field(
      0, range=schema.NON_NEGATIVE, architecture=True,
      doc='> 0: every layer but each global_every-th attends to tokens at most local_window // '
      '2 positions away (ModernBERT: 128); 0: every layer attends globally.')
  rope_theta: float = schema.field(
      10_000.0, range=schema.POSITIVE, architecture=True,
      doc="The rotary positions' theta in global layers (positions='rotary'; ModernBERT: "
      '160,000).')
  local_rope_theta: float = schema.field(
      10_000.0, range=schema.POSITIVE, architecture=True,
      doc="The rotary positions' theta in local layers (ModernBERT: 10,000).")
  global_every: int = schema.field(
      1, range=schema.POSITIVE, architecture=True,
      doc='With local_window > 0, layers 0, global_every, 2 * global_every, ... attend globally '
      '(ModernBERT: 3).')


FIELDS = dataclasses.fields(ModernbertKeys)
schema.declare(FIELDS, 'model.')
DEFAULTS = schema.defaults(FIELDS)  # What every config carries: ModernBERT's switches off.
RANGES = schema.ranges(FIELDS, 'model.')
ARCHITECTURE = schema.architecture(FIELDS)  # Taken from a source checkpoint (init_from).
PRETRAINING_ONLY = schema.pretraining_only(FIELDS)
# The shared encoder's keys this unit owns (models/encoder.py: norm, use_bias, feed_forward,
# positions), with BERT's values, which every other family takes (DeBERTa: positions='none' too).
SHARED_SWITCHES = {f.name: f.default for f in encoder.KEYS if f.metadata['owner'] == 'modernbert'}


def _check_switches_off(model, name: str) -> None:
  """Another family takes BERT's values of the shared switches and no splash attention."""
  if model.get('attention_impl') == 'splash':
    raise ConfigError(
        f"config.model.attention_impl='splash' with config.model.name={name!r}: the splash "
        "kernels are the modern encoder's local and global attention, without dropout (model."
        "name='modernbert'); use attention_impl 'tpu' on TPUs or 'xla'.")
  # DeBERTa adds no absolute positions in its v3 form: positions='none' is its too.
  allowed = {'positions': 'none'} if name == 'deberta' else {}
  changed = [f'{k}={model.get(k, v)!r}' for k, v in SHARED_SWITCHES.items()
             if model.get(k, v) not in (v, allowed.get(k, v))]
  if changed:
    raise ConfigError(
        f'config.model.{", ".join(changed)} with config.model.name={name!r}: these are '
        "switches of the modern encoder (model.name='modernbert', configs/modernbert.py); "
        f'{name} takes {", ".join(f"{k}={v!r}" for k, v in SHARED_SWITCHES.items())}.')


def is_global(cfg, index: int) -> bool:
  """Whether layer `index` attends over the whole row: every layer without a local window, else
  every global_every-th from the first (ModernBERT's layers 0, 3, 6, ...)."""
  return cfg.local_window <= 0 or index % cfg.global_every == 0


def check(config, objective_names: list[str]) -> None:
  """The windows and thetas, the shared switches it owns and the splash kernels are
  model.name='modernbert''s; that family is bidirectional, XLA- or splash-attended, without
  segments (no NSP or SOP), its window even and its rotary heads of even size. (Negative windows
  and thetas, and global_every < 1, are RANGES'.)"""
  model = config.model
  name = model.get('name', 'bert')
  if name != 'modernbert':
    _check_switches_off(model, name)
    changed = [f'{key}={model.get(key, off)!r}' for key, off in DEFAULTS.items()
               if model.get(key, off) != off]
    if changed:
      raise ConfigError(
          f'config.model.{", config.model.".join(changed)} with config.model.name={name!r}: '
          "local windows and rotary thetas are the modern encoder's (model.name='modernbert', "
          f'configs/modernbert.py); {name} takes '
          + ', '.join(f'{key}={off!r}' for key, off in DEFAULTS.items()) + '.')
    return
  # Registered kernels take its windows in the additive bias, as 'xla' does.
  problems = checks.segmentless_xla_problems(
      config, objective_names, kernels=('splash', *ops.ATTENTION_KERNELS.available()))
  if model.attention_impl == 'splash':
    if model.attention_dropout_rate > 0:
      problems.append(f"attention_impl='splash' with attention_dropout_rate="
                      f'{model.attention_dropout_rate}: the kernels have no dropout; set it to 0')
  for key in ('layer_norm_impl', 'ffn_impl'):
    if model.get(key, 'xla') != 'xla':
      problems.append(f"{key}={model.get(key)!r}: the GPU kernels are BERT's post-LN block; set "
                      f"{key}='xla'")
  if model.local_window % 2:
    problems.append(f'local_window={model.local_window}: the window spans local_window // 2 '
                    'tokens each side, so it must be even (ModernBERT: 128; 0: none)')
  if model.positions == 'rotary' and (model.hidden_size // model.num_heads) % 2:
    problems.append(f'positions=\'rotary\' with head size {model.hidden_size // model.num_heads}'
                    ': rotary embeddings rotate pairs of features, so the head size must be even')
  if problems:
    raise ConfigError("config.model.name='modernbert': " + '; '.join(problems) + '.')

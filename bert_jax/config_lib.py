"""Config checks that run before anything compiles; each error names key, value and what is valid."""

import difflib
import math

from configs import base

VALID_CHOICES = {
    'mode': ('pretrain',),
    'model.dtype': ('float32', 'bfloat16', 'float16'),
    'model.param_dtype': ('float32', 'bfloat16'),
    'model.remat_policy': ('none', 'full', 'dots', 'dots_no_batch'),
    'model.attention_impl': ('xla', 'cudnn'),
    'model.gelu': ('erf', 'tanh'),
    'model.dropout_rng_impl': ('threefry', 'rbg'),
    'data.corpus_format': ('auto', 'bert', 'prose'),
    'mesh.preset': ('data', 'fsdp', 'fsdp_tensor'),
    'train.optimizer': ('adamw', 'lamb'),
}
RATES = ('model.hidden_dropout_rate', 'model.attention_dropout_rate', 'data.short_seq_prob',
         'data.eval_fraction', 'masking.rate', 'masking.mask_token_fraction',
         'masking.random_token_fraction', 'masking.keep_fraction')
POSITIVE = ('model.scan_unroll', 'model.vocab_size', 'model.hidden_size', 'model.num_layers', 'model.num_heads',
            'model.intermediate_size', 'model.max_position_embeddings',
            'model.type_vocab_size', 'data.max_seq_length', 'data.max_predictions_per_seq',
            'data.tokenizer_vocab_size', 'train.batch_size', 'train.num_steps',
            'train.log_every', 'train.eval_batches', 'train.keep_checkpoints')
NON_NEGATIVE = ('train.warmup_steps', 'train.eval_every', 'train.checkpoint_every',
                'train.learning_rate', 'train.weight_decay', 'train.max_grad_norm',
                'data.max_documents', 'train.peak_flops', 'train.max_nonfinite_skips')


class ConfigError(ValueError):
  """A config value that cannot work."""


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


def validate(config) -> None:
  """Static checks of a pretraining config; raises ConfigError on the first problem found."""
  flat = flatten(config)
  _check_known_keys(flat)
  for key, choices in VALID_CHOICES.items():
    if flat[key] not in choices:
      raise ConfigError(f'config.{key}={flat[key]!r} is not valid; choose one of {choices}.')
  for key in POSITIVE:
    if not flat[key] > 0:
      raise ConfigError(f'config.{key}={flat[key]!r} must be > 0.')
  for key in NON_NEGATIVE:
    if not flat[key] >= 0:
      raise ConfigError(f'config.{key}={flat[key]!r} must be >= 0.')
  for key in RATES:
    if not 0.0 <= flat[key] <= 1.0:
      raise ConfigError(f'config.{key}={flat[key]!r} is a rate and must lie in [0, 1].')
  _check_model(config.model)
  _check_data(config)
  if config.init_from:
    from bert_jax import init_from  # pylint: disable=g-import-not-at-top
    try:
      init_from.check_exists(config.init_from)
    except init_from.InitFromError as e:
      raise ConfigError(str(e)) from e


def _check_known_keys(flat) -> None:
  known = flatten(base.get_config())
  unknown = sorted(set(flat) - set(known))
  if unknown:
    hints = []
    for key in unknown:
      close = difflib.get_close_matches(key, known, n=1)
      hints.append(f'config.{key}' + (f' (did you mean config.{close[0]}?)' if close else ''))
    raise ConfigError(f'Unknown config keys: {", ".join(hints)}.')
  missing = sorted(set(known) - set(flat))
  if missing:
    raise ConfigError(f'Config lacks keys: {", ".join(missing)}; start from configs/base.py.')


def _check_model(model) -> None:
  if model.attention_impl == 'cudnn' and model.attention_dropout_rate > 0:
    raise ConfigError(
        f"config.model.attention_impl='cudnn' has no attention dropout, but "
        f'config.model.attention_dropout_rate={model.attention_dropout_rate}; set it to 0.0 '
        "(a documented departure from the paper) or use attention_impl='xla'.")
  if model.hidden_size % model.num_heads:
    raise ConfigError(
        f'config.model.hidden_size={model.hidden_size} is not divisible by '
        f'config.model.num_heads={model.num_heads}; valid head counts divide it, e.g. '
        f'{[h for h in range(1, 33) if model.hidden_size % h == 0]}.')


def _check_data(config) -> None:
  data, masking = config.data, config.masking
  if data.max_seq_length > config.model.max_position_embeddings:
    raise ConfigError(
        f'config.data.max_seq_length={data.max_seq_length} exceeds '
        f'config.model.max_position_embeddings={config.model.max_position_embeddings}.')
  fractions = (masking.mask_token_fraction, masking.random_token_fraction,
               masking.keep_fraction)
  if not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
    raise ConfigError(
        f'config.masking.mask_token_fraction + random_token_fraction + keep_fraction = '
        f'{fractions[0]} + {fractions[1]} + {fractions[2]} = {sum(fractions):.6g}; they must sum '
        'to 1.')
  needed = int(round(data.max_seq_length * masking.rate))
  if data.max_predictions_per_seq < needed:
    raise ConfigError(
        f'config.data.max_predictions_per_seq={data.max_predictions_per_seq} is too small for '
        f'config.masking.rate={masking.rate} x config.data.max_seq_length='
        f'{data.max_seq_length} = {needed} predictions; set it to at least {needed}.')
  minimum = 3 if data.nsp else 2
  if data.max_seq_length < minimum + 2:
    raise ConfigError(f'config.data.max_seq_length={data.max_seq_length} leaves no room for '
                      f'text; use at least {minimum + 2}.')
  if not data.corpus:
    raise ConfigError("config.data.corpus is empty; give text files or globs (comma "
                      "separated, .xz/.gz ok), or 'builtin' for the built-in corpus.")


def validate_runtime(config, tokenizer_vocab_size: int, batch_divisor: int) -> None:
  """Checks that need the tokenizer and the mesh; still before compilation.

  batch_divisor: devices the batch is split over (data x fsdp mesh axes).
  """
  if config.model.vocab_size < tokenizer_vocab_size:
    raise ConfigError(
        f'config.model.vocab_size={config.model.vocab_size} is smaller than the tokenizer\'s '
        f'vocabulary ({tokenizer_vocab_size} tokens); set it to at least '
        f'{tokenizer_vocab_size} (a multiple of 128 is fastest).')
  if config.train.batch_size % batch_divisor:
    raise ConfigError(
        f'config.train.batch_size={config.train.batch_size} is not divisible by the '
        f'{batch_divisor} devices the batch is split over (mesh data x fsdp); use a multiple of '
        f'{batch_divisor}.')

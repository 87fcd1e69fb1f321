"""Config checks that run before anything compiles; each error names key, value and what is valid."""

import os

import ml_collections

from bert_jax import models
from bert_jax.core import cli
from bert_jax.core import schema
from bert_jax.core import xla_options
from bert_jax.core.errors import ConfigError  # Re-exported: config_lib.ConfigError.
# Re-exported: the ranges' names, as config_lib.POSITIVE etc.
from bert_jax.core.schema import (  # noqa: F401  pylint: disable=unused-import
    ANY_SIGN, BELOW_ONE, INIT_SEED, MESH_AXIS, NON_NEGATIVE, OPEN_SHARE, POSITIVE, PROBABILITY,
    SEED, Range, flatten)
from bert_jax.data import batch_warmup
from bert_jax.models import architecture
from bert_jax.models import encoder
from configs import base

VALID_CHOICES = {
    'mode': ('pretrain', 'finetune'),
    **encoder.CHOICES,  # The shared encoder's keys (models/encoder.py).
    'data.corpus_format': ('auto', 'bert', 'prose'),
    'data.tokenizer': ('wordpiece', 'bpe', 'sentencepiece', 'sentencepiece_fairseq'),
    'data.rows': ('segments', 'full_sentences'),
    'masking.eval': ('train', 'reference'),
    'masking.spans': ('', 'geometric'),
    'mesh.preset': ('data', 'fsdp', 'fsdp_tensor'),
    'train.optimizer': ('adamw', 'lamb', 'stableadamw'),
    'train.schedule': ('linear', 'wsd'),  # optim.learning_rate_schedule's kinds and shapes.
    'train.decay_shape': ('linear', 'cosine', '1-sqrt'),
    'train.adam_mu_dtype': ('float32', 'bfloat16'),
}


# The common numeric keys of configs/base.py and configs/finetune.py and their valid values;
# ranges() adds the units' own. A numeric key missing from ranges() fails tests/test_config.py.
RANGES = {
    'seed': SEED, 'init_seed': INIT_SEED, 'seeds': POSITIVE,
    **encoder.RANGES,  # The shared encoder's keys (models/encoder.py).
    'mesh.data': MESH_AXIS, 'mesh.fsdp': MESH_AXIS, 'mesh.tensor': MESH_AXIS,
    'mesh.dcn_data': POSITIVE,
    'data.tokenizer_vocab_size': POSITIVE, 'data.max_seq_length': POSITIVE,
    'data.max_predictions_per_seq': POSITIVE, 'data.short_seq_prob': PROBABILITY,
    'data.eval_fraction': OPEN_SHARE, 'data.max_documents': NON_NEGATIVE,
    'data.max_pairs_per_row': POSITIVE, 'data.dupe_factor': NON_NEGATIVE,
    'data.workers': NON_NEGATIVE, 'data.input_shards': NON_NEGATIVE,
    'data.phase2_max_seq_length': POSITIVE, 'data.phase2_max_predictions_per_seq': POSITIVE,
    'data.language_alpha': Range(lambda x: 0 < x <= 1, 'in (0, 1]'),
    'masking.rate': PROBABILITY, 'masking.mask_token_fraction': PROBABILITY,
    'masking.random_token_fraction': PROBABILITY, 'masking.keep_fraction': PROBABILITY,
    'masking.max_ngram': POSITIVE,
    'masking.span_p': Range(lambda x: 0 < x <= 1, 'in (0, 1]'), 'masking.max_span': POSITIVE,
    'train.batch_size': POSITIVE, 'train.grad_accum_steps': POSITIVE,
    'train.num_steps': POSITIVE, 'train.phase2_fraction': BELOW_ONE,
    'train.batch_warmup_rows': NON_NEGATIVE, 'train.batch_warmup_tokens': NON_NEGATIVE,
    'train.phase2_batch_size': NON_NEGATIVE, 'train.learning_rate': POSITIVE,
    'train.warmup_steps': NON_NEGATIVE, 'train.weight_decay': NON_NEGATIVE,
    'train.decay_steps': NON_NEGATIVE,
    'train.adam_b1': BELOW_ONE, 'train.adam_b2': BELOW_ONE, 'train.adam_eps': POSITIVE,
    # optax's clipping to a norm of 0 zeroes every update (NaN for a zero gradient).
    'train.max_grad_norm': POSITIVE,
    'train.max_nonfinite_skips': NON_NEGATIVE, 'train.log_every': POSITIVE,
    'train.eval_every': POSITIVE, 'train.eval_batches': POSITIVE,
    'train.checkpoint_every': NON_NEGATIVE, 'train.keep_checkpoints': POSITIVE,
    'train.peak_flops': NON_NEGATIVE,
    # Fine-tuning only.
    'train.eval_batch_size': NON_NEGATIVE, 'train.num_epochs': POSITIVE,
    'train.warmup_proportion': BELOW_ONE,
    'train.layerwise_lr_decay': Range(lambda x: 0 <= x <= 1, 'in [0, 1] (0: off)'),
}


def validate(config) -> None:
  """Static checks of a pretraining config; raises ConfigError on the first problem found."""
  flat = flatten(config)
  _check_known_keys(flat, base.get_config(), 'configs/base.py')
  _check_ranges(flat, {**VALID_CHOICES, **_objectives().choices()}, _objectives().ranges())
  _check_schedule(config.train)
  _check_names(config)
  _check_accumulation(config, trained_batch_keys(config))
  batch_warmup.check(config)
  _objectives().check(config)
  encoder.check_shape(config.model)
  _check_families(config)
  _checks().check_model(config.model, _data_checks().row_lengths(config))
  _check_data(config)
  _check_phase2_model(config)
  _check_sources(config)
  xla_options.parse(config)  # Its form; whether XLA knows it, validate_runtime.


def write_config(config, workdir: str) -> None:
  """workdir/config.json: the run's whole config, replaced whole (a kill or a full disk leaves
  the old file, never a cut one)."""
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  files.write_text(os.path.join(workdir, 'config.json'),
                   config.to_json_best_effort(indent=2, sort_keys=True) + '\n')


def validate_and_adopt_source(config, validate_fn) -> None:
  """validate_fn(config); then, with config.init_from, the source's shape and vocab are adopted
  and the result validated again. A run whose objective reads a teacher first adopts the
  teacher's: the student is checked against it (interop/sources.py)."""
  from bert_jax.interop import sources  # pylint: disable=g-import-not-at-top
  sources.adopt_teacher(config)
  validate_fn(config)
  if config.init_from:
    sources.adopt_init_from(config)
    validate_fn(config)


def _check_sources(config) -> None:
  """The checkpoints the run reads (init_from, a teacher) exist and fit (interop/sources.py)."""
  from bert_jax.interop import sources  # pylint: disable=g-import-not-at-top
  sources.check(config)


def ranges() -> dict:
  """{key: Range} of every numeric config key: RANGES and the units' own (the family units',
  the objectives', the task kinds'), read at each call: a unit registered since counts."""
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  return {**_model_ranges(), **_objectives().ranges(), **tasks.ranges()}


def _model_ranges() -> dict:
  """RANGES and the family units' ranges: what both modes' configs hold."""
  return {**RANGES, **architecture.unit_ranges()}


def _check_ranges(flat, choices, unit_ranges) -> None:
  """Choices, then the ranges of the common keys and `unit_ranges` (the mode's units': the
  objectives' or the task kinds'), of the flattened config's keys; every number must be
  finite."""
  schema.check_ranges(flat, choices, {**_model_ranges(), **unit_ranges})


def _check_schedule(train) -> None:
  """The warmup fits in the run (past num_steps the learning rate would never reach its peak);
  a warmup-stable-decay schedule's decay fits after it (0: none, the peak held to the end, as a
  stable run that decays are branched from later)."""
  if train.warmup_steps > train.num_steps:
    raise ConfigError(
        f'config.train.warmup_steps={train.warmup_steps} exceeds config.train.num_steps='
        f'{train.num_steps}: the learning rate would never reach config.train.learning_rate='
        f'{train.learning_rate}; set warmup_steps to at most {train.num_steps} (the config '
        'argument steps=N scales the warmup with the steps).')
  if train.schedule != 'wsd':
    if train.get('decay_steps', 0):
      # Only wsd reads it: a linear schedule decays from the warmup's end to the last step.
      raise ConfigError(
          f'config.train.decay_steps={train.decay_steps} sets a warmup-stable-decay decay, but '
          f'config.train.schedule={train.schedule!r} decays from the warmup\'s end to '
          'num_steps; set config.train.schedule=wsd, or decay_steps=0.')
    return
  stable = train.num_steps - train.warmup_steps - train.decay_steps
  if stable < 0:
    raise ConfigError(
        f'config.train.decay_steps={train.decay_steps} with config.train.schedule=\'wsd\': the '
        f'decay takes at most {train.num_steps - train.warmup_steps} steps (config.train.num_steps='
        f'{train.num_steps} less the warmup of {train.warmup_steps}), the stable phase the rest '
        '(0: no decay).')


def _check_known_keys(flat, reference, reference_file) -> None:
  """Unknown keys (with a close match, or a removed key's replacement: the units' RENAMED) and
  missing ones."""
  schema.check_known_keys(flat, reference, reference_file, _objectives().RENAMED)


def _objectives():
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  return objectives


def _check_names(config) -> None:
  """config.model.name is a registered encoder; config.objectives, when the config has it, names
  registered objectives."""
  from bert_jax import models  # pylint: disable=g-import-not-at-top
  name = config.model.get('name', 'bert')
  if name not in models.available():
    raise ConfigError(f'config.model.name={name!r} is not a model; valid models are '
                      f'{", ".join(models.available())}.')
  if 'objectives' in config:
    try:
      _objectives().parse(config.objectives)
    except ValueError as e:
      raise ConfigError(str(e)) from e


def _family(config):
  """The registered family config.model.name names (its model module imported)."""
  return models.get(config.model.get('name', 'bert'))


def _checks():
  # The kernel settings' checks live beside their dispatch (bert_jax/ops); they import this
  # module's ConfigError.
  from bert_jax.ops import checks  # pylint: disable=g-import-not-at-top
  return checks


def _check_families(config) -> None:
  """Each family unit's check of its own keys, and of the shared keys it owns
  (architecture.KEY_UNITS)."""
  architecture.check_units(config, _objectives().parse(config.objectives))


def _data_checks():
  from bert_jax.data import checks  # pylint: disable=g-import-not-at-top
  return checks


def _check_data(config) -> None:
  """The data and masking keys, checked beside their readers (data/checks.py)."""
  _data_checks().check_pretraining(config)


def phase2_model(config) -> dict:
  """train.phase2_model's 'key=value,...' as {config.model key: value in that key's type}: the
  model settings phase 2 changes (a context extension's rotary theta or local window).
  ConfigError naming a key config.model lacks, a value of another type, or a key that shapes
  parameters (a phase continues the same weights)."""
  text = config.train.get('phase2_model', '')
  changes = {}
  for item in (part.strip() for part in text.split(',')):
    if not item:
      continue
    key, sep, value = (part.strip() for part in item.partition('='))
    where = f'config.train.phase2_model={text!r}'
    if not sep or key not in config.model:
      raise ConfigError(f'{where}: {item!r} is not KEY=VALUE of a config.model key (e.g. a '
                        'rotary theta or a local window of the modern encoder).')
    if key == 'name' or key in architecture.SHAPE_KEYS:
      raise ConfigError(f'{where}: model.{key} shapes the parameters, which phase 2 continues; '
                        'a phase changes settings such as rotary thetas and local windows.')
    current = config.model[key]
    try:
      if isinstance(current, bool):
        if value.lower() not in ('true', 'false'):
          raise ValueError(value)
        changes[key] = value.lower() == 'true'
      else:
        changes[key] = type(current)(value)
    except ValueError as e:
      kind = {bool: 'true or false', int: 'whole number'}.get(type(current), 'number')
      raise ConfigError(f'{where}: model.{key}={value!r} does not read as a {kind} (its value: '
                        f'{current!r}).') from e
  if changes and not config.train.phase2_fraction:
    raise ConfigError(f'config.train.phase2_model={text!r} needs a phase 2 '
                      '(config.train.phase2_fraction > 0).')
  return changes


def phase2_config(config):
  """The run's config as phase 2 trains it: the phase-2 seq length, predictions and batch size,
  and the model settings of train.phase2_model."""
  second = ml_collections.ConfigDict(config.to_dict())
  second.data.max_seq_length = config.data.phase2_max_seq_length
  second.data.max_predictions_per_seq = config.data.phase2_max_predictions_per_seq
  second.train.batch_size = config.train.phase2_batch_size or config.train.batch_size
  # A batch-size warmup is phase 1's: phase 2 trains its batch from its first step.
  second.train.batch_warmup_rows = second.train.batch_warmup_tokens = 0
  second.model.update(phase2_model(config))
  return second


def _check_phase2_model(config) -> None:
  """Phase 2's model (train.phase2_model) passes its family's checks at the phase-2 length."""
  if not phase2_model(config):
    return
  second = phase2_config(config)
  _check_ranges(flatten(second), {**VALID_CHOICES, **_objectives().choices()},
                _objectives().ranges())
  architecture.check_units(second, _objectives().parse(config.objectives))
  _checks().check_model(second.model, [second.data.max_seq_length])


def trained_batch_keys(config) -> list[str]:
  """The config.train keys of the batch sizes a run trains with: batch_size, and
  phase2_batch_size when phase 2 has its own."""
  return ['batch_size'] + (['phase2_batch_size'] if config.train.phase2_fraction
                           and config.train.phase2_batch_size else [])


def _check_accumulation(config, keys) -> None:
  """train.grad_accum_steps splits every trained batch (config.train's `keys`) into equal
  micro-batches (whether each objective gives the counts a micro-batch's loss divides by is
  objectives.check's)."""
  steps = config.train.grad_accum_steps
  if steps == 1:
    return
  for key in keys:
    size = config.train[key]
    if size % steps:
      divisors = [n for n in range(2, min(size, 64) + 1) if size % n == 0][:6]
      raise ConfigError(
          f'config.train.{key}={size} is not divisible by config.train.grad_accum_steps='
          f'{steps}: each step splits its batch into {steps} micro-batches of equal size. Use '
          f'a {key} that is a multiple of {steps}'
          + (f', or grad_accum_steps that divides {size} (e.g. '
             f'{", ".join(map(str, divisors))})' if divisors else '') + '.')


def validate_runtime(config, tokenizer_vocab_size: int, batch_divisor: int) -> None:
  """Checks that need the tokenizer and the mesh; still before compilation.

  batch_divisor: devices the batch is split over (data x fsdp mesh axes).
  """
  if config.model.vocab_size < tokenizer_vocab_size:
    raise ConfigError(
        f'config.model.vocab_size={config.model.vocab_size} is smaller than the tokenizer\'s '
        f'vocabulary ({tokenizer_vocab_size} tokens); set it to at least '
        f'{tokenizer_vocab_size} (a multiple of 128 is fastest).')
  _checks().check_gpu_kernels(config)
  xla_options.check_with_xla(config)
  check_batch_divides(config, trained_batch_keys(config), batch_divisor)
  batch_warmup.check_devices(config, batch_divisor)


def check_batch_divides(config, keys, batch_divisor: int) -> None:
  """Each trained batch (config.train's `keys`), or each of its micro-batches, splits evenly
  over the batch_divisor devices (data x fsdp mesh axes)."""
  steps = config.train.grad_accum_steps
  for key in keys:
    size = config.train[key]
    if steps == 1 and size % batch_divisor:
      raise ConfigError(
          f'config.train.{key}={size} is not divisible by the {batch_divisor} '
          f'devices the batch is split over (mesh data x fsdp); use a multiple of '
          f'{batch_divisor}.')
    if steps > 1 and (size // steps) % batch_divisor:
      raise ConfigError(
          f'config.train.{key}={size} in config.train.grad_accum_steps={steps} micro-batches '
          f'gives {size // steps} rows per micro-batch, not divisible by the {batch_divisor} '
          f'devices each micro-batch is split over (mesh data x fsdp); use a {key} that is a '
          f'multiple of {steps * batch_divisor} ({steps} x {batch_divisor}), or fewer '
          'micro-batches.')


# Fine-tuning: choices beyond the model's and the task kinds' (tasks.choices).
FINETUNE_CHOICES = {
    # '': the source's kind (init_from.adopt_source sets it before the second validation).
    'data.tokenizer': ('', 'wordpiece', 'bpe', 'sentencepiece', 'sentencepiece_fairseq'),
}


def validate_finetune(config) -> None:
  """Static checks of a fine-tuning config (the keys of its task kind's config file, e.g.
  configs/squad.py); ConfigError on the first problem, before any file is read or anything
  compiles."""
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  flat = flatten(config)
  reference = tasks.config_file(config.get('task', {}).get('kind', ''))
  _check_known_keys(flat, cli.load_config_spec(reference), reference)
  _check_ranges(flat, {**VALID_CHOICES, **FINETUNE_CHOICES, **tasks.choices(),
                       'task.kind': tuple(tasks.available())}, tasks.ranges())
  _check_names(config)
  # Pretraining-only model switches: fine-tuning builds the encoder without them (the fields so
  # marked, models/architecture.py).
  for key, off in architecture.pretraining_only_defaults().items():
    if config.model.get(key, off) != off:
      raise ConfigError(f'config.model.{key}={config.model.get(key)!r}: it shapes pretraining '
                        f'only, and fine-tuning from its workdir builds the encoder without it; '
                        f'set {off!r}.')
  shared_layers = config.train.layerwise_lr_decay and _family(config).shared_layers
  if shared_layers:
    raise ConfigError(f'config.train.layerwise_lr_decay={config.train.layerwise_lr_decay} '
                      + shared_layers)
  encoder.check_shape(config.model)
  _checks().check_model(config.model, [config.data.max_seq_length])
  if config.data.max_seq_length > config.model.max_position_embeddings:
    raise ConfigError(
        f'config.data.max_seq_length={config.data.max_seq_length} exceeds '
        f'config.model.max_position_embeddings={config.model.max_position_embeddings}.')
  _check_accumulation(config, ['batch_size'])
  tasks.check(config)
  _check_sources(config)


def validate_runtime_finetune(config, tokenizer_vocab_size: int) -> None:
  """Checks that need the tokenizer; still before compilation."""
  _checks().check_gpu_kernels(config)
  if config.model.vocab_size < tokenizer_vocab_size:
    raise ConfigError(
        f'config.model.vocab_size={config.model.vocab_size} is smaller than the vocab of '
        f'config.data.vocab_file ({tokenizer_vocab_size} tokens); they must belong together.')

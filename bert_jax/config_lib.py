"""Config checks that run before anything compiles; each error names key, value and what is valid."""

import math
import os
import re

from bert_jax import models
from bert_jax.core import schema
from bert_jax.core.errors import ConfigError  # Re-exported: config_lib.ConfigError.
# Re-exported: the ranges' names, as config_lib.POSITIVE etc.
from bert_jax.core.schema import (  # noqa: F401  pylint: disable=unused-import
    ANY_SIGN, BELOW_ONE, INIT_SEED, MESH_AXIS, NON_NEGATIVE, OPEN_SHARE, POSITIVE, PROBABILITY,
    SEED, Range, flatten)
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
    'train.optimizer': ('adamw', 'lamb'),
    'train.adam_mu_dtype': ('float32', 'bfloat16'),
    'distill.teacher_model.gelu': ('erf', 'tanh'),
}


# Every numeric key of configs/base.py and configs/finetune.py (and the task configs that start
# from it) and its valid values. A key missing here fails tests/test_config.py.
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
    'train.phase2_batch_size': NON_NEGATIVE, 'train.learning_rate': POSITIVE,
    'train.warmup_steps': NON_NEGATIVE, 'train.weight_decay': NON_NEGATIVE,
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
    'task.max_train_examples': NON_NEGATIVE, 'task.split_dev_fraction': BELOW_ONE,
    'task.doc_stride': POSITIVE, 'task.max_query_length': POSITIVE, 'task.n_best_size': POSITIVE,
    'task.max_answer_length': POSITIVE, 'task.null_score_diff_threshold': ANY_SIGN,
    'task.feature_layers': NON_NEGATIVE, 'task.feature_lstm_units': POSITIVE,
    'task.feature_lstm_layers': POSITIVE, 'task.lstm_layers': NON_NEGATIVE,
    'task.lstm_units': POSITIVE,
    # Distillation.
    'distill.temperature': POSITIVE, 'distill.alpha_ce': NON_NEGATIVE,
    'distill.alpha_mlm': NON_NEGATIVE, 'distill.alpha_cos': NON_NEGATIVE,
    'distill.teacher_model.vocab_size': POSITIVE, 'distill.teacher_model.hidden_size': POSITIVE,
    'distill.teacher_model.embedding_size': NON_NEGATIVE,
    'distill.teacher_model.num_layers': POSITIVE, 'distill.teacher_model.num_heads': POSITIVE,
    'distill.teacher_model.intermediate_size': POSITIVE,
    'distill.teacher_model.max_position_embeddings': POSITIVE,
    'distill.teacher_model.type_vocab_size': POSITIVE,
    'distill.teacher_model.layer_norm_eps': POSITIVE,
    # The family units' own keys (models/<family>/config.py).
    **architecture.unit_ranges(),
}


# Keys that no longer exist, and what replaced them.
RENAMED = {'data.nsp': "now config.objectives: 'mlm,nsp' for NSP, 'mlm' without"}


def validate(config) -> None:
  """Static checks of a pretraining config; raises ConfigError on the first problem found."""
  flat = flatten(config)
  _check_known_keys(flat, base.get_config(), 'configs/base.py')
  _check_ranges(flat, VALID_CHOICES)
  _check_schedule(config.train)
  _check_names(config)
  _check_accumulation(config)
  _objectives().check(config)
  encoder.check_shape(config.model)
  _check_families(config)
  _checks().check_model(config.model, row_lengths(config))
  _check_languages(config)
  _check_data(config)
  _check_sources(config)
  xla_options(config)


def xla_options(config) -> dict:
  """config.train.xla_options ('name=value,...') as jit's compiler_options; checks the form.

  Whether XLA knows each name and value is checked by check_xla_options, once JAX runs.
  """
  text = config.train.get('xla_options', '')
  if not isinstance(text, str):
    raise ConfigError(f'config.train.xla_options={text!r} must be a string of name=value items, '
                      "e.g. 'xla_gpu_enable_triton_gemm=false'.")
  options = {}
  # A comma starts a new item only before an option name: values may hold commas themselves
  # (xla_gpu_enable_command_buffer=FUSION,CUBLAS).
  for item in filter(None, (part.strip() for part in re.split(r',(?=\s*-*xla_)', text))):
    name, sep, value = item.partition('=')
    name, value = name.strip().lstrip('-'), value.strip()
    if not sep or not re.fullmatch(r'xla_[a-z0-9_]+', name):
      raise ConfigError(
          f'config.train.xla_options={text!r}: {item!r} is not name=value with an XLA debug '
          "option's name (xla_...), e.g. 'xla_gpu_enable_triton_gemm=false'.")
    if name in options:
      raise ConfigError(f'config.train.xla_options={text!r} sets {name} twice.')
    options[name] = _option_value(value)
  return options


def _option_value(text: str):
  """'false' -> False, '2' -> 2, else the text: XLA takes typed values for typed options."""
  if text.lower() in ('true', 'false'):
    return text.lower() == 'true'
  try:
    return int(text)
  except ValueError:
    return text


def check_xla_options(config) -> None:
  """Compiles a one-op function with config.train.xla_options, so that a name or value XLA does
  not know fails here, naming the key, rather than in the train step's compile."""
  options = xla_options(config)
  if not options:
    return
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  try:
    jax.jit(lambda x: x + 1, compiler_options=options).lower(jnp.zeros(())).compile()
  except Exception as e:  # XLA's error names the option: pylint: disable=broad-except
    raise ConfigError(f'config.train.xla_options={config.train.xla_options!r}: XLA refused it: '
                      f'{str(e).splitlines()[0]}') from e


def write_config(config, workdir: str) -> None:
  """workdir/config.json: the run's whole config, replaced whole (a kill or a full disk leaves
  the old file, never a cut one)."""
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  files.write_text(os.path.join(workdir, 'config.json'),
                   config.to_json_best_effort(indent=2, sort_keys=True) + '\n')


def validate_and_adopt_source(config, validate_fn) -> None:
  """validate_fn(config); then, with config.init_from, the source's shape and vocab are adopted
  and the result validated again. A run whose objective reads a teacher (distill) first adopts
  the teacher's: the student is checked against it (interop/sources.py)."""
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


def _check_ranges(flat, choices) -> None:
  """Choices, then RANGES (and those of a family unit registered since), of the flattened
  config's keys; every number must be finite."""
  schema.check_ranges(flat, choices, {**RANGES, **architecture.unit_ranges()})


def _check_schedule(train) -> None:
  """The warmup fits in the run: past num_steps the learning rate would never reach its peak."""
  if train.warmup_steps > train.num_steps:
    raise ConfigError(
        f'config.train.warmup_steps={train.warmup_steps} exceeds config.train.num_steps='
        f'{train.num_steps}: the learning rate would never reach config.train.learning_rate='
        f'{train.learning_rate}; set warmup_steps to at most {train.num_steps} (the config '
        'argument steps=N scales the warmup with the steps).')


def _check_known_keys(flat, reference, reference_file) -> None:
  schema.check_known_keys(flat, reference, reference_file, RENAMED)


def row_lengths(config) -> list[int]:
  """The row lengths a run's model sees: data.max_seq_length, and phase 2's when it has one."""
  lengths = [config.data.max_seq_length]
  if config.get('train', {}).get('phase2_fraction', 0):
    lengths.append(config.data.phase2_max_seq_length)
  return lengths


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


def _checks():
  # The kernel settings' checks live beside their dispatch (bert_jax/ops); they import this
  # module's ConfigError.
  from bert_jax.ops import checks  # pylint: disable=g-import-not-at-top
  return checks


def _check_families(config) -> None:
  """Each family unit's check of its own keys, and of the shared keys it owns
  (architecture.KEY_UNITS)."""
  architecture.check_units(config, _objectives().parse(config.objectives))


def _check_languages(config) -> None:
  """The cross-lingual data keys, checked beside their reader (data/crosslingual.py); language
  embeddings are XLM's unit's (models/xlm/config.py)."""
  from bert_jax.data import crosslingual  # pylint: disable=g-import-not-at-top
  crosslingual.check_config(config)


def _check_data(config) -> None:
  data = config.data
  if data.max_seq_length > config.model.max_position_embeddings:
    raise ConfigError(
        f'config.data.max_seq_length={data.max_seq_length} exceeds '
        f'config.model.max_position_embeddings={config.model.max_position_embeddings}.')
  run_objectives = _objectives().resolve(config)
  if run_objectives.masks_inputs:  # Otherwise the rows are unmasked: unused values.
    _check_masking(config)
  minimum = 3 if run_objectives.sentence_pairs else 2
  if data.max_seq_length < minimum + 2:
    raise ConfigError(f'config.data.max_seq_length={data.max_seq_length} leaves no room for '
                      f'text; use at least {minimum + 2}.')
  if data.prepared:
    from bert_jax.core import files  # pylint: disable=g-import-not-at-top
    if files.is_url(data.prepared):
      # Grain and ArrayRecord read local files by random access, shard by shard.
      raise ConfigError(f'config.data.prepared={data.prepared!r}: a prepared corpus is read from '
                        'a local path; mount the bucket with gcsfuse (launch_tpu.sh setup '
                        '--gcs-bucket=BUCKET mounts it at /mnt/gcs/BUCKET) and give the mounted '
                        'path, or copy the corpus to each host\'s disk.')
    if not os.path.isdir(os.path.expanduser(data.prepared)):
      raise ConfigError(f'config.data.prepared={data.prepared!r} is not a directory; prepare one '
                        'with `python -m bert_jax.data.prepare --config=... --output=DIR`.')
    if config.train.phase2_fraction:
      _check_phase2(config)
  elif not data.corpus and not data.get('parallel'):
    raise ConfigError("config.data.corpus is empty; give text files or globs (comma "
                      "separated, .xz/.gz ok), or 'builtin' for the built-in corpus (or a "
                      "prepared corpus in config.data.prepared).")
  else:
    if config.train.phase2_fraction:
      raise ConfigError(f'config.train.phase2_fraction={config.train.phase2_fraction} needs a '
                        'prepared corpus (config.data.prepared).')
    for key in ('packing', 'dupe_factor', 'workers', 'input_shards'):
      if data[key]:
        raise ConfigError(f'config.data.{key}={data[key]!r} needs a prepared corpus '
                          '(config.data.prepared); the in-memory reader of config.data.corpus '
                          'has no packing, static masking or workers.')


def trained_batch_keys(config) -> list[str]:
  """The config.train keys of the batch sizes a run trains with: batch_size, and
  phase2_batch_size when phase 2 has its own."""
  return ['batch_size'] + (['phase2_batch_size'] if config.train.phase2_fraction
                           and config.train.phase2_batch_size else [])


def _check_accumulation(config) -> None:
  """train.grad_accum_steps splits every trained batch into equal micro-batches (whether each
  objective gives the counts a micro-batch's loss divides by is objectives.check's)."""
  steps = config.train.grad_accum_steps
  if steps == 1:
    return
  for key in trained_batch_keys(config):
    size = config.train[key]
    if size % steps:
      divisors = [n for n in range(2, min(size, 64) + 1) if size % n == 0][:6]
      raise ConfigError(
          f'config.train.{key}={size} is not divisible by config.train.grad_accum_steps='
          f'{steps}: each step splits its batch into {steps} micro-batches of equal size. Use '
          f'a {key} that is a multiple of {steps}'
          + (f', or grad_accum_steps that divides {size} (e.g. '
             f'{", ".join(map(str, divisors))})' if divisors else '') + '.')


def _check_masking(config) -> None:
  """config.masking fits the data, for a run whose objectives mask inputs."""
  data, masking = config.data, config.masking
  if masking.rate == 0:
    raise ConfigError(
        f'config.masking.rate=0 masks no token: config.objectives={config.objectives!r} would '
        'have nothing to predict; use a rate in (0, 1] (the paper: 0.15).')
  fractions = (masking.mask_token_fraction, masking.random_token_fraction,
               masking.keep_fraction)
  if not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
    raise ConfigError(
        f'config.masking.mask_token_fraction + random_token_fraction + keep_fraction = '
        f'{fractions[0]} + {fractions[1]} + {fractions[2]} = {sum(fractions):.6g}; they must sum '
        'to 1.')
  _check_spans(config)
  needed = int(round(data.max_seq_length * masking.rate))
  if data.max_predictions_per_seq < needed:
    raise ConfigError(
        f'config.data.max_predictions_per_seq={data.max_predictions_per_seq} is too small for '
        f'config.masking.rate={masking.rate} x config.data.max_seq_length='
        f'{data.max_seq_length} = {needed} predictions; set it to at least {needed} (the '
        'config arguments mask_rate and seq raise it; masking would cap the predictions there '
        'and train at a lower rate).')


def _check_spans(config) -> None:
  """Span masking and n-gram masking exclude each other."""
  masking = config.masking
  if masking.spans and masking.max_ngram > 1:
    raise ConfigError(
        f'config.masking.spans={masking.spans!r} with config.masking.max_ngram='
        f'{masking.max_ngram}: span masking and n-gram masking are two ways of choosing the '
        "masked tokens; set masking.max_ngram=1 (spans) or masking.spans='' (n-grams).")


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
  check_xla_options(config)
  steps = config.train.grad_accum_steps
  for key in trained_batch_keys(config):
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


# Fine-tuning: choices and ranges beyond the model's (which validate_finetune checks as above).
FINETUNE_CHOICES = {
    'task.source': ('files', 'tfds'),
    'task.version': ('1.1', '2.0'),
    # '': the source's kind (init_from.adopt_source sets it before the second validation).
    'data.tokenizer': ('', 'wordpiece', 'bpe', 'sentencepiece', 'sentencepiece_fairseq'),
}


def validate_finetune(config) -> None:
  """Static checks of a fine-tuning config (configs/finetune.py's keys); ConfigError on the first
  problem, before any file is read or anything compiles."""
  from configs import finetune  # pylint: disable=g-import-not-at-top
  flat = flatten(config)
  _check_known_keys(flat, finetune.get_config(), 'configs/finetune.py')
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  _check_ranges(flat, {**VALID_CHOICES, **FINETUNE_CHOICES,
                       'task.kind': tuple(tasks.available())})
  _check_names(config)
  # Pretraining-only model switches: fine-tuning builds the encoder without them (the family
  # units' fields so marked, e.g. DeBERTa's mask decoder, whose table is dropped; rtd's sharing,
  # whose tables are materialised, when loading a workdir).
  switches = architecture.pretraining_only_defaults()
  for key, off in (*switches.items(), ('embedding_sharing', 'shared')):
    if config.model.get(key, off) != off:
      raise ConfigError(f'config.model.{key}={config.model.get(key)!r}: it shapes pretraining '
                        f'only, and fine-tuning from its workdir builds the encoder without it; '
                        f'set {off!r}.')
  if config.train.layerwise_lr_decay and config.model.get('name', 'bert') == 'albert':
    from bert_jax.models import albert  # pylint: disable=g-import-not-at-top
    raise ConfigError(f'config.train.layerwise_lr_decay={config.train.layerwise_lr_decay} '
                      + albert.SHARED_LAYERS_REFUSAL)
  encoder.check_shape(config.model)
  _checks().check_model(config.model, [config.data.max_seq_length])
  if config.data.max_seq_length > config.model.max_position_embeddings:
    raise ConfigError(
        f'config.data.max_seq_length={config.data.max_seq_length} exceeds '
        f'config.model.max_position_embeddings={config.model.max_position_embeddings}.')
  _check_task(config)
  _check_sources(config)


def _check_task(config) -> None:
  """What every kind shares, then the kind's own checks (its files exist, its settings fit
  together; bert_jax/tasks)."""
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  task = config.task
  if task.lstm_layers and task.feature_layers:
    raise ConfigError(f'config.task.lstm_layers={task.lstm_layers} with config.task.feature_layers='
                      f'{task.feature_layers}: the feature-based mode has its own BiLSTM '
                      '(config.task.feature_lstm_layers); set lstm_layers=0 for it, or '
                      'feature_layers=0 to fine-tune the encoder with a BiLSTM on top.')
  tasks.get(task.kind).check(config)


def validate_runtime_finetune(config, tokenizer_vocab_size: int) -> None:
  """Checks that need the tokenizer; still before compilation."""
  _checks().check_gpu_kernels(config)
  if config.model.vocab_size < tokenizer_vocab_size:
    raise ConfigError(
        f'config.model.vocab_size={config.model.vocab_size} is smaller than the vocab of '
        f'config.data.vocab_file ({tokenizer_vocab_size} tokens); they must belong together.')


def _check_phase2(config) -> None:
  data, seq = config.data, config.data.phase2_max_seq_length
  if seq > config.model.max_position_embeddings:
    raise ConfigError(f'config.data.phase2_max_seq_length={seq} exceeds '
                      f'config.model.max_position_embeddings='
                      f'{config.model.max_position_embeddings}.')
  needed = int(round(seq * config.masking.rate))
  if _objectives().resolve(config).masks_inputs and data.phase2_max_predictions_per_seq < needed:
    raise ConfigError(
        f'config.data.phase2_max_predictions_per_seq={data.phase2_max_predictions_per_seq} is '
        f'too small for config.masking.rate={config.masking.rate} x phase2_max_seq_length={seq} '
        f'= {needed} predictions; set it to at least {needed} (the config argument mask_rate '
        'raises it).')

"""The data and masking keys of a pretraining config, checked beside their readers (corpus,
prepare, masking): each error a ConfigError naming the key, its value and what is valid."""

import math
import os

from bert_jax import objectives
from bert_jax.core import files
from bert_jax.core.errors import ConfigError
from bert_jax.data import crosslingual
from bert_jax.data import mixture


def row_lengths(config) -> list[int]:
  """The row lengths a run's model sees: data.max_seq_length, and phase 2's when it has one."""
  lengths = [config.data.max_seq_length]
  if config.get('train', {}).get('phase2_fraction', 0):
    lengths.append(config.data.phase2_max_seq_length)
  return lengths


def check_pretraining(config) -> None:
  """A pretraining config's data and masking keys fit the model and each other: rows within the
  position table and long enough for text, masking that fits the rows (when an objective masks
  inputs), a prepared corpus that exists (phase 2 needs one), a corpus to read otherwise;
  first the cross-lingual keys, beside their reader (data/crosslingual.py)."""
  mixture.check_config(config)
  crosslingual.check_config(config)
  data = config.data
  if data.max_seq_length > config.model.max_position_embeddings:
    raise ConfigError(
        f'config.data.max_seq_length={data.max_seq_length} exceeds '
        f'config.model.max_position_embeddings={config.model.max_position_embeddings}.')
  run_objectives = objectives.resolve(config)
  if run_objectives.masks_inputs:  # Otherwise the rows are unmasked: unused values.
    _check_masking(config)
  minimum = 3 if run_objectives.sentence_pairs else 2
  if data.max_seq_length < minimum + 2:
    raise ConfigError(f'config.data.max_seq_length={data.max_seq_length} leaves no room for '
                      f'text; use at least {minimum + 2}.')
  if data.prepared:
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


def _check_phase2(config) -> None:
  data, seq = config.data, config.data.phase2_max_seq_length
  if seq > config.model.max_position_embeddings:
    raise ConfigError(f'config.data.phase2_max_seq_length={seq} exceeds '
                      f'config.model.max_position_embeddings='
                      f'{config.model.max_position_embeddings}.')
  needed = int(round(seq * config.masking.rate))
  if objectives.resolve(config).masks_inputs and data.phase2_max_predictions_per_seq < needed:
    raise ConfigError(
        f'config.data.phase2_max_predictions_per_seq={data.phase2_max_predictions_per_seq} is '
        f'too small for config.masking.rate={config.masking.rate} x phase2_max_seq_length={seq} '
        f'= {needed} predictions; set it to at least {needed} (the config argument mask_rate '
        'raises it).')

"""Pretraining: data, state, the step loop, evaluation, checkpoints and metrics."""

import atexit
import dataclasses
import functools
import json
import os
import shutil
import tempfile
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging

from bert_jax.core import checkpoint as checkpoint_lib
from bert_jax.train import guard
from bert_jax.train import health
from bert_jax import config_lib
from bert_jax.interop import init_from
from bert_jax.interop import teacher
from bert_jax.train import loop
from bert_jax.train import metrics as metrics_lib
from bert_jax.train import optim
from bert_jax import objectives
from bert_jax import plot
from bert_jax import sharding
from bert_jax.train import step as steps
from bert_jax.train import xla
from bert_jax.data import batch_warmup
from bert_jax.data import corpus as corpus_lib
from bert_jax.data import crosslingual
from bert_jax.data import identity
from bert_jax.data import mixture
from bert_jax.data import pipeline
from bert_jax.data import pretraining
from bert_jax.data import records
from bert_jax.data import streaming
from bert_jax.data import token_budget
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.core import files
from bert_jax.core import xla_options


NonFiniteLossError = guard.NonFiniteLossError
RunHealthError = health.RunHealthError

def prepare_data(config, workdir: str):
  """Corpus -> tokenizer -> (train stream, eval batches, tokenizer). Host-side, no compilation."""
  return prepare_run_data(config, workdir, objectives.resolve(config))


def prepare_run_data(config, workdir: str, run_objectives: objectives.ObjectiveSet):
  """prepare_data, with the config's objectives already resolved (a run's, once)."""
  if config.data.prepared:
    return prepare_run_streaming(config, True, run_objectives)
  languages = crosslingual.parse_languages(config.data.languages)
  try:
    if languages:
      text = crosslingual.read_corpus(config)
      documents = crosslingual.text_documents(text)
    else:
      documents = corpus_lib.read_corpus(config.data.corpus, config.data.corpus_format,
                                         config.data.max_documents)
  except (ValueError, OSError) as e:
    where = (f'config.data.corpus={config.data.corpus!r}, config.data.parallel='
             f'{config.data.parallel!r}' if languages else
             f'config.data.corpus={config.data.corpus!r}')
    raise config_lib.ConfigError(f'{where}: {e}') from e
  # The vocab an earlier run of this workdir kept there ('' when none).
  in_workdir = tokenizer_lib.kept_vocab(config.data.tokenizer, workdir)
  if jax.process_count() > 1 and not config.data.vocab_file and not in_workdir:
    # Each host would train its own vocab, and HF's trainer does not give identical ones.
    raise config_lib.ConfigError(
        f'config.data.vocab_file is empty in a run of {jax.process_count()} processes; give a '
        'vocab.txt every host reads (train one with a single-process run first).')
  # The workdir is only read here: a trained vocab is staged elsewhere and copied into the
  # workdir once the run has passed every check (keep_vocab).
  try:
    tokenizer = tokenizer_lib.load_or_train_tokenizer(
        config.data.vocab_file or in_workdir, documents,
        config.data.tokenizer_vocab_size, config.data.lowercase, _staging_dir(),
        config.data.tokenizer_cache_dir, config.data.tokenizer)
  except (ValueError, OSError) as e:
    raise config_lib.ConfigError(f'config.data.vocab_file={config.data.vocab_file!r}: {e}') from e
  if languages:
    encoded = crosslingual.encode(tokenizer, text)
    build = functools.partial(crosslingual.build_examples, alpha=config.data.language_alpha)
    eval_build = crosslingual.build_examples  # The held-out rows as the corpus has them.
  else:
    encoded = tokenizer_lib.encode_documents(tokenizer, documents)
    build = eval_build = pipeline.build_examples
  if len(encoded) < 2:
    raise config_lib.ConfigError(
        f'config.data.corpus={config.data.corpus!r} yields {len(encoded)} non-empty document(s)'
        f'{" and sentence pair(s)" if languages else ""}; pretraining needs at least 2 (one is '
        'held out for evaluation).')
  split = crosslingual.split if languages else pipeline.split_documents
  train_docs, eval_docs = split(encoded, config.data.eval_fraction, config.seed)
  settings = pretraining.MaskingSettings.from_config(config, tokenizer.special,
                                                     tokenizer.vocab_size,
                                                     tokenizer.is_continuation(), run_objectives)
  stream = pipeline.PretrainingStream(train_docs, settings,
                                      batch_warmup.stream_rows(config.train), config.seed, build)
  stream.data_sha256 = identity.digest(encoded)  # The whole corpus's ids, before the split.
  try:
    held_out = pipeline.eval_batches(eval_docs, eval_masking(settings, config),
                                     config.train.batch_size,
                                     config.train.eval_batches, config.seed, eval_build)
  except config_lib.ConfigError as e:
    if not languages:
      raise
    raise config_lib.ConfigError(
        f'{e} Each language holds out data.eval_fraction={config.data.eval_fraction} of its '
        f'documents (blank lines separate documents in a one-sentence-per-line file): held out '
        f'{crosslingual.describe(eval_docs, languages)}.') from None
  if languages:
    logging.info('Corpus: %s train, %s held out; vocab %d.',
                 crosslingual.describe(train_docs, languages),
                 crosslingual.describe(eval_docs, languages), tokenizer.vocab_size)
  else:
    logging.info('Corpus: %d documents (%d train, %d held out), %d sentences; vocab %d.',
                 len(encoded), len(train_docs), len(eval_docs),
                 sum(len(d) for d in encoded), tokenizer.vocab_size)
  return stream, held_out, tokenizer


# The paper's masking (section 3.1): what config.masking.eval='reference' scores the held-out
# set with.
REFERENCE_MASKING = {'mask_rate': 0.15, 'mask_token_fraction': 0.8, 'random_token_fraction': 0.1,
                     'is_continuation': None, 'max_ngram': 1, 'spans': ''}


def eval_masking(settings, config):
  """The held-out set's masking: the run's, or with masking.eval='reference' the paper's (a run
  that masks nothing, e.g. a left-to-right LM, keeps its unmasked rows)."""
  if config.masking.eval != 'reference' or not settings.mask_rate:
    return settings
  return dataclasses.replace(settings, **REFERENCE_MASKING)


def _staging_dir() -> str:
  """A temporary directory for files the run keeps in its workdir once it commits."""
  directory = tempfile.mkdtemp(prefix='bert_jax_')
  atexit.register(shutil.rmtree, directory, True)
  return directory


def keep_vocab(tokenizer, workdir: str) -> None:
  """workdir/vocab.txt (vocab.json + merges.txt, spiece.model): the vocab the run tokenizes
  with, for export and fine-tuning."""
  tokenizer_lib.keep(tokenizer, workdir)


def prepare_streaming(config, with_eval: bool = True):
  """A prepared corpus -> (this process's Grain train stream, eval batches or None, tokenizer)."""
  return prepare_run_streaming(config, with_eval, objectives.resolve(config))


def prepare_run_streaming(config, with_eval: bool, run_objectives: objectives.ObjectiveSet):
  """prepare_streaming, with the config's objectives already resolved (a run's, once)."""
  directory = os.path.expanduser(config.data.prepared)
  languages = crosslingual.parse_languages(config.data.languages)
  sources = mixture.parse(config.data.get('mixture', ''))
  try:
    # A cross-lingual corpus: a prepared corpus a language (DIR/{lang}), one vocab; a mixture a
    # prepared corpus a source (DIR/NAME).
    directories = (mixture.directories(directory, sources) if sources else
                   [os.path.join(directory, code)
                    for code in streaming.check_languages(directory, languages)] or [directory])
    metadatas = [records.read_metadata(d) for d in directories]
    # Without data.vocab_file, the vocab the corpus was prepared with.
    tokenizer = streaming.prepared_tokenizer(metadatas[0], directories[0], config)
    for d, metadata in zip(directories[1:], metadatas[1:]):
      streaming.check_prepared(metadata, d, tokenizer, config)
  except (ValueError, OSError) as e:
    raise config_lib.ConfigError(str(e)) from e
  stores = [streaming.DocumentStore(d, m) for d, m in zip(directories, metadatas)]
  splits = [streaming.split_ids(len(store), config.data.eval_fraction, config.seed)
            for store in stores]
  train_docs, eval_docs = (
      [streaming.SubsetDocuments(store, ids[part]) for store, ids in zip(stores, splits)]
      for part in (0, 1))
  if languages or sources:
    # Shares of tokens need each source's mean document length (metadata that lacks its token
    # count, from a hand-written corpus: shares of documents).
    lengths = ([m.num_tokens / max(m.num_documents, 1) for m in metadatas]
               if all(m.num_tokens for m in metadatas) else None)
    collection = streaming.LanguageDocuments if languages else streaming.SourceDocuments
    train_docs = collection(train_docs, lengths)
    eval_docs = collection(eval_docs, lengths)
  else:
    train_docs, eval_docs = train_docs[0], eval_docs[0]
  count, index = jax.process_count(), jax.process_index()
  settings = stream_settings(config, tokenizer, batch_warmup.stream_rows(config.train) // count,
                             run_objectives)
  try:
    stream = streaming.TrainStream(train_docs, settings, config.seed, config.data.workers, index,
                                   count, config.data.input_shards, config.data.language_alpha,
                                   mixture.shares(sources))
    for later in phases(config)[1:]:  # Found now, not when the phase starts.
      streaming.shard_block(stream.shards, index, count, later.config.train.batch_size // count)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from e
  stream.data_sha256 = identity.digest([identity.prepared_metadata(m) for m in metadatas])
  if not with_eval:
    return stream, None, tokenizer
  held_out = streaming.eval_batches(
      eval_docs,
      eval_masking(dataclasses.replace(settings, batch_size=config.train.batch_size), config),
      config.train.eval_batches, config.seed)
  parts = languages or [f'{s.name} {share:.0%} of the tokens'
                        for s, share in zip(sources, mixture.shares(sources))]
  logging.info('Prepared corpus %s%s: %d documents (%d train, %d held out), %d sentences, %d '
               'tokens; vocab %d; process %d of %d streams its share of the training '
               'documents%s.', directory, f' ({", ".join(parts)})' if parts else '',
               sum(map(len, stores)), len(train_docs), len(eval_docs),
               sum(m.num_sentences for m in metadatas), sum(m.num_tokens for m in metadatas),
               tokenizer.vocab_size, index + 1, count, ', packed' if config.data.packing else '')
  return stream, held_out, tokenizer


def stream_settings(config, tokenizer, rows_per_batch: int,
                    run_objectives: objectives.ObjectiveSet) -> streaming.StreamSettings:
  """The streaming pipeline's settings from the config and its objectives (objectives.resolve)."""
  return streaming.StreamSettings.from_config(
      config, tokenizer.special, tokenizer.vocab_size, tokenizer.is_continuation(),
      run_objectives,
      batch_size=rows_per_batch, packing=config.data.packing,
      max_pairs_per_row=config.data.max_pairs_per_row if config.data.packing else 1,
      dupe_factor=config.data.dupe_factor)


@dataclasses.dataclass(frozen=True)
class Phase:
  """A stretch of steps with one input shape (the paper: 90% at seq 128, 10% at 512)."""
  index: int  # 1 or 2.
  last_step: int  # Its last step (the first is the previous phase's last + 1).
  config: Any  # The run's config with this phase's seq length, predictions and batch size.


def phases(config) -> list[Phase]:
  """Phase 1, and phase 2 when config.train.phase2_fraction > 0."""
  num_steps = config.train.num_steps
  phase2_steps = token_budget.phase2_steps(config.train)
  if not phase2_steps:
    return [Phase(1, num_steps, config)]
  return [Phase(1, num_steps - phase2_steps, config),
          Phase(2, num_steps, config_lib.phase2_config(config))]


def train_and_evaluate(config, workdir: str) -> dict:
  """Pretrains per `config` in `workdir`, resuming from its newest checkpoint. Returns last eval.

  Nothing is written into the workdir before every check has passed, the resume's included
  (guard.claim); the workdir is locked for the run's life and SIGTERM handled throughout.
  """
  workdir = guard.check_workdir(workdir, 'pretrain')
  config_lib.validate_and_adopt_source(config, config_lib.validate)
  stop_on = health.parse_stop(config.train.stop_on_alarms)
  xla.apply_xla_flags(config)
  rules = sharding.logical_axis_rules(config.mesh.preset)
  run_objectives = objectives.resolve(config)  # Once: the model, optimizer and data read it.
  model = steps.build_model_from(config, run_objectives)
  tx = optim.create_optimizer(config.train, frozen=run_objectives.frozen_scopes)
  try:
    mesh = sharding.create_mesh(config.mesh)
    abstract_state = steps.check_state_divides(config, model, tx, mesh, rules)
  except sharding.MeshError as e:
    raise config_lib.ConfigError(str(e)) from e
  preemption = guard.Preemption()
  with preemption.handling(), guard.claim(workdir) as claim:
    run = preflight(config, workdir, model, tx, mesh, rules, abstract_state, run_objectives)
    claim.commit()  # Every check passed: from here on the run writes its files.
    with sharding.activation_rules(mesh, rules):
      return _train(config, workdir, run, model, tx, mesh, preemption, stop_on, run_objectives)


@dataclasses.dataclass
class Preflight:
  """A run as its checks leave it, nothing written yet: its data, the state it starts from
  (restored, or initialised from init_from or a distillation teacher) and where its data
  resumes."""
  stream: Any
  held_out: list
  tokenizer: Any
  checkpointer: checkpoint_lib.Checkpointer  # Restored from; saves the run's.
  state: Any
  state_shardings: Any
  position: dict  # The data position ({'epoch', 'batch'}, + 'stream', 'phase' on a resume).
  vocab_sha256: str  # The tokenizer's vocab digest, checked against a resumed checkpoint's.
  skipped: int  # Steps whose update was skipped for a non-finite loss or gradient, before.


def preflight(config, workdir, model, tx, mesh, rules, abstract_state,
              run_objectives: objectives.ObjectiveSet) -> Preflight:
  """The checks a run needs beyond its config's, in one place before the workdir is written
  (guard.claim's commit): room for a checkpoint, the data and tokenizer (a trained vocab is
  staged outside), the checks against them (validate_runtime), and a resume's against its
  checkpoint (vocab, input streams, data layout and digest)."""
  checkpoint_lib.check_writable(workdir, checkpoint_lib.state_bytes(abstract_state))
  stream, held_out, tokenizer = prepare_run_data(config, workdir, run_objectives)
  config_lib.validate_runtime(config, tokenizer.vocab_size, sharding.batch_divisor(mesh))
  logging.info('Mesh %s, preset %s; %s.', dict(mesh.shape), config.mesh.preset,
               describe_batch(config))
  logging.info('%s', describe_schedule(config))
  if batch_warmup.enabled(config.train):
    logging.info('%s', batch_warmup.describe(config.train, config.data.max_seq_length))
  _check_phase_models(config, tx, abstract_state, run_objectives)
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, 'checkpoints'),
                                             config.train.checkpoint_every,
                                             config.train.keep_checkpoints)
  with sharding.activation_rules(mesh, rules):
    state, state_shardings = steps.create_train_state(config, model, tx, mesh, rules)
    vocab_sha256 = tokenizer.vocab_hash()
    state, position, skipped = _starting_state(config, workdir, checkpointer, state,
                                               state_shardings, stream, tokenizer, vocab_sha256,
                                               run_objectives)
  return Preflight(stream, held_out, tokenizer, checkpointer, state, state_shardings, position,
                   vocab_sha256, skipped)


def describe_batch(config) -> str:
  """'batch 256', or with train.grad_accum_steps=4 'batch 256 (4 micro-batches of 64)': the
  sequences of an optimizer step, which throughput and MFU count."""
  rows, steps = config.train.batch_size, config.train.grad_accum_steps
  return f'batch {rows}' + (f' ({steps} micro-batches of {rows // steps})' if steps > 1 else '')


def describe_schedule(config) -> str:
  """'Schedule: 3000 steps (98.3M tokens), warmup 30 (1% of them) to a peak lr of 0.0005, then
  linear decay to 0.': what the run's optimizer does, said once at the start (the papers fix
  the warmup in steps; configs' `steps=N` keeps its share unless `warmup=` is given)."""
  train = config.train
  share = 100 * train.warmup_steps / max(train.num_steps, 1)
  then = 'then linear decay to 0'
  if train.schedule == 'wsd' and not train.decay_steps:
    then = 'held to the end (no decay: decay_steps=0; a decay branches from a checkpoint)'
  elif train.schedule == 'wsd':
    then = (f'held to step {train.num_steps - train.decay_steps}, then {train.decay_shape} decay '
            f'to 0 over the last {train.decay_steps} steps')
  tokens = token_budget.readable(token_budget.tokens_through(config, train.num_steps))
  return (f'Schedule: {train.num_steps} steps ({tokens} tokens), warmup {train.warmup_steps} '
          f'({share:.3g}% of them) to a peak lr of {train.learning_rate:g}, {then}.')


# What decides which examples make each batch: a resume with another value would repeat or skip
# examples, so it is refused (num_steps may change: a longer run continues the same stream).
DATA_LAYOUT_KEYS = (
    'seed', 'objectives', 'train.batch_size', 'train.phase2_batch_size',
    'train.phase2_fraction', 'data.max_seq_length', 'data.max_predictions_per_seq',
    'data.phase2_max_seq_length', 'data.phase2_max_predictions_per_seq', 'data.short_seq_prob',
    'data.eval_fraction', 'data.max_documents', 'data.packing', 'data.max_pairs_per_row',
    'data.dupe_factor', 'masking.rate', 'masking.mask_token_fraction',
    'masking.random_token_fraction', 'masking.keep_fraction', 'masking.whole_word',
    'masking.max_ngram', 'data.rows', 'data.tokenizer', 'masking.spans', 'masking.span_p',
    'masking.max_span', 'data.languages', 'data.language_alpha', 'train.batch_warmup_rows',
    'train.batch_warmup_tokens', 'data.mixture')
# Layout keys added after checkpoints were written without them: such a checkpoint's batches
# were made with these values.
LAYOUT_DEFAULTS = {'masking.max_ngram': 1, 'data.rows': 'segments', 'data.tokenizer': 'wordpiece',
                   'masking.spans': '', 'masking.span_p': 0.2, 'masking.max_span': 10,
                   'data.languages': '', 'data.language_alpha': 1.0,
                   'train.batch_warmup_rows': 0, 'train.batch_warmup_tokens': 0,
                   'data.mixture': ''}


def _check_layout(saved: dict, config, step: int, workdir: str) -> None:
  """A resume reads the saved data position with the batches of the config that saved it."""
  layout = saved.get('layout')
  if layout is not None:
    layout = {**LAYOUT_DEFAULTS, **layout}
  changed = guard.layout_changes(layout, guard.data_layout(config, DATA_LAYOUT_KEYS))
  if changed:
    raise config_lib.ConfigError(
        f'The checkpoint at step {step} in {workdir} was written with another data layout: '
        + '; '.join(changed) + '. Its data position counts batches of that layout, so this '
        'run would repeat or skip examples. Resume with the saved values (config.json), or '
        'start a new --workdir.')


# The settings that name a run's data (informative: the data's digest decides; data/identity.py).
DATA_SOURCE_KEYS = ('data.corpus', 'data.corpus_format', 'data.lowercase', 'data.prepared',
                    'data.tokenizer', 'data.languages', 'data.parallel', 'data.mixture')


def _check_data(saved: dict, data_sha256: str, config, step: int, workdir: str) -> None:
  """A resume reads the saved data position in the data that the checkpoint was trained on."""
  saved_hash = saved.get('data_sha256')
  if not saved_hash or not data_sha256 or saved_hash == data_sha256:
    return  # Checkpoints written before the digest was saved are not compared.
  now = guard.data_layout(config, DATA_SOURCE_KEYS)
  changed = guard.layout_changes(saved.get('data_source'), now)  # [] when none was saved.
  what = '; '.join(changed) or (
      'the same settings (' + ', '.join(f'config.{k}={v!r}' for k, v in now.items()
                                        if v not in ('', None))
      + ') now read other data: a corpus file changed on disk')
  raise config_lib.ConfigError(
      f'The checkpoint at step {step} in {workdir} was trained on other data (its token ids\' '
      f'sha256 {saved_hash[:12]}, this run\'s {data_sha256[:12]}): {what}. Its data position '
      'counts batches of that data, so this run would continue from a position that means '
      'other examples, and its held-out curve would change mid-run. Resume with the data it '
      'was trained on (config.json), or start a new --workdir.')


def _check_vocab(saved: dict, tokenizer, vocab_sha256: str, step: int, workdir: str) -> None:
  """The vocab a checkpoint was trained with must be the one this run tokenizes with."""
  saved_hash = saved.get('vocab_sha256')
  if saved_hash and saved_hash != vocab_sha256:
    raise config_lib.ConfigError(
        f'The checkpoint at step {step} in {workdir} was trained with the vocab of sha256 '
        f'{saved_hash[:12]} ({saved.get("vocab_file", "?")}), but this run tokenizes with '
        f'{tokenizer.vocab_file} (sha256 {vocab_sha256[:12]}); its token ids would '
        'mean other words. Pass the original config.data.vocab_file, or another --workdir.')


def _check_phase_models(config, tx, abstract_state, run_objectives) -> None:
  """Phase 2's model (train.phase2_model) has phase 1's parameters, shape for shape: the phase
  continues the same weights. Shapes only; nothing compiles."""
  if not config_lib.phase2_model(config):
    return
  shapes = lambda tree: jax.tree.map(lambda x: (x.shape, str(x.dtype)), tree)  # noqa: E731
  first = jax.tree_util.tree_flatten_with_path(shapes(abstract_state.params))[0]
  for phase in phases(config)[1:]:
    boxed = steps.abstract_train_state(
        phase.config, steps.build_model_from(phase.config, run_objectives), tx)
    later = jax.tree_util.tree_flatten_with_path(shapes(nn.meta.unbox(boxed).params))[0]
    if later != first:
      differs = next((jax.tree_util.keystr(a[0]) for a, b in zip(first, later) if a != b),
                     'the parameter tree')
      raise config_lib.ConfigError(
          f'config.train.phase2_model={config.train.phase2_model!r} changes {differs} of the '
          'model\'s parameters; phase 2 continues phase 1\'s weights, so it may change only '
          'settings that shape none (rotary thetas, local windows).')


def _starting_state(config, workdir, checkpointer, state, state_shardings, stream, tokenizer,
                    vocab_sha256: str,
                    run_objectives: objectives.ObjectiveSet) -> tuple[Any, dict, int]:
  """(state, data position, skipped steps) a run starts from: its newest checkpoint's, checked
  against this run's vocab, streams, layout and data; else init_from's or a teacher's weights."""
  position = {'epoch': 0, 'batch': 0}
  restored = checkpointer.restore(checkpoint_lib.abstract_like(state, state_shardings))
  skipped = 0  # Steps whose update was skipped for a non-finite loss or gradient.
  if restored is not None:
    state, saved = restored
    _check_vocab(saved, tokenizer, vocab_sha256, int(state.step), workdir)
    position = {'epoch': int(saved['epoch']), 'batch': int(saved['batch'])}
    if 'stream' in saved:
      position['stream'] = list(saved['stream'])
      shards = config.data.input_shards or jax.process_count()
      if len(position['stream']) != shards:
        raise config_lib.ConfigError(
            f'The checkpoint at step {int(state.step)} holds {len(position["stream"])} input '
            f'streams; this run makes {shards} (config.data.input_shards, 0: one per process). '
            f'Set --config.data.input_shards={len(position["stream"])} (any process count that '
            'divides it resumes the same batches), or start a new --workdir.')
      if int(saved.get('stream_workers', 0)) != config.data.workers:
        # Each worker streams its own slice of the documents: the order depends on their count.
        raise config_lib.ConfigError(
            f'The checkpoint at step {int(state.step)} was written with config.data.workers='
            f'{saved.get("stream_workers", 0)}; this run has {config.data.workers}, which would '
            'give another batch order. Resume with the same workers, or start a new --workdir.')
    _check_layout(saved, config, int(state.step), workdir)
    _check_data(saved, stream.data_sha256, config, int(state.step), workdir)
    skipped = int(saved.get('nonfinite_skips', 0))
    position['phase'] = int(saved.get('phase', 1))
    logging.info('Resumed from step %d (data epoch %d, batch %d).', int(state.step),
                 position['epoch'], position['batch'])
  elif config.init_from:
    with jax.set_mesh(None):  # Host-side conversion; its shape checks trace no sharded code.
      try:
        params = init_from.load_params(config, state.params)
      except init_from.InitFromError as e:
        raise config_lib.ConfigError(str(e)) from e
    state = state.replace(params=jax.device_put(params, state_shardings.params))
  elif teacher.TEACHER in run_objectives.frozen_scopes:
    # A distillation teacher and the student made from it.
    with jax.set_mesh(None):
      try:
        params = teacher.initial_params(config, state.params)
      except init_from.InitFromError as e:
        raise config_lib.ConfigError(str(e)) from e
    state = state.replace(params=jax.device_put(params, state_shardings.params))
  return state, position, skipped


def _train(config, workdir, run: Preflight, model, tx, mesh, preemption,
           stop_on: tuple[str, ...], run_objectives: objectives.ObjectiveSet) -> dict:
  """The step loop under the mesh and rules; see train_and_evaluate."""
  stream, held_out, tokenizer = run.stream, run.held_out, run.tokenizer
  state, state_shardings, position, skipped = (run.state, run.state_shardings, run.position,
                                               run.skipped)
  vocab_sha256 = run.vocab_sha256  # Saved with each checkpoint, checked on resume.
  batch_shardings = sharding.batch_sharding(mesh)
  checkpointer = run.checkpointer
  start_step = int(state.step)
  if jax.process_index() == 0:
    config_lib.write_config(config, workdir)
    keep_vocab(tokenizer, workdir)
  layout = guard.data_layout(config, DATA_LAYOUT_KEYS)
  data_source = guard.data_layout(config, DATA_SOURCE_KEYS)
  vocab_record = config.data.vocab_file or tokenizer_lib.vocab_path(config.data.tokenizer, workdir)
  run_phases = phases(config)

  def jitted_steps(phase_config, phase_model, which: str = ''):
    train_fn = steps.jit_pretraining_step(phase_config, phase_model, tx, state_shardings,
                                          batch_shardings,
                                          compiler_options=xla_options.parse(config))
    eval_fn = jax.jit(functools.partial(steps.eval_step, model=phase_model),
                      in_shardings=(state_shardings.params, batch_shardings))
    return (metrics_lib.announced(train_fn, f'the train step{which}'),
            metrics_lib.announced(eval_fn, f'the evaluation step{which}'))

  # Each phase's steps: phase 1's, unless train.phase2_model changes phase 2's model settings.
  phase_steps = {1: jitted_steps(config, model)}
  for later in run_phases[1:]:
    phase_steps[later.index] = (jitted_steps(
        later.config, steps.build_model_from(later.config, run_objectives),
        f' of phase {later.index}') if config_lib.phase2_model(config) else phase_steps[1])
  train_step = phase_steps[1][0]

  def eval_step(step, params, batch):
    """The evaluation of the model that trained up to `step` (its phase's)."""
    phase = next((p for p in run_phases if step <= p.last_step), run_phases[-1])
    return phase_steps[phase.index][1](params, batch)
  if isinstance(stream, pipeline.PretrainingStream):
    first_epoch = stream.epoch_examples(0)
    baseline = pipeline.baseline_accuracy(held_out, pipeline.most_frequent_label(first_epoch))
    if run_objectives.sentence_pairs:
      # The paper's pairing gives a one-sentence chunk a random B, so NotNext runs above 50%.
      label = 'swapped' if run_objectives.pair_kind == 'order' else 'NotNext'
      logging.info('Epoch 0: %d examples, %.1f%% %s.', len(first_epoch['input_ids']),
                   100 * float(np.mean(first_epoch['next_sentence_labels'])), label)
    to_global = sharding.global_batch  # Every process holds the whole global batch.
  else:
    # The streaming input has no epoch in memory: the guess comes from the held-out masks.
    merged = {k: np.concatenate([b[k] for b in held_out]) for k in held_out[0]}
    baseline = pipeline.baseline_accuracy(held_out, pipeline.most_frequent_label(merged))
    to_global = None  # Set per phase: each process holds only its rows.

  # What a model that learned nothing scores on the held-out set, beside every evaluation.
  unigram = health.unigram_loss(held_out, config.model.vocab_size)
  settings = loop.Settings(
      num_steps=config.train.num_steps, log_every=config.train.log_every,
      max_nonfinite_skips=config.train.max_nonfinite_skips,
      warmup_steps=config.train.warmup_steps,
      peak_flops=config.train.peak_flops or metrics_lib.measure_peak_flops(),
      schedule=optim.schedule_of(config.train),
      stop_on=stop_on,
      stop_on_setting=f'config.train.stop_on_alarms={config.train.stop_on_alarms!r}')

  def tokens_at(step: int) -> dict:
    """{'tokens': rows x seq length trained by steps 1..step}: a batch-size warmup's smaller
    batches and phase 2's rows counted, so runs of other schedules compare by tokens."""
    return {'tokens': token_budget.tokens_through(config, step)}

  def evaluate(step, state):
    totals = None
    for batch in held_out:
      stats = eval_step(step, state.params, sharding.global_batch(batch, batch_shardings))
      totals = stats if totals is None else jax.tree.map(np.add, totals, stats)
    values = steps.summarize(model, totals)
    if 'mlm_loss' in values:
      values['mlm_baseline_accuracy'] = baseline
    if unigram is not None and ('mlm_loss' in values or 'rtd_gen_loss' in values):
      values['unigram_loss'] = unigram
    if 'rtd_replaced_fraction' in values:
      values['rtd_disc_prior_loss'] = health.binary_entropy(values['rtd_replaced_fraction'])
    values.update(tokens_at(step))
    eval_history.append({**values, 'step': step})
    alarms = health.eval_alarms(eval_history, config.train.warmup_steps)
    if alarms:
      values['alarms'] = [a.name for a in alarms]
    writer.write(step, 'eval', values)
    parts = metrics_lib.objective_parts(values)
    parts = [p[:-1] + f'; most-frequent-token baseline {baseline:.3f})' if p.startswith('mlm ')
             else p for p in parts]
    logging.info('eval step %d | loss %.4f | %s', step, values['loss'], ' | '.join(parts))
    loop.raise_alarms(alarms, settings, writer, checkpointer)
    return values

  writer = metrics_lib.MetricWriter(workdir, start_step)
  # The evaluations before a resume count toward an alarm's two in a row.
  eval_history = _eval_records(workdir) if start_step else []
  num_steps = config.train.num_steps
  last_eval = {}
  if start_step == 0:
    last_eval = evaluate(0, state)
  elif start_step >= num_steps:
    logging.info('The checkpoint is at step %d of %d: nothing left to train.', start_step,
                 num_steps)
    # A run stopped between its last save and its final evaluation evaluates now.
    last_eval = metrics_lib.read_record(workdir, start_step, 'eval') or evaluate(start_step, state)

  phase = next((p for p in run_phases if start_step < p.last_step), run_phases[-1])

  def enter(phase, position):
    """The stretches of a phase from start_step on, its stream read from `position`: one, or
    with a batch-size warmup (phase 1) one per batch size, all reading the same batches."""
    phase_stream = stream if phase.index == 1 else prepare_run_streaming(
        phase.config, False, run_objectives)[0]
    if phase.index > 1:
      changes = config_lib.phase2_model(config)
      logging.info('Phase %d from step %d: seq %d, %d predictions, %s%s.', phase.index,
                   max(start_step, run_phases[phase.index - 2].last_step) + 1,
                   phase.config.data.max_seq_length,
                   phase.config.data.max_predictions_per_seq, describe_batch(phase.config),
                   ''.join(f', model.{k}={v}' for k, v in changes.items()))
    batches = phase_stream.batches(position)
    flops = metrics_lib.model_flops_per_sequence(phase.config)
    train = phase.config.train
    sizes = batch_warmup.stages(train, phase.config.data.max_seq_length)
    full = batch_warmup.Stage(phase.last_step, train.grad_accum_steps, train.batch_size)
    for size in [s for s in sizes if s.last_step > start_step] + [full]:
      if size is full:
        train_step = phase_steps[phase.index][0]
      else:  # A smaller batch: its own step, accumulating fewer micro-batches.
        smaller = ml_collections.ConfigDict(phase.config.to_dict())
        smaller.train.update(batch_size=size.rows, grad_accum_steps=size.micro_batches)
        train_step = jitted_steps(smaller, model, f' of {size.rows} rows')[0]
      make_global = to_global or functools.partial(sharding.global_batch_from_local,
                                                   global_rows=size.rows)
      yield loop.Stretch(
          size.last_step,
          # With a warmup the stream yields batches of its first size: a step reads several.
          batch_warmup.grouped(batches, size.rows // train.batch_warmup_rows) if sizes else batches,
          functools.partial(lambda batch, make: make(batch, batch_shardings), make=make_global),
          size.rows, flops, phase_stream, phase.index, train_step, continues=size is not full)

  def stretches():
    # A checkpoint saved at the last step of the phase before starts this phase afresh.
    yield from enter(phase, position if position.get('phase', 1) == phase.index
                     else {'epoch': 0, 'batch': 0})
    for later in run_phases[phase.index:]:
      yield from enter(later, {'epoch': 0, 'batch': 0})

  def saved_fields(step, stretch, position, skipped):
    del step
    stream_state = (stretch.source.checkpoint_state()
                    if hasattr(stretch.source, 'checkpoint_state') else {})
    return {**position, **stream_state, 'phase': stretch.phase, 'nonfinite_skips': skipped,
            'vocab_sha256': vocab_sha256, 'vocab_file': vocab_record, 'layout': layout,
            'data_sha256': stream.data_sha256, 'data_source': data_source}

  hooks = loop.Hooks(
      summarize=lambda stats, applied: steps.summarize(model, stats),
      evaluate=evaluate,
      evaluate_at=lambda step: step % config.train.eval_every == 0 or step == num_steps,
      saved_fields=saved_fields,
      step_fields=tokens_at,
      log_line=lambda step, values, eta: metrics_lib.log_train_line(step, num_steps, values,
                                                                    eta))
  with checkpoint_lib.closing(checkpointer):
    outcome = loop.run(state, train_step, stretches(), start_step=start_step, settings=settings, hooks=hooks,
                       checkpointer=checkpointer, writer=writer, preemption=preemption,
                       last_eval=last_eval, skipped=skipped)
  writer.close()
  last_eval = outcome.last_eval
  if outcome.stopped_at is not None:
    return last_eval
  if last_eval and jax.process_index() == 0:
    files.write_text(os.path.join(workdir, 'eval_results.json'), json.dumps(last_eval, indent=2))
  if jax.process_index() == 0:
    log_summary(workdir, last_eval)
    if config.train.get('plots', True):
      write_plots(workdir)
  return last_eval


def _eval_records(workdir: str) -> list[dict]:
  """metrics.jsonl's eval records (a resumed run's writer has kept those up to its step)."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not files.exists(path):
    return []
  with files.open(path, encoding='utf-8') as f:
    return [r for r in map(json.loads, f) if r['split'] == 'eval']


def log_summary(workdir: str, last_eval: dict) -> None:
  """One `Done.` line: how far each objective's eval loss fell since step 0, against what a model
  that learned nothing scores (the most frequent token, the unigram loss, the discriminator's
  prior)."""
  evals = _eval_records(workdir)
  if not evals or not last_eval:
    return
  first = evals[0]
  parts = []
  if 'mlm_loss' in last_eval and 'mlm_loss' in first:
    parts.append(
        f'Eval MLM loss {first["mlm_loss"]:.3f} -> {last_eval["mlm_loss"]:.3f} '
        f'({100 * (last_eval["mlm_loss"] / first["mlm_loss"] - 1):+.0f}%); MLM accuracy '
        f'{last_eval["mlm_accuracy"]:.3f} vs {last_eval["mlm_baseline_accuracy"]:.3f} for always '
        'predicting the most frequent masked token')
  if 'clm_loss' in last_eval and 'clm_loss' in first:
    parts.append(
        f'Eval next-token loss {first["clm_loss"]:.3f} -> {last_eval["clm_loss"]:.3f} '
        f'({100 * (last_eval["clm_loss"] / first["clm_loss"] - 1):+.0f}%), accuracy '
        f'{last_eval["clm_accuracy"]:.3f}')
  if 'rtd_disc_auc' in last_eval and 'rtd_disc_auc' in first:
    unigram = last_eval.get('unigram_loss')
    parts.append(
        f'Discriminator AUC {first["rtd_disc_auc"]:.3f} -> {last_eval["rtd_disc_auc"]:.3f} '
        f'(0.5: chance), its loss {last_eval["rtd_disc_loss"]:.3f} vs '
        f'{last_eval.get("rtd_disc_prior_loss", float("nan")):.3f} for the prior; generator MLM '
        f'loss {first["rtd_gen_loss"]:.3f} -> {last_eval["rtd_gen_loss"]:.3f}'
        + (f' (unigram {unigram:.3f})' if unigram is not None else ''))
  if parts:
    logging.info('Done. %s.', '; '.join(parts))


def write_plots(workdir: str) -> None:
  """WORKDIR/plots/curves.png of metrics.jsonl, its path logged. The run has finished: drawing
  never fails it, and without matplotlib the command that draws the plot later is logged. A
  gs:// workdir's curves are drawn from a local copy of metrics.jsonl, then uploaded."""
  out = os.path.join(workdir, 'plots')
  command = f'python -m bert_jax.plot {workdir} --out={out}'
  records = _train_records(workdir)
  if records is not None and records < 2:
    # One point is no curve; drawing costs seconds a short (test or smoke) run does not need.
    logging.info('No curves: %d train record(s) in metrics.jsonl; a curve needs two.', records)
    return
  try:
    if files.is_url(workdir):
      paths = _plot_remote(workdir, out)
    else:
      paths = plot.curves([workdir], out)
  except ImportError:
    logging.info('No plots: matplotlib is not installed. Install it and run: %s', command)
    return
  # A plot is a view of metrics.jsonl, which is written: a plotting bug costs the plot only.
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('Could not draw the curves (%s: %s); retry with: %s', type(e).__name__, e,
                    command)
    return
  logging.info('Curves: %s', paths[0])


def _plot_remote(workdir: str, out: str) -> list[str]:
  """plot.curves of a gs:// workdir: drawn in a local directory (named as the run, which labels
  the curves), uploaded to `out`."""
  with tempfile.TemporaryDirectory(prefix='bert_jax_') as staging:
    local = os.path.join(staging, os.path.basename(workdir))
    os.makedirs(local)
    with open(os.path.join(local, 'metrics.jsonl'), 'w', encoding='utf-8') as f:
      f.write(files.read_text(os.path.join(workdir, 'metrics.jsonl')))
    paths = []
    for path in plot.curves([local], os.path.join(local, 'plots')):
      paths.append(os.path.join(out, os.path.basename(path)))
      files.upload(path, paths[-1])
  return paths


def _train_records(workdir: str) -> int | None:
  """How many train records WORKDIR/metrics.jsonl holds; None when it cannot be read."""
  try:
    with files.open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
      return sum('"split": "train"' in line for line in f)
  except OSError:
    return None

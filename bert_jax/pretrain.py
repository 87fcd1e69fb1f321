"""Pretraining: data, state, the step loop, evaluation, checkpoints and metrics."""

import functools
import json
import os
import time

import jax
import numpy as np
from absl import logging

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import config_lib
from bert_jax import init_from
from bert_jax import metrics as metrics_lib
from bert_jax import optim
from bert_jax import sharding
from bert_jax import steps
from bert_jax.data import corpus as corpus_lib
from bert_jax.data import pipeline
from bert_jax.data import tokenizer as tokenizer_lib


class NonFiniteLossError(FloatingPointError):
  """The loss became NaN or inf."""


def prepare_data(config, workdir: str):
  """Corpus -> tokenizer -> (train stream, eval batches, tokenizer). Host-side, no compilation."""
  try:
    documents = corpus_lib.read_corpus(config.data.corpus, config.data.corpus_format,
                                       config.data.max_documents)
  except (ValueError, OSError) as e:
    raise config_lib.ConfigError(f'config.data.corpus={config.data.corpus!r}: {e}') from e
  if (jax.process_count() > 1 and not config.data.vocab_file
      and not os.path.isfile(os.path.join(workdir, 'vocab.txt'))):
    # Each host would train its own vocab, and HF's trainer does not give identical ones.
    raise config_lib.ConfigError(
        f'config.data.vocab_file is empty in a run of {jax.process_count()} processes; give a '
        'vocab.txt every host reads (train one with a single-process run first).')
  try:
    tokenizer = tokenizer_lib.load_or_train_tokenizer(
        config.data.vocab_file, documents, config.data.tokenizer_vocab_size,
        config.data.lowercase, workdir, config.data.tokenizer_cache_dir)
  except (ValueError, OSError) as e:
    raise config_lib.ConfigError(f'config.data.vocab_file={config.data.vocab_file!r}: {e}') from e
  encoded = tokenizer_lib.encode_documents(tokenizer, documents)
  if len(encoded) < 2:
    raise config_lib.ConfigError(
        f'config.data.corpus={config.data.corpus!r} yields {len(encoded)} non-empty document(s); '
        'pretraining needs at least 2 (one is held out for evaluation).')
  train_docs, eval_docs = pipeline.split_documents(encoded, config.data.eval_fraction,
                                                   config.seed)
  settings = pipeline.MaskingSettings.from_config(config, tokenizer.special,
                                                  tokenizer.vocab_size,
                                                  tokenizer.is_continuation())
  stream = pipeline.PretrainingStream(train_docs, settings, config.train.batch_size, config.seed)
  held_out = pipeline.eval_batches(eval_docs, settings, config.train.batch_size,
                                   config.train.eval_batches, config.seed)
  logging.info('Corpus: %d documents (%d train, %d held out), %d sentences; vocab %d.',
               len(encoded), len(train_docs), len(eval_docs),
               sum(len(d) for d in encoded), tokenizer.vocab_size)
  return stream, held_out, tokenizer


def write_config(config, workdir: str) -> None:
  with open(os.path.join(workdir, 'config.json'), 'w', encoding='utf-8') as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True) + '\n')


def train_and_evaluate(config, workdir: str) -> dict:
  """Pretrains per `config` in `workdir`, resuming from its newest checkpoint. Returns last eval."""
  if '://' in workdir:
    # Metrics and config are written with open(), so an object-store URL would become a local
    # directory named 'gs:'; refuse it instead of losing the run there.
    raise config_lib.ConfigError(
        f'--workdir={workdir!r}: URLs are not supported; mount the bucket (e.g. gcsfuse) and '
        'pass the mounted path.')
  config_lib.validate(config)
  if config.init_from:
    try:
      init_from.adopt_source(config)
    except init_from.InitFromError as e:
      raise config_lib.ConfigError(str(e)) from e
    config_lib.validate(config)
  rules = sharding.logical_axis_rules(config.mesh.preset)
  try:
    mesh = sharding.create_mesh(config.mesh)
    steps.check_state_divides(config, steps.build_model(config),
                              optim.create_optimizer(config.train), mesh, rules)
  except sharding.MeshError as e:
    raise config_lib.ConfigError(str(e)) from e
  os.makedirs(workdir, exist_ok=True)
  stream, held_out, tokenizer = prepare_data(config, workdir)
  config_lib.validate_runtime(config, tokenizer.vocab_size, sharding.batch_divisor(mesh))
  if jax.process_index() == 0:
    write_config(config, workdir)
  logging.info('Mesh %s, preset %s.', dict(mesh.shape), config.mesh.preset)
  with sharding.activation_rules(mesh, rules):
    return _train(config, workdir, stream, held_out, mesh, rules)


def _train(config, workdir, stream, held_out, mesh, rules) -> dict:
  """The step loop under the mesh and rules; see train_and_evaluate."""
  model = steps.build_model(config)
  tx = optim.create_optimizer(config.train)
  state, state_shardings = steps.create_train_state(config, model, tx, mesh, rules)
  batch_shardings = sharding.batch_sharding(mesh)

  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, 'checkpoints'),
                                             config.train.checkpoint_every,
                                             config.train.keep_checkpoints)
  position = {'epoch': 0, 'batch': 0}
  restored = checkpointer.restore(checkpoint_lib.abstract_like(state, state_shardings))
  if restored is not None:
    state, position = restored
    logging.info('Resumed from step %d (data epoch %d, batch %d).', int(state.step),
                 position['epoch'], position['batch'])
  elif config.init_from:
    with jax.set_mesh(None):  # Host-side conversion; its shape checks trace no sharded code.
      params = init_from.load_params(config, state.params)
    state = state.replace(params=jax.device_put(params, state_shardings.params))
  start_step = int(state.step)

  train_step = steps.jit_train_step(model, tx, state_shardings, batch_shardings)
  eval_step = jax.jit(functools.partial(steps.eval_step, model=model),
                      in_shardings=(state_shardings.params, batch_shardings))
  schedule = optim.learning_rate_schedule(config.train.learning_rate, config.train.warmup_steps,
                                          config.train.num_steps)
  first_epoch = stream.epoch_examples(0)
  baseline = pipeline.baseline_accuracy(held_out, pipeline.most_frequent_label(first_epoch))
  if config.data.nsp:
    # The paper's pairing gives a one-sentence chunk a random B, so NotNext runs above 50%.
    logging.info('Epoch 0: %d examples, %.1f%% NotNext.', len(first_epoch['input_ids']),
                 100 * float(np.mean(first_epoch['next_sentence_labels'])))

  def evaluate(step):
    totals = None
    for batch in held_out:
      stats = eval_step(state.params, sharding.global_batch(batch, batch_shardings))
      totals = stats if totals is None else jax.tree.map(np.add, totals, stats)
    values = steps.summarize(totals)
    values['mlm_baseline_accuracy'] = baseline
    writer.write(step, 'eval', values)
    logging.info('eval step %d | loss %.4f | mlm %.4f (acc %.3f; most-frequent-token baseline '
                 '%.3f)%s', step, values['loss'], values['mlm_loss'], values['mlm_accuracy'],
                 baseline, (f' | nsp {values["nsp_loss"]:.4f} (acc {values["nsp_accuracy"]:.3f})'
                            if 'nsp_loss' in values else ''))
    return values

  peak_flops = config.train.peak_flops or metrics_lib.measure_peak_flops()
  flops_per_seq = metrics_lib.model_flops_per_sequence(config)
  writer = metrics_lib.MetricWriter(workdir, start_step)
  num_steps = config.train.num_steps
  last_eval = {}
  if start_step == 0:
    last_eval = evaluate(0)
  elif start_step >= num_steps:
    logging.info('The checkpoint is at step %d of %d: nothing left to train.', start_step,
                 num_steps)

  batches = stream.batches(position)
  # Throughput counts train steps only: the first step's compilation, evals and saves are
  # excluded from the interval's time.
  accumulated, interval_steps, timed_steps = None, 0, 0
  interval_start, excluded = time.perf_counter(), 0.0
  for step in range(start_step + 1, num_steps + 1):
    batch, position = next(batches)
    step_start = time.perf_counter()
    state, stats = train_step(state, sharding.global_batch(batch, batch_shardings))
    if step == start_step + 1:
      jax.block_until_ready(stats)
      excluded += time.perf_counter() - step_start
    else:
      timed_steps += 1
    accumulated = stats if accumulated is None else jax.tree.map(
        lambda a, b: a + b, accumulated, stats)
    interval_steps += 1
    final = step == num_steps
    save = checkpointer.should_save(step, final)
    if step % config.train.log_every == 0 or final or save:
      stats = jax.device_get(accumulated)
      if stats['finite'] < interval_steps:
        raise NonFiniteLossError(
            f'The loss became NaN or inf between steps {step - interval_steps + 1} and {step}; '
            f'{checkpointer.describe_latest()}. Lower train.learning_rate or check the data.')
      elapsed = time.perf_counter() - interval_start - excluded
      seq_per_s = timed_steps * config.train.batch_size / elapsed if timed_steps else 0.0
      values = steps.summarize(stats)
      values.update(learning_rate=float(schedule(step - 1)),
                    grad_norm=float(stats['grad_norm']) / interval_steps,
                    seq_per_s=seq_per_s, mfu=seq_per_s * flops_per_seq / peak_flops)
      writer.write(step, 'train', values)
      eta = (num_steps - step) * config.train.batch_size / seq_per_s if seq_per_s else 0.0
      metrics_lib.log_train_line(step, num_steps, values, eta)
      accumulated, interval_steps, timed_steps = None, 0, 0
      interval_start, excluded = time.perf_counter(), 0.0
    pause_start = time.perf_counter()
    if step % config.train.eval_every == 0 or final:
      last_eval = evaluate(step)
    if save:
      checkpointer.save(step, state, position)
    excluded += time.perf_counter() - pause_start
  checkpointer.close()
  writer.close()
  if last_eval and jax.process_index() == 0:
    with open(os.path.join(workdir, 'eval_results.json'), 'w', encoding='utf-8') as f:
      json.dump(last_eval, f, indent=2)
  if jax.process_index() == 0:
    log_summary(workdir, last_eval)
  return last_eval


def log_summary(workdir: str, last_eval: dict) -> None:
  """One line: how far eval MLM loss fell and how accuracy compares with the baseline."""
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    evals = [r for r in map(json.loads, f) if r['split'] == 'eval']
  if not evals or not last_eval:
    return
  first = evals[0]['mlm_loss']
  logging.info('Done. Eval MLM loss %.3f -> %.3f (%+.0f%%); MLM accuracy %.3f vs %.3f for '
               'always predicting the most frequent masked token.', first,
               last_eval['mlm_loss'], 100 * (last_eval['mlm_loss'] / first - 1),
               last_eval['mlm_accuracy'], last_eval['mlm_baseline_accuracy'])

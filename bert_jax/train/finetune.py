"""Fine-tuning and evaluation: a task's features -> BERT + head -> the task's official metrics.

One command fine-tunes `config.seeds` seeds in turn (config.seed, config.seed + 1, ...) at each
learning rate of config.train.learning_rates (the paper's protocol, lr_grid.py), one rate after
another in this process; an empty grid is the one config.train.learning_rate. Seed s lives in
WORKDIR/seed_<s>/ (with a grid: WORKDIR/lr_<rate>/seed_<s>/) with its own checkpoints/ (orbax,
resumable), metrics.jsonl, results.json (its metrics and an eval per epoch) and predictions.
WORKDIR/results.json holds the selected rate's seeds (metrics per eval split and their median),
every rate's scores and convergence, and the task's majority-class baseline. A rerun of the same
command skips finished seeds and resumes an unfinished one. The machinery is pretraining's: the
same mesh and sharding presets, sharded state creation, checkpoints and metric writer.
"""

import dataclasses
import functools
import json
import os
import time

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from bert_jax.core import checkpoint as checkpoint_lib
from bert_jax.core import files
from bert_jax.core import schema
from bert_jax.train import guard
from bert_jax.train import loop
from bert_jax.train import lr_grid
from bert_jax import config_lib
from bert_jax.models import heads
from bert_jax.models import sharing
from bert_jax.interop import init_from
from bert_jax.interop import param_tree
from bert_jax.train import metrics as metrics_lib
from bert_jax import models
from bert_jax.train import optim
from bert_jax import sharding
from bert_jax.train import state as state_lib
from bert_jax.train import step as steps
from bert_jax.train import xla
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax import tasks
from bert_jax.tasks import base

INPUT_KEYS = ('input_ids', 'segment_ids', 'input_mask')
_SHUFFLE_STREAM = 5


def build_task(config) -> base.Task:
  """The task config.task names, with its files (its kind's builder, bert_jax/tasks)."""
  return tasks.get(config.task.kind).build(config)


def build_model(config, task: base.Task) -> heads.BertForFineTuning:
  t = config.task
  name = config.model.get('name', 'bert')
  return heads.BertForFineTuning(models.get(name).config_from(config), task.head,
                                 task.num_outputs, feature_layers=t.feature_layers,
                                 feature_lstm_units=t.feature_lstm_units,
                                 feature_lstm_layers=t.feature_lstm_layers,
                                 lstm_layers=t.lstm_layers, lstm_units=t.lstm_units, model=name)


def create_optimizer(train_config, num_steps: int, frozen_encoder: bool, num_layers: int = 0):
  """The paper's fine-tuning AdamW (optim.create_optimizer): warmup over a share of the steps,
  then linear decay to 0, with train.layerwise_lr_decay over the encoder's num_layers layers
  when set. Returns (optimizer, schedule)."""
  warmup = int(train_config.warmup_proportion * num_steps)
  tx = optim.create_optimizer(train_config, num_steps, warmup,
                              frozen=('bert',) if frozen_encoder else (), num_layers=num_layers)
  return tx, optim.learning_rate_schedule(train_config.learning_rate, warmup, num_steps)


def task_loss(head: str, outputs, batch, counts=None):
  """Mean loss of the head over the batch (token head: over labelled first pieces; multiple
  choice: the softmax over each example's choices). counts (task_counts of the whole batch): a
  micro-batch's sum divided by the whole batch's count, so that micro-batches add up to it."""
  ce = optax.softmax_cross_entropy_with_integer_labels
  if head == 'token':
    weights = batch['label_weights']  # [batch, length]
    total = counts['label_weights'] if counts else jnp.sum(weights)
    return jnp.sum(ce(outputs['logits'], batch['labels']) * weights) / jnp.maximum(total, 1.0)
  if head in ('classification', 'multiple_choice'):
    per_row = ce(outputs['logits'], batch['label'])
  elif head == 'regression':
    per_row = (outputs['logits'][:, 0] - batch['label']) ** 2
  else:  # Span: the mean of the start's and the end's cross-entropy.
    per_row = 0.5 * (ce(outputs['start_logits'], batch['start_positions'])
                     + ce(outputs['end_logits'], batch['end_positions']))
  return jnp.sum(per_row) / counts['rows'] if counts else jnp.mean(per_row)


def task_counts(head: str, batch) -> dict:
  """What task_loss divides a batch's sum by: its labelled pieces (token head) or rows."""
  if head == 'token':
    return {'label_weights': jnp.sum(batch['label_weights'])}
  return {'rows': jnp.float32(batch['input_ids'].shape[0])}


def _apply(model, params, batch, deterministic, rngs=None):
  return model.apply({'params': params}, *(batch[k] for k in INPUT_KEYS),
                     deterministic=deterministic, rngs=rngs)


def task_loss_fn(model):
  """loss_fn for step.train_step: the head's loss (no other stats)."""
  def loss_fn(params, batch, rngs, counts=None):
    return task_loss(model.head, _apply(model, params, batch, False, rngs), batch, counts), {}
  return loss_fn


def eval_step(params, batch, *, model):
  """The head's outputs on a batch, without dropout."""
  return _apply(model, params, batch, True)


def state_initializer(model, tx, max_seq_length: int):
  """init(rng) -> TrainState with logically annotated (boxed) parameters."""
  # Host numpy: nothing runs on a device.
  ids = np.zeros(heads.input_shape(model.head, model.num_outputs, 1, max_seq_length), np.int32)
  return state_lib.initializer(model, tx, ids, ids, ids)


def train_batches(features: dict, batch_size: int, seed: int, epoch: int):
  """Epoch `epoch`'s shuffled full batches (the remainder is dropped, as the original)."""
  order = np.random.default_rng([seed, _SHUFFLE_STREAM, epoch]).permutation(
      len(features['input_ids']))
  for start in range(0, len(order) - batch_size + 1, batch_size):
    rows = order[start:start + batch_size]
    yield {k: v[rows] for k, v in features.items()}


def padded_batches(features: dict, batch_size: int):
  """Every row once, in order; the last batch is padded with copies of row 0. Yields (batch, n)."""
  total = len(features['input_ids'])
  for start in range(0, total, batch_size):
    rows = np.arange(start, min(start + batch_size, total))
    count = len(rows)
    rows = np.concatenate([rows, np.zeros(batch_size - count, rows.dtype)])
    yield {k: v[rows] for k, v in features.items()}, count


class SeedRun:
  """Compiled steps for one task and shape, reused by every seed."""

  def __init__(self, config, task, model, tx, mesh, rules, encoder_params, head_params=None):
    self.config, self.task, self.model, self.tx = config, task, model, tx
    self.mesh, self.encoder_params = mesh, encoder_params
    self.head_params = head_params or {}  # Subtrees beside `bert` from init_from.
    init_boxed = state_initializer(model, tx, config.data.max_seq_length)
    self.state_shardings = state_lib.shardings(init_boxed, mesh, rules)
    self.abstract_state = nn.meta.unbox(state_lib.abstract(init_boxed))
    self._init = state_lib.jit_init(init_boxed, self.state_shardings)
    self.batch_shardings = sharding.batch_sharding(mesh)
    train_step = steps.jit_train_step(
        task_loss_fn(model), tx, self.state_shardings, self.batch_shardings,
        skip_nonfinite=config.train.max_nonfinite_skips > 0,
        grad_accum_steps=config.train.grad_accum_steps,
        counts_fn=functools.partial(task_counts, model.head))
    self.train_step = metrics_lib.announced(train_step, 'the fine-tuning step')
    predict_step = jax.jit(functools.partial(eval_step, model=model),
                           in_shardings=(self.state_shardings.params, self.batch_shardings))
    self.eval_step = metrics_lib.announced(predict_step, 'the evaluation step')

  @property
  def flops_per_seq(self) -> float:
    """Model FLOPs of one training row: the encoder's forward and backward (forward only when
    frozen, feature-based), each of a multiple-choice example's choices; the head's are few."""
    forward = models.get(self.config.model.get('name', 'bert')).flops(
        self.config.model, self.config.data.max_seq_length)
    passes = 1.0 if self.config.task.feature_layers else 3.0
    rows = self.task.num_outputs if self.task.head == 'multiple_choice' else 1
    return passes * forward * rows

  def fresh_state(self, seed: int):
    """A new state for `seed`; the encoder's weights from init_from when given."""
    state = self._init(jax.random.PRNGKey(seed))
    loaded = dict(self.head_params)
    if self.encoder_params is not None:
      loaded['bert'] = self.encoder_params
    if not loaded:
      return state
    params = dict(state.params)
    for name, subtree in loaded.items():
      params[name] = _overlay(params[name], subtree, self.state_shardings.params[name])
    return state.replace(params=params)

  def predict(self, params, split: base.EncodedSplit, batch_size: int) -> dict:
    """The head's outputs on every row of `split` (host numpy, padding rows dropped)."""
    inputs = {k: split.features[k] for k in INPUT_KEYS}
    parts = []
    for batch, count in padded_batches(inputs, batch_size):
      outputs = self.eval_step(params, sharding.global_batch(batch, self.batch_shardings))
      parts.append(jax.tree.map(lambda x, n=count: np.asarray(x)[:n], jax.device_get(outputs)))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def load_encoder_params(config, model):
  """The encoder (`bert/`) weights of config.init_from in this model's layout, or None."""
  return load_source_params(config, model)[0]


def load_source_params(config, model) -> tuple[dict | None, dict]:
  """(the encoder (`bert/`) weights of config.init_from in this model's layout, or None; the
  head's weights where the source is an HF <family>ForSequenceClassification (or a
  ForMultipleChoice with the same head keys, as BERT's) whose head fits this task, else {}).

  The encoder lacks `pooler` when the source has none (the masked-LM classes of BERT, RoBERTa,
  ALBERT): the model's fresh init fills it. RoBERTa's classification head brings the pooler (its
  dense).
  """
  if not config.init_from:
    return None, {}
  kind, path = init_from.parse(config.init_from)
  classifier = {}
  if kind == 'workdir':
    pretrain_params = init_from.workdir_params(path, init_from.parse_step(config.init_from))
    # A replaced-token-detection run under gradient-disentangled sharing: its discriminator's
    # own tables.
    pretrain_params = sharing.discriminator_tree(pretrain_params)
    # What served pretraining only (DeBERTa's mask decoder's position table) has no place in
    # the fine-tuning encoder.
    dropped = models.pretraining_only_paths(init_from.workdir_model(path))
    if dropped:
      pretrain_params = param_tree.unflatten(
          {k: v for k, v in param_tree.flatten(pretrain_params).items() if k not in dropped})
  else:
    # Converted through the pretraining layout with the masked-LM head alone, which every
    # family's head classes hold (BertForMaskedLM no NSP head): a head it lacks would be a
    # missing key, one it has beside is skipped. No head is used here.
    config = ml_collections.ConfigDict(config.to_dict())
    config.objectives = 'mlm'
    pretrain_params, classifier = init_from.import_for_finetuning(config)
  ids = jax.ShapeDtypeStruct(heads.input_shape(model.head, model.num_outputs, 1, 2), jnp.int32)
  target = jax.eval_shape(functools.partial(model.init, deterministic=True),
                          jax.random.PRNGKey(0), ids, ids, ids)['params']
  target = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nn.meta.unbox(target))
  encoder = jax.tree.map(np.asarray, pretrain_params['bert'])
  pooler = {k[len('bert/pooler/'):]: v for k, v in classifier.items()
            if k.startswith('bert/pooler/')}
  if pooler:
    encoder = {**encoder, 'pooler': traverse_util.unflatten_dict(pooler, sep='/')}
  encoder = init_from.match_layer_layout(encoder, target['bert'])  # Scanned or not, as this model.
  wanted = target['bert'] if 'pooler' in encoder else {
      k: v for k, v in target['bert'].items() if k != 'pooler'}
  init_from.check_same_structure(encoder, wanted, config.init_from)
  encoder = jax.tree.map(lambda x, t: x.astype(t.dtype), encoder, wanted)
  head_params = {}
  # The head's subtrees beside the encoder: `classifier`, and DistilBERT's `pre_classifier`.
  head = {k: v for k, v in classifier.items() if not k.startswith('bert/')}
  # A multiple-choice head is a one-output classifier on each choice's row.
  fits = (model.head in ('classification', 'regression', 'multiple_choice')
          and all(k.split('/')[0] in target and v.shape == target[k.split('/')[0]][
              k.split('/')[1]].shape for k, v in head.items()))
  if head and fits:
    logging.info('init_from %s: the classification head is loaded too.', config.init_from)
    for k, v in head.items():
      scope, leaf = k.split('/')
      head_params.setdefault(scope, {})[leaf] = v.astype(target[scope][leaf].dtype)
  elif head:
    logging.warning('init_from %s: its classification head (%s) does not fit this task\'s '
                    '%s head of %d output(s); the head starts fresh.', config.init_from,
                    {k: v.shape for k, v in head.items()}, model.head, model.num_outputs)
  return encoder, head_params


def _overlay(fresh, loaded, shardings):
  """`fresh` with every leaf `loaded` has replaced (put with its sharding); the rest kept."""
  if not isinstance(loaded, dict):
    return jax.device_put(loaded, shardings)
  return {k: _overlay(v, loaded[k], shardings[k]) if k in loaded else v
          for k, v in fresh.items()}


def run(config, workdir: str) -> dict:
  """Fine-tunes and evaluates per `config` in `workdir`; returns results.json's content ({} when
  stopped by SIGTERM: rerun the command to resume).

  Nothing is written into the workdir before every check has passed (guard.claim); the workdir
  is locked for the run's life and SIGTERM handled throughout.
  """
  workdir = guard.check_workdir(workdir, 'finetune')
  config_lib.validate_and_adopt_source(config, config_lib.validate_finetune)
  rates = lr_grid.rates(config.train)  # ConfigError on a bad grid, before any file is read.
  grid = bool(lr_grid.grid(config.train))
  xla.apply_xla_flags(config)
  tokenizer = load_tokenizer(config)
  config_lib.validate_runtime_finetune(config, tokenizer.vocab_size)
  task = build_task(config)
  seq = config.data.max_seq_length
  start = time.perf_counter()
  train = task.train_split(tokenizer, seq)
  evals = task.eval_splits(tokenizer, seq)
  test = task.test_split(tokenizer, seq) if hasattr(task, 'test_split') else None
  logging.info('%s: %d train rows (%d examples), eval %s; encoded in %.1fs.', task.name,
               train.num_rows, train.num_examples,
               {k: v.num_rows for k, v in evals.items()}, time.perf_counter() - start)
  batch_size = config.train.batch_size
  steps_per_epoch = train.num_rows // batch_size
  if steps_per_epoch == 0:
    raise config_lib.ConfigError(
        f'The training split has {train.num_rows} rows, fewer than config.train.batch_size='
        f'{batch_size}; use a smaller batch.')
  num_steps = max(1, int(round(steps_per_epoch * config.train.num_epochs)))
  try:
    mesh = sharding.create_mesh(config.mesh)
  except sharding.MeshError as e:
    raise config_lib.ConfigError(str(e)) from e
  divisor = sharding.batch_divisor(mesh)
  config_lib.check_batch_divides(config, ['batch_size'], divisor)
  if _eval_batch(config) % divisor:
    raise config_lib.ConfigError(
        f'config.train.eval_batch_size={_eval_batch(config)} is not divisible by the {divisor} '
        'devices the batch is split over (mesh data x fsdp).')
  model = build_model(config, task)
  # The rate is a constant of the optimizer's schedule: each rate has its own (and compiles
  # its own steps); all are built here so that a problem shows before anything is written.
  optimizers = {rate: create_optimizer(lr_grid.with_rate(config.train, rate), num_steps,
                                       config.task.feature_layers > 0, config.model.num_layers)
                for rate in rates}
  rules = sharding.logical_axis_rules(config.mesh.preset)
  settings = loop.Settings(
      num_steps=num_steps, log_every=config.train.log_every,
      max_nonfinite_skips=config.train.max_nonfinite_skips,
      warmup_steps=int(config.train.warmup_proportion * num_steps),
      peak_flops=config.train.peak_flops or metrics_lib.measure_peak_flops(),
      schedule=None)  # Each rate's.
  preemption = guard.Preemption()
  per_rate = {}
  check_seed_settings(config, workdir, rates, grid)
  with preemption.handling(), guard.claim(workdir) as claim:
    encoder_params, head_params = load_source_params(config, model)
    runner = SeedRun(config, task, model, optimizers[rates[0]][0], mesh, rules, encoder_params,
                     head_params)
    checkpoint_lib.check_writable(workdir, checkpoint_lib.state_bytes(runner.abstract_state))
    claim.commit()
    if jax.process_index() == 0:
      config_lib.write_config(config, workdir)
    for rate in rates:
      tx, schedule = optimizers[rate]
      if runner.tx is not tx:  # Built outside activation_rules, as the first.
        runner = SeedRun(config, task, model, tx, mesh, rules, encoder_params, head_params)
      rate_dir = os.path.join(workdir, lr_grid.directory(rate)) if grid else workdir
      per_rate[rate] = []
      with sharding.activation_rules(mesh, rules):  # The steps trace (and compile) in here.
        for offset in range(config.seeds):
          seed = config.seed + offset
          result = _run_seed(config, runner, train, evals, test, seed, steps_per_epoch,
                             dataclasses.replace(settings, schedule=schedule),
                             os.path.join(rate_dir, f'seed_{seed}'), preemption,
                             seed_settings(config, rate))
          if result is None:
            return {}
          per_rate[rate].append(result)
  split = lr_grid.selection_split(evals)
  protocol = lr_grid.summarize(per_rate, split, task.main_metric, grid)
  results = {**summarize_seeds(task, config, per_rate[protocol['learning_rate']], train,
                               num_steps),
             **protocol, 'baseline': task_baseline(task, train, evals),
             # What each score is over: a split cut to a few examples is not the paper's split.
             'eval_examples': {name: split.num_examples or split.num_rows
                               for name, split in evals.items()}}
  if jax.process_index() == 0:
    files.write_text(os.path.join(workdir, 'results.json'), json.dumps(results, indent=2))
    for rate, summary in results['by_rate'].items():
      change = summary['dev_loss_change']
      logging.info('%s %s at lr %s: %s median %.2f [%.2f-%.2f]; dev loss change over the last '
                   'epoch %s', task.name, split, rate, task.main_metric, summary['median'],
                   summary['min'], summary['max'], '-' if change is None else f'{change:+.4f}')
    for split_name, medians in results['median'].items():
      logging.info('%s %s at the selected lr %s, median of %d seed(s): %s', task.name,
                   split_name, lr_grid.label(results['learning_rate']), len(results['seeds']),
                   ', '.join(f'{k} {v:.2f}' for k, v in medians.items()))
    logging.info('Done. %s; results in %s.', done_summary(task, results),
                 os.path.join(workdir, 'results.json'))
  return results


def done_summary(task: base.Task, results: dict) -> str:
  """The run's end in a line: each eval split's main metric (median over seeds) beside what a
  model that ignores its input scores there, and the rate and seeds it is at."""
  baselines = (results.get('baseline') or {}).get('metrics') or {}
  parts = []
  for split, medians in results['median'].items():
    score = medians.get(task.main_metric)
    if score is None:  # An unlabelled split (GLUE test) has no metrics.
      continue
    part = f'{task.name} {split} {task.main_metric} {score:.2f}'
    baseline = (baselines.get(split) or {}).get(task.main_metric)
    if baseline is not None:
      part += f' (input-ignoring baseline {baseline:.2f})'
    parts.append(part)
  seeds = len(results['seeds'])
  return (', '.join(parts) + f': median of {seeds} seed{"s" if seeds > 1 else ""} at lr '
          f'{lr_grid.label(results["learning_rate"])}')


def task_baseline(task: base.Task, train: base.EncodedSplit, evals: dict) -> dict:
  """results.json's baseline: what a model that ignores its input scores on each eval split
  (tasks/base.Task.baseline), and what that model is; {} where the task defines none."""
  metrics = {name: task.baseline(train, split) for name, split in evals.items()}
  if any(m is None for m in metrics.values()):
    return {}
  return {'kind': task.baseline_kind, 'metrics': metrics}


def load_tokenizer(config):
  """config.data.tokenizer's tokenizer ('': WordPiece, when no init_from says otherwise) of
  config.data.vocab_file; ConfigError naming the file when it cannot be read."""
  kind = config.data.tokenizer or 'wordpiece'
  if not config.data.vocab_file:
    files = ' + '.join(tokenizer_lib.KEPT_FILES[kind])
    raise config_lib.ConfigError(
        f'config.data.vocab_file is empty and config.init_from gives no {files}: fine-tuning '
        f'needs the {kind} vocab the encoder was trained with.')
  try:
    return tokenizer_lib.load_tokenizer(kind, config.data.vocab_file, config.data.lowercase)
  except (OSError, ValueError) as e:
    raise config_lib.ConfigError(f'config.data.vocab_file={config.data.vocab_file!r} '
                                 f'(config.data.tokenizer={kind!r}): {e}') from e


def _eval_batch(config) -> int:
  return config.train.eval_batch_size or config.train.batch_size


# What decides a fine-tuning step's batch: a resume with another value would repeat or skip rows.
DATA_LAYOUT_KEYS = ('task.kind', 'task.name', 'task.max_train_examples', 'train.batch_size',
                    'data.max_seq_length')


# Keys of a fine-tuning config that change no seed's result (how often it logs, evaluates or
# saves, where compiled steps are cached, the rate grid, whose rate each seed records itself).
_BOOKKEEPING_KEYS = frozenset({
    'task.write_predictions', 'train.learning_rates', 'train.eval_batch_size', 'train.log_every',
    'train.eval_every_epoch', 'train.checkpoint_every', 'train.keep_checkpoints',
    'train.compilation_cache_dir', 'train.peak_flops'})
# Settings added after seeds were recorded without them: such a seed ran with these values.
SETTING_DEFAULTS = {'train.grad_accum_steps': 1, 'train.max_nonfinite_skips': 0,
                    'init_vocab_by_token': False}


SETTINGS_FILE = 'settings.json'  # In each seed's directory: what its files were run with.


def seed_settings(config, rate: float) -> dict:
  """{dotted key: value} of what decides a seed's result at learning rate `rate`: the source
  (init_from), the task, the data, the model and the training settings, bookkeeping aside."""
  flat = schema.flatten(config)
  flat['train.learning_rate'] = rate
  decides = lambda k: (k in ('init_from', 'init_resize_vocab', 'init_vocab_by_token')  # noqa: E731
                       or k.startswith(('task.', 'data.', 'model.', 'train.')))
  settings = {k: v for k, v in flat.items() if decides(k) and k not in _BOOKKEEPING_KEYS}
  return json.loads(json.dumps(settings))  # As read back from the file: lists, not tuples.


def check_seed_settings(config, workdir: str, rates, grid: bool) -> None:
  """ConfigError, before anything is written, when a seed directory this run would reuse (its
  results or checkpoints) was run with other settings, naming each key that differs; seeds
  from before the record are not compared."""
  for rate in rates:
    settings = seed_settings(config, rate)
    rate_dir = os.path.join(workdir, lr_grid.directory(rate)) if grid else workdir
    for seed in range(config.seed, config.seed + config.seeds):
      seed_dir = os.path.join(rate_dir, f'seed_{seed}')
      path = os.path.join(seed_dir, SETTINGS_FILE)
      if not files.isfile(path):
        continue
      try:
        saved = json.loads(files.read_text(path))
      except ValueError as e:
        raise config_lib.ConfigError(
            f'{os.path.join(seed_dir, SETTINGS_FILE)} is not JSON ({e}); the seed\'s files '
            'cannot be matched to this run: give a new --workdir.') from e
      changed = guard.layout_changes({**SETTING_DEFAULTS, **saved}, settings, 'the seed\'s')
      if changed:
        raise config_lib.ConfigError(
            f'Seed {seed} in {seed_dir} was run with other settings: ' + '; '.join(changed)
            + '. Its results and checkpoints belong to those: rerun with the saved values '
            '(config.json), or give a new --workdir.')


def _run_seed(config, runner: SeedRun, train, evals, test, seed, steps_per_epoch,
              loop_settings: loop.Settings, seed_dir, preemption,
              settings: dict) -> dict | None:
  """Trains and evaluates one seed (or reads its finished results, whose settings
  check_seed_settings compared); returns them, or None when SIGTERM stopped it (its checkpoint
  saved)."""
  results_path = os.path.join(seed_dir, 'results.json')
  if files.isfile(results_path):
    try:
      result = json.loads(files.read_text(results_path))
      logging.info('Seed %d is finished (%s); skipping it.', seed, results_path)
      return result
    except ValueError as e:  # Cut short or damaged on disk: the seed's results are redone.
      aside = files.move_aside(results_path, renamer=jax.process_index() == 0)
      logging.warning('Seed %d: %s cannot be read (%s); moved it to %s and running the seed '
                      'again (it resumes from its checkpoint, if one is kept).', seed,
                      results_path, e, aside)
  files.makedirs(seed_dir)
  if jax.process_index() == 0:
    files.write_text(os.path.join(seed_dir, SETTINGS_FILE), json.dumps(settings, indent=1))
  task, batch_size = runner.task, config.train.batch_size
  num_steps = loop_settings.num_steps
  checkpointer = checkpoint_lib.Checkpointer(
      os.path.join(seed_dir, 'checkpoints'),
      config.train.checkpoint_every or steps_per_epoch, config.train.keep_checkpoints)
  state = runner.fresh_state(seed)
  restored = checkpointer.restore(checkpoint_lib.abstract_like(state, runner.state_shardings))
  layout = guard.data_layout(config, DATA_LAYOUT_KEYS)
  # {eval split: an eval record per epoch}: the convergence evidence, kept in each checkpoint
  # so that a resumed seed still has the epochs before it.
  curve = {}
  skipped = 0  # Steps whose update was skipped for a non-finite loss or gradient.
  if restored is not None:
    state, saved = restored
    curve = saved.get('curve', {})
    skipped = int(saved.get('nonfinite_skips', 0))
    changed = guard.layout_changes(saved.get('layout'), layout)
    if changed:
      raise config_lib.ConfigError(
          f'The checkpoint of seed {seed} at step {int(state.step)} in {seed_dir} was written '
          'with other batches: ' + '; '.join(changed) + '. Resume with the saved values '
          '(config.json), or start a new --workdir.')
    logging.info('Seed %d: resumed from step %d.', seed, int(state.step))
  start_step = int(state.step)
  writer = metrics_lib.MetricWriter(seed_dir, start_step)
  train_inputs = {k: train.features[k] for k in INPUT_KEYS + heads.TARGETS[task.head]}

  def evaluate(step, state):
    epoch = step / steps_per_epoch
    out = {}
    for name, split in evals.items():
      outputs = runner.predict(state.params, split, _eval_batch(config))
      metrics, predictions = task.score(name, split, outputs)
      out[name] = (metrics, predictions)
      loss = _eval_loss(task.head, outputs, split)
      writer.write(step, 'eval', {'epoch': epoch, 'eval_split': name, **metrics, 'loss': loss})
      # A resumed seed evaluates its last step again: that record replaces the saved one.
      curve[name] = [p for p in curve.get(name, []) if p['step'] < step] + [
          {'epoch': epoch, 'step': step, **metrics,
           'loss': loss if _has_targets(task.head, split) else None}]
      logging.info('seed %d step %d eval %s: %s', seed, step, name,
                   ', '.join(f'{k} {v:.2f}' for k, v in metrics.items()))
    return out

  def batches():
    """(batch, position) from the step after start_step on, epoch after epoch."""
    epoch, skip = divmod(start_step, steps_per_epoch)
    while True:
      for index, batch in enumerate(train_batches(train_inputs, batch_size, seed, epoch)):
        if index >= skip:
          yield batch, {'epoch': epoch, 'batch': index + 1}
      epoch, skip = epoch + 1, 0

  def evaluate_at(step):
    return step % steps_per_epoch == 0 and config.train.eval_every_epoch or step == num_steps

  stretch = loop.Stretch(num_steps, batches(),
                         lambda batch: sharding.global_batch(batch, runner.batch_shardings),
                         batch_size, runner.flops_per_seq)
  hooks = loop.Hooks(
      summarize=lambda stats, applied: {'loss': float(stats['loss']) / max(applied, 1)},
      evaluate=evaluate, evaluate_at=evaluate_at,
      saved_fields=lambda step, stretch, position, skipped: {
          **position, 'layout': layout, 'curve': curve, 'nonfinite_skips': skipped},
      log_line=lambda step, values, eta: metrics_lib.log_train_line(
          step, num_steps, values, eta, prefix=f'seed {seed} '),
      log_at=lambda step: step % steps_per_epoch == 0,
      subject=f'seed {seed} ',
      remedy='Lower config.train.learning_rate (with a grid: train.learning_rates), or set '
             'train.max_nonfinite_skips to skip such steps.')
  last_eval = None
  if evaluate_at(start_step) and start_step and not any(
      p['step'] == start_step for points in curve.values() for p in points):
    # Preempted at an evaluation's step, which a preemption skips: it evaluates now.
    last_eval = evaluate(start_step, state)
  with checkpoint_lib.closing(checkpointer):
    outcome = loop.run(state, runner.train_step, iter([stretch]), start_step=start_step,
                       settings=loop_settings,
                       hooks=hooks, checkpointer=checkpointer, writer=writer,
                       preemption=preemption, last_eval=last_eval, skipped=skipped)
  state, last_eval = outcome.state, outcome.last_eval
  if outcome.stopped_at is not None:
    writer.close()
    return None
  if last_eval is None:  # Resumed at the end: evaluate the restored state.
    last_eval = evaluate(num_steps, state)
  writer.close()
  train_seconds = outcome.train_seconds
  result = {'seed': seed, 'metrics': {name: m for name, (m, _) in last_eval.items()},
            'train_seconds': train_seconds, 'train_seq_per_s':
            outcome.timed_rows / train_seconds if train_seconds else 0.0, 'curve': curve}
  if jax.process_index() == 0 and config.task.write_predictions:
    for name, (_, predictions) in last_eval.items():
      task.write_predictions(name, predictions, os.path.join(seed_dir, 'predictions'))
    if test is not None:
      outputs = runner.predict(state.params, test, _eval_batch(config))
      _, predictions = task.score('test', test, outputs)
      task.write_predictions('test', predictions, os.path.join(seed_dir, 'submission'))
  if jax.process_index() == 0:
    files.write_text(results_path, json.dumps(result, indent=2))
  return result


def _has_targets(head: str, split: base.EncodedSplit) -> bool:
  """Whether the split holds the head's training targets (SQuAD's dev holds answers instead)."""
  return all(k in split.features for k in heads.TARGETS[head])


def _eval_loss(head: str, outputs, split: base.EncodedSplit) -> float:
  """The training loss on an eval split (0.0 where the split has no targets, e.g. SQuAD dev)."""
  if not _has_targets(head, split):
    return 0.0
  targets = {k: split.features[k] for k in heads.TARGETS[head]}
  return float(task_loss(head, jax.tree.map(jnp.asarray, outputs), targets))


def summarize_seeds(task, config, per_seed: list[dict], train, num_steps: int) -> dict:
  """results.json's run fields: each seed's metrics per split (at the selected learning rate,
  which lr_grid.summarize's fields give), their median, and the run's settings."""
  splits = per_seed[0]['metrics'].keys()
  return {
      'task': task.name, 'main_metric': task.main_metric, 'median': lr_grid.medians(per_seed),
      'seeds': [r['seed'] for r in per_seed],
      'per_seed': {split: [r['metrics'][split] for r in per_seed] for split in splits},
      'train_seconds': [r['train_seconds'] for r in per_seed],
      'train_seq_per_s': [r['train_seq_per_s'] for r in per_seed],
      'init_from': config.init_from, 'train_rows': train.num_rows, 'num_steps': num_steps,
      'epochs': config.train.num_epochs, 'batch_size': config.train.batch_size,
      'max_seq_length': config.data.max_seq_length,
      'feature_layers': config.task.feature_layers,
      # 0: no BiLSTM between the encoder and the head; units count only where layers > 0.
      'lstm_layers': config.task.lstm_layers, 'lstm_units': config.task.lstm_units,
  }

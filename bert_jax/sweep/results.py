"""What a sweep's runs left in its workdir: budgets and losses of the pretraining runs, the
per-seed scores of the fine-tuning runs, and which runs are missing or unfinished.

Reads only WORKDIR/sweep.json and the run workdirs it names (relative to WORKDIR); writes
nothing. A run that is absent or unfinished is loaded with what it has so far, so the report of
a sweep that is still running shows its progress.
"""

import dataclasses
import json
import math
import os
import statistics

import ml_collections

from bert_jax import plot
from bert_jax.train import lr_grid
from bert_jax.train import metrics as metrics_lib
from bert_jax.train import pretrain

SWEEP_FILE = 'sweep.json'
# The language-model losses a held-out record may hold, in the order a run's is picked.
LM_KINDS = ('mlm', 'clm')

MISSING, UNFINISHED, FINISHED = 'missing', 'unfinished', 'finished'


@dataclasses.dataclass(frozen=True)
class PretrainRun:
  """One pretraining run: how far it got, what it cost, and its losses."""
  name: str
  workdir: str  # Relative to the sweep's workdir.
  config: str  # Its config file and arguments, e.g. 'configs/small.py:nsp=False'.
  overrides: dict  # Its --config.KEY=VALUE overrides.
  status: str  # MISSING, UNFINISHED or FINISHED.
  steps: int | None = None  # The last step metrics.jsonl reached.
  num_steps: int | None = None  # The config's train.num_steps.
  tokens: int | None = None  # Sequence slots trained on (padding included).
  flops: float | None = None  # Training FLOPs (model_flops_per_sequence x sequences).
  train_loss: float | None = None  # The last train record's loss (all objectives summed).
  lm_kind: str | None = None  # 'mlm' or 'clm': the loss the held-out figures are of.
  eval_loss: float | None = None  # The last eval record's <lm_kind>_loss.
  seq_per_s: float | None = None  # Mean over the train records that timed any step.
  mfu: float | None = None  # Likewise.
  train_curve: tuple = ()  # ((step, <lm_kind>_loss), ...) of the train records.
  eval_curve: tuple = ()  # ((step, <lm_kind>_loss), ...) of the eval records.
  # The last eval record's HELD_OUT_METRICS that the run has: ((key, value), ...).
  held_out: tuple = ()
  # Run-health alarms its records raised (bert_jax/train/health.py), in the order first raised:
  # ((name, first step, last step, times raised), ...).
  alarms: tuple = ()

  @property
  def perplexity(self) -> float | None:
    return None if self.eval_loss is None else math.exp(self.eval_loss)


@dataclasses.dataclass(frozen=True)
class FinetuneRun:
  """One fine-tuning run: an arm's encoder on one task, each seed's main metric (0-100)."""
  arm: str
  task: str
  step: int | None  # The pretraining step fine-tuned from; None: the run's final checkpoint.
  workdir: str  # Relative to the sweep's workdir.
  status: str  # MISSING, UNFINISHED or FINISHED.
  split: str | None = None  # 'dev' when the run has one, else its first split.
  metric: str | None = None  # The task's main metric.
  scores: tuple = ()  # One per seed, in seed order, at the selected learning rate.
  seeds_done: int = 0  # Seeds an unfinished run has finished (at every rate of its grid).
  learning_rate: float | None = None  # The rate selected on `split` (the only one without a grid).
  rate_medians: tuple = ()  # ((rate, median of the seeds), ...) in the grid's order.
  # Convergence at the selected rate, medians over the seeds: the last eval's loss on `split`
  # and its change since the eval before (the last epoch's; None with one eval per run).
  dev_loss: float | None = None
  dev_loss_change: float | None = None
  baseline: float | None = None  # The main metric of results.json's baseline on `split`.
  baseline_kind: str = ''  # What that baseline predicts.

  @property
  def median(self) -> float | None:
    return statistics.median(self.scores) if self.scores else None

  @property
  def above_baseline(self) -> bool | None:
    """Whether the median beats the baseline (None when either is unknown); a NaN median, a
    correlation of constant predictions, does not."""
    if self.median is None or self.baseline is None:
      return None
    return bool(self.median > self.baseline)


@dataclasses.dataclass(frozen=True)
class Sweep:
  """sweep.json and what its runs hold."""
  spec: dict  # sweep.json as written by the runner.
  pretrain: dict  # Run name -> PretrainRun, in the order of the arms they feed.
  finetune: tuple  # FinetuneRun, in sweep.json's order.

  @property
  def arms(self) -> list:
    return self.spec.get('arms', [])

  @property
  def tasks(self) -> list:
    return self.spec.get('tasks', [])

  def final(self, arm: str, task: str) -> FinetuneRun | None:
    """The fine-tuning run of (arm, task) from the pretraining run's last checkpoint."""
    return next((r for r in self.finetune if (r.arm, r.task, r.step) == (arm, task, None)), None)

  def average(self, arm: str) -> float | None:
    """The mean of an arm's task medians; None unless every task has one."""
    medians = [getattr(self.final(arm, task), 'median', None) for task in self.tasks]
    if not medians or None in medians:
      return None
    return statistics.fmean(medians)

  def stepped(self) -> list:
    """The fine-tuning runs from intermediate pretraining checkpoints."""
    return [r for r in self.finetune if r.step is not None]

  def alarmed(self, arm: str) -> PretrainRun | None:
    """The arm's pretraining run when it raised a run-health alarm, else None."""
    name = next((a.get('pretrain_run') for a in self.arms if a['name'] == arm), None)
    run = self.pretrain.get(name) if name else None
    return run if run is not None and run.alarms else None

  def baseline(self, task: str) -> FinetuneRun | None:
    """A finished run of `task` that carries the task's baseline (every run of a task scores it
    on the same data), or None."""
    return next((r for r in self.finetune if r.task == task and r.baseline is not None), None)


def load(workdir: str) -> Sweep:
  """Reads WORKDIR/sweep.json and every run it names; FileNotFoundError without sweep.json."""
  path = os.path.join(workdir, SWEEP_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} does not exist: {workdir!r} is not a sweep workdir (the '
                            'sweep runner writes sweep.json there before its first run).')
  with open(path, encoding='utf-8') as f:
    spec = json.load(f)
  runs = spec.get('pretrain_runs', {})
  # The runner writes sweep.json with sorted keys: the arms' list keeps the sweep's order.
  order = [a['pretrain_run'] for a in spec.get('arms', []) if a.get('pretrain_run') in runs]
  pretrain_runs = {name: load_pretrain(workdir, name, runs[name])
                   for name in dict.fromkeys(order + list(runs))}
  finetune_runs = tuple(load_finetune(workdir, run) for run in spec.get('finetune_runs', []))
  return Sweep(spec, pretrain_runs, finetune_runs)


def read_config(run_dir: str):
  """A run's config.json as a ConfigDict, or None where it has none yet."""
  path = os.path.join(run_dir, 'config.json')
  if not os.path.isfile(path):
    return None
  with open(path, encoding='utf-8') as f:
    return ml_collections.ConfigDict(json.load(f))


def budget(config, steps: int) -> tuple[int, float | None]:
  """(sequence slots, training FLOPs) of the first `steps` steps, phase by phase (a second
  phase has its own sequence length and batch size). FLOPs are None when the config names a
  model or objective this checkout does not have."""
  tokens, flops, first = 0, 0.0, 0
  for phase in pretrain.phases(config):
    done = max(0, min(steps, phase.last_step) - first)
    batch, seq = phase.config.train.batch_size, phase.config.data.max_seq_length
    tokens += done * batch * seq
    if flops is not None:
      try:
        flops += done * batch * metrics_lib.model_flops_per_sequence(phase.config)
      except ValueError:  # An unknown objective or model name: its FLOPs are not known here.
        flops = None
    first = phase.last_step
  return tokens, flops


def _lm_kind(records: list[dict]) -> str | None:
  for kind in LM_KINDS:
    if any(f'{kind}_loss' in r for r in records):
      return kind
  return None


def _mean(values: list[float]) -> float | None:
  return statistics.fmean(values) if values else None


# What the other objectives' heads achieve on the held-out set (the eval record's keys, in the
# report's order, with their labels): the sentence tasks' accuracy, how well ELECTRA's
# discriminator ranks replaced tokens, SpanBERT's boundary loss.
HELD_OUT_METRICS = (('nsp_accuracy', 'NSP accuracy'), ('sop_accuracy', 'SOP accuracy'),
                    ('rtd_disc_auc', 'RTD AUC'), ('rtd_disc_accuracy', 'RTD accuracy'),
                    ('sbo_loss', 'SBO loss'))


def alarms_of(records: list[dict]) -> tuple:
  """((alarm, first step, last step, times raised), ...) of a run's metrics records."""
  seen = {}
  for record in records:
    for alarm in record.get('alarms') or ():
      first, _, count = seen.get(alarm, (record['step'], None, 0))
      seen[alarm] = (first, record['step'], count + 1)
  return tuple((alarm, *steps) for alarm, steps in seen.items())


def load_pretrain(workdir: str, name: str, run: dict) -> PretrainRun:
  """One pretraining run of sweep.json's pretrain_runs."""
  run_dir = os.path.join(workdir, run['workdir'])
  common = {'name': name, 'workdir': run['workdir'], 'config': run.get('config', ''),
            'overrides': run.get('overrides', {})}
  metrics_path = os.path.join(run_dir, 'metrics.jsonl')
  if not os.path.isfile(metrics_path):
    return PretrainRun(status=MISSING, **common)
  records = plot.read_records(metrics_path)
  config = read_config(run_dir)
  train = [r for r in records if r.get('split') == 'train']
  evals = [r for r in records if r.get('split') == 'eval']
  steps = max((r['step'] for r in records), default=0)
  num_steps = config.train.num_steps if config is not None else None
  tokens, flops = budget(config, steps) if config is not None else (None, None)
  finished = (os.path.isfile(os.path.join(run_dir, 'eval_results.json'))
              and num_steps is not None and steps >= num_steps)
  kind = _lm_kind(records)
  key = f'{kind}_loss' if kind else 'loss'
  timed = [r for r in train if r.get('seq_per_s')]  # 0: the interval timed no step.
  return PretrainRun(
      status=FINISHED if finished else UNFINISHED, steps=steps, num_steps=num_steps,
      tokens=tokens, flops=flops, train_loss=train[-1]['loss'] if train else None,
      lm_kind=kind, eval_loss=evals[-1].get(key) if evals else None,
      seq_per_s=_mean([r['seq_per_s'] for r in timed]),
      mfu=_mean([r['mfu'] for r in timed if 'mfu' in r]),
      train_curve=tuple((r['step'], r[key]) for r in train if key in r),
      eval_curve=tuple((r['step'], r[key]) for r in evals if key in r),
      held_out=tuple((k, evals[-1][k]) for k, _ in HELD_OUT_METRICS if evals and k in evals[-1]),
      alarms=alarms_of(records), **common)


def load_finetune(workdir: str, run: dict) -> FinetuneRun:
  """One fine-tuning run of sweep.json's finetune_runs; its scores from results.json."""
  run_dir = os.path.join(workdir, run['workdir'])
  common = {'arm': run['arm'], 'task': run['task'], 'step': run.get('step'),
            'workdir': run['workdir']}
  results_path = os.path.join(run_dir, 'results.json')
  if not os.path.isfile(results_path):
    if not os.path.isdir(run_dir):
      return FinetuneRun(status=MISSING, **common)
    return FinetuneRun(status=UNFINISHED, seeds_done=_seeds_done(run_dir), **common)
  with open(results_path, encoding='utf-8') as f:
    results = json.load(f)
  split = 'dev' if 'dev' in results['per_seed'] else next(iter(results['per_seed']))
  per_seed = results['per_seed'][split]
  # Task metrics are percentages already (bert_jax/tasks/base.py), the paper's scale.
  metric = results.get('main_metric') or next(iter(per_seed[0]))
  scores = tuple(float(r[metric]) for r in per_seed)
  # Runs from before the learning-rate grid have none of what follows but learning_rate.
  by_rate = results.get('by_rate') or {}
  selected = results.get('selected') or {}
  baseline = results.get('baseline') or {}
  return FinetuneRun(
      status=FINISHED, split=split, metric=metric, scores=scores, seeds_done=len(scores),
      learning_rate=results.get('learning_rate'),
      rate_medians=tuple((r['learning_rate'], r['median']) for r in by_rate.values()),
      dev_loss=selected.get('dev_loss'), dev_loss_change=selected.get('dev_loss_change'),
      baseline=baseline.get('metrics', {}).get(split, {}).get(metric),
      baseline_kind=baseline.get('kind', ''), **common)


def _seeds_done(run_dir: str) -> int:
  """Seeds with results.json in a fine-tuning workdir: seed_<s>/, or lr_<rate>/seed_<s>/ of
  each rate of a grid."""
  def finished_seeds(directory):
    return sum(os.path.isfile(os.path.join(directory, d, 'results.json'))
               for d in os.listdir(directory) if d.startswith('seed_'))
  rate_dirs = [os.path.join(run_dir, d) for d in os.listdir(run_dir)
               if d.startswith(lr_grid.DIRECTORY_PREFIX)]
  return finished_seeds(run_dir) + sum(finished_seeds(d) for d in rate_dirs if os.path.isdir(d))

"""An ablation sweep's report: `python -m bert_jax.sweep.report WORKDIR`.

Writes WORKDIR/report.md (the pretraining budgets, the downstream table shaped like the paper's,
accuracy against pretraining steps, notes, missing runs) and WORKDIR/plots/*.png from the
workdir alone. A rerun rebuilds report.md byte for byte: no timestamps, runs in sweep.json's
order, fixed float formats. Runs that are absent or unfinished show '-' and are listed, so a
sweep that is still running gets a partial report.
"""

import os
import sys

from bert_jax.core import files
from bert_jax.sweep import results
from bert_jax.sweep.results import load  # pylint: disable=unused-import  (the report's API)

REPORT_FILE = 'report.md'
PLOTS_DIR = 'plots'
NONE = '-'


def _cell(value, spec: str) -> str:
  return NONE if value is None else format(value, spec)


def _escape(text) -> str:
  """Text a table cell can hold: a '|' would end the cell."""
  return str(text).replace('|', '\\|').replace('\n', ' ')


def _count(value: float | None) -> str:
  """65536000 -> '65.5M': tokens and the like at a glance."""
  if value is None:
    return NONE
  for size, suffix in ((1e12, 'T'), (1e9, 'B'), (1e6, 'M'), (1e3, 'k')):
    if abs(value) >= size:
      return f'{value / size:.3g}{suffix}'
  return f'{value:.3g}'


def _code(text: str) -> str:
  return f'`{_escape(text)}`' if text else NONE


def _assignments(values: dict) -> str:
  return ', '.join(f'{k}={v}' for k, v in values.items())


def table(header: list[str], rows: list[list[str]]) -> str:
  """A markdown table."""
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
  return '\n'.join(lines)


def _lm_kinds(sweep: results.Sweep) -> list[str]:
  """The held-out losses the budget table has columns for: MLM always, CLM where a run has it."""
  present = {run.lm_kind for run in sweep.pretrain.values()}
  return [k for k in results.LM_KINDS if k == 'mlm' or k in present]


def shared_overrides(sweep: results.Sweep) -> dict:
  """The overrides every pretraining run has with the same value: said once, not per row."""
  runs = list(sweep.pretrain.values())
  if len(runs) < 2:
    return {}
  return {k: v for k, v in runs[0].overrides.items()
          if all(k in r.overrides and r.overrides[k] == v for r in runs[1:])}


def _has_other_objectives(sweep: results.Sweep) -> bool:
  """Whether any pretraining run's last eval record holds a HELD_OUT_METRICS value."""
  return any(run.held_out for run in sweep.pretrain.values())


def budget_rows(sweep: results.Sweep) -> tuple[list[str], list[list[str]]]:
  """(header, rows) of the pretraining budgets: one row per pretraining run, with its config
  and the overrides it does not share with every other run."""
  kinds = _lm_kinds(sweep)
  shared = shared_overrides(sweep)
  header = ['run', 'config', 'overrides', 'steps', 'tokens', 'PFLOPs', 'train loss']
  for kind in kinds:
    header += [f'held-out {kind.upper()} loss', f'{kind.upper()} perplexity']
  others = _has_other_objectives(sweep)
  if others:
    header.append('held-out, other objectives')
  header += ['seq/s', 'MFU']
  labels = dict(results.HELD_OUT_METRICS)
  rows = []
  for run in sweep.pretrain.values():
    own = {k: v for k, v in run.overrides.items() if k not in shared}
    steps = NONE if run.steps is None else str(run.steps)
    if run.steps is not None and run.num_steps is not None and run.steps < run.num_steps:
      steps = f'{run.steps}/{run.num_steps}'
    name = _escape(run.name) + (f' {ALARMED}' if run.alarms else '')
    row = [name, _code(run.config), _code(_assignments(own)), steps,
           _count(run.tokens),
           _cell(None if run.flops is None else run.flops / 1e15, '.4g'),
           _cell(run.train_loss, '.3f')]
    for kind in kinds:
      mine = run.lm_kind == kind
      row += [_cell(run.eval_loss if mine else None, '.3f'),
              _cell(run.perplexity if mine else None, '.2f')]
    if others:
      row.append('; '.join(f'{labels[k]} {v:.3f}' for k, v in run.held_out) or NONE)
    row += [_cell(run.seq_per_s, '.1f'),
            NONE if run.mfu is None else f'{100 * run.mfu:.1f}%']
    rows.append(row)
  return header, rows


def score_cell(run: results.FinetuneRun | None, seeds: int) -> str:
  """'median [min–max]' over the seeds, and how many seeds when fewer than the sweep's."""
  if run is None or not run.scores:
    return NONE
  text = f'{run.median:.1f}'
  if len(run.scores) > 1:
    text += f' [{min(run.scores):.1f}–{max(run.scores):.1f}]'
  if len(run.scores) < seeds:
    text += f' ({len(run.scores)}/{seeds} seeds)'
  return text


# Marks a score that is not above its task's baseline (a model that ignores its input).
AT_BASELINE = '†'
# Marks a pretraining run that raised a run-health alarm, and the arms pretrained by it.
ALARMED = '⚠'
WITHHELD = f'withheld ({ALARMED})'


def _rate(rate) -> str:
  return NONE if rate is None else f'{rate:g}'


def _metric(sweep: results.Sweep, task: str) -> str:
  return next((r.metric for r in sweep.finetune if r.task == task and r.metric), '')


def main_rows(sweep: results.Sweep) -> tuple[list[str], list[list[str]]]:
  """(header, rows) of the downstream table: one row per arm, a column per task (the median
  over seeds with their spread), their average, then the paper's numbers for the arm."""
  paper_columns = paper_columns_run(sweep)
  header = ['arm', 'pretraining']
  header += [_escape(f'{task} {_metric(sweep, task)}'.strip()) for task in sweep.tasks]
  header += ['average'] + [f'paper {_escape(c)}' for c in paper_columns]
  seeds = sweep.spec.get('seeds', 1)
  rows = []
  for arm in sweep.arms:
    alarmed = sweep.alarmed(arm['name'])
    row = [_escape(arm.get('label', arm['name'])),
           _escape(arm.get('pretrain_run') or 'none (random init)')
           + (f' {ALARMED} ' + ', '.join(a[0] for a in alarmed.alarms) if alarmed else '')]
    for task in sweep.tasks:
      run = sweep.final(arm['name'], task)
      cell = score_cell(run, seeds)
      row.append(cell + f' {AT_BASELINE}' if run and run.above_baseline is False else cell)
    # An alarmed arm's scores stay as measured; its summary is not set beside the others'.
    row.append(WITHHELD if alarmed else _cell(sweep.average(arm['name']), '.1f'))
    paper = arm.get('paper') or {}
    row += [_cell(paper.get(column), '.1f') for column in paper_columns]
    rows.append(row)
  baselines = [getattr(sweep.baseline(task), 'baseline', None) for task in sweep.tasks]
  if any(b is not None for b in baselines):
    average = None if None in baselines else sum(baselines) / len(baselines)
    rows.append([BASELINE_LABEL, 'none (input ignored)'] + [_cell(b, '.1f') for b in baselines]
                + [_cell(average, '.1f')] + [NONE] * len(paper_columns))
  return header, rows


def _not_run(sweep: results.Sweep) -> str:
  """'; its mnli, qnli are left out (not fine-tuned here)' for the paper's columns of tasks
  this sweep did not run."""
  run = paper_columns_run(sweep)
  left = [c for c in sweep.spec.get('paper', {}).get('columns', []) if c not in run]
  return f'; its {", ".join(left)} left out (not fine-tuned here)' if left else ''


def paper_columns_run(sweep: results.Sweep) -> list[str]:
  """The paper's columns of the tasks this sweep fine-tunes on ('squad' for 'squad1.1'): a
  paper number beside a task that did not run would read as a comparison."""
  return [column for column in sweep.spec.get('paper', {}).get('columns', [])
          if any(task == column or task.startswith(column) for task in sweep.tasks)]


BASELINE_LABEL = 'Baseline: majority class (or constant)'


def no_pretraining_arms(sweep: results.Sweep) -> list[str]:
  """The labels of the arms fine-tuned from random initialisation: the no-pretraining rows."""
  return [arm.get('label', arm['name']) for arm in sweep.arms if not arm.get('pretrain_run')]


def baseline_text(sweep: results.Sweep) -> str:
  """The downstream table's sentences on its floors: the baseline row, the marked cells, the
  no-pretraining row."""
  kinds = {task: sweep.baseline(task).baseline_kind for task in sweep.tasks
           if sweep.baseline(task) is not None}
  text = ''
  if kinds:
    text += (' The baseline row: what a model that ignores its input scores on the same split ('
             + '; '.join(f'{task}: {kind}' for task, kind in kinds.items())
             + f'). {AT_BASELINE}: a median not above that baseline.')
  arms = no_pretraining_arms(sweep)
  if arms:
    text += (f' The no-pretraining row: {", ".join(arms)} (the base\'s shape from random '
             'initialisation, fine-tuned alike).')
  else:
    text += (' The sweep has no arm from random initialisation (init=\'random\'), so no '
             'no-pretraining row.')
  return text


def _arm_task_rows(sweep: results.Sweep, field: str, cell) -> tuple[list[str], list[list[str]]]:
  """(header, rows): per arm a row of cell(run) per task (NONE where the run lacks `field`);
  empty rows when no run has `field` (runs from before the fine-tuning protocol)."""
  header = ['arm'] + [_escape(task) for task in sweep.tasks]
  runs = [[sweep.final(arm['name'], task) for task in sweep.tasks] for arm in sweep.arms]
  if not any(getattr(run, field, None) is not None for row in runs for run in row):
    return header, []
  return header, [[_escape(arm.get('label', arm['name']))]
                  + [NONE if getattr(run, field, None) is None else cell(run) for run in row]
                  for arm, row in zip(sweep.arms, runs)]


def rate_rows(sweep: results.Sweep) -> tuple[list[str], list[list[str]]]:
  """(header, rows) of the fine-tuning learning rates: per arm and task, the rate selected on
  dev and, with a grid, each rate's median over seeds."""
  def cell(run):
    text = _rate(run.learning_rate)
    if len(run.rate_medians) > 1:
      text += ' (' + ', '.join(f'{_rate(rate)}: {_cell(median, ".1f")}'
                               for rate, median in run.rate_medians) + ')'
    return text
  return _arm_task_rows(sweep, 'learning_rate', cell)


def convergence_rows(sweep: results.Sweep) -> tuple[list[str], list[list[str]]]:
  """(header, rows) of whether fine-tuning converged: per arm and task at the selected rate,
  the last dev loss and its change over the last epoch (medians over seeds)."""
  def cell(run):
    change = NONE if run.dev_loss_change is None else f'{run.dev_loss_change:+.3f}'
    return f'{run.dev_loss:.3f} ({change})'
  return _arm_task_rows(sweep, 'dev_loss', cell)


def health_rows(sweep: results.Sweep) -> tuple[list[str], list[list[str]]]:
  """(header, rows) of the run-health alarms: one row per alarm of each pretraining run that
  raised any; no rows when none did."""
  header = ['run', 'alarm', 'first raised at step', 'last', 'times']
  rows = [[_escape(run.name), name, str(first), str(last), str(count)]
          for run in sweep.pretrain.values() for name, first, last, count in run.alarms]
  return header, rows


def _splits(sweep: results.Sweep) -> str:
  """The eval splits the scores are of ('dev' unless a task has none)."""
  return '/'.join(sorted({r.split for r in sweep.finetune if r.split})) or 'dev'


def step_columns(sweep: results.Sweep) -> list[tuple[str, str]]:
  """The (arm, task) pairs fine-tuned from intermediate checkpoints, in arm then task order."""
  pairs = {(r.arm, r.task) for r in sweep.stepped()}
  return [(arm['name'], task) for arm in sweep.arms for task in sweep.tasks
          if (arm['name'], task) in pairs]


def step_rows(sweep: results.Sweep) -> tuple[list[str], list[list[str]]]:
  """(header, rows) of downstream medians against pretraining steps: a row per step, then the
  final checkpoint's; empty rows when no run fine-tunes an intermediate checkpoint."""
  columns = step_columns(sweep)
  labels = {arm['name']: arm.get('label', arm['name']) for arm in sweep.arms}
  header = ['pretraining step'] + [_escape(f'{labels[a]}: {t}') for a, t in columns]
  if not columns:
    return header, []
  by_key = {(r.arm, r.task, r.step): r for r in sweep.finetune}

  def medians(step):
    return [_cell(getattr(by_key.get((a, t, step)), 'median', None), '.1f') for a, t in columns]
  rows = [[str(step)] + medians(step) for step in sorted({r.step for r in sweep.stepped()})]
  return header, rows + [['final'] + medians(None)]


def missing_runs(sweep: results.Sweep) -> list[str]:
  """One line per run that is absent or unfinished, saying which and how far it got."""
  lines = []
  for run in sweep.pretrain.values():
    if run.status == results.MISSING:
      lines.append(f'pretraining `{run.name}` ({run.workdir}): missing')
    elif run.status == results.UNFINISHED:
      lines.append(f'pretraining `{run.name}` ({run.workdir}): unfinished, at step '
                   f'{run.steps} of {run.num_steps if run.num_steps is not None else "?"}')
  for run in sweep.finetune:
    name = f'fine-tuning `{run.arm}` on {run.task}' + (
        f' from step {run.step}' if run.step is not None else '')
    if run.status == results.MISSING:
      lines.append(f'{name} ({run.workdir}): missing')
    elif run.status == results.UNFINISHED:
      rates = len(sweep.spec.get('learning_rates') or [])
      total = sweep.spec.get('seeds', '?')
      if rates and isinstance(total, int):
        total = f'{total * rates} (seeds x learning rates)'
      lines.append(f'{name} ({run.workdir}): unfinished, {run.seeds_done} of {total} '
                   'seeds done')
  return lines


def plot_names(sweep: results.Sweep) -> list[str]:
  """The plots the report has: score against steps only where runs fine-tune such steps."""
  names = ['curves', 'downstream', 'score_vs_compute']
  return names + (['score_vs_steps'] if sweep.stepped() else [])


def markdown(sweep: results.Sweep) -> str:
  """report.md's text."""
  spec = sweep.spec
  out = [f'# {spec.get("title") or spec.get("name", "Sweep")}', '']
  if spec.get('description'):
    out += [spec['description'].strip(), '']
  seeds = spec.get('seeds', 1)
  rates = spec.get('learning_rates') or []
  out += [f'Sweep `{spec.get("name", "")}` ({spec.get("sweep_file", NONE)}); pretraining base '
          f'config {spec.get("base", NONE)}'
          + (f' (the sweep at size {spec["size"]})' if spec.get('size') else '')
          + f'; fine-tuning on {", ".join(sweep.tasks) or NONE}, '
          f'{seeds} seed(s) each'
          + (f' at each learning rate of {", ".join(map(_rate, rates))}, the rate with the '
             'best median on dev reported' if rates else '') + '.', '']

  shared = shared_overrides(sweep)
  out += ['## Pretraining budgets', '', table(*budget_rows(sweep)), '',
          (f'Every run also has `{_assignments(shared)}`. ' if shared else '')
          + 'Steps: the last step in metrics.jsonl (of train.num_steps while unfinished). Tokens '
          'are sequence slots, steps x batch size x sequence length, padding included. FLOPs: '
          'model_flops_per_sequence (3x forward, attention in full) x sequences. Train loss: the '
          "last train record's, all the run's objectives summed. Held-out loss and perplexity "
          '(exp of the loss): the last eval record. seq/s and MFU: the mean over the train '
          'records.'
          + (' An MLM perplexity (masked tokens, context on both sides) and a CLM one (every '
             'next token, left context only) are not comparable.'
             if 'clm' in _lm_kinds(sweep) else '')
          + (" Other objectives: the last eval record's accuracy of NSP or SOP, the ELECTRA "
             "discriminator's AUC and accuracy over every token, SpanBERT's boundary loss."
             if _has_other_objectives(sweep) else ''), '']

  header, rows = health_rows(sweep)
  if rows:
    out += ['## Run health', '', table(header, rows), '',
            f'{ALARMED}: a pretraining run that raised a run-health alarm (bert_jax/train/'
            'health.py; the log and metrics.jsonl say what was measured): a discriminator at '
            'chance, a language model stuck at the unigram prediction, a diverging or spiking '
            'loss, skipped non-finite steps. Its arms are marked below and their average '
            'withheld: a degenerate run says nothing about its recipe, so draw no conclusion '
            'from it before a rerun.', '']
  else:
    out += ['## Run health', '', 'No run raised an alarm (bert_jax/train/health.py).', '']

  header, rows = main_rows(sweep)
  paper = spec.get('paper', {})
  out += ['## Downstream', '', table(header, rows), '',
          f"Each task's main metric on its {_splits(sweep)} split (0-100): the median over "
          'seeds, [min–max] across them, and the seed count where fewer finished'
          + (', at the learning rate selected on that split (below)'
             if spec.get('learning_rates') else '')
          + '. Average: the mean of the task medians, given when every task has one.'
          + baseline_text(sweep)
          + (f' Paper columns: {paper["source"]}' + _not_run(sweep) + '.'
             if paper.get('source') else ''), '']

  header, rows = rate_rows(sweep)
  if rows:
    out += ['## Fine-tuning learning rate', '', table(header, rows), '',
            'The learning rate each arm and task is reported at: the one whose median over '
            'seeds is best on dev, and in brackets the median at each rate tried.', '']
  header, rows = convergence_rows(sweep)
  if rows:
    out += ['## Fine-tuning convergence', '', table(header, rows), '',
            'At the selected learning rate, medians over seeds: the dev loss after the last '
            'epoch and, in brackets, its change over that epoch (negative: still falling; - '
            'with one evaluation per run). A loss still falling fast says more epochs would '
            'change the score; a rising one, overfitting.', '']

  header, rows = step_rows(sweep)
  if rows:
    out += ['## Downstream against pretraining steps', '', table(header, rows), '',
            'The median over seeds of each arm and task, fine-tuned from the pretraining '
            'checkpoint at each step; final: the last checkpoint.', '']

  if spec.get('notes'):
    out += ['## Notes', ''] + [f'- {note}' for note in spec['notes']] + ['']

  lines = missing_runs(sweep)
  out += ['## Missing runs', '']
  out += [f'- {line}' for line in lines] if lines else ['None: every run finished.']
  out += ['', '## Plots', '']
  out += [f'![{name}]({PLOTS_DIR}/{name}.png)' for name in plot_names(sweep)]
  return '\n'.join(out) + '\n'


def write(workdir: str) -> str:
  """Writes WORKDIR/report.md and WORKDIR/plots/*.png; returns the markdown."""
  from bert_jax.sweep import plots  # pylint: disable=g-import-not-at-top  (needs matplotlib)
  sweep = load(workdir)
  text = markdown(sweep)
  plots.write(sweep, os.path.join(workdir, PLOTS_DIR), plot_names(sweep))
  files.write_text(os.path.join(workdir, REPORT_FILE), text)
  return text


def main(argv=None) -> None:
  args = sys.argv[1:] if argv is None else argv
  if len(args) != 1:
    sys.exit('usage: python -m bert_jax.sweep.report WORKDIR')
  try:
    write(args[0])
  except FileNotFoundError as e:
    sys.exit(str(e))
  print(os.path.join(args[0], REPORT_FILE))


if __name__ == '__main__':
  main()

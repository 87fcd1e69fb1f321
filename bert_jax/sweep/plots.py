"""A sweep's plots (PNG): loss curves, downstream scores per seed, score against compute and
against pretraining steps.

matplotlib is imported inside the functions (bert_jax/plot.py's Agg canvas, no pyplot state),
so the report's tables need no matplotlib. Sizes, dpi and colours are fixed (colours follow the
arms' order in sweep.json), so a rerun draws the same images.
"""

import os

from bert_jax import plot
from bert_jax.sweep import results

arm_colour = plot.colour


def run_colours(sweep: results.Sweep) -> dict[str, str]:
  """A pretraining run's colour: that of the first arm it feeds, else the next free one."""
  colours = {}
  for i, arm in enumerate(sweep.arms):
    if arm.get('pretrain_run'):
      colours.setdefault(arm['pretrain_run'], arm_colour(i))
  spare = len(sweep.arms)
  for name in sweep.pretrain:
    if name not in colours:
      colours[name], spare = arm_colour(spare), spare + 1
  return colours


def _figure(panels: int):
  """(figure, its axes): `panels` side by side."""
  figure, axes = plot.figure(1, panels)
  return figure, axes[0]


def curves(sweep: results.Sweep, path: str) -> None:
  """Train and held-out LM loss against step, one line per pretraining run (CLM dashed)."""
  figure, (train_ax, eval_ax) = _figure(2)
  colours = run_colours(sweep)
  for ax, attr, title in ((train_ax, 'train_curve', 'train'),
                          (eval_ax, 'eval_curve', 'held-out')):
    drawn = False
    for run in sweep.pretrain.values():
      points = getattr(run, attr)
      if not points:
        continue
      steps, losses = zip(*points)
      kind = (run.lm_kind or 'total').upper()
      ax.plot(steps, losses, color=colours[run.name], marker='.' if len(points) < 30 else None,
              linestyle='--' if run.lm_kind == 'clm' else '-', label=f'{run.name} ({kind})')
      drawn = True
    ax.set_title(f'{title} LM loss')
    ax.set_xlabel('step')
    ax.set_ylabel('loss (MLM solid, CLM dashed)')
    if drawn:
      ax.legend(fontsize='small')
    else:
      plot.empty(ax)
  plot.save(figure, path)


def downstream(sweep: results.Sweep, path: str) -> None:
  """One panel per task: each arm's median over seeds as a bar, every seed as a dot."""
  tasks = sweep.tasks or ['(no tasks)']
  figure, axes = _figure(len(tasks))
  labels = [arm.get('label', arm['name']) for arm in sweep.arms]
  for ax, task in zip(axes, tasks):
    scores = []
    for i, arm in enumerate(sweep.arms):
      run = sweep.final(arm['name'], task)
      if run is None or not run.scores:
        continue
      ax.bar(i, run.median, width=0.6, color=arm_colour(i), alpha=0.6)
      n = len(run.scores)
      offsets = [0.0] if n == 1 else [-0.2 + 0.4 * k / (n - 1) for k in range(n)]
      ax.scatter([i + o for o in offsets], run.scores, color='black', s=12, zorder=3)
      scores += run.scores
    metric = next((r.metric for r in sweep.finetune if r.task == task and r.metric), '')
    floor = sweep.baseline(task)
    baseline = getattr(floor, 'baseline', None)
    if scores and baseline is not None:
      kind = (floor.baseline_kind or 'majority class').split(' (')[0].split(' of ')[0]
      ax.axhline(baseline, color='grey', linestyle='--', linewidth=1,
                 label=f'baseline: {kind} ({baseline:.1f})')
      ax.legend(fontsize='small', loc='best')
    ax.set_title(task)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha='right', fontsize='small')
    if scores:
      low, high = score_axis(scores, baseline)
      ax.set_ylim(low, high)
      ax.set_ylabel(f'{metric} (0-100)'.strip() + (f', axis from {low:.0f}' if low > 0 else ''))
    else:
      ax.set_ylabel(f'{metric} (0-100)'.strip())
      plot.empty(ax)
  plot.save(figure, path)


def score_axis(scores: list[float], baseline: float | None) -> tuple[float, float]:
  """(low, high) of a downstream panel's score axis: the seeds' scores and the baseline with a
  margin, in [0, 100]. Bars start at `low`: where it is above 0 the axis label says so, since
  the bars' heights are then not the scores' ratios."""
  values = scores + ([baseline] if baseline is not None else [])
  return max(0.0, min(values) - 5.0), min(100.0, max(values) + 2.0)


def score_of(sweep: results.Sweep) -> tuple[str, dict[str, float]]:
  """(what, arm name -> score) for the compute plot: the average over tasks where every arm
  with scores has one, else the first task's median (never the two mixed). Arms pretrained by
  a run that raised a run-health alarm are left out: a degenerate run is not a point on the
  recipe's curve."""
  arms = [arm for arm in sweep.arms if not sweep.alarmed(arm['name'])]
  averages = {arm['name']: sweep.average(arm['name']) for arm in arms}
  scored = [arm['name'] for arm in arms
            if any(r.scores for r in sweep.finetune if r.arm == arm['name'] and r.step is None)]
  if scored and all(averages[name] is not None for name in scored):
    return 'average score over tasks', {name: averages[name] for name in scored}
  task = sweep.tasks[0] if sweep.tasks else ''
  medians = {arm['name']: getattr(sweep.final(arm['name'], task), 'median', None)
             for arm in arms}
  return f'{task} median', {name: value for name, value in medians.items() if value is not None}


# Point shapes of the arms in order (score_vs_compute).
MARKERS = ('o', 's', '^', 'D', 'v', 'P')


def score_vs_compute(sweep: results.Sweep, path: str) -> None:
  """The downstream score of each arm against its pretraining FLOPs and tokens (log x); arms
  without pretraining as dashed horizontal lines."""
  figure, axes = _figure(2)
  what, scores = score_of(sweep)
  for ax, attr, xlabel in ((axes[0], 'flops', 'pretraining FLOPs'),
                           (axes[1], 'tokens', 'pretraining tokens (sequence slots)')):
    drawn, dashed = False, False
    for i, arm in enumerate(sweep.arms):
      score = scores.get(arm['name'])
      if score is None:
        continue
      label = arm.get('label', arm['name'])
      run = sweep.pretrain.get(arm.get('pretrain_run') or '')
      x = getattr(run, attr, None) if run else None
      if not arm.get('pretrain_run'):
        ax.axhline(score, color=arm_colour(i), linestyle='--', label=label)
        dashed = True
      elif x:
        # A marker of its own: arms fine-tuned from one pretraining run share its x, and a
        # point of the same shape would hide one of them.
        ax.scatter([x], [score], color=arm_colour(i), s=70 - 8 * (i % 6),
                   marker=MARKERS[i % len(MARKERS)], label=label, zorder=3, alpha=0.8)
      else:
        continue
      drawn = True
    ax.set_xscale('log')
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f'{what} (0-100)')
    if dashed:
      ax.set_title('dashed: no pretraining', fontsize='small')
    if drawn:
      ax.legend(fontsize='small')
    else:
      plot.empty(ax)
  plot.save(figure, path)


def score_vs_steps(sweep: results.Sweep, path: str) -> None:
  """One panel per task: each arm's median against the pretraining step it fine-tuned from
  (its final checkpoint at the run's train.num_steps once that run finished)."""
  tasks = [t for t in sweep.tasks if any(r.task == t for r in sweep.stepped())] or ['(none)']
  figure, axes = _figure(len(tasks))
  for ax, task in zip(axes, tasks):
    drawn = False
    for i, arm in enumerate(sweep.arms):
      points = [(r.step, r.median) for r in sweep.stepped()
                if (r.arm, r.task) == (arm['name'], task) and r.scores]
      final = sweep.final(arm['name'], task)
      run = sweep.pretrain.get(arm.get('pretrain_run') or '')
      if points and final and final.scores and run and run.status == results.FINISHED:
        points.append((run.num_steps, final.median))
      if not points:
        continue
      steps, medians = zip(*sorted(points))
      ax.plot(steps, medians, color=arm_colour(i), marker='o',
              label=arm.get('label', arm['name']))
      drawn = True
    ax.set_title(task)
    ax.set_xlabel('pretraining step')
    ax.set_ylabel('median over seeds (0-100)')
    if drawn:
      ax.legend(fontsize='small')
    else:
      plot.empty(ax)
  plot.save(figure, path)


PLOTS = {'curves': curves, 'downstream': downstream, 'score_vs_compute': score_vs_compute,
         'score_vs_steps': score_vs_steps}


def write(sweep: results.Sweep, directory: str, names: list[str]) -> list[str]:
  """Draws the named plots into directory/<name>.png; returns their paths."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for name in names:
    paths.append(os.path.join(directory, f'{name}.png'))
    PLOTS[name](sweep, paths[-1])
  return paths

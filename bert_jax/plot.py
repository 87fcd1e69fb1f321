"""Curves of runs from their metrics.jsonl: `python -m bert_jax.plot WORKDIR [...] --out=DIR`.

Pretraining workdirs (WORKDIR/metrics.jsonl) draw DIR/curves.png: the total loss, each
objective's loss and accuracy (train solid, eval dashed), the learning rate, the gradient norm,
throughput (seq/s) and MFU, one colour per run. Fine-tuning workdirs (WORKDIR/seed_N/
metrics.jsonl) draw DIR/finetune.png: each seed's train loss, eval loss and eval main metric.
A pretraining run draws its own WORKDIR/plots/curves.png when it finishes.

matplotlib is imported inside the functions (Agg canvas, no pyplot state), so importing this
module needs none. Sizes, dpi and colours are fixed and the PNGs carry no software version: the
same records draw the same bytes. The sweep report (sweep/plots.py) draws with the same helpers.
"""

import argparse
import dataclasses
import json
import os
import re
import sys

DPI = 100
PANEL = (5.0, 3.8)  # Inches per panel (width, height).
# matplotlib's tab10, fixed here so the colours do not depend on the installed style.
COLOURS = ('#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
           '#7f7f7f', '#bcbd22', '#17becf')
# Lines of the same series by split: train solid, eval dashed (further eval splits dotted...).
STYLES = ('-', '--', ':', '-.')
# Record fields that are not a fine-tuning metric.
NOT_METRICS = ('step', 'split', 'epoch', 'eval_split', 'loss')
# The last row of curves.png: (field, title, scale, whether a 0 means "not measured").
TRAINING_PANELS = (('learning_rate', 'learning rate', 1.0, False),
                   ('grad_norm', 'gradient norm', 1.0, False),
                   ('seq_per_s', 'throughput (seq/s)', 1.0, True), ('mfu', 'MFU (%)', 100.0, True))
_SEED_DIR = re.compile(r'seed_(\d+)$')


def colour(index: int) -> str:
  return COLOURS[index % len(COLOURS)]


def figure(rows: int, columns: int):
  """(figure, axes[row][column]): a grid of panels on an Agg canvas."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(PANEL[0] * columns, PANEL[1] * rows), dpi=DPI)
  FigureCanvasAgg(fig)
  return fig, [list(row) for row in fig.subplots(rows, columns, squeeze=False)]


def save(fig, path: str) -> None:
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  fig.tight_layout()
  # No software version in the file: the same data draws the same bytes.
  fig.savefig(path, dpi=DPI, metadata={'Software': None})


def empty(ax, text: str = 'no finished runs') -> None:
  ax.text(0.5, 0.5, text, ha='center', va='center', transform=ax.transAxes, color='gray')


def read_records(path: str) -> list[dict]:
  """metrics.jsonl's records; a line cut short by a crash is skipped."""
  records = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except ValueError:
        continue
  return records


@dataclasses.dataclass(frozen=True)
class Run:
  """One workdir's records: a pretraining run's, or each seed's of a fine-tuning run."""
  label: str  # The legend's name: the workdir's basename, made unique.
  records: tuple = ()  # Pretraining: metrics.jsonl's records.
  seeds: tuple = ()  # Fine-tuning: ((seed, its records), ...) in seed order.
  metric: str | None = None  # Fine-tuning: the eval metric drawn (the task's main one).


def load(workdir: str, label: str) -> Run:
  """WORKDIR/metrics.jsonl, or each WORKDIR/seed_N/metrics.jsonl; FileNotFoundError without."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if os.path.isfile(path):
    return Run(label, records=tuple(read_records(path)))
  seeds = []
  if os.path.isdir(workdir):
    for name in os.listdir(workdir):
      match = _SEED_DIR.match(name)
      if match and os.path.isfile(os.path.join(workdir, name, 'metrics.jsonl')):
        seeds.append((int(match.group(1)), os.path.join(workdir, name, 'metrics.jsonl')))
  if not seeds:
    raise FileNotFoundError(
        f'{path} does not exist, nor does any {os.path.join(workdir, "seed_N", "metrics.jsonl")}'
        f': {workdir!r} is not a pretraining or fine-tuning workdir, or its run has not logged '
        'yet.')
  seeds = tuple((seed, tuple(read_records(p))) for seed, p in sorted(seeds))
  return Run(label, seeds=seeds, metric=main_metric(workdir, seeds))


def main_metric(workdir: str, seeds: tuple) -> str | None:
  """results.json's main metric; before it exists, 'f1' where scored, else the first metric."""
  path = os.path.join(workdir, 'results.json')
  if os.path.isfile(path):
    with open(path, encoding='utf-8') as f:
      metric = json.load(f).get('main_metric')
    if metric:
      return metric
  names = [k for _, records in seeds for r in records if r.get('split') == 'eval'
           for k in r if k not in NOT_METRICS]
  return 'f1' if 'f1' in names else next(iter(names), None)


def labels(workdirs: list[str]) -> list[str]:
  """Each workdir's basename; where two differ and share one, as many parent directories as
  tell them apart; the same directory given twice gets ' (2)', ' (3)'..."""
  paths = [os.path.abspath(w).split(os.sep) for w in workdirs]
  depth = [1] * len(paths)
  while True:
    names = ['/'.join(p[-d:]) for p, d in zip(paths, depth)]
    longer = [i for i, name in enumerate(names) if depth[i] < len(paths[i]) and any(
        names[j] == name and paths[j] != paths[i] for j in range(len(names)))]
    if not longer:
      break
    for i in longer:
      depth[i] += 1
  out = []
  for i, name in enumerate(names):
    repeat = names[:i].count(name)
    out.append(f'{name} ({repeat + 1})' if repeat else name)
  return out


def _points(records, split: str, key: str, scale: float = 1.0, skip_zero: bool = False):
  points = [(r['step'], r[key] * scale) for r in records
            if r.get('split') == split and isinstance(r.get(key), (int, float))]
  # A train interval that timed no step (only the compiling one) logs a throughput of 0.
  return [p for p in points if p[1]] if skip_zero else points


def _line(ax, points, color: str, style: str = '-') -> bool:
  if not points:
    return False
  steps, values = zip(*points)
  ax.plot(steps, values, color=color, linestyle=style, marker='.' if len(points) < 30 else None)
  return True


def _panel(ax, title: str, drawn: bool) -> None:
  ax.set_title(title)
  ax.set_xlabel('step')
  if not drawn:
    empty(ax, 'not in these runs')


def _objectives(runs: list[Run]) -> list[str]:
  """The objective names of '<name>_loss' fields, in the order the records first hold them."""
  names = [k[:-len('_loss')] for run in runs for r in run.records for k in r
           if k.endswith('_loss') and len(k) > len('_loss')]
  return list(dict.fromkeys(names))


def _run_legend(ax, names: list[str], colours: list[str], styles: dict[str, str]) -> None:
  """A legend of the runs' colours and of what each line style means."""
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top
  handles = [Line2D([], [], color=c, label=n) for n, c in zip(names, colours)]
  handles += [Line2D([], [], color='black', linestyle=s, label=n) for n, s in styles.items()]
  ax.legend(handles=handles, fontsize='small')


def draw_pretraining(runs: list[Run], path: str) -> None:
  """curves.png: losses, accuracies, learning rate, gradient norm, seq/s and MFU per run."""
  objectives = _objectives(runs)
  accuracies = [n for n in objectives
                if any(f'{n}_accuracy' in r for run in runs for r in run.records)]
  rows = [[('loss', 'loss', 1.0, False)]
          + [(f'{n}_loss', f'{n} loss', 1.0, False) for n in objectives],
          [(f'{n}_accuracy', f'{n} accuracy', 1.0, False) for n in accuracies],
          list(TRAINING_PANELS)]
  rows = [row for row in rows if row]
  fig, axes = figure(len(rows), max(len(row) for row in rows))
  for row, row_axes in zip(rows, axes):
    for ax in row_axes[len(row):]:
      ax.set_visible(False)
    for ax, (key, title, scale, skip_zero) in zip(row_axes, row):
      drawn = False
      for i, run in enumerate(runs):
        for split, style in zip(('train', 'eval'), STYLES):
          drawn |= _line(ax, _points(run.records, split, key, scale, skip_zero), colour(i), style)
      _panel(ax, title, drawn)
  _run_legend(axes[0][0], [run.label for run in runs], [colour(i) for i in range(len(runs))],
              {'train': STYLES[0], 'eval': STYLES[1]})
  save(fig, path)


def draw_finetuning(runs: list[Run], path: str) -> None:
  """finetune.png: each seed's train loss, eval loss and eval main metric (one colour each)."""
  series = [(f'{run.label} seed {seed}' if len(runs) > 1 else f'seed {seed}', records, run.metric)
            for run in runs for seed, records in run.seeds]
  splits = list(dict.fromkeys(r['eval_split'] for _, records, _ in series for r in records
                              if r.get('split') == 'eval' and 'eval_split' in r))
  styles = dict(zip(splits, STYLES))
  fig, axes = figure(1, 3)
  train_ax, loss_ax, metric_ax = axes[0]
  drawn = [False, False, False]
  for i, (_, records, metric) in enumerate(series):
    drawn[0] |= _line(train_ax, _points(records, 'train', 'loss'), colour(i))
    for split, style in styles.items():
      evals = [r for r in records if r.get('eval_split') == split]
      losses = _points(evals, 'eval', 'loss')
      # A split without targets (SQuAD dev) logs an eval loss of 0.0: not a loss to draw.
      if any(value for _, value in losses):
        drawn[1] |= _line(loss_ax, losses, colour(i), style)
      if metric:
        drawn[2] |= _line(metric_ax, _points(evals, 'eval', metric), colour(i), style)
  metrics = sorted({metric for _, _, metric in series if metric})
  _panel(train_ax, 'train loss', drawn[0])
  _panel(loss_ax, 'eval loss', drawn[1])
  _panel(metric_ax, f'eval {"/".join(metrics) or "metric"} (0-100)', drawn[2])
  _run_legend(train_ax, [name for name, _, _ in series], [colour(i) for i in range(len(series))],
              {})
  if len(styles) > 1:
    _run_legend(metric_ax, [], [], {f'eval on {split}': style for split, style in styles.items()})
  save(fig, path)


def curves(workdirs: list[str], out_dir: str) -> list[str]:
  """Draws the workdirs' curves into out_dir: curves.png of the pretraining runs, finetune.png
  of the fine-tuning runs (each where there are such runs); returns their paths.

  Raises FileNotFoundError naming a workdir without metrics.jsonl, before drawing anything.
  """
  runs = [load(w, label) for w, label in zip(workdirs, labels(workdirs))]
  paths = []
  pretraining = [run for run in runs if not run.seeds]
  if pretraining:
    paths.append(os.path.join(out_dir, 'curves.png'))
    draw_pretraining(pretraining, paths[-1])
  finetuning = [run for run in runs if run.seeds]
  if finetuning:
    paths.append(os.path.join(out_dir, 'finetune.png'))
    draw_finetuning(finetuning, paths[-1])
  return paths


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog='python -m bert_jax.plot', description=__doc__.split(
      '\n', 1)[0])
  parser.add_argument('workdirs', nargs='+', metavar='WORKDIR',
                      help='pretraining or fine-tuning workdirs, drawn together')
  parser.add_argument('--out', required=True, metavar='DIR', help='where the PNGs go')
  args = parser.parse_args(argv)
  try:
    paths = curves(args.workdirs, args.out)
  except FileNotFoundError as e:
    sys.exit(str(e))
  print('\n'.join(paths))


if __name__ == '__main__':
  main()

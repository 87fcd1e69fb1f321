"""Training equivalence: does a fast path (kernels, bf16) train like the float32 XLA path?

    python -m bert_jax.equivalence --config=configs/tiny.py:steps=300 --workdir=runs/eq \
        --config.model.attention_impl=tpu --config.model.dtype=bfloat16

A kernel can match the reference's loss and gradients at a step and still take training
somewhere else over thousands of steps; only training both sees it. The command trains the
config as given (`fast`) and as the float32 XLA path (`reference`: REFERENCE's settings, no
kernel), from the same initialisation on the same batches, and the reference once more from
another initialisation (`reference_seed`: config.init_seed, the batches still config.seed's),
each in WORKDIR/<path>, one after another in this process. It compares their held-out
evaluations (the same batches for all).

The yardstick is measured, not guessed: for each held-out metric, the largest gap between the
two reference runs over the evaluations after step 0 (what another initialisation alone moves
it by). A path is equivalent when, for every metric, its largest gap to the reference stays
within TOLERANCE_FACTOR x that yardstick plus RELATIVE_FLOOR of the metric's size (for a
metric both seeds sit on one plateau of) plus, for an accuracy, its held-out sampling floor (two
models that predict alike differ by binomial noise over the few predictions a small held-out set
has; two seeds can tie there by chance). The table has each evaluation's values per path and,
per path and metric, the largest gap, its step, the tolerance and the verdict;
WORKDIR/equivalence.json keeps it all. Exit status 0 when every path is equivalent, 1 otherwise.

Other paths: `--path=NAME:KEY=VALUE,KEY=VALUE` (config keys, as --config.KEY=VALUE), e.g.
`--path=xla_bf16:model.dtype=bfloat16,model.attention_impl=xla`. `--notrain` judges the runs
WORKDIR/<path> holds, however far they got, training nothing: paths trained side by side (each
`python -m bert_jax.main` with the path's settings) or cut short. docs/equivalence.md says what
was measured.
"""

import copy
import json
import os
import sys

# The float32 XLA path of any config: the same model and data, no kernel, no 16-bit compute,
# threefry dropout masks (rbg and in-kernel masks are other draws of the same function).
REFERENCE = {
    'model.dtype': 'float32', 'model.attention_impl': 'xla', 'model.layer_norm_impl': 'xla',
    'model.ffn_impl': 'xla', 'model.flat_matmuls': False, 'model.dropout_rng_impl': 'threefry',
    'model.long_attention_backward': 'triton', 'model.short_attention_backward': 'triton',
    'train.adam_mu_dtype': 'float32',
}
FAST, REFERENCE_PATH, SEED_PATH = 'fast', 'reference', 'reference_seed'
# A path may drift from the reference by this many times what another initialisation moves it.
# One pair of initialisations is a single draw of that spread: on a 2-layer ELECTRA (CPU, 300
# steps) the fast path's generator accuracy drifted 1.04x the pair's gap, at 1.0 a failed
# verdict on noise; at 1.5 a doubled learning rate on configs/tiny.py (4.6x) is still caught.
TOLERANCE_FACTOR = 1.5
# Added to each tolerance, as a share of the metric's largest reference value: bf16's relative
# precision (8 significant bits). Where both reference runs sit on one plateau (a micro model's
# NSP loss at chance, 0.693: the two seeds 0.0009 apart, bf16 alone 0.003 off) the seeds' gap
# measures no noise; a larger share would hide faults (a doubled learning rate moves configs/
# tiny.py's MLM loss 0.05 off, 4.6x its seeds' gap of 0.011, and 1% of it is 0.065).
RELATIVE_FLOOR = 2.0**-8
# An accuracy (a share of the held-out set's n predictions) may move by this many standard errors
# of a difference of two such shares, sqrt(2 p (1 - p) / n), with p its reference values' and
# n at most 1 / the smallest step between the values any path reports (k/n apart). Without it, a
# micro BERT's 80 held-out predictions at chance (the seeds tied at 1/80) failed a 2/80 gap.
SAMPLING_Z = 2.0
# Eval-record fields that are not training outcomes (settings, timing, the data's floors).
NOT_METRICS = frozenset({
    'step', 'split', 'seq_per_s', 'mfu', 'learning_rate', 'mlm_baseline_accuracy',
    'unigram_loss', 'rtd_disc_prior_loss', 'alarms'})


def parse_path(text: str) -> tuple[str, dict]:
  """'NAME:KEY=VALUE,KEY=VALUE' -> (NAME, {KEY: VALUE}); values parsed as JSON where they can be
  (numbers, true/false), else kept as text. ValueError naming the malformed part."""
  name, sep, rest = text.partition(':')
  if not sep or not name.strip() or not rest.strip():
    raise ValueError(f'--path={text!r}: use NAME:KEY=VALUE[,KEY=VALUE...], e.g. '
                     "'xla_bf16:model.dtype=bfloat16'.")
  overrides = {}
  for item in rest.split(','):
    key, sep, value = item.partition('=')
    if not sep or not key.strip():
      raise ValueError(f'--path={text!r}: {item!r} is not KEY=VALUE.')
    try:
      overrides[key.strip()] = json.loads(value.strip().replace('True', 'true')
                                          .replace('False', 'false'))
    except ValueError:
      overrides[key.strip()] = value.strip()
  return name.strip(), overrides


def paths_for(config, extra: dict | None = None) -> dict[str, dict]:
  """{path: its overrides of `config`}: fast (none), reference, reference_seed, then `extra`."""
  seed = config.get('init_seed', -1)
  other = (config.seed if seed < 0 else seed) + 1
  return {FAST: {}, REFERENCE_PATH: dict(REFERENCE),
          SEED_PATH: {**REFERENCE, 'init_seed': other}, **(extra or {})}


def with_overrides(config, overrides: dict, where: str = 'equivalence path'):
  """A copy of `config` with {'section.key': value} set as a sweep sets them (types kept); a
  ValueError names an unknown key and the closest known one."""
  from bert_jax.sweep import spec  # pylint: disable=g-import-not-at-top
  config = copy.deepcopy(config)
  spec.apply_overrides(config, overrides, where)
  return config


def read_evals(workdir: str) -> dict[int, dict]:
  """{step: eval record} of a run's metrics.jsonl (the last record of a step wins)."""
  from bert_jax import plot  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.isfile(path):
    return {}
  return {int(r['step']): r for r in plot.read_records(path) if r.get('split') == 'eval'}


def run(config, workdir: str, paths: dict[str, dict],
        train: bool = True) -> dict[str, dict[int, dict]]:
  """Trains `config` with each path's overrides in WORKDIR/<path> (a finished path is read, not
  trained again; with `train` False none is trained: the evaluations each has so far, as of runs
  trained elsewhere, side by side or cut short); {path: {step: eval record}}."""
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  runs = {}
  for name, overrides in paths.items():
    path_dir = os.path.join(workdir, name)
    if train and not os.path.isfile(os.path.join(path_dir, 'eval_results.json')):
      pretrain.train_and_evaluate(with_overrides(config, overrides), path_dir)
    runs[name] = read_evals(path_dir)
  return runs


def metric_names(runs: dict[str, dict[int, dict]]) -> list[str]:
  """The numeric training outcomes the reference's evaluations report, sorted."""
  names = set()
  for record in runs.get(REFERENCE_PATH, {}).values():
    names |= {k for k, v in record.items() if k not in NOT_METRICS
              and isinstance(v, (int, float)) and not isinstance(v, bool)}
  return sorted(names)


def largest_gap(runs: dict, path: str, metric: str) -> tuple[float, int | None]:
  """(largest |path - reference| of `metric` over the evaluations after step 0 that both have,
  its step); a NaN on either side is an infinite gap; (0.0, None) with none shared."""
  reference, evals = runs[REFERENCE_PATH], runs[path]
  worst, at = 0.0, None
  for step in sorted(set(reference) & set(evals)):
    a, b = evals[step].get(metric), reference[step].get(metric)
    if step == 0 or a is None or b is None:
      continue
    gap = abs(a - b)
    gap = gap if gap == gap else float('inf')  # NaN.
    if at is None or gap > worst:
      worst, at = gap, step
  return worst, at


def sampling_floor(runs: dict[str, dict[int, dict]], metric: str) -> float:
  """SAMPLING_Z standard errors of a difference of two accuracies over the held-out set (0.0
  for a metric that is not an accuracy, or with fewer than two distinct values to size n by)."""
  if not metric.endswith('_accuracy'):
    return 0.0
  values = sorted({r[metric] for evals in runs.values() for r in evals.values()
                   if isinstance(r.get(metric), (int, float)) and r[metric] == r[metric]})
  steps = [b - a for a, b in zip(values, values[1:]) if b - a > 1e-9]
  if not steps:
    return 0.0
  n = 1.0 / min(steps)  # At most the predictions' count: the floor errs wide.
  variance = max(p * (1.0 - p) for p in (
      min(max(r[metric], 0.0), 1.0) for r in runs[REFERENCE_PATH].values() if metric in r))
  return SAMPLING_Z * (2.0 * variance / n) ** 0.5


def judge(runs: dict[str, dict[int, dict]], factor: float = TOLERANCE_FACTOR) -> dict:
  """Per path but the two references: per metric the largest gap to the reference, its step,
  the tolerance (factor x the references' largest gap + RELATIVE_FLOOR x the metric's largest
  reference value + an accuracy's `sampling_floor`) and whether it is within; and `equivalent`
  (None when no evaluation after step 0 is shared)."""
  for needed in (REFERENCE_PATH, SEED_PATH):
    if needed not in runs:
      raise ValueError(f'judge needs the {needed!r} path: the yardstick is the gap between '
                       f'{REFERENCE_PATH!r} and {SEED_PATH!r}.')
  metrics = metric_names(runs)
  yardstick = {m: largest_gap(runs, SEED_PATH, m)[0] for m in metrics}
  size = {m: max((abs(r[m]) for s, r in runs[REFERENCE_PATH].items() if s and m in r),
                 default=0.0) for m in metrics}
  floor = {m: sampling_floor(runs, m) for m in metrics}
  out = {'yardstick': yardstick, 'sampling_floor': floor, 'factor': factor, 'paths': {}}
  for path in runs:
    if path in (REFERENCE_PATH, SEED_PATH):
      continue
    gaps = {}
    for metric in metrics:
      gap, step = largest_gap(runs, path, metric)
      if step is None:
        continue
      tolerance = factor * yardstick[metric] + RELATIVE_FLOOR * size[metric] + floor[metric]
      gaps[metric] = {'largest_gap': gap, 'at_step': step, 'tolerance': tolerance,
                      'within': gap <= tolerance}
    out['paths'][path] = {'gaps': gaps,
                          'equivalent': all(g['within'] for g in gaps.values()) if gaps else None}
  return out


def table(runs: dict[str, dict[int, dict]], verdict: dict) -> str:
  """Markdown: each evaluation's metrics per path, then each path's gaps and verdict."""
  paths, metrics = list(runs), metric_names(runs)
  steps = sorted(set().union(*[set(e) for e in runs.values()])) if runs else []
  lines = ['| step | metric | ' + ' | '.join(paths) + ' |', '|---|---|' + '---|' * len(paths)]
  for step in steps:
    for metric in metrics:
      values = [runs[p].get(step, {}).get(metric) for p in paths]
      lines.append(f'| {step} | {metric} | '
                   + ' | '.join('' if v is None else f'{v:.4f}' for v in values) + ' |')
  lines += ['', f'| path | metric | largest gap to {REFERENCE_PATH} | at step | yardstick '
                f'({SEED_PATH}) | tolerance | within |', '|---|---|---|---|---|---|---|']
  words = {True: 'equivalent', False: 'NOT equivalent', None: 'no shared evaluation'}
  for path, result in verdict['paths'].items():
    for metric, g in result['gaps'].items():
      lines.append(f'| {path} | {metric} | {g["largest_gap"]:.4f} | {g["at_step"]} | '
                   f'{verdict["yardstick"][metric]:.4f} | {g["tolerance"]:.4f} | '
                   f'{"yes" if g["within"] else "NO"} |')
    lines.append(f'| {path} | all | | | | | {words[result["equivalent"]]} |')
  return '\n'.join(lines)


def main(argv=None) -> int:
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, 'The fast path\'s config.', flag_values=values)
  flags.DEFINE_string('workdir', None, 'Holds a run per path.', flag_values=values)
  flags.DEFINE_multi_string('path', [], 'NAME:KEY=VALUE,... (repeatable).', flag_values=values)
  flags.DEFINE_float('factor', TOLERANCE_FACTOR, 'Tolerance: this x the yardstick.',
                     flag_values=values)
  flags.DEFINE_bool('train', True, 'False: judge the evaluations WORKDIR/<path> hold (runs '
                    'trained elsewhere, e.g. side by side on one GPU), training nothing.',
                    flag_values=values)
  values(sys.argv if argv is None else argv)
  if values.config is None or not values.workdir:
    raise SystemExit('usage: python -m bert_jax.equivalence --config=FILE[:ARGS] '
                     '--workdir=DIR [--config.KEY=VALUE ...] [--path=NAME:KEY=VALUE,...]')
  try:
    extra = dict(parse_path(p) for p in values.path)
    paths = paths_for(values.config, extra)
    for name, overrides in paths.items():
      with_overrides(values.config, overrides, f'--path {name}')
  except ValueError as e:
    raise SystemExit(f'Invalid path: {e}') from None
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  try:
    runs = run(values.config, values.workdir, paths, values.train)
  except config_lib.ConfigError as e:
    raise SystemExit(f'Invalid config: {e}') from None
  verdict = judge(runs, values.factor)
  print(table(runs, verdict))
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  files.write_text(os.path.join(values.workdir, 'equivalence.json'), json.dumps(
      {'paths': paths, 'evals': {p: list(r.values()) for p, r in runs.items()},
       'verdict': verdict}, indent=1))
  return 0 if all(r['equivalent'] for r in verdict['paths'].values()) else 1


def run_command() -> None:
  """`python -m bert_jax.equivalence`: config files import `configs.base`, so the repository
  root goes on the path first."""
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  sys.exit(main())

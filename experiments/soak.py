"""Soak test: hundreds of SIGKILL/restart cycles of one training run, then compare with a clean run.

  python experiments/soak.py --cycles=200 --workdir=/tmp/soak [--config=configs/tiny.py]
      [-- --config.KEY=VALUE ...]

Each cycle starts `python -m bert_jax.main` on the same workdir and SIGKILLs it after a random
delay, uniform in [--min_delay, --max_delay] seconds, counted from launch for --startup_share of
the cycles (kills in imports, data preparation, restore, compilation) and from the process's first
logged train step for the others (kills in train steps, evaluations and checkpoint writes). After the cycles, the same command runs to the
end, and its final parameters are compared with an uninterrupted run in WORKDIR/reference. A run
that finishes inside the cycles is compared too, and the cycles go on with a fresh run
(WORKDIR/run0, run1, ...).

With --corrupt_share, that share of the kills is followed by a single-bit flip (a random bit of a
random file) in the newest complete checkpoint, when an older one exists. Each flip is judged at
once by restoring the damaged step with plain orbax (to the untouched copy's shapes and
shardings, as the run restores) beside that copy: "damaging" when
the arrays or the data position read differ (or cannot be read), "harmless" when it hit bytes no
value depends on. The next restore must then not resume from a damaged step
(`loaded_damaged`, which must be 0); the final bit-identical comparison checks the rest.

Reported per cycle (WORKDIR/soak.jsonl) and in total (printed JSON): the step the run had logged
before the kill, the step it had resumed from, the progress lost (logged steps beyond the newest
complete checkpoint: at most checkpoint_every if checkpoints are sound), whether a checkpoint
write was in flight at the kill (an orbax temporary directory left behind), and any cycle that
resumed from an earlier step than the one before it (there must be none).
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_FLAGS = ['--config.train.checkpoint_every=10', '--config.train.log_every=10',
                 '--config.train.keep_checkpoints=2']


def main_command(config, workdir, extra):
  return [sys.executable, '-m', 'bert_jax.main', f'--config={config}', f'--workdir={workdir}',
          *DEFAULT_FLAGS, *extra]


def logged_step(workdir) -> int:
  """The newest train step in metrics.jsonl (0 if none)."""
  path = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(path):
    return 0
  step = 0
  with open(path, encoding='utf-8') as f:
    for line in f:
      try:
        record = json.loads(line)
      except json.JSONDecodeError:  # A line cut by the kill.
        continue
      if record.get('split') == 'train':
        step = max(step, record['step'])
  return step


def _training(stderr_path) -> bool:
  """Whether this process has logged a train step (`step N/M | ...`): it is in the step loop."""
  with open(stderr_path, encoding='utf-8', errors='replace') as f:
    return re.search(r'\] step \d+/\d+ \|', f.read()) is not None


def checkpoint_dirs(workdir):
  directory = os.path.join(workdir, 'checkpoints')
  return os.listdir(directory) if os.path.isdir(directory) else []


def final_params(workdir, step):
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  return ocp.StandardCheckpointer().restore(path)['params']


def max_param_diff(a, b) -> float:
  """The largest difference of two trees' values (inf where the structures or shapes differ or
  a value is NaN on one side only)."""
  a, b = _leaves(a), _leaves(b)
  if len(a) != len(b):
    return float('inf')
  diff = 0.0
  for x, y in zip(a, b):
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape:
      return float('inf')
    if x.size:
      with np.errstate(invalid='ignore'):
        d = np.abs(x.astype(np.float64) - y.astype(np.float64))
      same_nan = np.isnan(x.astype(np.float64)) & np.isnan(y.astype(np.float64))
      d = np.where(same_nan, 0.0, np.nan_to_num(d, nan=np.inf))
      diff = max(diff, float(np.max(d)))
  return diff


def read_step(step_dir, like=None):
  """(arrays, data position) of a checkpoint step read by plain orbax, with no checks of ours.
  With `like` (arrays read before), restored to its shapes, dtypes and shardings, as the run
  restores: orbax's record of the saved placement (`_sharding`) is then not read."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  target = None if like is None else jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
  arrays = ocp.StandardCheckpointer().restore(os.path.join(step_dir, 'state'), target)
  with open(os.path.join(step_dir, 'data', 'metadata'), encoding='utf-8') as f:
    return arrays, json.load(f)


def flip_one_bit(run_dir, rng, scratch, num_steps):
  """Flips one random bit of the newest complete checkpoint; returns what was hit and whether it
  changes what a restore reads (None when there is no older checkpoint to fall back to, or the
  newest is the run's last, which the soak compares with the reference)."""
  steps = sorted(int(name) for name in checkpoint_dirs(run_dir) if name.isdigit())
  if len(steps) < 2 or steps[-1] >= num_steps:
    return None
  step_dir = os.path.join(run_dir, 'checkpoints', str(steps[-1]))
  pristine = os.path.join(scratch, 'pristine')
  shutil.rmtree(pristine, ignore_errors=True)
  shutil.copytree(step_dir, pristine)
  files = sorted(os.path.join(root, name) for root, _, names in os.walk(step_dir)
                 for name in names if os.path.getsize(os.path.join(root, name)))
  path = rng.choice(files)
  offset, bit = rng.randrange(os.path.getsize(path)), rng.randrange(8)
  with open(path, 'r+b') as f:
    f.seek(offset)
    byte = f.read(1)[0]
    f.seek(offset)
    f.write(bytes([byte ^ (1 << bit)]))
  before = read_step(pristine)
  try:
    after = read_step(step_dir, like=before[0])
    damaging = after[1] != before[1] or max_param_diff(after[0], before[0]) != 0.0 or any(
        np.asarray(x).dtype != np.asarray(y).dtype for x, y in zip(_leaves(after[0]),
                                                                  _leaves(before[0])))
  except Exception:  # pylint: disable=broad-except
    damaging = True
  return {'step': steps[-1], 'file': os.path.relpath(path, step_dir), 'offset': offset,
          'bit': bit, 'damaging': damaging}


def _leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.leaves(tree)


def num_steps_of(workdir) -> int:
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    return json.load(f)['train']['num_steps']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--cycles', type=int, default=200)
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--config', default='configs/tiny.py')
  parser.add_argument('--min_delay', type=float, default=4.0)
  parser.add_argument('--max_delay', type=float, default=16.0)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--startup_share', type=float, default=0.2,
                      help='Share of cycles killed during start-up (delay from launch).')
  parser.add_argument('--corrupt_share', type=float, default=0.0,
                      help='Share of kills followed by a single-bit flip in the newest checkpoint.')
  parser.add_argument('--finish', action='store_true',
                      help='No cycles: finish and summarise a soak whose loop was stopped.')
  parser.add_argument('extra', nargs='*', help='--config.KEY=VALUE overrides, after --')
  args = parser.parse_args()
  rng = random.Random(args.seed)
  workdir = os.path.abspath(args.workdir)
  reference = os.path.join(workdir, 'reference')
  os.makedirs(workdir, exist_ok=True)
  log_path = os.path.join(workdir, 'soak.jsonl')

  if not os.path.exists(os.path.join(reference, 'eval_results.json')):
    print('Reference run...', flush=True)
    subprocess.run(main_command(args.config, reference, args.extra), cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  num_steps = num_steps_of(reference)
  if args.finish:
    finish_interrupted(args, workdir, reference, num_steps)
    return

  cycles, previous_resume, finished_runs = [], 0, []
  pending_flip = None  # The flip made after the previous kill, until a run restores.
  start = time.time()
  for cycle in range(args.cycles):
    run_dir = os.path.join(workdir, f'run{len(finished_runs)}')
    delay = rng.uniform(args.min_delay, args.max_delay)
    stderr_path = os.path.join(workdir, 'cycle.stderr')
    in_startup = rng.random() < args.startup_share
    with open(stderr_path, 'w', encoding='utf-8') as stderr:
      process = subprocess.Popen(main_command(args.config, run_dir, args.extra), cwd=REPO,
                                 stdout=subprocess.DEVNULL, stderr=stderr)
      if not in_startup:
        # Start-up (imports, data, compilation) takes seconds that vary with the machine's
        # load: the delay counts from the first train step (or the restore) on.
        while process.poll() is None and not _training(stderr_path):
          time.sleep(0.05)
      try:
        process.wait(timeout=delay)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    with open(stderr_path, encoding='utf-8', errors='replace') as f:
      log = f.read()
    match = re.search(r'Resumed from step (\d+)', log)
    resumed = int(match.group(1)) if match else None  # None: killed before restoring.
    flip_judged, loaded_damaged = None, False
    if pending_flip is not None and (resumed is not None or 'Restored the previous' in log):
      flip_judged = pending_flip
      loaded_damaged = pending_flip['damaging'] and resumed == pending_flip['step']
      pending_flip = None
    reached = logged_step(run_dir)
    saved = [int(name) for name in checkpoint_dirs(run_dir) if name.isdigit()]
    record = {
        'cycle': cycle, 'time': round(time.time(), 1), 'delay_s': round(delay, 2),
        'in_startup': in_startup,
        'killed': process.returncode == -9,
        'returncode': process.returncode, 'resumed_from': resumed, 'logged_step': reached,
        'newest_checkpoint': max(saved, default=0),
        # Progress logged before the kill that no complete checkpoint holds.
        'lost_steps': max(0, reached - max(saved, default=0)),
        'save_in_flight': any('tmp' in name for name in checkpoint_dirs(run_dir)),
        # Back to an older step than the last resume: only after a damaging flip fell back.
        'went_back': resumed is not None and resumed < previous_resume and not (
            flip_judged and flip_judged['damaging']),
        'flip_judged': flip_judged, 'loaded_damaged': loaded_damaged,
        'error': None if process.returncode in (0, -9) else log.strip().splitlines()[-1:],
    }
    if (process.returncode == -9 and args.corrupt_share and pending_flip is None
        and rng.random() < args.corrupt_share):
      pending_flip = flip_one_bit(run_dir, rng, workdir, num_steps)
      record['flipped'] = pending_flip
    cycles.append(record)
    previous_resume = resumed if resumed is not None else previous_resume
    with open(log_path, 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')
    print(f'cycle {cycle}: delay {delay:.1f}s resumed {resumed} logged {reached} '
          f'in-flight {record["save_in_flight"]} rc {process.returncode}', flush=True)
    if process.returncode == 0 or record['newest_checkpoint'] == num_steps:
      # This run finished inside a cycle: compare it, and go on killing a fresh run.
      finished_runs.append(max_param_diff(final_params(run_dir, num_steps),
                                          final_params(reference, num_steps)))
      print(f'run {len(finished_runs) - 1} finished: max |param diff| {finished_runs[-1]}',
            flush=True)
      previous_resume = 0

  finish(args, workdir, reference, num_steps, cycles, finished_runs, time.time() - start)


def finish(args, workdir, reference, num_steps, cycles, finished_runs, seconds):
  """Runs the last run to its end, compares it with the reference, writes the summary."""
  run_dir = os.path.join(workdir, f'run{len(finished_runs)}')
  final = subprocess.run(main_command(args.config, run_dir, args.extra), cwd=REPO, text=True,
                         capture_output=True, check=False)
  finished_runs.append(max_param_diff(final_params(run_dir, num_steps),
                                      final_params(reference, num_steps)))
  diff = max(finished_runs)
  lost = [c['lost_steps'] for c in cycles if c['killed']]
  summary = {
      'cycles': len(cycles), 'kills': sum(c['killed'] for c in cycles),
      'kills_before_restore': sum(c['killed'] and c['resumed_from'] is None for c in cycles),
      'kills_with_save_in_flight': sum(c['save_in_flight'] for c in cycles),
      'errors': [c['error'] for c in cycles if c['error']],
      'went_back': sum(c['went_back'] for c in cycles),
      'bit_flips': sum(bool(c.get('flipped')) for c in cycles),
      'damaging_flips': sum(bool(c.get('flipped') and c['flipped']['damaging']) for c in cycles),
      'loaded_damaged': sum(bool(c.get('loaded_damaged')) for c in cycles),
      'fell_back_after_flip': sum(bool(c.get('flip_judged') and c['flip_judged']['damaging']
                                       and not c['loaded_damaged']) for c in cycles),
      'max_lost_steps': max(lost, default=0),
      'mean_lost_steps': sum(lost) / max(len(lost), 1),
      'final_run_returncode': final.returncode, 'num_steps': num_steps,
      'runs_completed': len(finished_runs), 'final_params_max_abs_diff': diff,
      'identical': diff == 0.0,
      'cycle_minutes': round(seconds / 60, 1),
  }
  print(json.dumps(summary), flush=True)
  with open(os.path.join(workdir, 'soak_summary.json'), 'w', encoding='utf-8') as f:
    json.dump(summary, f, indent=2)
  stderr_path = os.path.join(workdir, 'cycle.stderr')
  if os.path.exists(stderr_path):
    shutil.copy(stderr_path, os.path.join(workdir, 'last_cycle.stderr'))


def finish_interrupted(args, workdir, reference, num_steps):
  """--finish: the summary of a soak whose cycle loop was stopped (from WORKDIR/soak.jsonl)."""
  with open(os.path.join(workdir, 'soak.jsonl'), encoding='utf-8') as f:
    cycles = [json.loads(line) for line in f if line.strip()]
  finished_runs = []
  while os.path.isdir(os.path.join(workdir, f'run{len(finished_runs)}', 'checkpoints',
                                   str(num_steps))):
    run_dir = os.path.join(workdir, f'run{len(finished_runs)}')
    finished_runs.append(max_param_diff(final_params(run_dir, num_steps),
                                        final_params(reference, num_steps)))
  times = [c['time'] for c in cycles if 'time' in c]
  seconds = times[-1] - times[0] if len(times) > 1 else 0.0
  finish(args, workdir, reference, num_steps, cycles, finished_runs, seconds)


if __name__ == '__main__':
  main()

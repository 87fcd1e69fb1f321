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
resumed from an earlier step than the one before it (there must be none). A stage that fails
(exits neither 0 nor killed) 3 cycles in a row ends the soak with a `stuck` summary and exit
status 1: a restart that cannot get on is a finding, not a cycle to repeat.

With --pipeline, each run is a researcher's whole path, and the kills land anywhere along it:
pretraining (WORKDIR/runK/pretrain), `bert_jax.convert export` of its final checkpoint
(runK/hf), and GLUE MRPC fine-tuning from it (runK/finetune: 2 seeds of --finetune_examples
rows, batch 16, a checkpoint every 4 steps). A stage that exits 0 is done and the next cycle starts the next
one. Bit flips then also hit an in-progress fine-tuning seed's newest checkpoint, and, before a
run's first export attempt, a copy of its final pretraining checkpoint, which is exported at
once: a damaging flip must be refused (`exported_damaged`, which must be 0), a harmless one must
export the reference's bytes. A finished pipeline is compared with the reference's: pretraining
parameters, the exported model.safetensors and config.json, each fine-tuning seed's final
parameters and its dev metrics.
"""

import argparse
import gc
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
# A stage that fails (exits neither 0 nor killed) this many cycles in a row is stuck: a rerun of
# the same command cannot get past what it found, so the soak stops and says so.
STUCK_AFTER = 3


def main_command(config, workdir, extra):
  return [sys.executable, '-m', 'bert_jax.main', f'--config={config}', f'--workdir={workdir}',
          *DEFAULT_FLAGS, *extra]


def with_cache(command, cache):
  """The command with JAX's persistent compilation cache in `cache` ('' for none): restarts skip
  most compilation, and kills then also land in cache writes."""
  return command + ([f'--config.train.compilation_cache_dir={cache}'] if cache else [])


def export_command(pretrain_dir, out):
  return [sys.executable, '-m', 'bert_jax.convert', 'export', f'--workdir={pretrain_dir}',
          f'--out={out}']


def finetune_command(pretrain_dir, workdir, examples):
  return [sys.executable, '-m', 'bert_jax.main',
          f'--config=configs/glue.py:task=mrpc,init={pretrain_dir},seeds=2,seq=64,epochs=1,batch=16',
          f'--workdir={workdir}', f'--config.task.max_train_examples={examples}',
          '--config.train.checkpoint_every=4', '--config.train.keep_checkpoints=2',
          '--config.train.log_every=4']


def stages(args, run_dir):
  """[(name, command, workdir)] of one run: pretraining alone, or with --pipeline the whole path."""
  if not args.pipeline:
    return [('pretrain', with_cache(main_command(args.config, run_dir, args.extra), args.cache),
             run_dir)]
  pretrain, out, finetune = (os.path.join(run_dir, name) for name in ('pretrain', 'hf',
                                                                      'finetune'))
  return [('pretrain', with_cache(main_command(args.config, pretrain, args.extra), args.cache),
           pretrain),
          ('export', export_command(pretrain, out), out),
          ('finetune', with_cache(finetune_command(pretrain, finetune, args.finetune_examples),
                                  args.cache), finetune)]


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
  """Whether this process has logged a train step (`step N/M | ...`, fine-tuning's
  `seed S step N/M | ...`): it is in the step loop."""
  with open(stderr_path, encoding='utf-8', errors='replace') as f:
    return re.search(r'\] (seed \d+ )?step \d+/\d+ \|', f.read()) is not None


def checkpoint_dirs(workdir):
  directory = os.path.join(workdir, 'checkpoints')
  return os.listdir(directory) if os.path.isdir(directory) else []


def final_params(workdir, step, like=None):
  """The parameters of checkpoint `step`; with `like` (a state read before), read to its shapes
  and shardings as a run restores, so orbax's record of the saved placement, which a harmless
  bit flip may have hit, is not read."""
  return read_step(os.path.join(workdir, 'checkpoints', str(step)), like)[0]['params']


def final_state(workdir, step):
  return read_step(os.path.join(workdir, 'checkpoints', str(step)))[0]


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
  previous = sys.unraisablehook
  sys.unraisablehook = lambda unraisable: None  # A failed read's abandoned callbacks' echoes.
  try:
    arrays = ocp.StandardCheckpointer().restore(os.path.join(step_dir, 'state'), target)
  finally:
    gc.collect()
    sys.unraisablehook = previous
    # Callbacks of an abandoned read that fire later: their 'Event loop is closed', as commands
    # drop it (the soak's own reads of damaged steps printed dozens of these tracebacks).
    if REPO not in sys.path:
      sys.path.insert(0, REPO)
    from bert_jax.core import errors  # pylint: disable=g-import-not-at-top
    errors.quiet_closed_loop_echoes()
  with open(os.path.join(step_dir, 'data', 'metadata'), encoding='utf-8') as f:
    return arrays, json.load(f)


def flip_one_bit(run_dir, rng, scratch, num_steps, allow_single=False):
  """Flips one random bit of the newest complete checkpoint; returns what was hit and whether it
  changes what a restore reads (None when there is no older checkpoint to fall back to, unless
  `allow_single`, or the newest is the run's last, which the soak compares with the reference)."""
  steps = sorted(int(name) for name in checkpoint_dirs(run_dir) if name.isdigit())
  if not steps or (len(steps) < 2 and not allow_single) or steps[-1] >= num_steps:
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
  parser.add_argument('--cache', default='',
                      help='A persistent compilation cache directory for every run (default none).')
  parser.add_argument('--pipeline', action='store_true',
                      help='Each run pretrains, exports and fine-tunes; kills land in all three.')
  parser.add_argument('--finetune_examples', type=int, default=512,
                      help='--pipeline: MRPC training rows per fine-tuning seed.')
  parser.add_argument('--export_max_delay', type=float, default=6.0,
                      help='--pipeline: an export is killed after 1 to this many seconds from '
                      'launch (it takes about 6 s on 2 idle CPU cores: some finish); after 3 '
                      'kills in a row the next one runs to its end.')
  parser.add_argument('--finish', action='store_true',
                      help='No cycles: finish and summarise a soak whose loop was stopped.')
  parser.add_argument('extra', nargs='*', help='--config.KEY=VALUE overrides, after --')
  args = parser.parse_args()
  rng = random.Random(args.seed)
  workdir = os.path.abspath(args.workdir)
  reference = os.path.join(workdir, 'reference')
  os.makedirs(workdir, exist_ok=True)
  log_path = os.path.join(workdir, 'soak.jsonl')

  if not all(done_before(name, directory) for name, _, directory in
             stages(args, reference)):
    print('Reference run...', flush=True)
    for name, command, directory in stages(args, reference):
      if not done_before(name, directory):
        subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
  num_steps = num_steps_of(pretrain_dir(args, reference))
  if args.finish:
    finish_interrupted(args, workdir, reference, num_steps)
    return

  cycles, previous_resume, finished_runs = [], 0, []
  pending_flip = None  # The flip made after the previous kill, until a run restores.
  stage = 0  # Index in stages() of the current run's stage.
  export_probed = False  # Whether the current run's final checkpoint had its export probe.
  export_kills = 0  # Exports killed in a row.
  failed = []  # The cycles in a row whose stage failed.
  start = time.time()
  for cycle in range(args.cycles):
    run_dir = os.path.join(workdir, f'run{len(finished_runs)}')
    name, command, directory = stages(args, run_dir)[stage]
    export_probe = None
    if name == 'export' and not export_probed:
      export_probed = True
      if args.corrupt_share and rng.random() < args.corrupt_share:
        export_probe = probe_export(pretrain_dir(args, run_dir), rng, workdir,
                                    os.path.join(reference, 'hf'))
    delay = rng.uniform(*((1.0, args.export_max_delay) if name == 'export' else
                          (args.min_delay, args.max_delay)))
    if name == 'export' and export_kills >= 3:
      delay = 3600.0  # On a loaded machine an export can outlast every delay: let this one end.
    stderr_path = os.path.join(workdir, 'cycle.stderr')
    in_startup = name == 'export' or rng.random() < args.startup_share
    seed_dir = current_seed_dir(directory) if name == 'finetune' else directory
    with open(stderr_path, 'w', encoding='utf-8') as stderr:
      process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr)
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
    resumed = resumed_step(log, name, pending_flip)
    flip_judged, loaded_damaged = None, False
    if pending_flip is not None and pending_flip['stage'] == name and (
        resumed is not None or 'Restored the previous' in log):
      flip_judged = pending_flip
      loaded_damaged = pending_flip['damaging'] and resumed == pending_flip['step']
      pending_flip = None
    if name == 'finetune':
      seed_dir = current_seed_dir(directory) or seed_dir
    reached = logged_step(seed_dir) if seed_dir else 0
    saved = [int(n) for n in checkpoint_dirs(seed_dir) if n.isdigit()] if seed_dir else []
    record = {
        'cycle': cycle, 'time': round(time.time(), 1), 'stage': name, 'delay_s': round(delay, 2),
        'in_startup': in_startup,
        'killed': process.returncode == -9,
        'returncode': process.returncode, 'resumed_from': resumed, 'logged_step': reached,
        'newest_checkpoint': max(saved, default=0),
        # Progress logged before the kill that no complete checkpoint holds.
        'lost_steps': max(0, reached - max(saved, default=0)),
        'save_in_flight': any('tmp' in n for n in checkpoint_dirs(seed_dir)) if seed_dir else False,
        # Back to an older step than the last resume: only after a damaging flip fell back.
        'went_back': name == 'pretrain' and resumed is not None and resumed < previous_resume
                     and not (flip_judged and flip_judged['damaging']),
        'flip_judged': flip_judged, 'loaded_damaged': loaded_damaged,
        'export_probe': export_probe,
        'error': None if process.returncode in (0, -9) else log.strip().splitlines()[-1:],
    }
    export_kills = export_kills + 1 if name == 'export' and process.returncode == -9 else 0
    if (process.returncode == -9 and args.corrupt_share and pending_flip is None
        and name != 'export' and rng.random() < args.corrupt_share):
      if name == 'pretrain':
        pending_flip = flip_one_bit(directory, rng, workdir, num_steps)
      elif seed_dir:
        pending_flip = flip_one_bit(seed_dir, rng, workdir, float('inf'))
      if pending_flip:
        pending_flip.update(stage=name, seed_dir=seed_dir)
      record['flipped'] = pending_flip
    cycles.append(record)
    if name == 'pretrain':
      previous_resume = resumed if resumed is not None else previous_resume
    with open(log_path, 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')
    print(f'cycle {cycle}: {name} delay {delay:.1f}s resumed {resumed} logged {reached} '
          f'in-flight {record["save_in_flight"]} rc {process.returncode}', flush=True)
    failed = failed + [record] if record['error'] else []
    if len(failed) >= STUCK_AFTER:
      stop_stuck(workdir, failed, cycles, time.time() - start)
    finished = process.returncode == 0 or (
        not args.pipeline and record['newest_checkpoint'] == num_steps)
    if not finished:
      continue
    if name == 'finetune' and pending_flip and pending_flip['stage'] == 'finetune':
      pending_flip = None  # Its seed ended; the flip was never restored (judged by the compare).
    stage += 1
    if stage < len(stages(args, run_dir)):
      continue
    # This run finished inside a cycle: compare it, and go on killing a fresh run.
    finished_runs.append(compare_run(args, run_dir, reference, num_steps))
    print(f'run {len(finished_runs) - 1} finished: {finished_runs[-1]}', flush=True)
    stage, previous_resume, export_probed, pending_flip = 0, 0, False, None

  finish(args, workdir, reference, num_steps, cycles, finished_runs, time.time() - start,
         stage)


def pretrain_dir(args, run_dir):
  return os.path.join(run_dir, 'pretrain') if args.pipeline else run_dir


def done_before(name, directory) -> bool:
  """Whether a stage (its name, its output directory) has its outputs: a reference run that was
  cut goes on from there, an interrupted soak's last run is finished from its first stage
  without them."""
  if name == 'pretrain':
    return os.path.exists(os.path.join(directory, 'eval_results.json'))
  if name == 'export':
    return os.path.exists(os.path.join(directory, 'model.safetensors'))
  return os.path.exists(os.path.join(directory, 'results.json'))


def resumed_step(log, name, pending_flip):
  """The step this process resumed from (None: killed before restoring, or nothing to resume).
  Fine-tuning: the seed of the pending flip's, else the last seed that resumed."""
  if name == 'pretrain':
    match = re.search(r'Resumed from step (\d+)', log)
    return int(match.group(1)) if match else None
  if name != 'finetune':
    return None
  matches = re.findall(r'Seed (\d+): resumed from step (\d+)', log)
  if pending_flip and pending_flip.get('seed_dir'):
    seed = os.path.basename(pending_flip['seed_dir']).removeprefix('seed_')
    matches = [m for m in matches if m[0] == seed]
  return int(matches[-1][1]) if matches else None


def current_seed_dir(finetune_dir):
  """The fine-tuning seed in progress: the first seed_N without results.json (None before any)."""
  if not os.path.isdir(finetune_dir):
    return None
  seeds = sorted((n for n in os.listdir(finetune_dir) if re.fullmatch(r'seed_\d+', n)),
                 key=lambda n: int(n[5:]))
  for name in seeds:
    if not os.path.exists(os.path.join(finetune_dir, name, 'results.json')):
      return os.path.join(finetune_dir, name)
  return None


def probe_export(pretrain, rng, scratch, reference_hf):
  """Flips one random bit of a copy of the run's final checkpoint and exports the copy: a
  damaging flip must be refused, a harmless one must give the reference's model bytes."""
  copy = os.path.join(scratch, 'export_probe')
  shutil.rmtree(copy, ignore_errors=True)
  shutil.copytree(pretrain, copy, ignore=shutil.ignore_patterns('tensorboard', 'plots', '.lock'))
  steps = sorted(int(n) for n in checkpoint_dirs(copy) if n.isdigit())
  # Steps before the last are out of the export's sight: drop them, so the flip hits what it reads.
  for step in steps[:-1]:
    shutil.rmtree(os.path.join(copy, 'checkpoints', str(step)))
  flip = flip_one_bit(copy, rng, scratch, float('inf'), allow_single=True)
  out = os.path.join(scratch, 'export_probe_hf')
  shutil.rmtree(out, ignore_errors=True)
  result = subprocess.run(export_command(copy, out), cwd=REPO, capture_output=True, text=True,
                          check=False)
  exported = result.returncode == 0
  identical = exported and same_export(out, reference_hf)
  flip.update(exported=exported, identical=identical,
              exported_damaged=exported and flip['damaging'] and not identical,
              refusal=None if exported else result.stderr.strip().splitlines()[-1:])
  shutil.rmtree(copy, ignore_errors=True)
  shutil.rmtree(out, ignore_errors=True)
  return flip


def same_export(out, reference_hf) -> bool:
  """Whether an export holds the reference export's model bytes and config."""
  for name in ('model.safetensors', 'config.json'):
    a, b = os.path.join(out, name), os.path.join(reference_hf, name)
    if not (os.path.exists(a) and os.path.exists(b)):
      return False
    with open(a, 'rb') as f, open(b, 'rb') as g:
      if f.read() != g.read():
        return False
  return True


def compare_run(args, run_dir, reference, num_steps):
  """A finished run against the reference: the largest parameter difference (inf where an
  export's bytes or a seed's dev metrics differ); with --pipeline a dict of each part."""
  theirs_state = final_state(pretrain_dir(args, reference), num_steps)
  pretrain = max_param_diff(final_params(pretrain_dir(args, run_dir), num_steps, theirs_state),
                            theirs_state['params'])
  if not args.pipeline:
    return pretrain
  parts = {'pretrain': pretrain,
           'export_identical': same_export(os.path.join(run_dir, 'hf'),
                                           os.path.join(reference, 'hf'))}
  ours, theirs = (os.path.join(d, 'finetune') for d in (run_dir, reference))
  with open(os.path.join(ours, 'results.json'), encoding='utf-8') as f, open(
      os.path.join(theirs, 'results.json'), encoding='utf-8') as g:
    parts['finetune_metrics_equal'] = json.load(f)['per_seed'] == json.load(g)['per_seed']
  diffs = []
  for seed in sorted(n for n in os.listdir(theirs) if re.fullmatch(r'seed_\d+', n)):
    last = max(int(n) for n in checkpoint_dirs(os.path.join(theirs, seed)) if n.isdigit())
    seed_state = final_state(os.path.join(theirs, seed), last)
    diffs.append(max_param_diff(final_params(os.path.join(ours, seed), last, seed_state),
                                seed_state['params']))
  parts['finetune'] = max(diffs)
  parts['max_diff'] = (max(pretrain, parts['finetune'])
                       if parts['export_identical'] and parts['finetune_metrics_equal']
                       else float('inf'))
  return parts


def stop_stuck(workdir, failed, cycles, seconds):
  """Ends the soak on a stage that failed STUCK_AFTER cycles in a row: its summary names the
  stage, the cycles and their errors (a finding: a restart must always get on)."""
  summary = {'stuck': {'stage': failed[-1]['stage'], 'cycles': [c['cycle'] for c in failed],
                       'returncodes': [c['returncode'] for c in failed],
                       'errors': [c['error'] for c in failed]},
             'cycles': len(cycles), 'kills': sum(c['killed'] for c in cycles),
             'cycle_minutes': round(seconds / 60, 1), 'identical': False}
  print(json.dumps(summary), flush=True)
  with open(os.path.join(workdir, 'soak_summary.json'), 'w', encoding='utf-8') as f:
    json.dump(summary, f, indent=2)
  sys.exit(f'Stuck: the {failed[-1]["stage"]} stage failed {len(failed)} cycles in a row '
           f'(cycles {failed[0]["cycle"]}-{failed[-1]["cycle"]}): {failed[-1]["error"]}')


def finish(args, workdir, reference, num_steps, cycles, finished_runs, seconds, stage=0):
  """Runs the last run's stages to their end, compares it with the reference, writes the
  summary."""
  run_dir = os.path.join(workdir, f'run{len(finished_runs)}')
  returncodes = []
  for _, command, _ in stages(args, run_dir)[stage:]:
    returncodes.append(subprocess.run(command, cwd=REPO, text=True, capture_output=True,
                                      check=False).returncode)
  finished_runs.append(compare_run(args, run_dir, reference, num_steps))
  diff = max(r['max_diff'] if isinstance(r, dict) else r for r in finished_runs)
  lost = [c['lost_steps'] for c in cycles if c['killed']]
  probes = [c['export_probe'] for c in cycles if c.get('export_probe')]
  summary = {
      'cycles': len(cycles), 'kills': sum(c['killed'] for c in cycles),
      'kills_by_stage': {name: sum(c['killed'] and c.get('stage', 'pretrain') == name
                                   for c in cycles) for name in ('pretrain', 'export',
                                                                  'finetune')},
      'kills_before_restore': sum(c['killed'] and c['resumed_from'] is None
                                  and c.get('stage') != 'export' for c in cycles),
      'kills_with_save_in_flight': sum(c['save_in_flight'] for c in cycles),
      'errors': [c['error'] for c in cycles if c['error']],
      'went_back': sum(c['went_back'] for c in cycles),
      'bit_flips': sum(bool(c.get('flipped')) for c in cycles),
      'damaging_flips': sum(bool(c.get('flipped') and c['flipped']['damaging']) for c in cycles),
      'loaded_damaged': sum(bool(c.get('loaded_damaged')) for c in cycles),
      'fell_back_after_flip': sum(bool(c.get('flip_judged') and c['flip_judged']['damaging']
                                       and not c['loaded_damaged']) for c in cycles),
      'export_probes': len(probes),
      'export_probes_damaging': sum(p['damaging'] for p in probes),
      'export_probes_refused': sum(not p['exported'] for p in probes),
      'exported_damaged': sum(p['exported_damaged'] for p in probes),
      'max_lost_steps': max(lost, default=0),
      'mean_lost_steps': sum(lost) / max(len(lost), 1),
      'final_run_returncodes': returncodes, 'num_steps': num_steps,
      'runs_completed': len(finished_runs), 'runs': finished_runs,
      'final_params_max_abs_diff': diff, 'identical': diff == 0.0,
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
  while True:
    run_dir = os.path.join(workdir, f'run{len(finished_runs)}')
    last = stages(args, run_dir)[-1]
    if not done_before(last[0], last[2]) or (not args.pipeline and not os.path.isdir(
        os.path.join(run_dir, 'checkpoints', str(num_steps)))):
      break
    finished_runs.append(compare_run(args, run_dir, reference, num_steps))
  times = [c['time'] for c in cycles if 'time' in c]
  seconds = times[-1] - times[0] if len(times) > 1 else 0.0
  run_dir = os.path.join(workdir, f'run{len(finished_runs)}')
  # The stage the loop was in: the first without its outputs (the last one, at most).
  run_stages = stages(args, run_dir)
  stage = 0
  while stage < len(run_stages) - 1 and done_before(run_stages[stage][0], run_stages[stage][2]):
    stage += 1
  finish(args, workdir, reference, num_steps, cycles, finished_runs, seconds, stage)


if __name__ == '__main__':
  main()

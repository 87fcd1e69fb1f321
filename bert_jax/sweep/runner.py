"""Runs a sweep's jobs (spec.plan): one after another or several at once, skipping finished ones.

Each job is an ordinary `python -m bert_jax.main` run (or `bert_jax.data.prepare`) in its own
workdir under the sweep's, so an interrupted sweep resumes when run again: a finished run is
skipped, an unfinished one resumes from its checkpoint. WORKDIR/sweep.json records every job's
config; a rerun whose job would run with another config than the one recorded for a run that
exists is refused (it would mix two configs in one run). Logs go to WORKDIR/logs/<job>.log.
"""

import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from bert_jax.sweep import spec as spec_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARY_FILE = 'sweep.json'


def finished(job: spec_lib.Job, workdir: str) -> bool:
  """Whether `job` has nothing left to do: pretraining evaluated at its last step, fine-tuning
  with results of every seed, a prepared corpus with its metadata."""
  path = os.path.join(workdir, job.workdir)
  if job.kind == 'prepare':
    return os.path.isfile(os.path.join(path, 'metadata.json'))
  if job.kind == 'finetune':
    results = _read_json(os.path.join(path, 'results.json'))
    return bool(results) and len(results.get('seeds', [])) >= job.num_steps
  if not os.path.isfile(os.path.join(path, 'eval_results.json')):
    return False
  try:
    with open(os.path.join(path, 'metrics.jsonl'), encoding='utf-8') as f:
      evals = [r['step'] for r in map(json.loads, f) if r.get('split') == 'eval']
  except (OSError, ValueError):
    return False
  return bool(evals) and max(evals) >= job.num_steps


def _read_json(path: str):
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _flag_value(value) -> str:
  return repr(value) if isinstance(value, float) else str(value)


def command(job: spec_lib.Job, workdir: str, python: str = sys.executable,
            peak_flops: float = 0.0) -> list[str]:
  """The job's command line; `peak_flops` > 0 sets a pretraining run's MFU reference unless
  the job sets train.peak_flops itself."""
  overrides = [f'--config.{k}={_flag_value(v)}' for k, v in job.overrides.items()]
  if peak_flops and job.kind == 'pretrain' and 'train.peak_flops' not in job.overrides:
    overrides.append(f'--config.train.peak_flops={peak_flops!r}')
  if job.kind == 'prepare':
    return [python, '-m', 'bert_jax.data.prepare', f'--config={job.config}',
            f'--output={job.workdir}', *overrides]
  return [python, '-m', 'bert_jax.main', f'--config={job.config}',
          f'--workdir={os.path.join(os.path.abspath(workdir), job.workdir)}', *overrides]


def _recorded_jobs(plan: spec_lib.Plan) -> dict:
  return {job.name: {'config': job.config, 'overrides': job.overrides} for job in plan.jobs}


def check_recorded(plan: spec_lib.Plan, workdir: str) -> None:
  """SweepError when a job whose run exists would now run with another config than recorded."""
  previous = _read_json(os.path.join(workdir, SUMMARY_FILE))
  if not previous:
    return
  recorded = previous.get('jobs', {})
  for job in plan.jobs:
    if job.kind == 'prepare' or job.name not in recorded:
      continue
    now = json.loads(json.dumps(_recorded_jobs(plan)[job.name], default=str))
    if now != recorded[job.name] and os.path.isdir(os.path.join(workdir, job.workdir)):
      before = recorded[job.name]
      changed = sorted(k for k in set(now['overrides']) | set(before['overrides'])
                       if now['overrides'].get(k) != before['overrides'].get(k))
      what = (f'config {before["config"]!r} -> {now["config"]!r}'
              if now['config'] != before['config'] else
              ', '.join(f'{k}: {before["overrides"].get(k)!r} -> {now["overrides"].get(k)!r}'
                        for k in changed))
      raise spec_lib.SweepError(
          f'{job.name} exists in {workdir} with another config ({what}); resuming it would mix '
          'two configs in one run. Run the changed sweep in another --workdir, or delete '
          f'{os.path.join(workdir, job.workdir)} to redo that run.')


def write_summary(plan: spec_lib.Plan, workdir: str) -> None:
  """WORKDIR/sweep.json: what the report reads, and every job's config."""
  os.makedirs(workdir, exist_ok=True)
  summary = {**plan.summary, 'jobs': _recorded_jobs(plan)}
  temporary = os.path.join(workdir, f'{SUMMARY_FILE}.{os.getpid()}.tmp')
  with open(temporary, 'w', encoding='utf-8') as f:
    json.dump(summary, f, indent=2, sort_keys=True, default=str)
    f.write('\n')
  os.replace(temporary, os.path.join(workdir, SUMMARY_FILE))


def run(plan: spec_lib.Plan, workdir: str, parallel: int = 1, in_process: bool = False,
        env: dict | None = None, log=print) -> list[str]:
  """Runs every unfinished job, `parallel` at a time, pretraining runs one at a time (each waits
  for the jobs it needs); returns the names of the jobs that failed (their dependents are not
  started)."""
  workdir = os.path.abspath(workdir)
  check_recorded(plan, workdir)
  write_summary(plan, workdir)
  os.makedirs(os.path.join(workdir, 'logs'), exist_ok=True)
  done = {job.name for job in plan.jobs if finished(job, workdir)}
  peak_flops = 0.0
  if parallel > 1 and not in_process and any(
      job.kind == 'pretrain' and job.name not in done for job in plan.jobs):
    # A run measures the device's peak at its start; beside other runs it would read low and
    # its MFU high. One measurement on the idle device serves every pretraining run.
    peak_flops = measure_peak_flops(env)
    log(f'[sweep] peak {peak_flops / 1e12:.1f} TFLOP/s measured on the idle device: every '
        'pretraining run\'s MFU is against it.')
  for name in sorted(done):
    log(f'[sweep] {name}: finished before; skipped.')
  pending = [job for job in plan.jobs if job.name not in done]
  failed, blocked, running = [], [], {}
  previous = signal.signal(signal.SIGTERM, _raise_stop)
  try:
    _loop(plan, workdir, parallel, in_process, env, log, peak_flops,
          pending, done, failed, blocked, running)
  except Stopped:
    _stop_running(running, log)
    raise
  finally:
    signal.signal(signal.SIGTERM, previous)
  return failed + blocked


class Stopped(Exception):
  """SIGTERM reached the sweep: its running jobs are asked to stop (each saves a checkpoint)."""


def _raise_stop(signum, frame):  # pylint: disable=unused-argument
  raise Stopped()


# How long a stopped sweep waits for its runs to save their checkpoints and exit; a TPU VM's
# maintenance notice gives about a minute.
STOP_GRACE_S = 60.0


def _stop_running(running: dict, log) -> None:
  """Passes SIGTERM on to the running jobs and waits for them, so that none outlives the sweep
  (a rerun would find its workdir locked) and each leaves a checkpoint to resume from."""
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  for name, (_, process, _) in running.items():
    if process.poll() is None:
      log(f'[sweep] {name}: stopping (SIGTERM); rerun the sweep to resume it.')
      process.terminate()
  deadline = time.monotonic() + STOP_GRACE_S
  for name, (_, process, _) in running.items():
    try:
      process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      log(f'[sweep] {name}: still running {STOP_GRACE_S:.0f} s after SIGTERM; killed.')
      process.kill()
      process.wait()


def _loop(plan, workdir, parallel, in_process, env, log, peak_flops,
          pending, done, failed, blocked, running) -> None:
  """The scheduling loop of `run`: starts what may start, collects what ended."""
  durations = {}  # Job kind -> seconds of each of its runs that ended in this sweep.
  while pending or running:
    for job in list(pending):
      if any(dep in failed or dep in blocked for dep in job.after):
        pending.remove(job)
        blocked.append(job.name)
        log(f'[sweep] {job.name}: not started, a job it needs failed.')
        continue
      if len(running) >= max(1, parallel) or not all(dep in done for dep in job.after):
        continue
      if job.kind == 'pretrain' and any(j.kind == 'pretrain' for j, _, _ in running.values()):
        continue  # A pretraining run fills the devices: two would only share them.
      pending.remove(job)
      log(f'[sweep] {job.name}: started ({len(done)}/{len(plan.jobs)} done).')
      if in_process:
        start = time.monotonic()
        ok = _run_in_process(job, workdir)
        _log_progress(job, ok, time.monotonic() - start, plan, pending, done, durations, 1, log)
        _finish(job, ok, done, failed, workdir, log)
      else:
        wait_until_free(os.path.join(workdir, job.workdir), log, STOP_GRACE_S)
        running[job.name] = (job, _start(job, workdir, env, peak_flops), time.monotonic())
    for name, (job, process, start) in list(running.items()):
      if process.poll() is None:
        continue
      del running[name]
      ok = process.returncode == 0 and finished(job, workdir)
      _log_progress(job, ok, time.monotonic() - start, plan, pending + [
          j for j, _, _ in running.values()], done, durations, parallel, log)
      _finish(job, ok, done, failed, workdir, log)
    if running:
      time.sleep(0.5)


def _log_progress(job, ok, seconds, plan, left, done, durations, parallel, log) -> None:
  """'[sweep] NAME: done in N s (K/M done; about T left)': the time left estimated from this
  sweep's runs of each kind so far (see time_left); a failed run's time is not one of them."""
  if ok:
    durations.setdefault(job.kind, []).append(seconds)
  estimate = time_left([j.kind for j in left], durations, parallel)
  log(f'[sweep] {job.name}: {"done" if ok else "FAILED"} in {seconds:.0f} s '
      f'({len(done) + int(ok)}/{len(plan.jobs)} done'
      + (f'; about {max(1, round(estimate / 60))} min left by the runs so far)' if estimate
         else ')') + '.')


def time_left(kinds: list[str], durations: dict, parallel: int) -> float | None:
  """Seconds the jobs of `kinds` still need: each the mean of its kind's runs so far
  (`durations`), pretraining runs one after another (each fills the devices), the rest
  `parallel` at a time. None while a kind left has no run yet to go by."""
  if not kinds:
    return 0.0
  if any(kind not in durations for kind in kinds):
    return None
  mean = {kind: sum(times) / len(times) for kind, times in durations.items()}
  serial = sum(mean[kind] for kind in kinds if kind == 'pretrain')
  shared = sum(mean[kind] for kind in kinds if kind != 'pretrain')
  return serial + shared / max(1, parallel)



def _log_path(job: spec_lib.Job, workdir: str) -> str:
  return os.path.join(workdir, 'logs', job.name.replace('/', '__') + '.log')


def measure_peak_flops(env: dict | None = None) -> float:
  """metrics.measure_peak_flops in a process of its own (this one keeps off the devices); 0.0
  when it fails, and each run then measures its own."""
  code = ('from bert_jax.train import metrics; print(metrics.measure_peak_flops())')
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, check=False)
  try:
    return float(result.stdout.strip().splitlines()[-1])
  except (ValueError, IndexError):
    return 0.0


# Linux's prctl option that signals a child when the thread that started it ends.
_PR_SET_PDEATHSIG = 1


def _stop_with_parent(parent_pid: int):
  """For Popen's preexec_fn: the child gets SIGTERM (a checkpoint and a clean exit) when the
  sweep dies, even by SIGKILL, which leaves no chance to pass a signal on; an orphaned run would
  hold its workdir against the sweep's rerun. Nothing off Linux."""
  if not sys.platform.startswith('linux'):
    return None
  prctl = ctypes.CDLL(None).prctl  # Looked up before the fork, not in the child.

  def set_signal():
    prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # The sweep died before the line above took effect.
      os.kill(os.getpid(), signal.SIGTERM)
  return set_signal


def wait_until_free(job_workdir: str, log, timeout_s: float) -> None:
  """Waits (at most `timeout_s`) while a run still holds `job_workdir`: the previous sweep's run,
  stopping after that sweep was killed, saves its checkpoint before it lets go."""
  from bert_jax.train import guard  # pylint: disable=g-import-not-at-top
  holder = guard.in_use(job_workdir)
  if holder is None:
    return
  log(f'[sweep] {job_workdir} is held by {holder} (a run of a stopped sweep, saving its '
      f'checkpoint?); waiting up to {timeout_s:.0f} s for it to end.')
  deadline = time.monotonic() + timeout_s
  while holder is not None and time.monotonic() < deadline:
    time.sleep(0.5)
    holder = guard.in_use(job_workdir)


def _start(job: spec_lib.Job, workdir: str, env: dict | None, peak_flops: float = 0.0):
  environment = {**os.environ, **(env or {})}
  argv = command(job, workdir, peak_flops=peak_flops)
  log_file = open(_log_path(job, workdir), 'ab')  # pylint: disable=consider-using-with
  log_file.write(f'$ {shlex.join(argv)}\n'.encode())
  log_file.flush()
  process = subprocess.Popen(argv, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT,
                             env=environment, preexec_fn=_stop_with_parent(os.getpid()))
  log_file.close()
  return process


def _finish(job, ok, done, failed, workdir, log) -> None:
  if ok:
    done.add(job.name)
    return
  failed.append(job.name)
  try:
    with open(_log_path(job, workdir), encoding='utf-8', errors='replace') as f:
      tail = f.readlines()[-15:]
  except OSError:
    tail = []
  log(f'[sweep] {job.name} failed; the end of {_log_path(job, workdir)}:\n' + ''.join(tail))


def _run_in_process(job: spec_lib.Job, workdir: str) -> bool:
  """Runs `job` in this process (tests, small CPU runs): the same config the command builds."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.train import xla  # pylint: disable=g-import-not-at-top
  config = spec_lib.load_config(job.config, job.name)
  spec_lib.apply_overrides(config, job.overrides, job.name)
  try:
    if job.kind != 'prepare':
      xla.apply_compilation_cache(config)  # As bert_jax.main does.
    if job.kind == 'prepare':
      from bert_jax.data import prepare  # pylint: disable=g-import-not-at-top
      prepare.prepare(config, job.workdir, 1, 64, 200)
    elif job.kind == 'finetune':
      from bert_jax.train import finetune  # pylint: disable=g-import-not-at-top
      finetune.run(config, os.path.join(workdir, job.workdir))
    else:
      from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
      pretrain.train_and_evaluate(config, os.path.join(workdir, job.workdir))
  except (config_lib.ConfigError, ValueError, OSError) as e:
    logging.error('%s failed: %s', job.name, e)
    with open(_log_path(job, workdir), 'a', encoding='utf-8') as f:
      f.write(f'{job.name} failed: {e}\n')
    return False
  return finished(job, workdir)


def pod_commands(plan: spec_lib.Plan, workdir: str, launch: str = './launch_tpu.sh run') -> str:
  """A shell script of `launch_tpu.sh run` lines, one per unfinished job, in an order that works
  one at a time (each run must finish before the next starts)."""
  lines = ['#!/usr/bin/env bash',
           f'# Sweep {plan.summary["name"]}: {len(plan.jobs)} runs in {workdir}. Start each when',
           '# the one before it has finished (launch_tpu.sh logs shows it); a finished run is',
           '# skipped by bert_jax itself only if resumed, so leave finished ones out.',
           'set -euo pipefail', ': "${NAME:?set NAME}" "${ZONE:?set ZONE}"']
  for job in plan.jobs:
    if finished(job, workdir):
      lines.append(f'# {job.name}: finished.')
      continue
    args = command(job, workdir, python='python')[3:] if job.kind != 'prepare' else None
    if job.kind == 'prepare':
      lines.append(f'# {job.name}: on the first worker, before the runs:')
      lines.append('# ' + shlex.join(command(job, workdir, python='python')))
      continue
    lines.append(f'# {job.name}')
    lines.append(f'{launch} --name="$NAME" --zone="$ZONE" -- {shlex.join(args)}')
  return '\n'.join(lines) + '\n'

"""Ablation sweeps: `python -m bert_jax.sweep COMMAND --sweep=sweeps/table5.py --workdir=DIR`.

Commands:
  check     Validate every arm's pretraining and fine-tuning config, for this machine's
            kernels too, and list the runs.
  run       Run the unfinished runs (--parallel=N at once on one machine), then write the
            report. Rerun to resume an interrupted sweep: finished runs are skipped.
  commands  Print the launch_tpu.sh commands of the unfinished runs, for a pod.
  report    Write DIR/report.md and DIR/plots/ from the workdirs alone.
Sweep fields can be overridden like configs: --sweep.steps=2000 --sweep.finetune.seeds=1
--sweep.base=configs/tiny.py.
"""

import os
import signal
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

COMMANDS = ('check', 'run', 'commands', 'report')
_SWEEP = config_flags.DEFINE_config_file('sweep', None, 'Sweep file, e.g. sweeps/table5.py.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'The sweep\'s directory: one per run inside.')
_PARALLEL = flags.DEFINE_integer('parallel', 1, 'Runs at once (they share the devices).')
_IN_PROCESS = flags.DEFINE_boolean('in_process', False,
                                   'Run each job in this process (one at a time).')
flags.mark_flags_as_required(['workdir'])


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f'Give one command: {", ".join(COMMANDS)}.')
  from bert_jax.sweep import report  # pylint: disable=g-import-not-at-top
  from bert_jax.sweep import runner  # pylint: disable=g-import-not-at-top
  from bert_jax.sweep import spec  # pylint: disable=g-import-not-at-top
  command, workdir = argv[1], os.path.abspath(os.path.expanduser(_WORKDIR.value))
  if command == 'report':
    try:
      print(report.write(workdir))
    except FileNotFoundError as e:
      sys.exit(str(e))
    return
  if _SWEEP.value is None:
    raise app.UsageError(f'{command} needs --sweep=FILE.')
  if _PARALLEL.value < 1:
    raise app.UsageError(f'--parallel={_PARALLEL.value}: must be >= 1.')
  try:
    plan = spec.plan(_SWEEP.value, workdir, config_flags.get_config_filename(flags.FLAGS['sweep']))
    runner.check_recorded(plan, workdir)
  except spec.SweepError as e:
    sys.exit(f'Invalid sweep: {e}')
  if command == 'check':
    for job in plan.jobs:
      state = 'finished' if runner.finished(job, workdir) else 'to run'
      print(f'[{state}] {spec.describe(job)}')
    # As each run will check itself on this machine: its kernels against the backend here.
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')  # A GPU stays free.
    problems = spec.backend_problems(plan)
    if problems:
      sys.exit(f'{len(problems)} run(s) cannot run on this machine; the first: {problems[0]} '
               f'The sweep\'s base picks the kernels it finds (configs/small.py:kernels=auto); '
               'an arm or override that names others runs where they are.')
    return
  if command == 'commands':
    print(runner.pod_commands(plan, workdir), end='')
    return
  # Several runs on one GPU: each takes memory as it needs it instead of most of the device.
  env = {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'} if _PARALLEL.value > 1 else {}
  try:
    failed = runner.run(plan, workdir, _PARALLEL.value, _IN_PROCESS.value, env)
  except runner.Stopped:
    print('[sweep] stopped by SIGTERM; rerun the same command to resume.', flush=True)
    sys.exit(128 + signal.SIGTERM)
  try:
    print(report.write(workdir))
  except ImportError as e:  # matplotlib: the runs are done; the report can follow elsewhere.
    print(f'No report: {e}. Install matplotlib, then: python -m bert_jax.sweep report '
          f'--workdir={workdir}')
  if failed:
    sys.exit(f'{len(failed)} run(s) failed or did not start: {", ".join(failed)}; their logs '
             f'are in {os.path.join(workdir, "logs")}. Rerun the same command to resume.')


if __name__ == '__main__':
  from bert_jax.core import chips  # pylint: disable=g-import-not-at-top
  chips.quiet_absent_tpu()
  from bert_jax.core import cli  # pylint: disable=g-import-not-at-top
  # One-line errors for bad flags and sweep files (a syntax error names its line).
  app.run(main, flags_parser=cli.flags_parser(__name__))

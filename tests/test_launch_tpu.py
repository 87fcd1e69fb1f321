"""launch_tpu.sh: the gcloud commands it prints under --dry-run, its errors, and its remote scripts.

The `run` and `stop` scripts it would send to the workers are also executed here, in a scratch home
directory with a stand-in python, so the quoting of the pass-through flags is checked for real.
"""

import os
import shlex
import shutil
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'launch_tpu.sh')
TPU = ['--name=bert-pod', '--zone=europe-west4-a']
SSH = ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'bert-pod', '--zone=europe-west4-a']
# Flags with spaces, '=', quotes, globs and $: each must reach bert_jax.main as one argument.
BERT_FLAGS = ['--config=configs/base.py:layers=6,nsp=False', '--workdir=/mnt/gcs/b/my run',
              "--config.data.corpus=/data/wiki/*.txt,/data/it's.txt.xz", '--config.seed=$HOME',
              '--config.train.batch_size', '256']


def launch(*args, check=True):
  result = subprocess.run(['bash', SCRIPT, *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
  if check:
    assert result.returncode == 0, result.stderr
  return result


def dry_run(*args):
  """The printed commands, each as its argv."""
  lines = launch('--dry-run', *args).stdout.splitlines()
  assert lines and all(line.startswith('+ ') for line in lines), lines
  return [shlex.split(line[2:]) for line in lines]


def remote_script(command):
  """The --command=... of a gcloud ssh command."""
  (script,) = [arg[len('--command='):] for arg in command if arg.startswith('--command=')]
  return script


def test_create_makes_a_tpu_vm():
  (command,) = dry_run('create', *TPU, '--accelerator-type=v3-32',
                       '--version=tpu-ubuntu2204-base', '--project=my-project', '--spot')
  assert command == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'create', 'bert-pod',
                     '--zone=europe-west4-a', '--project=my-project', '--accelerator-type=v3-32',
                     '--version=tpu-ubuntu2204-base', '--spot']


def test_create_queued_requests_a_queued_resource():
  (command,) = dry_run('create', '--queued', *TPU, '--accelerator-type', 'v4-32', '--version',
                       'tpu-ubuntu2204-base')
  assert command == ['gcloud', 'compute', 'tpus', 'queued-resources', 'create', 'bert-pod',
                     '--zone=europe-west4-a', '--accelerator-type=v4-32',
                     '--runtime-version=tpu-ubuntu2204-base', '--node-id=bert-pod']


def test_create_preemptible():
  (command,) = dry_run('create', *TPU, '--accelerator-type=v3-8', '--version=v', '--preemptible')
  assert command[-1] == '--preemptible' and command[3:5] == ['tpu-vm', 'create']


def test_setup_copies_the_tree_then_installs_on_every_worker():
  pack, copy, unpack, install = dry_run('setup', *TPU)
  assert pack[:3] == ['git', '-C', REPO] and 'tar' in pack
  assert copy[:5] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp']
  assert copy[-1] == '--worker=all' and 'bert-pod:bert_jax.tar.gz' in copy
  assert unpack[:-1] == SSH + ['--worker=all']
  assert 'tar -xzf bert_jax.tar.gz -C bert_jax' in remote_script(unpack)
  assert install[:-1] == SSH + ['--worker=all']
  script = remote_script(install)
  assert 'python3.11 -m venv .venv' in script
  assert '.venv/bin/pip install -q -r requirements-tpu.txt' in script
  assert 'gcsfuse' not in script


def test_setup_can_clone_a_repository_and_mount_a_bucket():
  (command,) = dry_run('setup', *TPU, '--repo=https://github.com/me/bert_jax.git',
                       '--branch=main', '--gcs-bucket=my-bucket')
  script = remote_script(command)
  assert 'git clone -q https://github.com/me/bert_jax.git bert_jax' in script
  assert 'git checkout -q main' in script
  assert 'gcsfuse --implicit-dirs --rename-dir-limit=1000000 my-bucket /mnt/gcs/my-bucket' in script


def test_run_starts_bert_jax_on_every_worker_with_the_flags_verbatim():
  (command,) = dry_run('run', *TPU, '--env=LIBTPU_INIT_ARGS=--xla_a=1 --xla_b', '--', *BERT_FLAGS)
  assert command[:-1] == SSH + ['--worker=all']
  script = remote_script(command)
  assert 'setsid nohup env ' in script and '>> logs/run.log 2>&1 < /dev/null &' in script
  words = shlex.split(script[script.index('setsid nohup'):script.index('>> logs/run.log 2>&1')])
  assert words == ['setsid', 'nohup', 'env', 'LIBTPU_INIT_ARGS=--xla_a=1 --xla_b',
                   '.venv/bin/python', '-m', 'bert_jax.main', *BERT_FLAGS]


def test_run_passes_a_gs_workdir_and_init_from_verbatim():
  flags = ['--config=configs/base.py', '--workdir=gs://b/run', '--config.init_from=gs://b/old@8']
  (command,) = dry_run('run', *TPU, '--', *flags)
  script = remote_script(command)
  words = shlex.split(script[script.index('setsid nohup'):script.index('>> logs/run.log 2>&1')])
  assert words[-3:] == flags


def test_logs_tails_worker_0_or_the_one_asked():
  (command,) = dry_run('logs', *TPU)
  assert command == SSH + ['--worker=0', '--command=tail -n 100 bert_jax/logs/run.log']
  (command,) = dry_run('logs', *TPU, '--worker=3', '--lines=20', '--follow')
  assert command == SSH + ['--worker=3', '--command=tail -n 20 -F bert_jax/logs/run.log']


def test_stop_ends_the_run_on_every_worker_or_stops_the_vm():
  (command,) = dry_run('stop', *TPU)
  assert command[:-1] == SSH + ['--worker=all'] and 'kill -TERM' in remote_script(command)
  (command,) = dry_run('stop', *TPU, '--vm')
  assert command == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'stop', 'bert-pod',
                     '--zone=europe-west4-a']


def test_delete_removes_the_vm_or_the_queued_resource():
  (command,) = dry_run('delete', *TPU)
  assert command == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'delete', 'bert-pod',
                     '--zone=europe-west4-a']
  (command,) = dry_run('delete', *TPU, '--queued', '--yes')
  assert command == ['gcloud', 'compute', 'tpus', 'queued-resources', 'delete', 'bert-pod',
                     '--zone=europe-west4-a', '--force', '--quiet']


@pytest.mark.parametrize('args, message', [
    ((), 'no command given'),
    (('launch',), "unknown command 'launch'"),
    (('create', '--zone=z', '--accelerator-type=v3-32', '--version=v'), "'create' needs --name"),
    (('create', '--name=n'), "'create' needs --zone --accelerator-type --version"),
    (('setup', '--name=n'), "'setup' needs --zone"),
    (('run', *TPU), "'run' needs the bert_jax flags after --"),
    (('logs', '--zone=z', '--name'), '--name needs a value'),
    (('logs', *TPU, '--queued'), "--queued does not apply to 'logs'"),
    (('stop', *TPU, '--bogus=1'), "unknown option '--bogus=1'"),
    (('stop', *TPU, '--', '--x'), "only 'run' takes arguments after --"),
    (('create', *TPU, '--accelerator-type=v4-8', '--version=v', '--queued', '--preemptible'),
     'queued resources take --spot'),
    (('logs', *TPU, '--worker=all'), '--worker=all must be one worker'),
    (('setup', *TPU, '--gcs-bucket=gs://b'), 'without gs://'),
    (('run', *TPU, '--', '--config.data.prepared=gs://b/corpus'), 'mount the bucket'),
])
def test_errors_name_the_problem_and_exit_nonzero(args, message):
  result = launch('--dry-run', *args, check=False)
  assert result.returncode != 0 and result.stdout == ''
  assert message in result.stderr


def test_help_lists_every_command():
  usage = launch('--help').stdout
  for command in ('create', 'setup', 'run', 'logs', 'stop', 'delete', '--dry-run'):
    assert command in usage


def _fake_worker(tmp_path):
  """A home directory with a checkout whose python records its arguments, and a curl that
  answers the metadata server's worker number."""
  home = tmp_path / 'home'
  python = home / 'bert_jax' / '.venv' / 'bin' / 'python'
  python.parent.mkdir(parents=True)
  python.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$HOME/argv"\n'
                    'echo "$CLOUD_TPU_TASK_ID $LIBTPU_INIT_ARGS" > "$HOME/env"\nexec sleep 60\n')
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  (bin_dir / 'curl').write_text('#!/bin/sh\necho 3\n')
  for path in (python, bin_dir / 'curl'):
    path.chmod(0o755)
  env = dict(os.environ, HOME=str(home), PATH=f'{bin_dir}:{os.environ["PATH"]}')
  return home, env


def _wait_for(predicate, seconds=20):
  deadline = time.time() + seconds
  while not predicate():
    assert time.time() < deadline, 'timed out'
    time.sleep(0.05)


@pytest.mark.skipif(shutil.which('setsid') is None, reason='needs setsid (util-linux)')
def test_run_and_stop_scripts_work_on_a_worker(tmp_path):
  home, env = _fake_worker(tmp_path)
  (run_command,) = dry_run('run', *TPU, '--env=LIBTPU_INIT_ARGS=--xla_a=1', '--', *BERT_FLAGS)
  (stop_command,) = dry_run('stop', *TPU)

  def on_worker(command):
    return subprocess.run(['bash', '-c', remote_script(command)], cwd=home, env=env,
                          capture_output=True, text=True, timeout=30)

  (home / 'bert_jax' / 'logs').mkdir()
  assert 'no run is going' in on_worker(stop_command).stdout
  started = on_worker(run_command)
  assert started.returncode == 0, started.stderr
  assert 'worker 3: started pid' in started.stdout
  # The fake python writes argv, then env: wait for both to be whole before reading either.
  _wait_for(lambda: (home / 'argv').exists() and (home / 'argv').read_text().endswith('\0')
            and (home / 'env').exists() and (home / 'env').read_text().endswith('\n'))
  assert (home / 'argv').read_text().split('\0')[:-1] == ['-m', 'bert_jax.main', *BERT_FLAGS]
  assert (home / 'env').read_text().split() == ['3', '--xla_a=1']
  log = (home / 'bert_jax' / 'logs' / 'run.log').read_text()
  assert 'worker 3: env LIBTPU_INIT_ARGS=--xla_a=1 .venv/bin/python -m bert_jax.main' in log
  pid = int((home / 'bert_jax' / 'logs' / 'run.pid').read_text())
  try:
    again = on_worker(run_command)
    assert again.returncode != 0 and 'a run is still going' in again.stderr
    stopped = on_worker(stop_command)
    assert stopped.returncode == 0 and 'stopped the run' in stopped.stdout
    _wait_for(lambda: not _alive(pid))
  finally:
    if _alive(pid):
      os.kill(pid, 9)


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  # The orphaned run may stay a zombie until something reaps it: count that as gone.
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().split(')')[-1].split()[0] != 'Z'
  except FileNotFoundError:  # Reaped between the signal and the read.
    return False


def test_the_script_passes_shellcheck():
  if shutil.which('shellcheck') is None:
    message = 'shellcheck is not installed (apt-get install -y shellcheck)'
    if os.environ.get('BERT_JAX_REQUIRE_DATA') == '1':
      pytest.fail(f'BERT_JAX_REQUIRE_DATA=1 but {message}.')
    pytest.skip(message)
  result = subprocess.run(['shellcheck', SCRIPT], capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stdout

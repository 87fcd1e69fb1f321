"""Two JAX processes on this machine (gloo collectives on CPU) train exactly as one process does.

Each process has one CPU device and contributes its rows of every global batch; the one-process
reference has two CPU devices, so both runs build the same 2-device mesh and see the same batches.
Both processes write their parts of each orbax checkpoint into the one shared workdir.
"""

import os
import shutil
import socket
import subprocess
import sys

import pytest

from bert_jax.data import corpus as corpus_lib
from bert_jax.data import tokenizer as tokenizer_lib
from test_train import OVERRIDES, REPO, assert_trees_equal, read_metrics, without_timing

pytestmark = pytest.mark.slow  # Every test here runs for many seconds.

STEPS = {'train.num_steps': 4, 'train.warmup_steps': 2, 'train.log_every': 2,
         'train.eval_every': 2, 'train.checkpoint_every': 2, 'train.eval_batches': 1}
DATA_MESH = {'mesh.preset': 'data', 'mesh.data': -1}  # Parameters replicated on both processes.
FSDP_MESH = {'mesh.preset': 'fsdp', 'mesh.data': 1, 'mesh.fsdp': -1}  # Each holds half of them.
TIMEOUT_S = 240
# Both runs compile with the same flags: conftest's fast CPU codegen (compiling is most of the
# test), which pytest's own environment already holds.
XLA_FLAGS = os.environ.get('XLA_FLAGS', '')


@pytest.fixture(scope='module')
def data_flags(tmp_path_factory):
  """A corpus file and a vocab that every process reads (multi-process runs train no vocab)."""
  directory = tmp_path_factory.mktemp('data')
  documents = corpus_lib.read_corpus('builtin', max_documents=OVERRIDES['data.max_documents'])
  corpus_file = str(directory / 'corpus.txt')
  corpus_lib.write_bert_format(documents, corpus_file)
  tokenizer = tokenizer_lib.train_tokenizer(documents, OVERRIDES['data.tokenizer_vocab_size'],
                                            True, str(directory))
  return {'data.corpus': corpus_file, 'data.corpus_format': 'bert',
          'data.vocab_file': tokenizer.vocab_file}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def start_run(workdir, flags, num_processes, log_prefix):
  """Starts the `num_processes` processes of one run, on 2 CPU devices in all."""
  command = [sys.executable, '-m', 'bert_jax.main', '--config=configs/tiny.py',
             f'--workdir={workdir}'] + [f'--config.{k}={v}' for k, v in flags.items()]
  env = {k: v for k, v in os.environ.items() if not k.startswith('JAX_')}
  env.update(JAX_PLATFORMS='cpu', XLA_FLAGS=(
      f'{XLA_FLAGS} --xla_force_host_platform_device_count={2 // num_processes}'))
  if num_processes > 1:
    env.update(JAX_COORDINATOR_ADDRESS=f'localhost:{free_port()}',
               JAX_NUM_PROCESSES=str(num_processes))
  run = []
  for index in range(num_processes):
    log = open(f'{log_prefix}.process{index}.log', 'w+', encoding='utf-8')
    process_env = dict(env, JAX_PROCESS_ID=str(index)) if num_processes > 1 else env
    run.append((subprocess.Popen(command, cwd=REPO, env=process_env, stdout=log,
                                 stderr=subprocess.STDOUT), log))
  return run


def finish(*runs):
  """Waits for every process of `runs`; returns each run's logs. A failure shows its log."""
  processes = [process for run in runs for process, _ in run]
  try:
    for process in processes:
      process.wait(timeout=TIMEOUT_S)
  finally:
    for process in processes:
      if process.poll() is None:  # A peer died, so this one waits at a barrier: stop it.
        process.kill()
        process.wait()
  all_logs = []
  for run in runs:
    logs = []
    for index, (process, log) in enumerate(run):
      log.seek(0)
      logs.append(log.read())
      log.close()
      assert process.returncode == 0, f'process {index} of {len(run)}:\n{logs[-1][-4000:]}'
    all_logs.append(logs)
  return all_logs


def final_params(workdir, step):
  """The checkpoint's parameters, restored onto this test process's one device."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  checkpointer = ocp.StandardCheckpointer()
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                        checkpointer.metadata(path).item_metadata)
  return checkpointer.restore(path, target)['params']


def run_one_and_two_processes(flags, tmp_path):
  """The one-process reference and the two-process run, side by side; returns their workdirs."""
  one, two = str(tmp_path / 'one'), str(tmp_path / 'two')
  _, logs = finish(start_run(one, flags, 1, tmp_path / 'one'),
                   start_run(two, flags, 2, tmp_path / 'two'))
  for log in logs:
    assert 'JAX distributed service' in log and 'on 2 cpu device(s)' in log
  return one, two


def assert_same_run(workdir, reference, step):
  assert_trees_equal(final_params(workdir, step), final_params(reference, step))
  assert without_timing(read_metrics(workdir)) == without_timing(read_metrics(reference))


@pytest.mark.xdist_group('multiprocess_data_flags')
def test_two_processes_train_as_one_on_the_same_global_batch(data_flags, tmp_path):
  one, two = run_one_and_two_processes({**OVERRIDES, **data_flags, **STEPS, **DATA_MESH},
                                       tmp_path)
  assert sorted(os.listdir(os.path.join(two, 'checkpoints'))) == ['2', '4']
  # Orbax spreads the writes of replicated arrays over the processes that hold a replica.
  assert os.listdir(os.path.join(two, 'checkpoints', '4', 'state', 'ocdbt.process_1'))
  assert_same_run(two, one, 4)


@pytest.mark.xdist_group('multiprocess_data_flags')
def test_two_processes_with_sharded_parameters_resume_as_one(data_flags, tmp_path):
  flags = {**OVERRIDES, **data_flags, **STEPS, **FSDP_MESH}
  one, two = run_one_and_two_processes(flags, tmp_path)
  assert_same_run(two, one, 4)
  # As if the pod was preempted after step 2: the same command on both processes resumes.
  shutil.rmtree(os.path.join(two, 'checkpoints', '4'))
  (logs,) = finish(start_run(two, flags, 2, tmp_path / 'resumed'))
  assert all('Resumed from step 2' in log for log in logs)
  assert_same_run(two, one, 4)


def test_two_processes_stream_their_own_documents_as_one_process_and_resume_on_one(tmp_path):
  """A prepared corpus in two input shards: each of two processes streams its own shard (its own
  documents), and the run equals one process streaming both; the checkpoint holds both shards'
  states, so the run resumes exactly on one process (as after losing a host)."""
  import json  # pylint: disable=g-import-not-at-top
  from test_streaming import write_prepared_with_vocab  # pylint: disable=g-import-not-at-top
  prepared = write_prepared_with_vocab(tmp_path / 'prepared', 60)
  flags = {**OVERRIDES, **STEPS, **DATA_MESH, 'data.prepared': prepared, 'data.corpus': '',
           'data.max_documents': 0, 'data.packing': True, 'data.input_shards': 2}
  one, two = str(tmp_path / 'one'), str(tmp_path / 'two')
  _, logs = finish(start_run(one, flags, 1, tmp_path / 'one'),
                   start_run(two, flags, 2, tmp_path / 'two'))
  assert 'process 1 of 2 streams' in logs[0] and 'process 2 of 2 streams' in logs[1]
  assert_same_run(two, one, 4)
  with open(os.path.join(two, 'checkpoints', '4', 'data', 'metadata'), encoding='utf-8') as f:
    states = [json.loads(s) for s in json.load(f)['stream']]
  assert len(states) == 2 and states[0] != states[1]
  shutil.rmtree(os.path.join(two, 'checkpoints', '4'))
  (logs,) = finish(start_run(two, flags, 1, tmp_path / 'resumed'))  # One host left.
  assert 'Resumed from step 2' in logs[0]
  assert_same_run(two, one, 4)

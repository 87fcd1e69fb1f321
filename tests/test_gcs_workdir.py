"""A pretraining workdir in Cloud Storage, against an emulator on loopback (gcp-storage-emulator).

Every library reaches the emulator by its own setting (EMULATOR_ENV): gcsfs and
google-cloud-storage by STORAGE_EMULATOR_HOST, tensorstore (orbax's arrays) by
TENSORSTORE_GCS_HTTP_URL, etils.epath (orbax's directories) through gcsfs once TensorFlow's gfile
is turned off (EPATH_USE_TF=false). The emulator ignores generation preconditions, which the
workdir lock relies on; `emulator` adds them for lock objects (honour_preconditions), as Cloud
Storage documents them: a write or delete whose ifGenerationMatch differs from the object's
generation (0: there is none) is answered 412. Its downloads lack the x-goog-generation header
that Cloud Storage sends and tensorstore reads before rewriting an OCDBT manifest ("Malformed
StorageGeneration"); `emulator` adds it (send_generation).
"""

import gc
import http
import json
import os
import signal
import socket
import subprocess
import sys
import time

import gcp_storage_emulator.server  # A missing emulator fails this module: requirements-dev.txt.
from gcp_storage_emulator.handlers import objects as emulator_objects
import numpy as np
import pytest

from bert_jax.train import metrics
from conftest import assert_refused, MICRO, micro_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = 'bert-jax-test'


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def honour_preconditions(monkeypatch):
  """Uploads and deletes of `.lock` objects answer 412 when ifGenerationMatch is not the object's
  generation."""

  def generation(storage, bucket, name):
    try:
      return str(storage.get_file_obj(bucket, name)['generation'])
    except Exception:  # pylint: disable=broad-except
      return '0'

  def failed(request, storage, name):
    wanted = request.query.get('ifGenerationMatch')
    return (name.endswith('/.lock') and wanted
            and wanted[0] != generation(storage, request.params['bucket_name'], name))

  def refuse(response):
    response.status = http.HTTPStatus.PRECONDITION_FAILED
    response.json({'error': {'code': 412, 'message': 'conditionNotMet'}})

  def guarded(upload, name_of):
    def wrapper(request, response, storage):
      if failed(request, storage, name_of(request)):
        return refuse(response)
      return upload(request, response, storage)
    return wrapper

  monkeypatch.setattr(emulator_objects, '_media_upload', guarded(
      emulator_objects._media_upload, lambda r: r.query['name'][0]))
  monkeypatch.setattr(emulator_objects, '_multipart_upload', guarded(
      emulator_objects._multipart_upload,
      lambda r: r.query['name'][0] if 'name' in r.query else r.data['meta'].get('name')))
  delete = emulator_objects.delete

  def guarded_delete(request, response, storage, *args, **kwargs):
    if failed(request, storage, request.params['object_id']):
      return refuse(response)
    return delete(request, response, storage, *args, **kwargs)
  replace_handler(monkeypatch, delete, guarded_delete)


def send_generation(monkeypatch):
  """Downloads carry the object's generation in x-goog-generation, as Cloud Storage's do."""
  download = emulator_objects.download

  def with_generation(request, response, storage, *args, **kwargs):
    try:
      response['x-goog-generation'] = str(storage.get_file_obj(
          request.params['bucket_name'], request.params['object_id'])['generation'])
    except Exception:  # pylint: disable=broad-except
      pass  # Not found: download answers 404.
    return download(request, response, storage, *args, **kwargs)
  replace_handler(monkeypatch, download, with_generation)
  monkeypatch.setattr(emulator_objects, 'download', with_generation)  # objects.get's alt=media.


def replace_handler(monkeypatch, handler, replacement):
  for _, methods in gcp_storage_emulator.server.HANDLERS:
    for method, current in list(methods.items()):
      if current is handler:
        monkeypatch.setitem(methods, method, replacement)


@pytest.fixture(scope='module')
def emulator():
  """The emulator's environment (EMULATOR_ENV), set in this process for the module's tests."""
  url = f'http://127.0.0.1:{free_port()}'
  server = gcp_storage_emulator.server.create_server(
      '127.0.0.1', int(url.rsplit(':', 1)[1]), in_memory=True, default_bucket=BUCKET)
  patch = pytest.MonkeyPatch()
  honour_preconditions(patch)
  send_generation(patch)
  env = {'STORAGE_EMULATOR_HOST': url, 'TENSORSTORE_GCS_HTTP_URL': url,
         'TENSORSTORE_GCS_HTTP_VERSION': '1', 'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'emulator',
         'EPATH_USE_TF': 'false', 'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',
         'GOOGLE_CLOUD_PROJECT': 'bert-jax-test'}
  for key, value in env.items():
    patch.setenv(key, value)
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  from etils.epath import gpath  # pylint: disable=g-import-not-at-top
  # Both cache a backend chosen by the environment: an earlier test's choice (TensorFlow's gfile,
  # where TensorFlow is installed) would send gs:// to the real Cloud Storage.
  caches = (files._filesystem, gpath._is_tf_installed)  # pylint: disable=protected-access
  for cache in caches:
    cache.cache_clear()
  server.start()
  yield env
  gc.collect()  # tensorboardX's writers upload their events once more when collected.
  server.stop()
  patch.undo()
  for cache in caches:
    cache.cache_clear()


def test_files_write_read_list_and_rename_objects(emulator):
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  root = f'gs://{BUCKET}/files'
  files.write_text(f'{root}/a/config.json', '{"x": 1}')
  with files.open(f'{root}/a/metrics.jsonl', 'w') as f:
    f.write('line\n')
  assert files.read_text(f'{root}/a/config.json') == '{"x": 1}'
  assert files.listdir(f'{root}/a') == ['config.json', 'metrics.jsonl']
  assert files.isdir(f'{root}/a') and files.isfile(f'{root}/a/config.json')
  assert files.listdir(f'{root}/none') == [] and not files.exists(f'{root}/none')
  files.rename(f'{root}/a', f'{root}/b')
  assert files.listdir(root) == ['b']
  local = files.local_copy(f'{root}/b/config.json', ('metrics.jsonl', 'absent.txt'))
  assert sorted(os.listdir(os.path.dirname(local))) == ['config.json', 'metrics.jsonl']
  files.remove(f'{root}/b/config.json')
  assert files.listdir(f'{root}/b') == ['metrics.jsonl']


def test_object_lock_refuses_a_live_holder_and_takes_over_a_dead_one(emulator):
  from bert_jax.train import object_lock  # pylint: disable=g-import-not-at-top
  url = f'gs://{BUCKET}/lock/.lock'
  first = object_lock.ObjectLock(url)
  assert first.acquire(lambda holder: False) is None
  with pytest.raises(object_lock.LockHeldError) as refused:
    object_lock.ObjectLock(url).acquire(lambda holder: False)
  assert refused.value.holder['pid'] == os.getpid() and refused.value.age_s < 60
  second = object_lock.ObjectLock(url)  # The first holder's process counts as gone.
  assert second.acquire(lambda holder: True)['pid'] == os.getpid()
  first.release()  # No longer its object: the second's lock stays.
  with pytest.raises(object_lock.LockHeldError):
    object_lock.ObjectLock(url).acquire(lambda holder: False)
  second.release()
  stale = object_lock.ObjectLock(url, stale_s=0.0)
  assert stale.acquire(lambda holder: False) is None  # Released: free again.
  taker = object_lock.ObjectLock(url, stale_s=0.0)  # Not renewed for 0 s: a dead run's.
  assert taker.acquire(lambda holder: False) is not None
  stale.release()
  taker.release()


def test_a_second_run_on_a_gs_workdir_is_refused_naming_the_first(emulator):
  from bert_jax.train import guard  # pylint: disable=g-import-not-at-top
  workdir = f'gs://{BUCKET}/claimed'
  with guard.claim(workdir) as held:
    held.commit()
    with pytest.raises(guard.WorkdirError, match=rf'in use by another run \(process {os.getpid()}'):
      with guard.claim(workdir):
        pass
  with guard.claim(workdir):  # Released at the end of the first.
    pass


def test_metrics_on_gs_keep_the_records_up_to_the_resumed_checkpoint(emulator):
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  from bert_jax.train import metrics  # pylint: disable=g-import-not-at-top
  workdir = f'gs://{BUCKET}/metrics'
  writer = metrics.MetricWriter(workdir)
  for step in (2, 4, 6):
    writer.write(step, 'train', {'loss': 1.0 / step})
  writer.sync()  # What a checkpoint does; a kill after it loses nothing it covers.
  assert [json.loads(line)['step'] for line in
          files.read_text(f'{workdir}/metrics.jsonl').splitlines()] == [2, 4, 6]
  writer.close()
  resumed = metrics.MetricWriter(workdir, resume_step=4)
  resumed.write(6, 'train', {'loss': 0.5})
  resumed.close()
  records = [json.loads(line) for line in files.read_text(f'{workdir}/metrics.jsonl').splitlines()]
  assert [(r['step'], r['loss']) for r in records] == [(2, 0.5), (4, 0.25), (6, 0.5)]
  assert metrics.read_record(workdir, 6, 'train') == {'loss': 0.5}
  assert files.listdir(f'{workdir}/tensorboard')


def test_url_workdirs_other_than_a_gs_directory_are_refused():
  from bert_jax.train import guard  # pylint: disable=g-import-not-at-top
  for workdir in ('s3://bucket/run', 'gs://bucket', 'gs://bucket/'):
    with pytest.raises(guard.WorkdirError, match='only gs://BUCKET/DIR'):
      guard.check_workdir(workdir, 'pretrain')


def test_a_prepared_corpus_on_gs_is_refused_naming_gcsfuse():
  config = micro_config(**{'data.prepared': 'gs://bucket/prepared'})
  assert_refused(config, 'gcsfuse')


# The acceptance runs: a micro pretraining run in the bucket, stopped and resumed, against the
# same run uninterrupted on local disk.
SHORT = {'train.num_steps': 12, 'train.log_every': 2, 'train.eval_every': 6,
         'train.checkpoint_every': 4}


def without_timing(records):
  return [{k: v for k, v in r.items() if k not in metrics.TIMING_FIELDS} for r in records]


def read_metrics(workdir):
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  return [json.loads(line) for line in files.read_text(f'{workdir}/metrics.jsonl').splitlines()]


def assert_trees_equal(a, b):
  import jax  # pylint: disable=g-import-not-at-top
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b) > 0
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope='module')
def runs(emulator, tmp_path_factory):
  """(local workdir, gs:// workdir): the same micro run, the second stopped after step 4 as by
  SIGTERM (the loop's preemption path: a checkpoint, metrics uploaded, a clean exit) and resumed
  by the same call. Step 4 has no evaluation: a preempted step skips its own (the loop's rule),
  which would make the records differ from an uninterrupted run's anywhere."""
  from bert_jax.train import guard  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  cache = tmp_path_factory.mktemp('gcs-vocab')
  local = str(tmp_path_factory.mktemp('local-run'))
  pretrain.train_and_evaluate(micro_config(cache, **SHORT), local)
  remote = f'gs://{BUCKET}/runs/micro'
  with pytest.MonkeyPatch.context() as patch:  # Undone even when the run fails.
    patch.setattr(guard.Preemption, 'reached', lambda self, step, checkpointer: step == 4)
    pretrain.train_and_evaluate(micro_config(cache, **SHORT), remote)
  pretrain.train_and_evaluate(micro_config(cache, **SHORT, **{'train.plots': True}), remote)
  return local, remote


@pytest.mark.slow
def test_a_gs_run_stopped_and_resumed_ends_as_an_uninterrupted_local_run(runs):
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  local, remote = runs
  assert without_timing(read_metrics(remote)) == without_timing(read_metrics(local))
  assert_trees_equal(init_from.workdir_params(remote, 12), init_from.workdir_params(local, 12))
  names = set(files.listdir(remote))
  assert {'config.json', 'metrics.jsonl', 'checkpoints', 'tensorboard', 'vocab.txt',
          'eval_results.json', 'plots'} <= names
  assert '.lock' not in names  # Deleted at the end of the run.
  assert files.listdir(f'{remote}/checkpoints') == ['12', '8']
  with files.open(f'{remote}/plots/curves.png', 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  with open(os.path.join(local, 'eval_results.json'), encoding='utf-8') as f:
    assert json.loads(files.read_text(f'{remote}/eval_results.json')) == json.load(f)


@pytest.mark.slow
def test_a_gs_workdir_exports_to_hf_and_initialises_another_run(runs, tmp_path):
  from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  from bert_jax.tools import convert  # pylint: disable=g-import-not-at-top
  local, remote = runs
  assert convert.export_workdir(remote, str(tmp_path / 'remote')) == 12
  convert.export_workdir(local, str(tmp_path / 'local'))
  for name in ('model.safetensors', 'config.json', 'vocab.txt'):
    with open(tmp_path / 'remote' / name, 'rb') as a, open(tmp_path / 'local' / name, 'rb') as b:
      assert a.read() == b.read(), name
  init_from.check_exists(f'{remote}@8')
  with pytest.raises(init_from.InitFromError, match='has no checkpoint of step 4'):
    init_from.check_exists(f'{remote}@4')
  assert_trees_equal(init_from.workdir_params(remote, 8), init_from.workdir_params(local, 8))
  config = micro_config(**{'init_from': f'{remote}@8'})
  init_from.adopt_source(config)
  assert config.data.vocab_file == f'{remote}/vocab.txt'
  tokenizer = tokenizer_lib.load_tokenizer('wordpiece', config.data.vocab_file, True)
  assert tokenizer.vocab_size == MICRO['model.vocab_size']


def command(workdir, cache, **extra):
  flags = {**MICRO, 'data.tokenizer_cache_dir': cache, **extra}
  return [sys.executable, '-m', 'bert_jax.main', '--config=configs/tiny.py',
          f'--workdir={workdir}'] + [f'--config.{k}={v}' for k, v in flags.items()]


LONG = {'train.num_steps': 60, 'train.log_every': 5, 'train.eval_every': 30,
        'train.checkpoint_every': 5}


@pytest.mark.slow
def test_sigkill_of_a_gs_run_then_the_same_command_ends_as_a_local_run(emulator, tmp_path):
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  from bert_jax.core import checkpoint  # pylint: disable=g-import-not-at-top
  env = {**os.environ, **emulator}
  cache, local = str(tmp_path / 'vocab'), str(tmp_path / 'local')
  subprocess.run(command(local, cache, **LONG), cwd=REPO, env=env, check=True,
                 capture_output=True, timeout=300)
  remote = f'gs://{BUCKET}/runs/killed'
  process = subprocess.Popen(command(remote, cache, **LONG), cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  while not checkpoint.checkpoint_steps(remote) and time.time() < deadline:
    time.sleep(0.05)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert process.returncode == -signal.SIGKILL
  saved = checkpoint.checkpoint_steps(remote)
  assert saved and saved[-1] < 60, 'the run was not interrupted'
  assert files.exists(f'{remote}/.lock')  # Left by the killed run: taken over below.
  result = subprocess.run(command(remote, cache, **LONG), cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Took over' in result.stderr and 'Resumed from step' in result.stderr
  assert without_timing(read_metrics(remote)) == without_timing(read_metrics(local))


@pytest.mark.slow
def test_fine_tuning_on_a_gs_workdir_stopped_and_resumed_ends_as_a_local_run(emulator, tmp_path):
  from bert_jax.core import files  # pylint: disable=g-import-not-at-top
  from bert_jax.train import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.train import guard  # pylint: disable=g-import-not-at-top
  import test_finetune  # pylint: disable=g-import-not-at-top  # Its tiny SST-2 task.
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join(test_finetune.SPECIAL + list(test_finetune.WORDS)) + '\n')
  config = lambda: test_finetune.sst2_config(tmp_path, str(vocab), num_epochs=1.0)  # noqa: E731
  local = finetune.run(config(), str(tmp_path / 'local'))
  remote = f'gs://{BUCKET}/runs/sst2'
  with pytest.MonkeyPatch.context() as patch:  # As by SIGTERM after step 7: saved, then stopped.
    patch.setattr(guard.Preemption, 'reached', lambda self, step, checkpointer: step == 7)
    assert finetune.run(config(), remote) == {}
  assert files.listdir(f'{remote}/seed_0/checkpoints') == ['7']
  resumed = finetune.run(config(), remote)
  assert resumed['per_seed'] == local['per_seed']
  assert resumed['by_rate'] == local['by_rate']  # The dev curve too.
  assert json.loads(files.read_text(f'{remote}/results.json'))['median'] == local['median']
  assert {'config.json', 'results.json', 'seed_0'} <= set(files.listdir(remote))
  assert {'metrics.jsonl', 'settings.json', 'results.json', 'checkpoints',
          'predictions'} <= set(files.listdir(f'{remote}/seed_0'))
  assert files.listdir(f'{remote}/seed_0/predictions') == ['sst2_dev.tsv']

"""Fault injection: preemption, crashes, corrupt checkpoints, NaNs, full disks, wrong and untrusted
inputs. Each test injects one fault and checks that the run either makes progress or stops with a
clear message, and that no good checkpoint is lost.

End-to-end faults run `python -m bert_jax.main` on the micro config of test_train.py; the
checkpoint-level ones use Checkpointer directly. experiments/soak.py repeats the crash loop for
hundreds of cycles (not in CI).
"""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.core import checkpoint as checkpoint_lib
from bert_jax.train import guard
from bert_jax import config_lib
from bert_jax.train import pretrain
from bert_jax import sharding
from bert_jax.train import step as steps
import conftest
import test_train
from test_train import REPO, assert_trees_equal, command, final_params, read_metrics

vocab_cache = test_train.vocab_cache  # The module-wide shared vocab fixture.

RUN = {'train.num_steps': 120, 'train.log_every': 5, 'train.eval_every': 1000,
       'train.checkpoint_every': 20}


def run(workdir, expect_ok=True, **extra):
  result = subprocess.run(command(workdir, **{**RUN, **extra}), cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  if expect_ok:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def saved_steps(workdir):
  directory = os.path.join(workdir, 'checkpoints')
  return sorted(int(s) for s in os.listdir(directory) if s.isdigit())


def wait_for(predicate, timeout=240):
  deadline = time.time() + timeout
  while not predicate():
    if time.time() > deadline:
      raise TimeoutError('condition not reached')
    time.sleep(0.01)


def train_records(workdir):
  path = os.path.join(workdir, 'metrics.jsonl')
  return [r for r in read_metrics(workdir) if r['split'] == 'train'] if os.path.exists(path) else []


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """The uninterrupted run every faulted run must end identical to."""
  workdir = str(tmp_path_factory.mktemp('reference'))
  run(workdir)
  return workdir


# 1. Preemption ------------------------------------------------------------------------------

def cache_reads(stderr: str) -> tuple[int, int]:
  """(compiles read from the compilation cache, compiles that asked it), from main's log."""
  match = re.search(r'Compilation cache .*: (\d+) of (\d+) compiles read from it', stderr)
  assert match, stderr[-3000:]
  return int(match.group(1)), int(match.group(2))


@pytest.mark.slow
@pytest.mark.xdist_group('faults_reference')
def test_sigterm_saves_the_current_step_exits_0_and_the_rerun_resumes(reference, tmp_path):
  """...and the rerun reads its compiled steps from the persistent compilation cache the
  preempted run wrote (the reference compiled its own: the results are the same)."""
  workdir = str(tmp_path / 'preempted')
  # No periodic checkpoint before the end: what is saved comes from the SIGTERM.
  flags = {'train.checkpoint_every': 1000, 'train.log_every': 1,
           'train.compilation_cache_dir': str(tmp_path / 'xla_cache')}
  process = subprocess.Popen(command(workdir, **{**RUN, **flags}), cwd=REPO, text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  wait_for(lambda: len(train_records(workdir)) >= 3)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 0, stderr[-3000:]
  stopped = int(re.search(r'Preempted: stopped after step (\d+) of 120', stderr).group(1))
  assert 3 <= stopped < 120
  assert saved_steps(workdir) == [stopped]
  assert not os.path.exists(os.path.join(workdir, 'eval_results.json'))
  assert cache_reads(stderr)[0] == 0 and os.listdir(tmp_path / 'xla_cache')
  result = run(workdir, **flags)
  assert f'Resumed from step {stopped}' in result.stderr
  assert cache_reads(result.stderr)[0] >= 1
  assert_trees_equal(final_params(workdir, 120), final_params(reference, 120))


# 2. Crash at any moment -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.xdist_group('faults_reference')
def test_sigkill_at_random_moments_then_the_same_command_ends_identically(reference, tmp_path):
  """SIGKILL in startup, in steps and in checkpoint writes (saved every 2 steps), twice (the
  soak, experiments/soak.py, kills hundreds of times); the runs share a persistent compilation
  cache, which a kill may leave with a partly written entry (JAX then compiles again)."""
  workdir = str(tmp_path / 'crashing')
  flags = {'train.checkpoint_every': 2,
           'train.compilation_cache_dir': str(tmp_path / 'xla_cache')}
  rng = random.Random(0)
  resumed_from = []
  for _ in range(2):
    before = saved_steps(workdir)[-1] if os.path.isdir(os.path.join(workdir, 'checkpoints')) \
        else 0
    process = subprocess.Popen(command(workdir, **{**RUN, **flags}), cwd=REPO, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Wait for training to go past the last checkpoint, then kill after a random delay.
    try:
      wait_for(lambda b=before: any(s > b for s in saved_steps(workdir))
               if os.path.isdir(os.path.join(workdir, 'checkpoints')) else False, timeout=120)
    except TimeoutError:
      pass
    time.sleep(rng.uniform(0.0, 0.3))
    process.kill()
    _, stderr = process.communicate()
    match = re.search(r'Resumed from step (\d+)', stderr)
    resumed_from.append(int(match.group(1)) if match else 0)
    if saved_steps(workdir) and saved_steps(workdir)[-1] == 120:
      break
  assert resumed_from == sorted(resumed_from), resumed_from  # Never goes back.
  result = run(workdir, **flags)
  assert 'Resumed from step' in result.stderr
  assert_trees_equal(final_params(workdir, 120), final_params(reference, 120))


# 3. Corrupt or truncated newest checkpoint ----------------------------------------------------

def small_state(value):
  return {'w': jnp.full((64, 64), value, jnp.float32), 'b': jnp.full((64,), value, jnp.float32)}


ABSTRACT = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), small_state(0.0))


def saved_checkpointer(directory, values=(1.0, 2.0)):
  checkpointer = checkpoint_lib.Checkpointer(directory, every=1, keep=5)
  for step, value in enumerate(values, start=1):
    checkpointer.save(step, small_state(value), {'epoch': 0, 'batch': step})
  checkpointer.close()
  return checkpoint_lib.Checkpointer(directory, every=1, keep=5)


def data_files(step_dir):
  return [os.path.join(root, name) for root, _, names in os.walk(step_dir) for name in names]


def truncate_all(step_dir):
  for path in data_files(step_dir):
    with open(path, 'r+b') as f:
      f.truncate(os.path.getsize(path) // 2)


def scramble_all(step_dir):
  for path in data_files(step_dir):
    size = os.path.getsize(path)
    with open(path, 'wb') as f:
      f.write(np.random.default_rng(0).bytes(max(size, 16)))


@pytest.mark.parametrize('damage', [truncate_all, scramble_all, shutil.rmtree],
                         ids=['truncated', 'garbage', 'emptied'])
def test_unreadable_newest_checkpoint_falls_back_and_is_kept_aside(tmp_path, caplog, damage):
  directory = str(tmp_path / 'checkpoints')
  saved_checkpointer(directory).close()
  newest = os.path.join(directory, '2')
  if damage is shutil.rmtree:  # Emptied: its directory is there, its files are gone.
    shutil.rmtree(os.path.join(newest, 'state'))
  else:
    damage(os.path.join(newest, 'state'))
  checkpointer = checkpoint_lib.Checkpointer(directory, every=1, keep=5)
  with caplog.at_level('WARNING'):
    state, position = checkpointer.restore(ABSTRACT)
  np.testing.assert_array_equal(state['w'], 1.0)
  assert position['batch'] == 1
  assert 'Restored the previous good checkpoint, step 1' in caplog.text
  names = os.listdir(directory)
  assert '1' in names and '2' not in names
  assert any(name.startswith('2.unreadable-') for name in names), names
  # The run goes on: step 2 is written again, and the damaged copy stays for inspection.
  checkpointer.save(2, small_state(3.0), {'epoch': 0, 'batch': 2})
  checkpointer.close()
  restored, _ = checkpoint_lib.Checkpointer(directory, 1, 5).restore(ABSTRACT)
  np.testing.assert_array_equal(restored['w'], 3.0)
  assert any(name.startswith('2.unreadable-') for name in os.listdir(directory))


def test_when_no_checkpoint_is_readable_nothing_is_moved(tmp_path):
  directory = str(tmp_path / 'checkpoints')
  saved_checkpointer(directory, values=(1.0,)).close()
  truncate_all(os.path.join(directory, '1', 'state'))
  with pytest.raises(checkpoint_lib.CheckpointError, match=r'No checkpoint .* can be read.*step 1'):
    checkpoint_lib.Checkpointer(directory, 1, 5).restore(ABSTRACT)
  assert os.listdir(directory) == ['1']


@pytest.mark.slow
@pytest.mark.xdist_group('faults_reference')
def test_corrupt_newest_checkpoint_of_a_run_then_the_run_ends_identically(reference, tmp_path):
  workdir = str(tmp_path / 'corrupted')
  shutil.copytree(reference, workdir)
  os.remove(os.path.join(workdir, 'metrics.jsonl'))  # Rewritten from the resumed step on.
  truncate_all(os.path.join(workdir, 'checkpoints', '120', 'state'))
  result = run(workdir)
  assert 'Restored the previous good checkpoint, step 100' in result.stderr
  assert 'Resumed from step 100' in result.stderr
  assert_trees_equal(final_params(workdir, 120), final_params(reference, 120))


@pytest.mark.slow
@pytest.mark.xdist_group('faults_reference')
def test_an_array_renamed_in_the_newest_step_s_metadata_falls_back_then_ends_identically(
    reference, tmp_path):
  """One flipped bit in orbax's tree metadata renamed an optimizer array (found by the pipeline
  soak: 'query' became 'quer9' under opt_state); orbax then reports another tree structure, as
  for a changed config, and every rerun stopped there. The older step, which fits, tells the two
  apart: the damaged step is moved aside and the run ends as the uninterrupted one."""
  workdir = str(tmp_path / 'renamed')
  shutil.copytree(reference, workdir)
  os.remove(os.path.join(workdir, 'metrics.jsonl'))  # Rewritten from the resumed step on.
  path = os.path.join(workdir, 'checkpoints', '120', 'state', '_METADATA')
  with open(path, encoding='utf-8') as f:
    text = f.read()
  at = text.index('{"key": "query", "key_type": 2}', text.index("\"('opt_state'"))
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text[:at] + text[at:].replace('"query"', '"quer9"', 1))  # 'y' ^ 0x40: one bit.
  result = run(workdir)
  assert 'tree structures do not match' in result.stderr  # The damage orbax reports.
  assert 'Restored the previous good checkpoint, step 100' in result.stderr
  assert any(name.startswith('120.unreadable-')
             for name in os.listdir(os.path.join(workdir, 'checkpoints')))
  assert_trees_equal(final_params(workdir, 120), final_params(reference, 120))


@pytest.mark.slow
@pytest.mark.xdist_group('faults_reference')
def test_a_checkpoint_of_another_model_shape_is_named(reference, tmp_path):
  workdir = str(tmp_path / 'reshaped')
  shutil.copytree(reference, workdir)
  result = run(workdir, expect_ok=False, **{'model.intermediate_size': 128})
  assert result.returncode == 1
  assert 'holds a state of another shape' in result.stderr
  assert 'step 120' in result.stderr
  assert saved_steps(workdir) == [100, 120]  # Nothing moved or deleted.


# 4. NaN or inf --------------------------------------------------------------------------------

def poison_step(monkeypatch, bad_step):
  """Makes the masked-LM weights of training batch `bad_step` NaN (so loss and grads are NaN)."""
  original_batches = pretrain.pipeline.PretrainingStream.batches

  def batches(self, position):
    for step, (batch, after) in enumerate(original_batches(self, position), start=1):
      if step == bad_step:
        batch = {**batch, 'masked_lm_weights': np.full_like(batch['masked_lm_weights'], np.nan)}
      yield batch, after

  monkeypatch.setattr(pretrain.pipeline.PretrainingStream, 'batches', batches)


def micro_config(tmp_path=None, **overrides):
  """conftest's micro config with RUN and `overrides` ('section.key': value)."""
  return conftest.micro_config(tmp_path, **{**RUN, **overrides})


@pytest.mark.slow
def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path,
                                                                           monkeypatch):
  poison_step(monkeypatch, 47)
  workdir = str(tmp_path / 'nan')
  config = micro_config(tmp_path)
  with pytest.raises(pretrain.NonFiniteLossError, match=r'NaN or inf at step 47 \(and 3 more up to step '
                     r'50\); last good checkpoint: step 40'):
    pretrain.train_and_evaluate(config, workdir)
  assert saved_steps(workdir) == [20, 40]


@pytest.mark.slow
def test_nan_steps_are_skipped_and_counted_when_configured(tmp_path, monkeypatch, caplog):
  poison_step(monkeypatch, 47)
  workdir = str(tmp_path / 'skip')
  config = micro_config(tmp_path, **{'train.max_nonfinite_skips': 3})
  with caplog.at_level('WARNING'):
    pretrain.train_and_evaluate(config, workdir)
  assert 'Skipped the update of step(s) [47]' in caplog.text
  records = train_records(workdir)
  assert all(np.isfinite(r['loss']) for r in records)
  assert [r['nonfinite_skips'] for r in records if r['step'] in (45, 50, 120)] == [0, 1, 1]
  assert saved_steps(workdir)[-1] == 120


@pytest.mark.slow
def test_skipped_step_keeps_parameters_and_optimizer_state():
  config = micro_config(**{'train.batch_size': 4})
  model = steps.build_model(config)
  tx = pretrain.optim.create_optimizer(config.train)
  mesh = sharding.create_mesh(config.mesh)
  rules = sharding.logical_axis_rules(config.mesh.preset)
  with sharding.activation_rules(mesh, rules):
    state, _ = steps.create_train_state(config, model, tx, mesh, rules)
    batch = {k: np.zeros(v.shape, v.dtype) for k, v in steps.dummy_batch(4, 32, 5).items()}
    batch['masked_lm_weights'] = np.full((4, 5), np.nan, np.float32)
    step = jax.jit(lambda s, b: steps.train_step(s, b, loss_fn=steps.pretraining_loss_fn(model),
                                                 tx=tx, skip_nonfinite=True))
    new_state, stats = step(state, batch)
  assert float(stats['finite']) == 0.0 and float(stats['mlm_loss_sum']) == 0.0
  assert int(new_state.step) == 1
  assert_trees_equal(new_state.params, state.params)
  assert_trees_equal(new_state.opt_state, state.opt_state)


# 5. Disk full, unwritable workdir, failed checkpoint write -------------------------------------

def test_too_little_free_space_fails_before_training(tmp_path, monkeypatch):
  monkeypatch.setattr(checkpoint_lib.shutil, 'disk_usage',
                      lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))  # pylint: disable=protected-access
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, _, **kw: compiles.append(event) if 'backend_compile' in event else None)
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r'has 0.00 GiB free, less than one checkpoint .* needs'):
    pretrain.train_and_evaluate(micro_config(tmp_path), str(tmp_path / 'full'))
  assert not compiles


def test_a_train_state_over_the_device_memory_fails_before_compiling(tmp_path, monkeypatch):
  monkeypatch.setattr(steps, 'device_memory_limit', lambda mesh: 2**12)  # A 4 KiB device.
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, _, **kw: compiles.append(event) if 'backend_compile' in event else None)
  workdir = tmp_path / 'too_big'
  with pytest.raises(config_lib.ConfigError, match=(
      r'does not fit the device: its parameters \(\d+ KiB per device\), .* need \d+ KiB '
      r"before any activation, and one cpu has 4 KiB. .*config.mesh.preset='fsdp'")):
    pretrain.train_and_evaluate(micro_config(tmp_path), str(workdir))
  assert not compiles and not workdir.exists()


def test_the_memory_floor_counts_one_devices_shard_of_each_array():
  mesh = jax.sharding.AbstractMesh((2, 4), ('data', 'fsdp'))
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('fsdp', None))
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  tree = {'a': jax.ShapeDtypeStruct((64, 10), jnp.float32),
          'b': jax.ShapeDtypeStruct((8,), jnp.bfloat16)}
  assert steps.state_bytes_per_device(tree, {'a': split, 'b': whole}) == 16 * 10 * 4 + 8 * 2
  assert steps.state_bytes_per_device(tree, {'a': whole, 'b': whole}) == 64 * 10 * 4 + 8 * 2


@pytest.mark.slow
def test_unwritable_workdir_is_named(tmp_path):
  blocker = tmp_path / 'a-file'
  blocker.write_text('not a directory')
  result = run(str(blocker / 'run'), expect_ok=False)
  assert result.returncode == 1
  assert f"--workdir='{blocker / 'run'}' cannot be created" in result.stderr


FAILING_SAVE = r'''
import os, resource, signal, sys
sys.path.insert(0, {repo!r})
import jax
import jax.numpy as jnp
from bert_jax.core import checkpoint as checkpoint_lib
from bert_jax.train import guard
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # Writes past the limit fail with EFBIG instead.
checkpointer = checkpoint_lib.Checkpointer({directory!r}, every=1, keep=5)
checkpointer.save(1, {{'w': jnp.ones((16,))}}, {{'epoch': 0, 'batch': 1}})
checkpointer.wait()
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # No file over 1 MiB: a full disk.
try:
  # 4 MiB that do not compress, in several arrays as a model's state is (each failed write
  # leaves its own abandoned callbacks).
  noise = {{f'w{{i}}': jax.random.normal(jax.random.key(i), (1 << 17,)) for i in range(8)}}
  checkpointer.save(2, {{'w': jnp.ones((16,)), **noise}}, {{'epoch': 0, 'batch': 2}})
  checkpointer.close()
except checkpoint_lib.CheckpointError as e:
  print('ERROR:', e)
'''


def test_a_failed_checkpoint_write_keeps_the_previous_one(tmp_path):
  directory = str(tmp_path / 'checkpoints')
  script = FAILING_SAVE.format(repo=REPO, directory=directory)
  result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True,
                          timeout=120, check=False)
  assert 'ERROR: Saving the checkpoint of step 2' in result.stdout, result.stderr[-3000:]
  assert '(File too large (errno 27))' in result.stdout  # The OS error, not orbax's paths.
  assert 'last good checkpoint: step 1' in result.stdout
  # One line says it: no orbax tracebacks, no echoes of its abandoned callbacks.
  assert 'Traceback' not in result.stderr and 'Event loop' not in result.stderr, result.stderr
  assert os.listdir(directory) == ['1']  # The half-written step does not hold the disk.
  state, position = checkpoint_lib.Checkpointer(directory, 1, 5).restore(
      {'w': jax.ShapeDtypeStruct((16,), jnp.float32)})
  np.testing.assert_array_equal(state['w'], 1.0)
  assert position['batch'] == 1


# 6. Wrong inputs ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.xdist_group('faults_reference')
def test_resuming_with_another_vocab_is_named(reference, tmp_path):
  workdir = str(tmp_path / 'revocab')
  shutil.copytree(reference, workdir)
  with open(os.path.join(reference, 'vocab.txt'), encoding='utf-8') as f:
    words = f.read().splitlines()
  other = tmp_path / 'other_vocab.txt'
  other.write_text('\n'.join(words[:-2] + [words[-1], words[-2]]) + '\n', encoding='utf-8')
  result = run(workdir, expect_ok=False, **{'data.vocab_file': str(other),
                                            'train.num_steps': 140})
  assert result.returncode == 1
  assert 'was trained with the vocab of sha256' in result.stderr
  assert str(other) in result.stderr
  assert saved_steps(workdir) == [100, 120]


def test_config_key_that_does_not_exist_is_named(tmp_path):
  result = run(str(tmp_path / 'typo'), expect_ok=False, **{'train.learning_rat': 0.1})
  assert result.returncode != 0
  assert 'learning_rat' in result.stderr and 'learning_rate' in result.stderr


def test_corpus_path_matching_no_file_is_named(tmp_path):
  missing = str(tmp_path / 'nowhere' / '*.txt')
  with pytest.raises(config_lib.ConfigError, match=re.escape(missing) + '.* matches no file'):
    pretrain.train_and_evaluate(micro_config(tmp_path, **{'data.corpus': missing}),
                                str(tmp_path / 'run'))


def test_non_utf8_corpus_is_named(tmp_path):
  path = tmp_path / 'utf16.txt'
  path.write_bytes(('A sentence here.\nAnother one.\n\n' * 50).encode('utf-16'))
  with pytest.raises(config_lib.ConfigError, match=re.escape(str(path)) + '.*is not UTF-8'):
    pretrain.train_and_evaluate(micro_config(tmp_path, **{'data.corpus': str(path)}),
                                str(tmp_path / 'run'))


# 7. Untrusted files ---------------------------------------------------------------------------

class _Payload:
  """Unpickling this runs `touch MARKER`: what a malicious weights file does."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f'touch {self.marker}',))


def test_a_pickle_payload_in_imported_weights_is_refused(tmp_path):
  torch = pytest.importorskip('torch')
  from bert_jax.interop import hf as hf_interop  # pylint: disable=g-import-not-at-top
  marker = tmp_path / 'payload-ran'
  path = tmp_path / 'pytorch_model.bin'
  torch.save({'bert.embeddings.word_embeddings.weight': torch.zeros(4, 4),
              'extra': _Payload(marker)}, path)
  with pytest.raises(hf_interop.UnsafeCheckpointError, match=r'Refusing to load .*pytorch_model'):
    hf_interop.load_hf_state_dict(str(tmp_path))
  assert not marker.exists()
  # A plain state dict of tensors still loads.
  torch.save({'w': torch.ones(2, 2)}, path)
  state_dict, _ = hf_interop.load_hf_state_dict(str(path))
  np.testing.assert_array_equal(state_dict['w'], 1.0)


# 6. Integrity: checkpoints whose bytes changed on disk -------------------------------------------

def test_an_array_changed_on_disk_makes_its_step_unreadable_naming_the_array(tmp_path, caplog):
  directory = str(tmp_path / 'checkpoints')
  saved_checkpointer(directory).close()
  # Step 2's arrays replaced by other, well-formed ones: orbax reads them without complaint.
  other = str(tmp_path / 'other')
  forged = checkpoint_lib.Checkpointer(other, every=1, keep=5)
  forged.save(2, {**small_state(2.0), 'b': jnp.full((64,), 2.5, jnp.float32)},
              {'epoch': 0, 'batch': 2})
  forged.close()
  shutil.rmtree(os.path.join(directory, '2', 'state'))
  shutil.copytree(os.path.join(other, '2', 'state'), os.path.join(directory, '2', 'state'))
  with caplog.at_level('WARNING'):
    state, position = checkpoint_lib.Checkpointer(directory, 1, 5).restore(ABSTRACT)
  np.testing.assert_array_equal(state['w'], 1.0)
  assert position == {'epoch': 0, 'batch': 1}  # The integrity record is not part of it.
  assert "array ['b'] differs from the one saved" in caplog.text
  assert 'Restored the previous good checkpoint, step 1' in caplog.text


def test_a_changed_data_position_makes_its_step_unreadable(tmp_path, caplog):
  directory = str(tmp_path / 'checkpoints')
  saved_checkpointer(directory).close()
  [path] = [p for p in data_files(os.path.join(directory, '2', 'data')) if 'metadata' in p]
  with open(path, encoding='utf-8') as f:
    text = f.read()
  assert '"batch": 2' in text
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text.replace('"batch": 2', '"batch": 7'))
  with caplog.at_level('WARNING'):
    _, position = checkpoint_lib.Checkpointer(directory, 1, 5).restore(ABSTRACT)
  assert position['batch'] == 1
  assert 'the data position differs from the one saved' in caplog.text


def drop_integrity_record(step_dir):
  """One flipped bit in the record's JSON key ('integrity' -> 'integritx'): the record is gone."""
  [path] = [p for p in data_files(os.path.join(step_dir, 'data')) if 'metadata' in p]
  with open(path, encoding='utf-8') as f:
    text = f.read()
  assert '"integrity"' in text
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text.replace('"integrity"', '"integritx"'))


def test_a_step_without_its_integrity_record_is_unreadable(tmp_path, caplog, monkeypatch):
  monkeypatch.delenv(checkpoint_lib.UNVERIFIED_ENV, raising=False)
  directory = str(tmp_path / 'checkpoints')
  saved_checkpointer(directory).close()
  drop_integrity_record(os.path.join(directory, '2'))
  with pytest.raises(checkpoint_lib.IntegrityError, match='no integrity record.*'
                     + checkpoint_lib.UNVERIFIED_ENV + '=1'):
    checkpoint_lib.read_step(directory, 2)
  with caplog.at_level('WARNING'):
    state, position = checkpoint_lib.Checkpointer(directory, 1, 5).restore(ABSTRACT)
  # The intact step before it is restored; the one without a record is kept aside.
  np.testing.assert_array_equal(state['w'], 1.0)
  assert position == {'epoch': 0, 'batch': 1}
  assert 'has no integrity record' in caplog.text
  assert 'Restored the previous good checkpoint, step 1' in caplog.text
  assert any(name.startswith('2.unreadable-') for name in os.listdir(directory))


def test_a_step_without_a_record_is_read_unverified_when_asked(tmp_path, caplog, monkeypatch):
  monkeypatch.setenv(checkpoint_lib.UNVERIFIED_ENV, '1')
  directory = str(tmp_path / 'checkpoints')
  saved_checkpointer(directory).close()
  drop_integrity_record(os.path.join(directory, '2'))
  with caplog.at_level('WARNING'):
    state, position = checkpoint_lib.Checkpointer(directory, 1, 5).restore(ABSTRACT)
  np.testing.assert_array_equal(state['w'], 2.0)
  assert position['batch'] == 2 and 'restored unverified' in caplog.text
  np.testing.assert_array_equal(checkpoint_lib.read_step(directory, 2)[0]['w'], 2.0)


def test_a_restore_in_another_dtype_is_named_as_such_and_moves_nothing(tmp_path):
  # Orbax casts to the target's dtype, so another param_dtype would read as a checksum mismatch
  # in every step, i.e. as damage.
  directory = str(tmp_path / 'checkpoints')
  saved_checkpointer(directory).close()
  halves = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16)
                        if x.dtype == jnp.float32 else x, ABSTRACT)
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r"step 2 .* holds 2 arrays in another dtype than this config builds "
                           r"\(\['b'\]: saved float32, now bfloat16; and 1 more\): "
                           r'config\.model\.param_dtype.*It is not damaged'):
    checkpoint_lib.Checkpointer(directory, 1, 5).restore(halves)
  assert sorted(os.listdir(directory)) == ['1', '2']
  state, position = checkpoint_lib.Checkpointer(directory, 1, 5).restore(ABSTRACT)
  np.testing.assert_array_equal(state['w'], 2.0)


@pytest.mark.parametrize('old, new', [('": "float32"', '": "float33"'),  # A dtype changed.
                                      ("\"['b']\": ", "\"['c']\": ")])  # An array's name.
def test_a_changed_dtype_record_makes_its_step_unreadable_not_a_config_change(tmp_path, caplog,
                                                                              old, new):
  """A bit flipped in the integrity record's dtype table (found by the soak) must not read as
  another param_dtype (an error that stops the run) nor pass unnoticed: the step is unreadable
  and the one before it is restored."""
  directory = str(tmp_path / 'checkpoints')
  saved_checkpointer(directory).close()
  [path] = [p for p in data_files(os.path.join(directory, '2', 'data')) if 'metadata' in p]
  with open(path, encoding='utf-8') as f:
    text = f.read()
  dtypes_at = text.index('"dtypes"')
  assert old in text[dtypes_at:]
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text[:dtypes_at] + text[dtypes_at:].replace(old, new, 1))
  with pytest.raises(checkpoint_lib.IntegrityError, match="arrays' dtypes differs"):
    checkpoint_lib.read_step(directory, 2)  # Export, init_from, predict: refused too.
  with caplog.at_level('WARNING'):
    state, position = checkpoint_lib.Checkpointer(directory, 1, 5).restore(ABSTRACT)
  np.testing.assert_array_equal(state['w'], 1.0)
  assert position['batch'] == 1
  assert "its record of the arrays' dtypes differs from the one saved" in caplog.text


def test_another_structure_in_every_step_is_a_config_change_and_moves_nothing(tmp_path):
  directory = str(tmp_path / 'checkpoints')
  saved_checkpointer(directory).close()
  renamed = {'v' if key == 'w' else key: value for key, value in ABSTRACT.items()}
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r'step 2 .* holds a state of another shape or structure than this '
                           r'config builds .*no older step fits it either.*Nothing was moved'):
    checkpoint_lib.Checkpointer(directory, 1, 5).restore(renamed)
  assert sorted(os.listdir(directory)) == ['1', '2']


@pytest.mark.slow
def test_single_bit_flips_anywhere_in_the_newest_step_never_restore_damaged_values(tmp_path):
  rng = random.Random(0)
  directory = str(tmp_path / 'pristine')
  saved_checkpointer(directory).close()
  files = data_files(os.path.join(directory, '2'))
  outcomes = set()
  for trial in range(24):
    copy = str(tmp_path / f'trial{trial}')
    shutil.copytree(directory, copy)
    path = rng.choice(data_files(os.path.join(copy, '2')))
    size = os.path.getsize(path)
    if not size:
      continue
    offset, bit = rng.randrange(size), rng.randrange(8)
    with open(path, 'r+b') as f:
      f.seek(offset)
      byte = f.read(1)[0]
      f.seek(offset)
      f.write(bytes([byte ^ (1 << bit)]))
    try:
      state, position = checkpoint_lib.Checkpointer(copy, 1, 5).restore(ABSTRACT)
    except checkpoint_lib.CheckpointError:
      outcomes.add('refused')  # The flip hit what every step shares (none here) or both.
      continue
    # Either step 2 exactly as saved (the flip hit bytes no value depends on) or step 1.
    expected = 2.0 if position['batch'] == 2 else 1.0
    np.testing.assert_array_equal(state['w'], expected)
    np.testing.assert_array_equal(state['b'], expected)
    outcomes.add(position['batch'])
  assert len(files) > 5 and 1 in outcomes  # Some flips were caught and fell back.


# 7. One run per workdir; nothing written before the checks pass --------------------------------

def test_a_second_run_on_a_held_workdir_is_refused_at_once(tmp_path):
  from bert_jax.train import guard  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'busy')
  with guard.claim(workdir):
    with pytest.raises(guard.WorkdirError, match=rf"--workdir='{workdir}' is in use by another "
                       rf'run \(process {os.getpid()} on '):
      pretrain.train_and_evaluate(micro_config(tmp_path), workdir)
    assert os.listdir(workdir) == ['.lock']  # The refused run wrote nothing.


def test_the_lock_of_a_killed_run_is_taken_over_with_a_message(tmp_path, caplog):
  from bert_jax.train import guard  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'stale')
  holder = subprocess.Popen(
      [sys.executable, '-c', 'import sys, time; sys.path.insert(0, sys.argv[1]); '
       'from bert_jax.train import guard; c = guard.Claim(sys.argv[2]); c.acquire(); '
       'c.commit(); print("held", flush=True); time.sleep(600)', REPO, workdir],
      stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == 'held'
    with pytest.raises(guard.WorkdirError, match=f'process {holder.pid} on '):
      with guard.claim(workdir):
        pass
  finally:
    holder.kill()
    holder.wait()
  with caplog.at_level('WARNING'):
    with guard.claim(workdir) as claim:
      claim.commit()
  assert f'the run of process {holder.pid}' in caplog.text and 'no longer running' in caplog.text


@pytest.mark.parametrize('kind', ['root', 'model', 'foreign', 'file', 'finetune', 'checkpoints'])
def test_a_directory_that_is_not_a_run_of_this_mode_is_refused_untouched(tmp_path, kind):
  from bert_jax.train import guard  # pylint: disable=g-import-not-at-top
  workdir = {'root': '/', 'file': str(tmp_path / 'a-file')}.get(kind, str(tmp_path / kind))
  expected = {'root': 'give a directory of its own', 'model': 'is a model directory',
              'foreign': "holds files that are not a bert_jax pretrain run's \\(notes.md\\)",
              'file': 'is a file, not a directory', 'finetune': 'holds a finetune run',
              'checkpoints': 'is a file where the run keeps its checkpoint directory'}[kind]
  if kind == 'model':
    os.makedirs(workdir)
    for name in ('config.json', 'model.safetensors'):
      (tmp_path / kind / name).write_text('{"model_type": "bert"}')
  elif kind == 'foreign':
    os.makedirs(workdir)
    (tmp_path / kind / 'notes.md').write_text('mine')
  elif kind == 'file':
    (tmp_path / 'a-file').write_text('mine')
  elif kind == 'checkpoints':
    os.makedirs(workdir)
    (tmp_path / kind / 'checkpoints').write_text('mine')
  elif kind == 'finetune':
    os.makedirs(workdir)
    (tmp_path / kind / 'config.json').write_text(
        '{"mode": "finetune", "train": {}, "data": {}, "model": {}}')
  before = None if kind in ('root', 'file') else sorted(
      (p, p.read_bytes()) for p in (tmp_path / kind).iterdir())
  with pytest.raises(guard.WorkdirError, match=expected):
    pretrain.train_and_evaluate(micro_config(tmp_path), workdir)
  if before is not None:
    assert sorted((p, p.read_bytes()) for p in (tmp_path / kind).iterdir()) == before


def test_a_run_refused_after_the_workdir_checks_leaves_nothing_behind(tmp_path):
  workdir = tmp_path / 'new' / 'run'
  config = micro_config(tmp_path, **{'data.vocab_file': str(tmp_path / 'missing-vocab.txt')})
  with pytest.raises(config_lib.ConfigError, match='missing-vocab.txt'):
    pretrain.train_and_evaluate(config, str(workdir))
  assert not (tmp_path / 'new').exists()


@pytest.mark.slow
@pytest.mark.xdist_group('faults_reference')
def test_a_resume_with_another_batch_size_is_refused_and_config_json_kept(reference, tmp_path):
  workdir = str(tmp_path / 'rebatched')
  shutil.copytree(reference, workdir)
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    saved_config = f.read()
  result = run(workdir, expect_ok=False, **{'train.batch_size': 4, 'train.num_steps': 140})
  assert result.returncode == 1
  assert re.search(r'another data layout: config\.train\.batch_size=4 \(the checkpoint: '
                   r'8\)', result.stderr), result.stderr[-2000:]
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    assert f.read() == saved_config
  assert saved_steps(workdir) == [100, 120]


# 8. A state that becomes non-finite with finite gradients ---------------------------------------

@pytest.mark.slow
def test_non_finite_parameters_are_never_checkpointed(tmp_path, monkeypatch):
  import optax  # pylint: disable=g-import-not-at-top
  create = pretrain.optim.create_optimizer

  def exploding(train_config, *args, **kwargs):
    def update(updates, state, params=None):
      del params
      scale = jnp.where(state.count >= 24, jnp.inf, 1.0)  # Step 25 on: inf * update.
      return jax.tree.map(lambda u: u * scale, updates), optax.ScaleByScheduleState(
          count=state.count + 1)
    return optax.chain(create(train_config, *args, **kwargs), optax.GradientTransformation(
        lambda params: optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32)), update))
  monkeypatch.setattr(pretrain.optim, 'create_optimizer', exploding)
  workdir = str(tmp_path / 'exploding')
  with pytest.raises(pretrain.NonFiniteLossError,
                     match=r'parameters or the optimizer state became NaN or inf by step 25 '
                     r'\(after step 20, .*last good checkpoint: step 20'):
    pretrain.train_and_evaluate(micro_config(tmp_path), workdir)
  assert saved_steps(workdir) == [20]


# 9. SIGTERM at the end of a run; fine-tuning ---------------------------------------------------

def sigterm_at(monkeypatch, method, when):
  """Sends this process SIGTERM inside Checkpointer.`method` when when(step) is true."""
  original = getattr(checkpoint_lib.Checkpointer, method)

  def patched(self, step, *args, **kwargs):
    if when(step):
      os.kill(os.getpid(), signal.SIGTERM)
    return original(self, step, *args, **kwargs)
  monkeypatch.setattr(checkpoint_lib.Checkpointer, method, patched)


@pytest.mark.slow
def test_sigterm_during_the_final_save_lets_the_run_finish(tmp_path, monkeypatch):
  sigterm_at(monkeypatch, 'save', lambda step: step == 30)
  workdir = str(tmp_path / 'final-save')
  pretrain.train_and_evaluate(micro_config(tmp_path, **{'train.num_steps': 30}), workdir)
  assert saved_steps(workdir) == [20, 30]
  assert not [n for n in os.listdir(os.path.join(workdir, 'checkpoints')) if not n.isdigit()]
  assert os.path.isfile(os.path.join(workdir, 'eval_results.json'))


@pytest.mark.slow
def test_sigterm_at_the_last_step_then_the_rerun_does_the_final_evaluation(tmp_path,
                                                                          monkeypatch, caplog):
  original_batches = pretrain.pipeline.PretrainingStream.batches

  def batches(self, position):  # SIGTERM while step 30, the last, trains.
    for step, item in enumerate(original_batches(self, position), start=1):
      if step == 30:
        os.kill(os.getpid(), signal.SIGTERM)
      yield item
  monkeypatch.setattr(pretrain.pipeline.PretrainingStream, 'batches', batches)
  workdir = str(tmp_path / 'last-step')
  config = micro_config(tmp_path, **{'train.num_steps': 30})
  with caplog.at_level('WARNING'):
    pretrain.train_and_evaluate(config, workdir)
  assert 'Preempted: stopped after step 30 of 30' in caplog.text
  assert not os.path.exists(os.path.join(workdir, 'eval_results.json'))
  monkeypatch.undo()
  last_eval = pretrain.train_and_evaluate(micro_config(tmp_path, **{'train.num_steps': 30}),
                                          workdir)
  assert 'mlm_loss' in last_eval
  assert os.path.isfile(os.path.join(workdir, 'eval_results.json'))
  evals = [r for r in read_metrics(workdir) if r['split'] == 'eval']
  assert [r['step'] for r in evals] == [0, 30]
  # A second rerun reads the final evaluation instead of adding another.
  assert pretrain.train_and_evaluate(config, workdir) == last_eval
  assert [r['step'] for r in read_metrics(workdir) if r['split'] == 'eval'] == [0, 30]


def test_a_checkpoint_saved_before_a_layout_key_existed_resumes_with_its_default():
  from configs import tiny  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  layout = guard.data_layout(config, pretrain.DATA_LAYOUT_KEYS)
  older = {k: v for k, v in layout.items() if k not in pretrain.LAYOUT_DEFAULTS}
  pretrain._check_layout({'layout': older}, config, 100, '/w')  # pylint: disable=protected-access
  config.masking.max_ngram = 3
  with pytest.raises(config_lib.ConfigError, match=r'masking\.max_ngram=3 \(the checkpoint: 1\)'):
    pretrain._check_layout({'layout': older}, config, 100, '/w')  # pylint: disable=protected-access

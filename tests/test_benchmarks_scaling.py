"""benchmarks/scaling.py: each GPU count runs on its own CUDA_VISIBLE_DEVICES subset with the
preset's mesh and n times the per-GPU batch; scaling is per-GPU seq/s over one GPU's; counts the
host lacks are skipped and named; bad input is refused before anything runs."""

import json

import pytest

from benchmarks import scaling


def test_mesh_flags_split_the_gpus_as_each_preset_names():
  assert scaling.mesh_flags('data', 4)[1:] == ['--config.mesh.data=4', '--config.mesh.fsdp=1',
                                               '--config.mesh.tensor=1']
  assert scaling.mesh_flags('fsdp', 2)[1:] == ['--config.mesh.data=1', '--config.mesh.fsdp=2',
                                               '--config.mesh.tensor=1']
  assert scaling.mesh_flags('fsdp_tensor', 8)[1:] == [
      '--config.mesh.data=1', '--config.mesh.fsdp=4', '--config.mesh.tensor=2',
      '--config.model.ffn_impl=xla']  # The fused feed-forward kernel needs whole MLP rows.
  with pytest.raises(ValueError, match='even GPU count, not 3'):
    scaling.mesh_flags('fsdp_tensor', 3)
  with pytest.raises(ValueError, match="'zero3'"):
    scaling.mesh_flags('zero3', 2)


def test_tensor_presets_pad_a_vocabulary_the_tensor_axis_cannot_split():
  # RoBERTa's 50,265 rows do not split over 2 GPUs: the next multiple of 128 does.
  assert scaling.vocab_flags('roberta-base', 'fsdp_tensor', 'large_gpu') == [
      '--config.model.vocab_size=50304']
  assert scaling.vocab_flags('large', 'fsdp_tensor', 'large_gpu') == []  # 30,522 splits.
  assert scaling.vocab_flags('roberta-base', 'fsdp', 'large_gpu') == []  # Rows stay whole.
  assert scaling.vocab_flags('roberta-base', 'fsdp_tensor',
                             'large_gpu+--config.model.vocab_size=50266') == []


def test_one_gpu_runs_the_baseline_only_and_larger_counts_every_preset():
  assert scaling.runs([4, 1, 2], ['data', 'fsdp']) == [
      (1, 'data'), (2, 'data'), (2, 'fsdp'), (4, 'data'), (4, 'fsdp')]


def test_main_runs_each_count_on_its_gpus_and_tabulates_scaling(tmp_path, capsys):
  calls = []

  def fake_run(command, cwd, xla_flags, timeout, env):
    del cwd, xla_flags, timeout
    gpus = len(env['CUDA_VISIBLE_DEVICES'].split(','))
    batch = int(next(c for c in command if c.startswith('--config.train.batch_size='))
                .split('=')[1])
    calls.append((env['CUDA_VISIBLE_DEVICES'], batch, [c for c in command if 'mesh' in c]))
    per_gpu = 1000.0 if gpus == 1 else 950.0  # 95% at 2 and 4 GPUs.
    return {'seq_per_s': per_gpu * gpus, 'mfu': 0.5, 'step_ms': 1000.0 * batch / (per_gpu * gpus),
            'peak_memory_bytes': 2**30, 'batch': batch, 'device': 'NVIDIA H200'}

  out = tmp_path / 'scaling.jsonl'
  records = scaling.main(['--gpus=1,2,4,8', '--presets=data,fsdp', '--shapes=large:128:128',
                          f'--out={out}'], run=fake_run, gpus_here=lambda: 4)
  assert [(visible, batch) for visible, batch, _ in calls] == [
      ('0', 128), ('0,1', 256), ('0,1', 256), ('0,1,2,3', 512), ('0,1,2,3', 512)]
  assert '--config.mesh.fsdp=4' in calls[-1][2]
  assert [json.loads(line)['gpus'] for line in out.read_text().splitlines()] == [1, 2, 2, 4, 4]
  assert len(records) == 5
  printed = capsys.readouterr().out
  assert 'skipped: 8 GPUs (this host has 4)' in printed
  assert '| large:128:128 | 4 | fsdp | 512 | 3800 | 950 | 95.0% | 50.0% |' in printed
  assert 'not lent here: 8 GPUs' in printed


def test_main_pads_the_vocabulary_of_tensor_runs_only(tmp_path):
  commands = []

  def fake_run(command, cwd, xla_flags, timeout, env):
    del cwd, xla_flags, timeout, env
    commands.append(command)
    return {'error': 'not run'}

  scaling.main(['--gpus=1,2', '--presets=data,fsdp_tensor', '--shapes=roberta-base:128:8',
                f'--out={tmp_path / "s.jsonl"}'], run=fake_run, gpus_here=lambda: 2)
  padded = ['--config.model.vocab_size=50304' in command for command in commands]
  assert padded == [False, False, True]  # 1 GPU data, 2 GPUs data, 2 GPUs fsdp_tensor.


@pytest.mark.parametrize('argv, message', [
    (['--gpus=2,4'], '1 among them'),
    (['--gpus=0,1'], 'positive counts'),
    (['--presets=data,zero3'], "--presets entry 'zero3'"),
    (['--shapes=huge:128:8'], "--shapes entry 'huge:128:8'"),
    (['--variant=fast'], "unknown variant 'fast'"),
])
def test_bad_input_is_refused_before_anything_runs(argv, message, capsys):
  with pytest.raises(SystemExit):
    scaling.main(argv, run=lambda *_: pytest.fail('ran'), gpus_here=lambda: 2)
  assert message in capsys.readouterr().err

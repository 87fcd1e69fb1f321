"""experiments/sweep.py: arms run as ordinary resumable runs and land in one table."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'experiments'))

import sweep  # pylint: disable=g-import-not-at-top,wrong-import-position

MICRO = ['--config.model.vocab_size=1024', '--config.model.hidden_size=32',
         '--config.model.intermediate_size=64', '--config.model.max_position_embeddings=32',
         '--config.data.tokenizer_vocab_size=1024', '--config.data.max_seq_length=32',
         '--config.data.max_predictions_per_seq=5', '--config.data.max_documents=100',
         '--config.data.eval_fraction=0.1', '--config.train.batch_size=8',
         '--config.train.num_steps=3', '--config.train.warmup_steps=1',
         '--config.train.eval_batches=1', '--config.train.peak_flops=1e11']


def test_arm_arguments_append_to_the_config():
  assert sweep.arm_config('configs/base.py', 'nsp=False') == 'configs/base.py:nsp=False'
  assert sweep.arm_config('configs/base.py:steps=9', 'nsp=False') == (
      'configs/base.py:steps=9,nsp=False')
  assert sweep.arm_dirname('layers=3,nsp=False') == 'layers=3_nsp=False'


@pytest.mark.slow
def test_sweep_runs_each_arm_and_tabulates(tmp_path):
  workdir = tmp_path / 'sweep'
  result = subprocess.run(
      [sys.executable, 'experiments/sweep.py', '--config=configs/tiny.py',
       '--arms=nsp=True;nsp=False', f'--workdir={workdir}', '--',
       f'--config.data.tokenizer_cache_dir={tmp_path / "vocab"}', *MICRO],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  table = (workdir / 'results.md').read_text().splitlines()
  assert table[2].startswith('| nsp=True |') and table[3].startswith('| nsp=False |')
  assert table[3].split('|')[4].strip() == '-'  # No NSP accuracy without the NSP head.
  assert (workdir / 'nsp=False' / 'checkpoints' / '3').is_dir()

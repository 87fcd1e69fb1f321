"""A new user's chain at tiny size, each phase reading the last one's output, through the command
lines README shows: prepare the built-in corpus -> stream it into a pretraining run -> fine-tune
that run on MRPC, and export it -> predict from the export. Each phase must say what it is
doing (progress, compile notices, a one-line end). A sweep at size tiny through its command line
is test_readme.py's; `sweep report` on a finished sweep, test_sweep.py's."""

import json
import os
import subprocess
import sys

import pytest

from conftest import shared_data_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, home, timeout=900):
  """(returncode, stdout + stderr) of `python -m ARGS` from the repository's root, with HOME in
  `home` (the trained vocab's cache is written there, not in the user's)."""
  env = dict(os.environ, HOME=str(home), PYTHONDONTWRITEBYTECODE='1')
  result = subprocess.run([sys.executable, '-m', *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)
  return result.returncode, result.stdout + result.stderr


def _ok(args, home, *expected):
  code, output = _run(args, home)
  assert code == 0, f'{" ".join(args)} exited {code}:\n{output[-5000:]}'
  for text in expected:
    assert text in output, f'{text!r} not in the output of {" ".join(args)}:\n{output[-5000:]}'
  return output


@pytest.mark.slow
def test_prepare_stream_finetune_export_predict_at_tiny_size(tmp_path):
  data = shared_data_dir()  # The MRPC files.
  prepared, pretrain = tmp_path / 'prepared', tmp_path / 'pretrain'
  # Prepare: the tiny config's corpus (built in) and the vocab it trains, into shards.
  _ok(['bert_jax.data.prepare', '--config=configs/tiny.py', f'--output={prepared}'],
      tmp_path, 'Prepared')
  assert os.path.isfile(prepared / 'metadata.json')
  # Stream it: a tiny pretraining run of 40 steps.
  output = _ok(['bert_jax.main', '--config=configs/tiny.py:steps=40', f'--workdir={pretrain}',
                f'--config.data.prepared={prepared}', '--config.data.corpus='],
               tmp_path, 'Compiling the train step', 'ETA', 'Done.')
  assert 'step 40/40' in output
  # Fine-tune the run on MRPC, one seed.
  mrpc = tmp_path / 'mrpc'
  output = _ok(['bert_jax.main', f'--config=configs/glue.py:task=mrpc,init={pretrain},seeds=1',
                f'--workdir={mrpc}', '--config.task.max_train_examples=64',
                '--config.data.max_seq_length=64',
                f'--config.task.data_dir={os.path.join(data, "glue", "MRPC")}'],
               tmp_path, 'ETA', 'Done.')
  with open(mrpc / 'results.json', encoding='utf-8') as f:
    assert 'f1' in json.dumps(json.load(f))
  # Export the pretraining run for transformers, then predict from the export.
  export = tmp_path / 'export'
  _ok(['bert_jax.convert', 'export', f'--workdir={pretrain}', f'--out={export}'], tmp_path)
  assert os.path.isfile(export / 'config.json') and os.path.isfile(export / 'vocab.txt')
  output = _ok(['bert_jax.predict', f'--workdir=hf:{export}', '--json',
                'Return the [MASK] of the object .'], tmp_path)
  answer = json.loads([line for line in output.splitlines() if line.startswith('{')][-1])
  (sentence,) = answer['predictions']
  (top,) = sentence['masks']  # One [MASK]: its --top_k tokens, most probable first.
  probabilities = [t['probability'] for t in top]
  assert len(top) == 5 and probabilities == sorted(probabilities, reverse=True)

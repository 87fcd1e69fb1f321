"""Checkpoint averaging: the mean (or EMA) of a run's checkpoints as a run that fine-tunes,
exports and resumes."""

import json
import os

import jax
import numpy as np
import pytest

import conftest
from bert_jax.interop import init_from
from bert_jax.tools import average
from bert_jax.tools import convert
from bert_jax.train import pretrain

RUN = {'train.num_steps': 12, 'train.checkpoint_every': 4, 'train.keep_checkpoints': 3,
       'train.log_every': 4, 'train.eval_every': 100}


def test_weights_are_the_mean_or_an_exponential_moving_average():
  assert average.weights(4) == [0.25] * 4
  ema = average.weights(3, 0.5)  # avg = x1; avg = .5 avg + .5 x2; avg = .5 avg + .5 x3.
  assert ema == [0.25, 0.25, 0.5] and sum(ema) == 1.0


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('average')
  workdir = str(tmp / 'run')
  pretrain.train_and_evaluate(conftest.micro_config(tmp, **RUN), workdir)
  return tmp, workdir


@pytest.mark.slow
@pytest.mark.xdist_group('average_run')
def test_the_average_fine_tunes_exports_and_resumes_as_a_run(run, tmp_path):
  tmp, workdir = run
  out = str(tmp_path / 'averaged')
  record = average.average_workdir(workdir, out, last=3)
  assert record['steps'] == [4, 8, 12] and record['weights'] == [1 / 3] * 3
  with open(os.path.join(out, average.RECORD), encoding='utf-8') as f:
    assert json.load(f)['steps'] == [4, 8, 12]
  expected = jax.tree.map(lambda *x: np.mean(np.stack(x).astype(np.float64), 0),
                          *[init_from.workdir_params(workdir, s) for s in (4, 8, 12)])
  averaged = init_from.workdir_params(out)  # What init_from and a fine-tuning run read.
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(averaged), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert convert.export_workdir(out, str(tmp_path / 'hf')) == 12
  assert os.path.isfile(tmp_path / 'hf' / 'model.safetensors')
  # The same command on the averaged run continues from it: step 12's optimizer and data.
  config = conftest.micro_config(tmp, **{**RUN, 'train.num_steps': 14})
  last = pretrain.train_and_evaluate(config, out)
  assert np.isfinite(last['loss'])
  assert sorted(int(s) for s in os.listdir(os.path.join(out, 'checkpoints'))) == [12, 14]


@pytest.mark.slow
@pytest.mark.xdist_group('average_run')
def test_bad_choices_are_refused_naming_what_there_is(run, tmp_path):
  _, workdir = run
  with pytest.raises(ValueError, match=r'no checkpoint of step\(s\) \[5\]; its steps: '
                     r'\[4, 8, 12\]'):
    average.average_workdir(workdir, str(tmp_path / 'a'), steps=[4, 5])
  with pytest.raises(ValueError, match=r'--last=4: .* holds 3 checkpoint\(s\)'):
    average.average_workdir(workdir, str(tmp_path / 'b'), last=4)
  (tmp_path / 'full').mkdir()
  (tmp_path / 'full' / 'x').write_text('x')
  with pytest.raises(ValueError, match='is not empty'):
    average.average_workdir(workdir, str(tmp_path / 'full'), last=2)
  assert not (tmp_path / 'a').exists() and not (tmp_path / 'b').exists()

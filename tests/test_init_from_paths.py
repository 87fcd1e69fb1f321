"""config.init_from paths: relative ones are taken from the current directory; @STEP is not
part of the path."""

import os

import pytest

from bert_jax.interop import init_from


@pytest.mark.parametrize('spec,kind,relative', [
    ('runs/pretrain', 'workdir', 'runs/pretrain'),
    ('hf:runs/tiny_hf', 'hf', 'runs/tiny_hf'),
    ('tf:ckpt/bert_model.ckpt', 'tf', 'ckpt/bert_model.ckpt'),
])
def test_relative_paths_become_absolute(spec, kind, relative, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert init_from.parse(spec) == (kind, os.path.join(str(tmp_path), relative))


def test_home_and_urls_are_kept_apart():
  assert init_from.parse('hf:~/bert')[1] == os.path.join(os.path.expanduser('~'), 'bert')
  assert init_from.parse('gs://bucket/run') == ('workdir', 'gs://bucket/run')


@pytest.mark.parametrize('spec,path,step', [
    ('runs/pretrain@2000', 'runs/pretrain', 2000),
    ('runs/pretrain', 'runs/pretrain', None),
    ('runs/a@b@12', 'runs/a@b', 12),  # Only a trailing @ and digits names a step.
    ('runs/pretrain@latest', 'runs/pretrain@latest', None),
])
def test_a_trailing_step_is_split_off_the_workdir(spec, path, step, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert init_from.parse(spec) == ('workdir', os.path.join(str(tmp_path), path))
  assert init_from.parse_step(spec) == step

"""config.init_from paths: relative ones are taken from the current directory."""

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

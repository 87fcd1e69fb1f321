"""Workdir files are replaced whole: a write that fails part way (a full disk; a kill is the same
cut) leaves the file as it was, never cut short, and no temporary beside it."""

import builtins
import errno
import os

import pytest

from bert_jax import config_lib
from bert_jax.tasks import base
from conftest import micro_config


@pytest.fixture
def disk_full_after(monkeypatch):
  """Text files opened for writing under a directory take `chars` characters, then the disk is
  full (OSError ENOSPC)."""
  real_open = builtins.open

  def arm(directory: str, chars: int = 20):
    def open_(path, mode='r', *args, **kwargs):
      f = real_open(path, mode, *args, **kwargs)
      if 'w' not in mode or not os.path.abspath(str(path)).startswith(str(directory)):
        return f
      real_write, written = f.write, [0]

      def write(text):
        if written[0] + len(text) > chars:
          real_write(text[:max(chars - written[0], 0)])
          f.flush()
          raise OSError(errno.ENOSPC, 'No space left on device')
        written[0] += len(text)
        return real_write(text)
      f.write = write
      return f
    monkeypatch.setattr(builtins, 'open', open_)
  return arm


def test_a_config_json_write_that_fails_leaves_the_saved_one(tmp_path, disk_full_after):
  config = micro_config(tmp_path)
  config_lib.write_config(config, str(tmp_path))
  saved = (tmp_path / 'config.json').read_bytes()
  config.train.learning_rate = 0.5  # The restart's config, which would replace it.
  disk_full_after(tmp_path)
  with pytest.raises(OSError, match='No space left'):
    config_lib.write_config(config, str(tmp_path))
  assert (tmp_path / 'config.json').read_bytes() == saved
  assert os.listdir(tmp_path) == ['config.json']


def test_a_predictions_write_that_fails_leaves_the_earlier_file(tmp_path, disk_full_after):
  path = str(tmp_path / 'sst2_dev.tsv')
  base.write_index_predictions(path, [0, 1, 1, 0] * 10)
  saved = (tmp_path / 'sst2_dev.tsv').read_bytes()
  disk_full_after(tmp_path)
  with pytest.raises(OSError, match='No space left'):
    base.write_index_predictions(path, [1, 1, 0, 0] * 10)
  assert (tmp_path / 'sst2_dev.tsv').read_bytes() == saved
  assert os.listdir(tmp_path) == ['sst2_dev.tsv']

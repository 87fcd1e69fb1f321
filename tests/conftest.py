"""Shared test helpers."""

import os
import pathlib

import pytest


def shared_data_dir() -> pathlib.Path:
  """Returns $BERT_JAX_DATA; skips the test when unset, fails instead if BERT_JAX_REQUIRE_DATA=1."""
  value = os.environ.get('BERT_JAX_DATA', '')
  if not value:
    reason = ('BERT_JAX_DATA is unset; point it at the shared data dir (e.g. /work/shared/data) '
              'to run tests on real data.')
    if os.environ.get('BERT_JAX_REQUIRE_DATA') == '1':
      pytest.fail(f'BERT_JAX_REQUIRE_DATA=1 but {reason}')
    pytest.skip(reason)
  path = pathlib.Path(value).expanduser()
  if not path.is_dir():  # Set but wrong is a mistake to report, not a reason to skip.
    pytest.fail(f'BERT_JAX_DATA={value!r} is not a directory.')
  return path

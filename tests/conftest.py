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


@pytest.fixture(params=['Lane', 'Warpgroup'])
def mosaic_semantics(request, monkeypatch):
  """Each Mosaic GPU kernel the library builds lowered under this lowering semantics (its
  plgpu.CompilerParams default): jax 0.10 defaults to Lane, the GPU image's jax 0.11 to
  Warpgroup, which rejects some programs Lane lowers (a constant index read by an accumulating
  wgmma, flash_backward.row_backward before 0.11's first GPU run)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.experimental.pallas.mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic import gpu as mgpu  # pylint: disable=g-import-not-at-top
  semantics = getattr(mgpu.LoweringSemantics, request.param)
  params = plgpu.CompilerParams

  def pinned(*args, **kwargs):
    kwargs.setdefault('lowering_semantics', semantics)
    return params(*args, **kwargs)
  monkeypatch.setattr(plgpu, 'CompilerParams', pinned)
  # The kernels' launchers cache their traces (fused_norm.lowered_once), which hold the
  # compiler parameters they were traced with.
  jax.clear_caches()
  yield request.param
  jax.clear_caches()

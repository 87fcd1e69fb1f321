"""Shared test helpers."""

import importlib
import json
import os
import pathlib

import numpy as np
import pytest

# Compiling is most of a CPU test's time. XLA's fast CPU codegen (no LLVM optimisation, the
# classic emitters) compiles the tests' tiny programs faster and leaves the HLO, which is what
# the tests exercise, as it is. Set before any test imports JAX; the subprocesses tests start
# inherit it. A run that sets its own optimisation level keeps it.
FAST_COMPILE_FLAGS = ('--xla_backend_optimization_level=0',
                      '--xla_llvm_disable_expensive_passes=true',
                      '--xla_cpu_use_fusion_emitters=false')
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = ' '.join(
      [os.environ.get('XLA_FLAGS', ''), *FAST_COMPILE_FLAGS]).strip()

# Most slow tests train the same tiny programs in fresh processes, and each paid their compiles
# again. One persistent compilation cache for the whole session (every compile, however short)
# lets a program compiled once be read by every later process and xdist worker: the controller
# makes it, the workers and subprocesses inherit the variables. A run whose config names its own
# `train.compilation_cache_dir` still uses that one (train/xla.apply_compilation_cache), which
# is what the tests of the cache itself check. A cache the caller set stands, and is kept.
SESSION_CACHE_ENV = 'BERT_JAX_TEST_SESSION_CACHE'
SESSION_CACHE_OWNER_ENV = 'BERT_JAX_TEST_SESSION_CACHE_OWNER'  # The pid that made it.
if not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
  import tempfile  # pylint: disable=g-import-not-at-top
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(prefix='bert_jax_tests_xla_')
  os.environ[SESSION_CACHE_ENV] = os.environ['JAX_COMPILATION_CACHE_DIR']
  os.environ[SESSION_CACHE_OWNER_ENV] = str(os.getpid())
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')


def pytest_unconfigure(config):
  """Removes the session's compilation cache in the process that made it (xdist's controller,
  once every worker is done): not in a worker, nor in a pytest a test runs in a subprocess
  (the conformance proofs), which inherit the variables and would remove it mid-session."""
  directory = os.environ.get(SESSION_CACHE_ENV)
  del config
  if directory and os.environ.get(SESSION_CACHE_OWNER_ENV) == str(os.getpid()):
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(directory, ignore_errors=True)


def pytest_configure(config):
  """Under `-n N` (xdist's --dist=load), tests marked @pytest.mark.xdist_group(NAME) run on one
  worker (--dist=loadgroup; the others are spread as by load): the tests that share an expensive
  module-scoped fixture (a reference run, a trained workdir) then build it once, not once per
  worker. A --dist the command line chose stands."""
  if getattr(config.option, 'dist', 'no') == 'load':  # xdist's controller.
    config.option.dist = 'loadgroup'
  elif getattr(config, 'workerinput', {}).get('loadgroup'):  # A worker: name tests by group.
    config.option.loadgroup = True


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
  """Tells each xdist worker whether the controller groups (workers parse the command line
  again, where -n alone means load)."""
  node.workerinput['loadgroup'] = node.config.getvalue('dist') == 'loadgroup'


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Under -n, a test that uses a module-scoped fixture of its own module (a trained workdir, a
  reference run, the sharding subprocesses' results) joins its module's xdist group unless it
  names one: the fixture is then built on one worker, not on each. Autouse fixtures, which
  every test of a module takes, do not group it. The slow tier goes first (the workers take
  tests and groups in this order): its runs of minutes start early and the fast tests fill
  the end, so that no worker waits idle while the other finishes a long run."""
  if not getattr(config.option, 'loadgroup', False):
    return
  items.sort(key=lambda item: item.get_closest_marker('slow') is None)  # Stable.
  for item in items:
    if item.get_closest_marker('xdist_group') or not hasattr(item, '_fixtureinfo'):
      continue
    module = item.nodeid.split('::')[0]
    for name in item.fixturenames:
      definitions = item._fixtureinfo.name2fixturedefs.get(name) or ()
      if any(d.scope == 'module' and d.baseid == module and not getattr(d, '_autouse', False)
             for d in definitions):
        item.add_marker(pytest.mark.xdist_group(module))
        break


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


@pytest.fixture(autouse=True)
def restore_absl_level():
  """Each test starts with the absl logger's level as the session found it (unset: the root's,
  which caplog.at_level sets). Tools' mains (predict, convert) raise it to WARNING for their runs;
  a test that calls one in-process would otherwise hide INFO logs from the tests that follow it
  on the same worker."""
  import logging  # pylint: disable=g-import-not-at-top
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  yield
  absl_logger.setLevel(level)


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


# A pretraining run small enough for a test: a 2-layer, 32-wide model on 150 documents of the
# built-in corpus. Tests start from micro_config and override what they exercise.
MICRO = {
    'model.vocab_size': 1024, 'model.hidden_size': 32, 'model.num_layers': 2,
    'model.num_heads': 2, 'model.intermediate_size': 64, 'model.max_position_embeddings': 32,
    'data.tokenizer_vocab_size': 1024, 'data.max_seq_length': 32,
    'data.max_predictions_per_seq': 5, 'data.max_documents': 150, 'data.eval_fraction': 0.1,
    'train.batch_size': 8, 'train.learning_rate': 1e-3, 'train.warmup_steps': 5,
    'train.eval_batches': 2, 'train.keep_checkpoints': 2, 'train.peak_flops': 1e11,
    # Drawing curves is seconds a run; tests/test_plot.py and the README's run draw them.
    'train.plots': False,
}


def micro_config(tmp_path=None, **overrides):
  """configs/tiny.py with MICRO and `overrides` ('section.key' or a top-level key: value); the
  trained vocab cached under tmp_path."""
  from configs import tiny  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  for key, value in {**MICRO, **overrides}.items():
    *parents, leaf = key.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  if tmp_path is not None:
    config.data.tokenizer_cache_dir = str(tmp_path / 'vocab-cache')
  return config


# SWAG's regular CSV header (swagaf data/train.csv, val.csv): an unnamed index column first.
SWAG_HEADER = ('', 'video-id', 'fold-ind', 'startphrase', 'sent1', 'sent2', 'gold-source',
               'ending0', 'ending1', 'ending2', 'ending3', 'label')
SWAG_PLACES = ('paris', 'london', 'the film', 'the story')


def swag_rows(n: int, seed: int = 0) -> list[list[str]]:
  """n questions in SWAG's columns: the right ending names the place the context names."""
  rng = np.random.default_rng(seed)
  rows = []
  for i in range(n):
    person = ('john', 'smith')[i % 2]
    endings = [str(p) for p in rng.permutation(SWAG_PLACES)]
    label = int(rng.integers(len(endings)))
    sent1 = f'{person} liked {endings[label]}, very much .'  # A comma: a quoted CSV field.
    sent2 = f'{person} went to'
    rows.append([str(i), f'lsmdc{seed:04d}_{i}', str(i), f'{sent1} {sent2}', sent1, sent2,
                 'gold', *endings, str(label)])
  return rows


def write_swag(directory, train: int = 12, dev: int = 7) -> str:
  """A SWAG folder (train.csv, val.csv in SWAG's format) of swag_rows; returns its path."""
  import csv  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  for name, n, seed in (('train.csv', train, 0), ('val.csv', dev, 1)):
    with open(os.path.join(directory, name), 'w', encoding='utf-8', newline='') as f:
      csv.writer(f).writerows([SWAG_HEADER, *swag_rows(n, seed)])
  return str(directory)


def dot_flops(jaxpr, times=1) -> int:
  """2 x multiply-adds of every dot_general a jaxpr runs, scan bodies times their length: the
  FLOPs a family's or objective's `flops` must equal."""
  import jax  # pylint: disable=g-import-not-at-top  # After the XLA flags above.
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'dot_general':
      (contract, _), _ = eqn.params['dimension_numbers']
      lhs = eqn.invars[0].aval.shape
      total += 2 * np.prod(eqn.outvars[0].aval.shape) * np.prod([lhs[a] for a in contract])
    repeat = eqn.params.get('length', 1) if eqn.primitive.name == 'scan' else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        inner = getattr(sub, 'jaxpr', sub)
        if isinstance(inner, jax.extend.core.Jaxpr):
          total += dot_flops(inner, repeat)
  return total * times


def random_pretraining_batch(config, rows=4, seed=0, seq=None, predictions=None, vocab=200):
  """A hand-made pretraining batch of the config's shapes (or `seq` tokens, `predictions`
  masked positions), with the keys its objectives read: padded tails, two segments, masked
  positions, NotNext labels 0/1 (the data side's swapped pairs give the same keys)."""
  from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  s = seq or config.data.max_seq_length
  p = predictions or config.data.max_predictions_per_seq
  lengths = rng.integers(s // 2, s + 1, rows)
  mask = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
  batch = {
      'input_ids': rng.integers(5, vocab, (rows, s)).astype(np.int32) * mask,
      'input_mask': mask,
      'segment_ids': ((np.arange(s)[None] >= lengths[:, None] // 2) * mask).astype(np.int32),
      'masked_lm_positions': np.stack([rng.choice(np.arange(1, n), p, replace=False)
                                       for n in lengths]).astype(np.int32),
      'masked_lm_ids': rng.integers(5, vocab, (rows, p)).astype(np.int32),
      'masked_lm_weights': np.ones((rows, p), np.float32),
      'next_sentence_labels': rng.integers(0, 2, rows).astype(np.int32),
  }
  objectives = steps.build_model(config).objectives
  return {k: v for k, v in batch.items() if k in steps.dummy_batch(1, s, p, objectives=objectives)}


def run_records(workdir) -> dict[str, list[dict]]:
  """A run's metrics.jsonl records by split: {'train': [...], 'eval': [...]}, in order."""
  records = {'train': [], 'eval': []}
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    for line in f:
      record = json.loads(line)
      records.setdefault(record['split'], []).append(record)
  return records


def require(module: str):
  """pytest.importorskip, except that BERT_JAX_REQUIRE_DATA=1 (CI) makes a missing package
  fail."""
  if os.environ.get('BERT_JAX_REQUIRE_DATA') == '1':
    return importlib.import_module(module)
  return pytest.importorskip(module)


def micro_run(tmp_path, **overrides) -> str:
  """Trains micro_config(tmp_path, **overrides) into tmp_path/run; returns the workdir."""
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / 'run')
  pretrain.train_and_evaluate(micro_config(tmp_path, **overrides), workdir)
  return workdir


def assert_refused(config, match: str) -> None:
  """config_lib.validate(config) raises a ConfigError whose message matches `match` (a regex),
  before anything is built."""
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.validate(config)

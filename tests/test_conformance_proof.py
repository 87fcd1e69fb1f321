"""tests/conformance/ takes whatever the registries hold when it is collected: families,
objectives, task kinds and attention kernels registered from outside bert_jax by plugins
(tests/registered_families.py, registered_objectives.py, registered_tasks.py,
registered_kernels.py), with
no edit to the suite, are held to the contract of each. CamemBERT, a family of a dozen lines,
passes every check, transformers' included; the scaled BERT, which borrows BERT's model_type,
passes the checks that need no transformers class; the BERT with miscounted FLOPs fails the FLOPs
check and nothing else. The segment objective passes every check; the one whose stats are means
fails the pooling check and nothing else. The cue-word task kind passes every check; the one
whose train split lacks its labels fails the check of its encoded splits and nothing else. The
Pallas attention kernel passes in BERT, causal BERT and ModernBERT, DeBERTa refusing it; the same
kernel without the keys' gradient fails there."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

import conftest
from test_family_unit import NAME as SCALED  # pylint: disable=g-bad-import-order
from registered_families import CAMEMBERT, MISCOUNTED  # pylint: disable=g-bad-import-order
from registered_kernels import EINSUM_DROPOUT, NO_KEY_GRADIENT, PALLAS_ROWS
from registered_objectives import MEAN  # pylint: disable=g-bad-import-order
from registered_tasks import UNLABELLED  # pylint: disable=g-bad-import-order

TESTS = os.path.dirname(os.path.abspath(__file__))
CAUSAL = 'bert_causal'  # conformance/test_kernels.py's causal BERT row.


def outcomes(tmp_path, suite: str, plugin: str, names, tier='not slow') -> dict[str, str]:
  """{test name: 'passed' | 'failed' | 'skipped'} of tests/conformance/`suite`'s `tier` (a -m
  expression; '': every test) for the ids holding `names`, run in a pytest of its own with
  `plugin` loaded before collection."""
  report = tmp_path / f'{plugin}.xml'
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(
      [TESTS, os.path.dirname(TESTS), os.environ.get('PYTHONPATH', '')])}
  subprocess.run(
      [sys.executable, '-m', 'pytest', os.path.join(TESTS, 'conformance', suite),
       '-p', plugin, '-p', 'no:cacheprovider', '-q', '-m', tier, '-k',
       ' or '.join(names), f'--junitxml={report}'],
      cwd=os.path.dirname(TESTS), env=env, capture_output=True, text=True, check=False)
  # It inherits this session's compilation cache (conftest.py) and leaves it in place.
  cache = os.environ.get(conftest.SESSION_CACHE_ENV)
  assert not cache or os.path.isdir(cache), f'the pytest in a subprocess removed {cache}'
  found = {}
  for case in ElementTree.parse(report).getroot().iter('testcase'):
    failed = case.find('failure') is not None or case.find('error') is not None
    found[case.get('name')] = 'failed' if failed else (
        'skipped' if case.find('skipped') is not None else 'passed')
  return found


@pytest.mark.slow
def test_families_registered_by_a_plugin_are_held_to_the_suite(tmp_path):
  found = outcomes(tmp_path, 'test_families.py', 'registered_families',
                   (CAMEMBERT, SCALED, MISCOUNTED))
  family = lambda name: {k: v for k, v in found.items() if f'[{name}' in k}  # noqa: E731
  camembert, scaled, miscounted = family(CAMEMBERT), family(SCALED), family(MISCOUNTED)
  every = {k.replace(f'[{CAMEMBERT}', '[') for k in camembert}
  assert len(camembert) >= 5 and set(camembert.values()) == {'passed'}, camembert
  assert any(k.startswith('test_import_gives_transformers') for k in camembert), camembert
  # No transformers class of its own: FLOPs, scanned and unrolled (the fast tier's checks).
  assert set(scaled.values()) == {'passed'} and len(scaled) == 2, scaled
  assert {k.replace(f'[{SCALED}', '[') for k in scaled} < every
  assert {k: v for k, v in miscounted.items() if v == 'failed'} == {
      f'test_flops_are_the_dot_products_the_encoder_runs[{MISCOUNTED}-{scan}]': 'failed'
      for scan in ('True', 'False')}, miscounted
  assert len(miscounted) == 2, miscounted


@pytest.mark.slow
def test_objectives_registered_by_a_plugin_are_held_to_the_suite(tmp_path):
  found = outcomes(tmp_path, 'test_objectives.py', 'registered_objectives', ('segment',))
  segment = {k: v for k, v in found.items() if k.endswith('[segment]')}
  mean = {k: v for k, v in found.items() if k.endswith(f'[{MEAN}]')}
  assert len(segment) >= 3 and set(segment.values()) == {'passed'}, found
  assert {k.replace('[segment]', '') for k in segment} == {
      k.replace(f'[{MEAN}]', '') for k in mean}, found
  assert {k for k, v in mean.items() if v == 'failed'} == {
      f'test_its_stats_pool_exactly_over_rows[{MEAN}]'}, found


@pytest.mark.slow
def test_task_kinds_registered_by_a_plugin_are_held_to_the_suite(tmp_path):
  found = outcomes(tmp_path, 'test_tasks.py', 'registered_tasks', ('cue_word',), tier='')
  cue_word = {k: v for k, v in found.items() if k.endswith('[cue_word]')}
  unlabelled = {k: v for k, v in found.items() if k.endswith(f'[{UNLABELLED}]')}
  assert len(cue_word) == 3 and set(cue_word.values()) == {'passed'}, found
  assert {k for k, v in unlabelled.items() if v == 'failed'} == {
      f'test_its_task_encodes_its_heads_targets_and_scores_its_main_metric[{UNLABELLED}]'}, found
  assert len(unlabelled) == 3, found


@pytest.mark.slow
def test_attention_kernels_registered_by_a_plugin_are_held_to_the_suite(tmp_path):
  # BERT, causal BERT, ModernBERT (windows in the bias) and DeBERTa, which refuses them.
  found = outcomes(tmp_path, 'test_kernels.py', 'registered_kernels',
                   ('-bert', 'modernbert', 'deberta', 'masks'), tier='')
  kernel = lambda name: {k.split('[')[1][len(name) + 1:-1]: v  # noqa: E731
                         for k, v in found.items() if f'[{name}-' in k}
  skipped = {'deberta': 'skipped'}
  assert kernel(PALLAS_ROWS.name) == {
      'bert': 'passed', CAUSAL: 'passed', 'modernbert': 'passed', **skipped}, found
  assert kernel(NO_KEY_GRADIENT.name) == {
      'bert': 'failed', CAUSAL: 'failed', 'modernbert': 'failed', **skipped}, found
  assert kernel(EINSUM_DROPOUT.name) == {
      'bert': 'passed', CAUSAL: 'passed', 'modernbert': 'passed', **skipped}, found
  # Only the kernel with dropout owes the dropout check.
  assert {k: v for k, v in found.items() if 'masks' in k} == {
      f'test_its_dropout_masks_come_from_the_dropout_stream[{EINSUM_DROPOUT.name}]': 'passed'}

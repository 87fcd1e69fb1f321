"""tests/conformance/ takes whatever the registries hold when it is collected: three families
registered from outside bert_jax by a plugin (tests/registered_families.py), with no edit to the
suite, are held to every family's contract. CamemBERT, a family of a dozen lines, passes every
check, transformers' included; the scaled BERT, which borrows BERT's model_type, passes the
checks that need no transformers class; the BERT with miscounted FLOPs fails the FLOPs check and
nothing else."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from test_family_unit import NAME as SCALED  # pylint: disable=g-bad-import-order
from registered_families import CAMEMBERT, MISCOUNTED  # pylint: disable=g-bad-import-order

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_families_registered_by_a_plugin_are_held_to_the_suite(tmp_path):
  report = tmp_path / 'report.xml'
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(
      [TESTS, os.path.dirname(TESTS), os.environ.get('PYTHONPATH', '')])}
  subprocess.run(
      [sys.executable, '-m', 'pytest', os.path.join(TESTS, 'conformance', 'test_families.py'),
       '-p', 'registered_families', '-p', 'no:cacheprovider', '-q', '-m', 'not slow', '-k',
       f'{CAMEMBERT} or {SCALED} or {MISCOUNTED}', f'--junitxml={report}'],
      cwd=os.path.dirname(TESTS), env=env, capture_output=True, text=True, check=False)
  outcomes = {}
  for case in ElementTree.parse(report).getroot().iter('testcase'):
    failed = case.find('failure') is not None or case.find('error') is not None
    outcomes[case.get('name')] = 'failed' if failed else (
        'skipped' if case.find('skipped') is not None else 'passed')
  family = lambda name: {k: v for k, v in outcomes.items() if f'[{name}' in k}  # noqa: E731
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

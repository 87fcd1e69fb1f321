"""The layer contract (.importlinter): every import points down the layers, and no two packages
or modules of one parent import each other; no import is exempt."""

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, '.importlinter')
# In its own process: import-linter's configuration disables the loggers that exist when it runs
# (absl's among them), which would silence the rest of a test process.
LINT = ('import sys; from importlinter import cli; '
        'sys.exit(cli.lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))')


def lint(config_path: str) -> tuple[int, str]:
  """(lint-imports' exit code, its report) for the contracts in `config_path`."""
  result = subprocess.run([sys.executable, '-c', LINT, config_path], cwd=REPO,
                          capture_output=True, text=True, check=False)
  return result.returncode, result.stdout + result.stderr


def test_imports_follow_the_layers_and_form_no_circle():
  code, report = lint(CONFIG)
  assert code == 0, report
  assert 'Contracts: 2 kept, 0 broken.' in report, report
  with open(CONFIG, encoding='utf-8') as f:
    # No upward import left: no contract exempts one.
    assert not re.search(r'^ignore_imports', f.read(), re.MULTILINE)


def lint_planted(tmp_path, old: str, new: str) -> tuple[int, str]:
  """lint() of .importlinter with its first `old` replaced by `new`."""
  with open(CONFIG, encoding='utf-8') as f:
    text = f.read()
  planted = text.replace(old, new, 1)
  assert planted != text
  path = tmp_path / 'planted.ini'
  path.write_text(planted, encoding='utf-8')
  return lint(str(path))


def test_an_exemption_for_an_import_that_does_not_exist_fails(tmp_path):
  # An ignore that matches no import is an error: an exemption cannot outlive its import.
  code, report = lint_planted(tmp_path, 'unmatched_ignore_imports_alerting = error\n',
                              'unmatched_ignore_imports_alerting = error\nignore_imports =\n'
                              '    bert_jax.ops -> bert_jax.train\n')
  assert code != 0
  assert 'bert_jax.ops -> bert_jax.train' in report, report


def test_the_contract_catches_an_import_from_a_higher_layer(tmp_path):
  # Swap two layers: every import of the lower by the upper now points up.
  code, report = lint_planted(tmp_path, '    bert_jax.ops\n    bert_jax.kernels\n',
                              '    bert_jax.kernels\n    bert_jax.ops\n')
  assert code != 0
  assert 'bert_jax.ops' in report and 'BROKEN' in report, report

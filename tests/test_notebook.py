"""notebooks/bert_jax_demo.ipynb runs top to bottom, shrunk (BERT_JAX_DEMO_SMALL=1), on CPU.

The notebook is executed from a temporary copy in a fresh kernel whose working directory is a
temporary folder (its runs go there); the repository's notebook and its saved outputs are not
touched. Any cell that raises fails the run: a notebook with a deliberately failing cell shows
that the same helper catches it.
"""

import json
import os
import shutil

import pytest

import conftest

nbformat = pytest.importorskip('nbformat')
nbclient = pytest.importorskip('nbclient')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, 'notebooks', 'bert_jax_demo.ipynb')
CELL_TIMEOUT_S = 900  # One cell at most; the shrunk pretraining takes 1-2 min on 2 cores.


def execute_notebook(path: str, cwd: str, env: dict) -> 'nbformat.NotebookNode':
  """Runs every cell of the notebook at `path` in a fresh python3 kernel working in `cwd` with
  environment `env`; raises nbclient's CellExecutionError at the first cell that raises.
  Returns the executed notebook; the file at `path` is not written."""
  notebook = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(notebook, kernel_name='python3', timeout=CELL_TIMEOUT_S,
                                   resources={'metadata': {'path': cwd}})
  client.execute(env=env)
  return notebook


def printed(notebook) -> str:
  """Everything the notebook's code cells printed (stdout and stderr), in order."""
  return ''.join(output.get('text', '') for cell in notebook.cells
                 if cell.cell_type == 'code' for output in cell.outputs)


def demo_env(**extra) -> dict:
  """This process's environment, with the repository importable from anywhere (the kernel
  works in a temporary folder, like a notebook outside a checkout after `pip install`)."""
  env = dict(os.environ, **extra)
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [REPO, env.get('PYTHONPATH', '')]))
  return env


@pytest.mark.slow
def test_demo_notebook_runs_top_to_bottom_shrunk(tmp_path):
  with open(NOTEBOOK, 'rb') as f:
    saved = f.read()
  copy = tmp_path / 'bert_jax_demo.ipynb'
  shutil.copy(NOTEBOOK, copy)
  env = demo_env(BERT_JAX_DEMO_SMALL='1')
  # The notebook steps the tiny config tens of times: XLA's optimised CPU code (conftest's fast
  # codegen off) runs those steps about 3x faster than it costs to compile.
  env['XLA_FLAGS'] = ' '.join(flag for flag in env.get('XLA_FLAGS', '').split()
                              if flag not in conftest.FAST_COMPILE_FLAGS)
  # Without the shared data the fine-tuning takes the SST-2 sample bundled with the notebook.
  env.pop('BERT_JAX_DATA', None)
  notebook = execute_notebook(str(copy), str(tmp_path), env)
  text = printed(notebook)
  assert 'SST-2 from the bundled sample' in text
  assert 'SST-2 dev accuracy' in text
  assert 'max abs difference of the MLM logits' in text  # transformers is a dev requirement.
  records = [json.loads(line) for line in open(tmp_path / 'runs' / 'demo' / 'metrics.jsonl')]
  assert max(r['step'] for r in records) == 40  # The shrunk run, in the kernel's folder.
  with open(NOTEBOOK, 'rb') as f:
    assert f.read() == saved


def test_a_failing_cell_fails_the_run(tmp_path):
  notebook = nbformat.v4.new_notebook()
  notebook.cells = [nbformat.v4.new_code_cell('ran = True'),
                    nbformat.v4.new_code_cell("raise ValueError('deliberate failure')"),
                    nbformat.v4.new_code_cell("open('after.txt', 'w').close()")]
  path = tmp_path / 'failing.ipynb'
  nbformat.write(notebook, str(path))
  with pytest.raises(nbclient.exceptions.CellExecutionError, match='deliberate failure'):
    execute_notebook(str(path), str(tmp_path), demo_env())
  assert not (tmp_path / 'after.txt').exists()  # Execution stopped at the failing cell.


def code_cells(notebook):
  return [cell for cell in notebook.cells if cell.cell_type == 'code']


@pytest.fixture(scope='module')
def demo():
  return nbformat.read(NOTEBOOK, as_version=4)


def test_every_code_cell_follows_a_markdown_cell(demo):
  for before, cell in zip(demo.cells, demo.cells[1:]):
    if cell.cell_type == 'code':
      assert before.cell_type == 'markdown', cell.source[:80]


def test_first_code_cell_is_the_papermill_parameters_read_from_the_environment(demo):
  first = code_cells(demo)[0]
  assert 'parameters' in first.metadata.get('tags', [])
  assert "os.environ.get('BERT_JAX_DEMO_SMALL'" in first.source


def test_saved_outputs_come_from_one_run_without_errors_or_timestamps(demo):
  cells = code_cells(demo)
  assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
  for cell in cells:
    assert not [o for o in cell.outputs if o.output_type == 'error'], cell.source[:80]
    assert 'execution' not in cell.metadata  # nbclient's timestamps: stripped before saving.
  nbformat.validate(demo)

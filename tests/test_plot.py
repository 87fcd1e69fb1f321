"""bert_jax.plot: curves.png and finetune.png from metrics.jsonl, stable bytes, clear errors, and
what a finished pretraining run does when drawing fails. That a real run draws its own
plots/curves.png is checked on test_train.py's run (the workdir contract) and README's quickstart
(tests/test_readme.py), which train anyway."""

import json
import os

import pytest

from bert_jax import plot
from bert_jax.train import pretrain

pytest.importorskip('matplotlib')

PNG = b'\x89PNG\r\n\x1a\n'


def write_records(path, records):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(json.dumps(r) + '\n' for r in records)


def pretraining_records(scale: float, nsp: bool = True) -> list[dict]:
  """A run of 40 steps: train records every 10 steps (the first timed none), eval every 20."""
  records = []
  for step in range(0, 41, 10):
    losses = {'loss': scale * (10 - step / 10), 'mlm_loss': scale * (9 - step / 10),
              'mlm_accuracy': step / 100}
    if nsp:
      losses.update(nsp_loss=0.7 - step / 1000, nsp_accuracy=0.5 + step / 1000)
    if step:
      records.append({'step': step, 'split': 'train', **losses, 'learning_rate': 1e-4 * step / 40,
                      'grad_norm': 1.0 + scale, 'seq_per_s': 0.0 if step == 10 else 50 * scale,
                      'mfu': 0.0 if step == 10 else 0.3 * scale})
    if step % 20 == 0:
      records.append({'step': step, 'split': 'eval', **losses, 'mlm_baseline_accuracy': 0.06})
  return records


@pytest.fixture(name='two_runs')
def fixture_two_runs(tmp_path):
  write_records(str(tmp_path / 'mlm_nsp' / 'metrics.jsonl'), pretraining_records(1.0))
  write_records(str(tmp_path / 'mlm' / 'metrics.jsonl'), pretraining_records(1.2, nsp=False))
  return [str(tmp_path / 'mlm_nsp'), str(tmp_path / 'mlm')]


def test_two_runs_draw_one_png_and_a_rerun_the_same_bytes(two_runs, tmp_path):
  paths = plot.curves(two_runs, str(tmp_path / 'a'))
  assert paths == [str(tmp_path / 'a' / 'curves.png')]
  data = (tmp_path / 'a' / 'curves.png').read_bytes()
  assert data.startswith(PNG) and len(data) > 50_000
  plot.curves(two_runs, str(tmp_path / 'b'))
  assert (tmp_path / 'b' / 'curves.png').read_bytes() == data


def test_a_line_cut_short_by_a_crash_is_skipped(tmp_path):
  path = tmp_path / 'run' / 'metrics.jsonl'
  write_records(str(path), pretraining_records(1.0))
  with open(path, 'a', encoding='utf-8') as f:
    f.write('{"step": 50, "spl')
  assert plot.read_records(str(path)) == pretraining_records(1.0)


def test_a_workdir_without_metrics_is_named(two_runs, tmp_path):
  missing = str(tmp_path / 'not_a_run')
  os.makedirs(missing)
  with pytest.raises(FileNotFoundError, match='not_a_run.*not a pretraining or fine-tuning'):
    plot.curves(two_runs + [missing], str(tmp_path / 'out'))
  assert not (tmp_path / 'out').exists()  # Nothing drawn before every workdir was read.
  with pytest.raises(SystemExit, match=r'not_a_run/metrics\.jsonl does not exist'):
    plot.main([missing, f'--out={tmp_path / "out"}'])


def test_labels_are_basenames_told_apart_by_their_parents():
  assert plot.labels(['runs/a', 'runs/b/']) == ['a', 'b']
  assert plot.labels(['x/base', 'y/base', 'small']) == ['x/base', 'y/base', 'small']
  assert plot.labels(['p/x/base', 'q/x/base']) == ['p/x/base', 'q/x/base']
  assert plot.labels(['runs/a', 'runs/a']) == ['a', 'a (2)']


def finetune_records(seed: int, metrics=('f1', 'accuracy')) -> list[dict]:
  records = []
  for step in (5, 10):
    records.append({'step': step, 'split': 'train', 'loss': 0.7 - step / 100 - seed / 100,
                    'learning_rate': 2e-5, 'seq_per_s': 100.0})
    records.append({'step': step, 'split': 'eval', 'epoch': step / 10, 'eval_split': 'dev',
                    **{m: 80.0 + step + seed for m in metrics}, 'loss': 0.5 - step / 100})
  return records


def test_a_finetuning_workdir_draws_each_seed(tmp_path):
  for seed in (0, 1, 2):
    write_records(str(tmp_path / 'mrpc' / f'seed_{seed}' / 'metrics.jsonl'),
                  finetune_records(seed))
  paths = plot.curves([str(tmp_path / 'mrpc')], str(tmp_path / 'out'))
  assert paths == [str(tmp_path / 'out' / 'finetune.png')]
  data = (tmp_path / 'out' / 'finetune.png').read_bytes()
  assert data.startswith(PNG) and len(data) > 20_000
  assert plot.load(str(tmp_path / 'mrpc'), 'mrpc').metric == 'f1'


def test_the_main_metric_is_results_json_s(tmp_path):
  write_records(str(tmp_path / 'stsb' / 'seed_0' / 'metrics.jsonl'),
                finetune_records(0, metrics=('spearman', 'pearson')))
  assert plot.load(str(tmp_path / 'stsb'), 'stsb').metric == 'spearman'  # The first one.
  (tmp_path / 'stsb' / 'results.json').write_text(json.dumps({'main_metric': 'pearson'}))
  assert plot.load(str(tmp_path / 'stsb'), 'stsb').metric == 'pearson'


def test_without_matplotlib_the_run_logs_the_command(tmp_path, monkeypatch, caplog):
  def no_matplotlib(workdirs, out_dir):
    raise ImportError('No module named matplotlib')
  monkeypatch.setattr(plot, 'curves', no_matplotlib)
  with caplog.at_level('INFO'):
    pretrain.write_plots(str(tmp_path))
  assert f'python -m bert_jax.plot {tmp_path} --out={tmp_path / "plots"}' in caplog.text


def test_a_failed_plot_does_not_fail_the_run(tmp_path, caplog):
  # A finished run whose metrics.jsonl is gone: drawing fails, the run does not.
  with caplog.at_level('WARNING'):
    pretrain.write_plots(str(tmp_path))
  assert 'Could not draw the curves (FileNotFoundError' in caplog.text


def test_a_run_with_one_train_record_draws_no_curves(tmp_path, caplog):
  write_records(str(tmp_path / 'metrics.jsonl'), pretraining_records(1.0)[:2])
  with caplog.at_level('INFO'):
    pretrain.write_plots(str(tmp_path))
  assert not (tmp_path / 'plots').exists()
  assert 'a curve needs two' in caplog.text
  write_records(str(tmp_path / 'metrics.jsonl'), pretraining_records(1.0))
  pretrain.write_plots(str(tmp_path))
  assert (tmp_path / 'plots' / 'curves.png').is_file()

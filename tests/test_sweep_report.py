"""The sweep report: tables from synthetic workdirs, budgets, missing runs, reruns, plots."""

import json
import math
import statistics
import subprocess
import sys

import pytest

from bert_jax.sweep import plots
from bert_jax.sweep import report
from bert_jax.sweep import results
from bert_jax.train import lr_grid
from bert_jax.train import metrics as metrics_lib
from configs import tiny

TASKS = ('sst2', 'mrpc')
SEEDS = 3
ARMS = (  # (name, label, pretraining run, paper numbers)
    ('mlm_nsp', 'MLM + NSP (BERT)', 'mlm_nsp', {'sst2': 92.7, 'mrpc': 86.7}),
    ('mlm', 'MLM only', 'mlm', {'sst2': 92.6}),
    ('random', 'No pretraining', None, {}),
)
PAPER_COLUMNS = ['mnli', 'sst2', 'mrpc']


def pretrain_config(objectives: str, num_steps: int, phase2_fraction: float = 0.0):
  config = tiny.get_config()
  config.objectives = objectives
  config.train.update(num_steps=num_steps, batch_size=13, phase2_fraction=phase2_fraction,
                      phase2_batch_size=7)
  config.data.update(max_seq_length=32, phase2_max_seq_length=64)
  return config


def write_pretrain(directory, config, steps: int, lm: str = 'mlm', finished: bool = True):
  """config.json and metrics.jsonl of a run that reached `steps`; eval_results.json if done."""
  directory.mkdir(parents=True)
  if config is not None:
    (directory / 'config.json').write_text(config.to_json())
  records = []
  for step in range(0, steps + 1, 10):
    loss = 8.0 / (1 + step / 10)
    if step:
      records.append({'step': step, 'split': 'train', 'loss': loss + 0.7,
                      f'{lm}_loss': loss, 'seq_per_s': 100.0 + step, 'mfu': 0.001 * step,
                      'learning_rate': 1e-3})
    records.append({'step': step, 'split': 'eval', 'loss': loss + 0.8, f'{lm}_loss': loss + 0.1})
  (directory / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  if finished:
    (directory / 'eval_results.json').write_text(json.dumps(records[-1]))
  return records


def scores_of(arm: str, task: str, step=None) -> list[float]:
  """Each seed's accuracy, made up but distinct per (arm, task, step, seed)."""
  base = ({'mlm_nsp': 85.0, 'mlm': 83.0, 'random': 60.0}[arm] + {'sst2': 6.0, 'mrpc': 0.0}[task]
          + (step or 0) / 100)
  return [round(base + 1.3 * seed - 0.4 * seed**2, 2) for seed in range(SEEDS)]


def write_finetune(directory, task: str, scores: list[float]):
  """results.json as finetune.summarize_seeds makes it."""
  directory.mkdir(parents=True)
  per_seed = [{'accuracy': s, 'f1': s - 1.0} for s in scores]
  (directory / 'results.json').write_text(json.dumps({
      'task': task, 'main_metric': 'accuracy', 'seeds': list(range(len(scores))),
      'median': {'dev': {k: statistics.median(r[k] for r in per_seed) for k in per_seed[0]}},
      'per_seed': {'dev': per_seed}}))


def write_grid_finetune(directory, task: str, per_rate: dict, baseline: float,
                        losses=(0.70, 0.52, 0.50)):
  """results.json as finetune.run writes it with a learning-rate grid ({rate: each seed's
  accuracy}): every rate's summary (lr_grid.summarize), the selected rate's seeds on top, and
  the majority-class baseline."""
  directory.mkdir(parents=True, exist_ok=True)
  def seed(index, accuracy):
    curve = [{'epoch': i + 1.0, 'step': i + 1, 'accuracy': accuracy, 'loss': loss}
             for i, loss in enumerate(losses)]
    return {'seed': index, 'metrics': {'dev': {'accuracy': accuracy}}, 'curve': {'dev': curve}}
  seeds = {rate: [seed(i, a) for i, a in enumerate(scores)] for rate, scores in per_rate.items()}
  protocol = lr_grid.summarize(seeds, 'dev', 'accuracy', grid=True)
  chosen = seeds[protocol['learning_rate']]
  (directory / 'results.json').write_text(json.dumps({
      'task': task, 'main_metric': 'accuracy', 'seeds': [r['seed'] for r in chosen],
      'median': lr_grid.medians(chosen), 'per_seed': {'dev': [r['metrics']['dev'] for r in chosen]},
      **protocol,
      'baseline': {'kind': 'majority class of the training rows',
                   'metrics': {'dev': {'accuracy': baseline}}}}))
  return protocol


def make_sweep(root, steps=(), skip=()):
  """A finished sweep in root: two pretraining runs, three arms (one from random init), every
  arm on every task, and fine-tuning from each of `steps`; runs named in `skip` left out."""
  configs = {'mlm_nsp': pretrain_config('mlm,nsp', 40), 'mlm': pretrain_config('mlm', 40)}
  for name, config in configs.items():
    write_pretrain(root / 'pretrain' / name, config, 40)
  finetune_runs = []
  for arm, _, run, _ in ARMS:
    for task in TASKS:
      for step in [None] + (list(steps) if run else []):
        rel = f'finetune/{arm}/{task}' + (f'@{step}' if step else '')
        finetune_runs.append({'arm': arm, 'task': task, 'step': step, 'workdir': rel})
        if rel not in skip:
          write_finetune(root / rel, task, scores_of(arm, task, step))
  (root / 'sweep.json').write_text(json.dumps({
      'name': 'table5', 'title': 'BERT Table 5: pre-training tasks',
      'description': 'Pre-training tasks, ablated.', 'sweep_file': 'sweeps/table5.py',
      'base': 'configs/tiny.py', 'tasks': list(TASKS), 'seeds': SEEDS,
      'notes': ['MRPC dev is its own split.'],
      'paper': {'source': 'Devlin et al. 2018, Table 5', 'columns': PAPER_COLUMNS},
      'pretrain_runs': {name: {'workdir': f'pretrain/{name}', 'config': 'configs/tiny.py',
                               'overrides': {'objectives': c.objectives, 'train.log_every': 10}}
                        for name, c in configs.items()},
      'arms': [{'name': a, 'label': label, 'pretrain_run': run, 'finetune_overrides': {},
                'paper': paper} for a, label, run, paper in ARMS],
      'finetune_runs': finetune_runs}, indent=2, sort_keys=True))
  return configs


def cells(header_rows, row_label):
  header, rows = header_rows
  return dict(zip(header, next(r for r in rows if r[0] == row_label)))


def test_main_table_gives_median_spread_and_average_of_the_seeds(tmp_path):
  make_sweep(tmp_path)
  row = cells(report.main_rows(report.load(str(tmp_path))), 'MLM + NSP (BERT)')
  medians = []
  for task in TASKS:
    scores = scores_of('mlm_nsp', task)
    medians.append(statistics.median(scores))
    assert row[f'{task} accuracy'] == (
        f'{statistics.median(scores):.1f} [{min(scores):.1f}–{max(scores):.1f}]')
  assert row['average'] == f'{statistics.fmean(medians):.1f}'
  assert row['pretraining'] == 'mlm_nsp'


def test_paper_columns_hold_the_arms_numbers_and_dashes_for_the_tasks_that_ran(tmp_path):
  make_sweep(tmp_path)
  sweep = report.load(str(tmp_path))
  header, _ = table = report.main_rows(sweep)
  for _, label, _, paper in ARMS:
    row = cells(table, label)
    for column in ('sst2', 'mrpc'):
      expected = f'{paper[column]:.1f}' if column in paper else '-'
      assert row[f'paper {column}'] == expected
  # MNLI is one of the paper's columns, not one of the sweep's tasks: no column, and said so.
  assert 'paper mnli' not in header
  assert 'Table 5; its mnli left out (not fine-tuned here).' in report.markdown(sweep)


def test_fewer_seeds_than_the_sweeps_are_counted(tmp_path):
  make_sweep(tmp_path, skip={'finetune/mlm/sst2'})
  scores = scores_of('mlm', 'sst2')[:2]
  write_finetune(tmp_path / 'finetune/mlm/sst2', 'sst2', scores)
  row = cells(report.main_rows(report.load(str(tmp_path))), 'MLM only')
  assert row['sst2 accuracy'] == (f'{statistics.median(scores):.1f} '
                                  f'[{min(scores):.1f}–{max(scores):.1f}] (2/{SEEDS} seeds)')


def test_absent_run_shows_a_dash_and_is_listed_missing(tmp_path):
  make_sweep(tmp_path, skip={'finetune/mlm/mrpc'})
  sweep = report.load(str(tmp_path))
  row = cells(report.main_rows(sweep), 'MLM only')
  assert row['mrpc accuracy'] == '-'
  assert row['average'] == '-'  # Not every task has a median.
  assert row['sst2 accuracy'] != '-'
  assert report.missing_runs(sweep) == ['fine-tuning `mlm` on mrpc (finetune/mlm/mrpc): missing']
  text = report.markdown(sweep)
  assert '- fine-tuning `mlm` on mrpc (finetune/mlm/mrpc): missing' in text


def test_unfinished_finetuning_run_counts_its_finished_seeds(tmp_path):
  make_sweep(tmp_path, skip={'finetune/random/sst2'})
  for seed in range(2):
    (tmp_path / f'finetune/random/sst2/seed_{seed}').mkdir(parents=True)
  (tmp_path / 'finetune/random/sst2/seed_0/results.json').write_text('{}')
  sweep = report.load(str(tmp_path))
  assert cells(report.main_rows(sweep), 'No pretraining')['sst2 accuracy'] == '-'
  assert report.missing_runs(sweep) == [
      f'fine-tuning `random` on sst2 (finetune/random/sst2): unfinished, 1 of {SEEDS} seeds done']


def test_an_arm_not_above_the_majority_baseline_is_marked_and_the_baseline_has_a_row(tmp_path):
  make_sweep(tmp_path, skip={'finetune/mlm/mrpc', 'finetune/mlm_nsp/mrpc'})
  # MLM only answers the majority class at every rate; MLM + NSP beats it.
  write_grid_finetune(tmp_path / 'finetune/mlm/mrpc', 'mrpc',
                      {5e-5: [68.4, 68.4, 68.4], 2e-5: [68.4, 68.4, 68.4]}, baseline=68.4)
  write_grid_finetune(tmp_path / 'finetune/mlm_nsp/mrpc', 'mrpc',
                      {5e-5: [80.0, 82.0, 81.0], 2e-5: [70.0, 71.0, 72.0]}, baseline=68.4)
  sweep = report.load(str(tmp_path))
  table = report.main_rows(sweep)
  assert cells(table, 'MLM only')['mrpc accuracy'] == f'68.4 [68.4–68.4] {report.AT_BASELINE}'
  assert cells(table, 'MLM + NSP (BERT)')['mrpc accuracy'] == '81.0 [80.0–82.0]'
  baseline = cells(table, report.BASELINE_LABEL)
  assert (baseline['mrpc accuracy'], baseline['sst2 accuracy']) == ('68.4', '-')
  text = report.markdown(sweep)
  assert 'mrpc: majority class of the training rows' in text
  assert f'{report.AT_BASELINE}: a median not above that baseline' in text
  assert 'The no-pretraining row: No pretraining (the base' in text


def test_a_sweep_without_a_random_init_arm_says_it_has_no_no_pretraining_row(tmp_path):
  make_sweep(tmp_path)
  sweep = report.load(str(tmp_path))
  spec = {**sweep.spec, 'arms': [a for a in sweep.arms if a['pretrain_run']]}
  text = report.baseline_text(results.Sweep(spec, sweep.pretrain, sweep.finetune))
  assert "no arm from random initialisation (init='random'), so no no-pretraining row" in text


def test_the_learning_rate_table_gives_the_rate_chosen_on_dev_and_each_rates_median(tmp_path):
  make_sweep(tmp_path, skip={'finetune/mlm/mrpc'})
  write_grid_finetune(tmp_path / 'finetune/mlm/mrpc', 'mrpc',
                      {5e-5: [70.0, 95.0, 71.0], 3e-5: [80.0, 82.0, 78.0]}, baseline=68.4)
  sweep = report.load(str(tmp_path))
  run = sweep.final('mlm', 'mrpc')
  assert (run.learning_rate, run.scores) == (3e-5, (80.0, 82.0, 78.0))
  row = cells(report.rate_rows(sweep), 'MLM only')
  assert row['mrpc'] == '3e-05 (5e-05: 71.0, 3e-05: 80.0)'
  assert row['sst2'] == '-'  # A run from before the grid records no rate.
  assert cells(report.main_rows(sweep), 'MLM only')['mrpc accuracy'] == '80.0 [78.0–82.0]'
  assert '## Fine-tuning learning rate' in report.markdown(sweep)


def test_the_convergence_table_gives_the_last_dev_loss_and_its_last_epoch_change(tmp_path):
  make_sweep(tmp_path, skip={'finetune/mlm/mrpc'})
  write_grid_finetune(tmp_path / 'finetune/mlm/mrpc', 'mrpc', {5e-5: [80.0, 81.0, 82.0]},
                      baseline=68.4, losses=(0.70, 0.52, 0.43))
  sweep = report.load(str(tmp_path))
  assert cells(report.convergence_rows(sweep), 'MLM only')['mrpc'] == '0.430 (-0.090)'
  assert '## Fine-tuning convergence' in report.markdown(sweep)


def test_tables_of_the_protocol_are_left_out_for_runs_from_before_it(tmp_path):
  make_sweep(tmp_path)
  sweep = report.load(str(tmp_path))
  assert report.rate_rows(sweep)[1] == [] and report.convergence_rows(sweep)[1] == []
  assert report.BASELINE_LABEL not in [row[0] for row in report.main_rows(sweep)[1]]


def test_unfinished_grid_run_counts_the_finished_seeds_of_every_rate(tmp_path):
  make_sweep(tmp_path, skip={'finetune/random/sst2'})
  spec = json.loads((tmp_path / 'sweep.json').read_text())
  spec['learning_rates'] = [5e-5, 3e-5]
  (tmp_path / 'sweep.json').write_text(json.dumps(spec))
  for rate, done in (('lr_5e-05', 3), ('lr_3e-05', 1)):
    for seed in range(done):
      (tmp_path / f'finetune/random/sst2/{rate}/seed_{seed}').mkdir(parents=True)
      (tmp_path / f'finetune/random/sst2/{rate}/seed_{seed}/results.json').write_text('{}')
  assert report.missing_runs(report.load(str(tmp_path))) == [
      'fine-tuning `random` on sst2 (finetune/random/sst2): unfinished, 4 of '
      f'{2 * SEEDS} (seeds x learning rates) seeds done']


def test_a_complete_sweep_lists_no_missing_runs(tmp_path):
  make_sweep(tmp_path)
  assert report.missing_runs(report.load(str(tmp_path))) == []
  assert 'None: every run finished.' in report.markdown(report.load(str(tmp_path)))


def test_budget_counts_sequence_slots_and_model_flops(tmp_path):
  configs = make_sweep(tmp_path)
  sweep = report.load(str(tmp_path))
  config = configs['mlm_nsp']
  run = sweep.pretrain['mlm_nsp']
  assert run.steps == 40 and run.status == 'finished'
  assert run.tokens == 40 * config.train.batch_size * config.data.max_seq_length
  assert run.flops == pytest.approx(
      40 * config.train.batch_size * metrics_lib.model_flops_per_sequence(config))
  row = cells(report.budget_rows(sweep), 'mlm_nsp')
  assert row['PFLOPs'] == f'{run.flops / 1e15:.4g}'
  eval_mlm = [r for r in map(json.loads, (tmp_path / 'pretrain/mlm_nsp/metrics.jsonl')
                             .read_text().splitlines()) if r['split'] == 'eval'][-1]['mlm_loss']
  assert row['held-out MLM loss'] == f'{eval_mlm:.3f}'
  assert row['MLM perplexity'] == f'{math.exp(eval_mlm):.2f}'


def test_overrides_every_run_shares_are_said_once(tmp_path):
  make_sweep(tmp_path)
  sweep = report.load(str(tmp_path))
  assert cells(report.budget_rows(sweep), 'mlm')['overrides'] == '`objectives=mlm`'
  assert 'Every run also has `train.log_every=10`.' in report.markdown(sweep)


def test_budget_of_a_two_phase_run_counts_each_phase(tmp_path):
  config = pretrain_config('mlm', 40, phase2_fraction=0.25)
  write_pretrain(tmp_path / 'run', config, 40)
  run = report.results.load_pretrain(str(tmp_path), 'two_phase', {'workdir': 'run'})
  second = config.copy_and_resolve_references()
  second.data.max_seq_length = config.data.phase2_max_seq_length
  second.data.max_predictions_per_seq = config.data.phase2_max_predictions_per_seq
  second.train.batch_size = config.train.phase2_batch_size
  assert run.tokens == (30 * config.train.batch_size * config.data.max_seq_length
                        + 10 * second.train.batch_size * second.data.max_seq_length)
  assert run.flops == pytest.approx(
      30 * config.train.batch_size * metrics_lib.model_flops_per_sequence(config)
      + 10 * second.train.batch_size * metrics_lib.model_flops_per_sequence(second))


def test_unfinished_pretraining_run_shows_its_progress(tmp_path):
  make_sweep(tmp_path)
  (tmp_path / 'pretrain/mlm').rename(tmp_path / 'old')
  write_pretrain(tmp_path / 'pretrain/mlm', pretrain_config('mlm', 40), 20, finished=False)
  sweep = report.load(str(tmp_path))
  assert cells(report.budget_rows(sweep), 'mlm')['steps'] == '20/40'
  assert 'pretraining `mlm` (pretrain/mlm): unfinished, at step 20 of 40' in (
      report.missing_runs(sweep))


def test_clm_run_gets_its_own_loss_columns(tmp_path):
  make_sweep(tmp_path)
  (tmp_path / 'pretrain/mlm').rename(tmp_path / 'old')
  records = write_pretrain(tmp_path / 'pretrain/mlm', None, 40, lm='clm')
  sweep = report.load(str(tmp_path))
  row = cells(report.budget_rows(sweep), 'mlm')
  clm = [r for r in records if r['split'] == 'eval'][-1]['clm_loss']
  assert row['held-out CLM loss'] == f'{clm:.3f}'
  assert row['CLM perplexity'] == f'{math.exp(clm):.2f}'
  assert row['held-out MLM loss'] == '-'
  assert cells(report.budget_rows(sweep), 'mlm_nsp')['held-out CLM loss'] == '-'
  assert 'are not comparable' in report.markdown(sweep)


def test_other_objectives_held_out_metrics_get_a_column_only_when_a_run_has_them(tmp_path):
  make_sweep(tmp_path)
  assert 'held-out, other objectives' not in report.budget_rows(report.load(str(tmp_path)))[0]
  path = tmp_path / 'pretrain/mlm_nsp/metrics.jsonl'
  records = [json.loads(line) for line in path.read_text().splitlines()]
  records[-1].update(nsp_accuracy=0.9312, rtd_disc_auc=0.5103)  # The last eval record.
  records[-3].update(nsp_accuracy=0.5)  # An earlier one: not reported.
  path.write_text(''.join(json.dumps(r) + '\n' for r in records))
  sweep = report.load(str(tmp_path))
  assert cells(report.budget_rows(sweep), 'mlm_nsp')['held-out, other objectives'] == (
      'NSP accuracy 0.931; RTD AUC 0.510')
  assert cells(report.budget_rows(sweep), 'mlm')['held-out, other objectives'] == '-'
  assert 'the last eval record\'s accuracy of NSP or SOP' in report.markdown(sweep)


def test_steps_table_appears_only_with_stepped_runs(tmp_path):
  make_sweep(tmp_path / 'plain')
  plain = report.load(str(tmp_path / 'plain'))
  assert report.step_rows(plain)[1] == []
  assert 'against pretraining steps' not in report.markdown(plain)
  assert 'score_vs_steps' not in report.plot_names(plain)

  make_sweep(tmp_path / 'stepped', steps=(10, 20))
  stepped = report.load(str(tmp_path / 'stepped'))
  header, rows = report.step_rows(stepped)
  assert [r[0] for r in rows] == ['10', '20', 'final']
  assert len(header) == 1 + 2 * len(TASKS)  # The random-init arm has no steps.
  row = cells((header, rows), '20')
  assert row['MLM only: mrpc'] == f'{statistics.median(scores_of("mlm", "mrpc", 20)):.1f}'
  assert '## Downstream against pretraining steps' in report.markdown(stepped)


def test_write_rebuilds_the_same_report_and_draws_the_plots(tmp_path):
  pytest.importorskip('matplotlib')
  make_sweep(tmp_path, steps=(20,), skip={'finetune/mlm/mrpc'})
  text = report.write(str(tmp_path))
  assert (tmp_path / 'report.md').read_text(encoding='utf-8') == text
  first = (tmp_path / 'report.md').read_bytes()
  pngs = {p.name: p.read_bytes() for p in (tmp_path / 'plots').iterdir()}
  assert sorted(pngs) == ['curves.png', 'downstream.png', 'score_vs_compute.png',
                          'score_vs_steps.png']
  for data in pngs.values():
    assert data.startswith(b'\x89PNG\r\n\x1a\n') and len(data) > 10_000
  for name in pngs:
    assert f'(plots/{name})' in text
  report.write(str(tmp_path))
  assert (tmp_path / 'report.md').read_bytes() == first
  assert {p.name: p.read_bytes() for p in (tmp_path / 'plots').iterdir()} == pngs


def test_a_downstream_panel_s_axis_holds_the_baseline_and_says_where_it_starts():
  from bert_jax.sweep import plots  # pylint: disable=g-import-not-at-top
  # MRPC's F1 of always saying 'paraphrase' (81.2) below the arms' scores: on the axis.
  assert plots.score_axis([84.0, 86.5], 81.2) == pytest.approx((76.2, 88.5))
  assert plots.score_axis([84.0, 86.5], None) == pytest.approx((79.0, 88.5))
  assert plots.score_axis([3.0, 99.5], 0.0) == (0.0, 100.0)  # Within 0-100.


def test_the_compute_plot_names_the_dashed_line_only_where_it_draws_one(tmp_path, monkeypatch):
  pytest.importorskip('matplotlib')
  from bert_jax.sweep import plots  # pylint: disable=g-import-not-at-top
  make_sweep(tmp_path)
  figures = []
  monkeypatch.setattr(plots.plot, 'save', lambda figure, path: figures.append(figure))
  sweep = report.load(str(tmp_path))
  plots.score_vs_compute(sweep, str(tmp_path / 'a.png'))
  assert [ax.get_title() for ax in figures[-1].axes] == ['dashed: no pretraining'] * 2
  sweep.spec['arms'] = [arm for arm in sweep.arms if arm.get('pretrain_run')]  # No random init.
  plots.score_vs_compute(sweep, str(tmp_path / 'b.png'))
  axes = figures[-1].axes
  assert [ax.get_title() for ax in axes] == ['', '']
  # Each arm's point has a shape of its own (arms from one pretraining run share its x).
  shapes = [collection.get_paths()[0].vertices.tobytes() for collection in axes[0].collections]
  assert len(shapes) == len(sweep.arms) == len(set(shapes))


def test_workdir_without_sweep_json_is_a_clear_error(tmp_path):
  with pytest.raises(SystemExit, match='sweep.json does not exist'):
    report.main([str(tmp_path)])


@pytest.mark.slow  # A subprocess: a fresh interpreter is the only clean sys.modules.
def test_tables_need_no_matplotlib():
  code = ('import sys; from bert_jax.sweep import report; '
          "assert 'matplotlib' not in sys.modules")
  subprocess.run([sys.executable, '-c', code], check=True)


def test_an_arm_pretrained_by_an_alarmed_run_is_marked_and_its_average_withheld(tmp_path):
  make_sweep(tmp_path)
  path = tmp_path / 'pretrain' / 'mlm' / 'metrics.jsonl'
  records = [json.loads(line) for line in path.read_text().splitlines()]
  for record in records:
    if record['split'] == 'eval' and record['step'] >= 30:
      record['alarms'] = ['mlm_at_unigram']
    if record['split'] == 'train' and record['step'] == 20:
      record['alarms'] = ['loss_spike']
  path.write_text(''.join(json.dumps(r) + '\n' for r in records))
  sweep = report.load(str(tmp_path))
  assert sweep.pretrain['mlm'].alarms == (('loss_spike', 20, 20, 1), ('mlm_at_unigram', 30, 40, 2))
  table = report.main_rows(sweep)
  alarmed = cells(table, 'MLM only')
  assert alarmed['pretraining'] == f'mlm {report.ALARMED} loss_spike, mlm_at_unigram'
  assert alarmed['average'] == report.WITHHELD
  scores = scores_of('mlm', 'sst2')  # The scores stay as measured.
  assert alarmed['sst2 accuracy'].startswith(f'{statistics.median(scores):.1f} [')
  healthy = cells(table, 'MLM + NSP (BERT)')
  assert healthy['pretraining'] == 'mlm_nsp' and healthy['average'] != report.WITHHELD
  assert cells(report.budget_rows(sweep), f'mlm {report.ALARMED}')['steps'] == '40'
  assert cells(report.health_rows(sweep), 'mlm')['alarm'] == 'loss_spike'
  text = report.markdown(sweep)
  assert '## Run health' in text and 'draw no conclusion' in text
  assert set(plots.score_of(sweep)[1]) == {'mlm_nsp', 'random'}  # Off the compute plot.


def test_a_sweep_without_alarms_says_so(tmp_path):
  make_sweep(tmp_path)
  sweep = report.load(str(tmp_path))
  assert report.health_rows(sweep)[1] == []
  assert 'No run raised an alarm' in report.markdown(sweep)
  assert report.ALARMED not in report.table(*report.main_rows(sweep))

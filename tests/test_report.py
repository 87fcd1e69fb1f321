"""The results table: our medians and seeds beside the paper's numbers."""

import json

import pytest

from bert_jax.tasks import report


def write_results(directory, task, per_seed, feature_layers=0, lstm_layers=0):
  directory.mkdir()
  medians = {k: sorted(r[k] for r in per_seed)[len(per_seed) // 2] for k in per_seed[0]}
  (directory / 'results.json').write_text(json.dumps({
      'task': task, 'median': {'dev': medians}, 'per_seed': {'dev': per_seed},
      'feature_layers': feature_layers, 'lstm_layers': lstm_layers}))
  return str(directory)


def test_table_puts_our_median_and_seeds_beside_the_paper(tmp_path, capsys):
  mrpc = write_results(tmp_path / 'mrpc', 'mrpc', [{'f1': 85.3, 'accuracy': 77.7},
                                                   {'f1': 87.0, 'accuracy': 81.4},
                                                   {'f1': 83.9, 'accuracy': 76.5}])
  ner = write_results(tmp_path / 'ner', 'conll2003',
                      [{'precision': 89.6, 'recall': 90.3, 'f1': 90.0}], feature_layers=4)
  report.main([mrpc, ner])
  lines = capsys.readouterr().out.splitlines()
  assert ('| mrpc | mrpc | dev | f1 | 85.30 | 3: 85.3, 87.0, 83.9 |  | GLUE test | 88.9 | 89.3 |  '
          '|  |' in lines)
  assert ('| mrpc | mrpc | dev | accuracy | 77.70 | 3: 77.7, 81.4, 76.5 | 86.7 |  |  |  |  |  |'
          in lines)
  # Feature-based NER is set against the paper's feature-based dev F1, not fine-tuning's test F1.
  assert any(line.startswith('| ner | conll2003 (feature-based) | dev | f1 | 90.00')
             and '96.1' in line
             for line in lines)
  assert not any('precision' in line for line in lines)


def test_a_bilstm_run_is_named_apart_from_plain_fine_tuning(tmp_path, capsys):
  plain = write_results(tmp_path / 'plain', 'sst2', [{'accuracy': 91.0}])
  bilstm = write_results(tmp_path / 'bilstm', 'sst2', [{'accuracy': 90.0}], lstm_layers=1)
  report.main([plain, bilstm])
  out = capsys.readouterr().out
  assert '| plain | sst2 | dev | accuracy | 91.00 |' in out
  assert '| bilstm | sst2 (+ BiLSTM x1) | dev | accuracy | 90.00 |' in out


def test_the_split_says_how_many_examples_it_scored(tmp_path, capsys):
  squad = write_results(tmp_path / 'squad', 'squad1.1', [{'exact_match': 40.0, 'f1': 50.0}])
  results = json.loads((tmp_path / 'squad' / 'results.json').read_text())
  results['eval_examples'] = {'dev': 46}  # Half of a test's few dev articles.
  (tmp_path / 'squad' / 'results.json').write_text(json.dumps(results))
  report.main([squad])
  assert '| squad | squad1.1 | dev (46 examples) | f1 | 50.00 |' in capsys.readouterr().out


def test_missing_results_names_the_file(tmp_path):
  with pytest.raises(SystemExit, match='results.json does not exist'):
    report.main([str(tmp_path)])


def test_swag_accuracy_stands_beside_the_paper_s_dev_accuracy(tmp_path, capsys):
  swag = write_results(tmp_path / 'swag', 'swag', [{'accuracy': 70.2}, {'accuracy': 71.5},
                                                   {'accuracy': 69.9}])
  report.main([swag])
  assert ('| swag | swag | dev | accuracy | 70.20 | 3: 70.2, 71.5, 69.9 |  | dev | 81.6 | 86.6 |  '
          '|  |' in capsys.readouterr().out.splitlines())


def test_the_selected_learning_rate_and_the_majority_baseline_stand_beside_our_score(tmp_path,
                                                                                     capsys):
  mrpc = write_results(tmp_path / 'mrpc', 'mrpc', [{'f1': 81.2}, {'f1': 82.0}, {'f1': 81.5}])
  results = json.loads((tmp_path / 'mrpc' / 'results.json').read_text())
  results.update(learning_rate=3e-5, learning_rates=[5e-5, 4e-5, 3e-5, 2e-5], grid=True,
                 baseline={'kind': 'majority class of the training rows',
                           'metrics': {'dev': {'f1': 81.2}}})
  (tmp_path / 'mrpc' / 'results.json').write_text(json.dumps(results))
  report.main([mrpc])
  assert any(line.startswith('| mrpc | mrpc | dev | f1 | 81.50 |')
             and line.endswith('| 3e-05 (best of 4) | 81.2 |')
             for line in capsys.readouterr().out.splitlines())

"""Fine-tuning results beside the paper's: `python -m bert_jax.tasks.report WORKDIR [WORKDIR ...]`.

Prints one markdown row per (task, split, metric) of each workdir's results.json: our median over
seeds (and each seed), then the paper's BERT-Base and BERT-Large numbers where PAPER.md has them,
the learning rate the scores are at (with a grid: the one selected on dev, and of how many), and
the task's baseline (GLUE: the majority class of the training file; STS-B's constant: 0).
The paper's GLUE and NER numbers are test-set scores; ours are dev scores unless a test set was
scored, so the comparison is indicative, as the column says. SQuAD v1.1's and SWAG's are dev.
Our split says how many examples it scored (results.json's eval_examples, where the run wrote
it): a dev split cut to a few examples is not the paper's.
"""

import json
import os
import sys

from bert_jax.tasks import glue

# (task, metric) -> (paper's split, BERT-Base, BERT-Large); None where the paper gives no number.
PAPER = {
    **{(name, spec.main_metric): (f'GLUE {split}', base, large)
       for name, spec in glue.TASKS.items() for split, base, large in spec.paper[:1]},
    ('mnli', 'accuracy'): ('GLUE test (m/mm)', 84.6, 86.7),
    ('squad1.1', 'exact_match'): ('dev', 80.8, 84.1),
    ('squad1.1', 'f1'): ('dev', 88.5, 90.9),
    ('squad2.0', 'f1'): ('test', None, 83.1),
    ('conll2003', 'f1'): ('test', 92.4, 92.8),
    ('swag', 'accuracy'): ('dev', 81.6, 86.6),
}
# BERT-Base dev numbers of the paper's pre-training ablation (MLM + NSP): closer to our dev scores.
PAPER_BASE_DEV = {('mnli', 'accuracy'): 84.4, ('qnli', 'accuracy'): 88.4,
                  ('mrpc', 'accuracy'): 86.7, ('sst2', 'accuracy'): 92.7,
                  ('squad1.1', 'f1'): 88.5}
# The paper's feature-based NER (BERT-Base, dev F1): concat of the last 4 layers vs fine-tuning.
PAPER_FEATURE_BASED_DEV = 96.1


def load(workdir: str) -> dict:
  path = os.path.join(workdir, 'results.json')
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} does not exist; is {workdir!r} a finished fine-tuning '
                            'workdir (python -m bert_jax.main --config=configs/glue.py ...)?')
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def _number(value) -> str:
  return '' if value is None else f'{value:.1f}'


def rows(results: dict) -> list[list[str]]:
  """Table rows of one results.json."""
  task = results['task']
  feature_based = results.get('feature_layers', 0) > 0
  out = []
  for split, medians in results['median'].items():
    for metric, median in medians.items():
      if metric in ('precision', 'recall', 'total') or metric.startswith(('HasAns', 'NoAns')):
        continue
      seeds = ', '.join(f'{r[metric]:.1f}' for r in results['per_seed'][split])
      paper_split, base, large = PAPER.get((task, metric), ('', None, None))
      dev = PAPER_BASE_DEV.get((task, metric))
      if feature_based and task == 'conll2003' and metric == 'f1':
        paper_split, base, large, dev = 'dev, feature-based', PAPER_FEATURE_BASED_DEV, None, None
      name = task + (' (feature-based)' if feature_based else '') + (
          f' (+ BiLSTM x{results["lstm_layers"]})' if results.get('lstm_layers', 0) else '')
      baseline = results.get('baseline', {}).get('metrics', {}).get(split, {}).get(metric)
      examples = results.get('eval_examples', {}).get(split)
      out.append([name, split + (f' ({examples} examples)' if examples else ''), metric, f'{median:.2f}', f'{len(results["per_seed"][split])}: '
                  f'{seeds}', _number(dev), paper_split, _number(base), _number(large),
                  _learning_rate(results), _number(baseline)])
  return out


def _learning_rate(results: dict) -> str:
  """'3e-05', or with a grid '3e-05 (best of 4)'; '' where results.json does not say."""
  rate = results.get('learning_rate')
  if rate is None:
    return ''
  tried = len(results.get('learning_rates') or [])
  return f'{rate:g}' + (f' (best of {tried})' if results.get('grid') and tried > 1 else '')


def table(runs: list[tuple[str, dict]]) -> str:
  """A markdown table of every (run name, results.json) given."""
  header = ['run', 'task', 'split', 'metric', 'ours (median)', 'seeds', 'paper Base dev',
            'paper split', 'paper Base', 'paper Large', 'learning rate', 'baseline']
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for name, results in runs:
    lines += ['| ' + ' | '.join([name] + row) + ' |' for row in rows(results)]
  return '\n'.join(lines)


def main(argv=None) -> None:
  workdirs = (sys.argv[1:] if argv is None else argv)
  if not workdirs:
    sys.exit('usage: python -m bert_jax.tasks.report WORKDIR [WORKDIR ...]')
  try:
    print(table([(os.path.basename(os.path.normpath(w)), load(w)) for w in workdirs]))
  except FileNotFoundError as e:
    sys.exit(str(e))


if __name__ == '__main__':
  main()

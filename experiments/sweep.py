"""Runs ablation arms one after another and tabulates their final eval metrics.

  python experiments/sweep.py --config=configs/tiny.py --arms='nsp=True;nsp=False' \
      --workdir=runs/nsp_ablation [-- --config.train.num_steps=500 ...]

Each arm is an ordinary `bert_jax.main` run in WORKDIR/<arm> with the arm's config arguments
appended to --config, so an interrupted sweep resumes where it stopped when run again. Flags after
`--` go to every arm. The table (markdown) is printed and written to WORKDIR/results.md.
"""

import argparse
import json
import os
import re
import subprocess
import sys

COLUMNS = ('mlm_loss', 'mlm_accuracy', 'nsp_accuracy', 'mlm_baseline_accuracy')


def arm_config(config: str, arm: str) -> str:
  """'configs/base.py' + 'nsp=False' -> 'configs/base.py:nsp=False' (appends to given args)."""
  return f'{config},{arm}' if ':' in config else f'{config}:{arm}'


def arm_dirname(arm: str) -> str:
  return re.sub(r'[^A-Za-z0-9_.=-]+', '_', arm.replace(',', '_')) or 'default'


def results_table(rows: list[tuple[str, dict]]) -> str:
  lines = ['| arm | ' + ' | '.join(COLUMNS) + ' |', '|---' * (len(COLUMNS) + 1) + '|']
  for arm, result in rows:
    cells = [f'{result[c]:.4f}' if c in result else '-' for c in COLUMNS]
    lines.append(f'| {arm} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  extra = argv[argv.index('--') + 1:] if '--' in argv else []
  own = argv[:argv.index('--')] if '--' in argv else argv
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config', required=True, help='Config file, optionally with :ARGS.')
  parser.add_argument('--arms', required=True,
                      help="Arms separated by ';', each config arguments, e.g. 'layers=3;layers=6'.")
  parser.add_argument('--workdir', required=True, help='One sub-directory per arm goes here.')
  args = parser.parse_args(own)
  arms = [a.strip() for a in args.arms.split(';') if a.strip()]
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  rows = []
  for arm in arms:
    workdir = os.path.join(os.path.abspath(args.workdir), arm_dirname(arm))
    command = [sys.executable, '-m', 'bert_jax.main', f'--config={arm_config(args.config, arm)}',
               f'--workdir={workdir}', *extra]
    print(f'== arm {arm}: {" ".join(command[1:])}', flush=True)
    if subprocess.run(command, cwd=repo, check=False).returncode != 0:
      sys.exit(f'Arm {arm!r} failed; its log is above. Re-run the sweep to resume.')
    with open(os.path.join(workdir, 'eval_results.json'), encoding='utf-8') as f:
      rows.append((arm, json.load(f)))
  table = results_table(rows)
  with open(os.path.join(args.workdir, 'results.md'), 'w', encoding='utf-8') as f:
    f.write(table + '\n')
  print(table)


if __name__ == '__main__':
  main()

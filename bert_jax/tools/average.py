"""Checkpoint averaging: the mean (or an exponential moving average) of a run's checkpoints,
written as a run of its own that fine-tunes, exports and resumes like any other.

  python -m bert_jax.average --workdir=RUN --last=3 --out=RUN_avg
  python -m bert_jax.average --workdir=RUN --steps=80000,90000,100000 --out=RUN_avg
  python -m bert_jax.average --workdir=RUN --last=5 --ema=0.5 --out=RUN_ema

The output holds the run's config.json and vocab and one checkpoint, at the newest averaged
step: the newest step's state (optimizer moments, data position) with the averaged parameters,
and averaged.json naming the steps and their weights. `--config.init_from=RUN_avg` fine-tunes
it, `python -m bert_jax.convert export --workdir=RUN_avg` exports it, and the same pretraining
command with `--workdir=RUN_avg` continues training from it.
"""

import argparse
import json
import os
import sys

import jax
import numpy as np

from bert_jax.core import checkpoint
from bert_jax.core import files
from bert_jax.data import tokenizer as tokenizer_lib

RECORD = 'averaged.json'


def weights(count: int, ema: float = 0.0) -> list[float]:
  """Each of `count` checkpoints' weight, oldest first: 1/count each, or with ema = d in (0, 1)
  those of avg <- d * avg + (1 - d) * x over the checkpoints in order (the oldest starts it)."""
  if not ema:
    return [1.0 / count] * count
  out = [ema ** (count - 1)] + [(1 - ema) * ema ** (count - 1 - i) for i in range(1, count)]
  return out


def average_params(trees: list, weights_: list[float]):
  """The weighted sum of parameter trees, leaf by leaf in float64, in each leaf's dtype."""
  def mean(*leaves):
    total = sum(w * np.asarray(x, np.float64) for w, x in zip(weights_, leaves))
    return total.astype(np.asarray(leaves[0]).dtype)
  return jax.tree.map(mean, *trees)


def choose_steps(workdir: str, steps: list[int] | None, last: int) -> list[int]:
  """The steps to average, oldest first: `steps` (each must be there) or the newest `last`."""
  there = checkpoint.checkpoint_steps(workdir)
  if steps:
    missing = [s for s in steps if s not in there]
    if missing:
      raise ValueError(f'--steps: {workdir} has no checkpoint of step(s) {missing}; its steps: '
                       f'{there or "none"}.')
    return sorted(set(steps))
  if last < 1 or last > len(there):
    raise ValueError(f'--last={last}: {workdir} holds {len(there)} checkpoint(s) ({there}); '
                     f'give 1 to {len(there)} (keep more with train.keep_checkpoints).')
  return there[-last:]


def _check_out(out: str, workdir: str) -> None:
  if os.path.abspath(out) == os.path.abspath(workdir):
    raise ValueError(f'--out={out!r} is the run\'s workdir; give a new directory.')
  if files.exists(out) and files.listdir(out):
    raise ValueError(f'--out={out!r} is not empty; give a new or empty directory.')


def average_workdir(workdir: str, out: str, steps: list[int] | None = None, last: int = 0,
                    ema: float = 0.0) -> dict:
  """Writes the average of `workdir`'s chosen checkpoints to the run directory `out` (see the
  module docstring); returns averaged.json's content. Every chosen checkpoint is read with a
  resume's integrity check first: nothing is written when one is damaged or missing."""
  workdir = files.absolute(workdir)
  if not 0.0 <= ema < 1.0:
    raise ValueError(f'--ema={ema}: give a decay in [0, 1) (0: the plain mean).')
  _check_out(out, workdir)
  chosen = choose_steps(workdir, steps, last)
  directory = os.path.join(workdir, 'checkpoints')
  states = [checkpoint.read_step(directory, step) for step in chosen]
  share = weights(len(chosen), ema)
  state, position = states[-1]
  state = dict(state, params=average_params([s['params'] for s, _ in states], share))
  files.makedirs(out)
  for name in ('config.json', *tokenizer_lib.KEPT_FILES.get(_tokenizer(workdir), ())):
    source = os.path.join(workdir, name)
    if files.isfile(source):
      with files.open(source, 'rb') as f:
        data = f.read()
      with files.open(os.path.join(out, name), 'wb') as f:
        f.write(data)
  saver = checkpoint.Checkpointer(os.path.join(out, 'checkpoints'), 0, 1)
  with checkpoint.closing(saver):
    saver.save(chosen[-1], state, position)
  record = {'workdir': workdir, 'steps': chosen, 'weights': share, 'ema': ema}
  files.write_text(os.path.join(out, RECORD), json.dumps(record, indent=1))
  return record


def _tokenizer(workdir: str) -> str:
  config = json.loads(files.read_text(os.path.join(workdir, 'config.json')))
  return config.get('data', {}).get('tokenizer', 'wordpiece')


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog='python -m bert_jax.average', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--workdir', required=True, help='The pretraining run to average.')
  parser.add_argument('--out', required=True, help='A new directory: the averaged run.')
  which = parser.add_mutually_exclusive_group(required=True)
  which.add_argument('--steps', help='Comma-separated checkpoint steps.')
  which.add_argument('--last', type=int, help='The newest N checkpoints.')
  parser.add_argument('--ema', type=float, default=0.0,
                      help='Weights of an exponential moving average with this decay (oldest '
                      'first) instead of the mean.')
  args = parser.parse_args(argv)
  steps = [int(s) for s in args.steps.split(',')] if args.steps else None
  try:
    record = average_workdir(args.workdir, args.out, steps, args.last or 0, args.ema)
  except (ValueError, checkpoint.CheckpointError, checkpoint.IntegrityError) as e:
    sys.exit(f'error: {e}')
  print(f'Averaged steps {record["steps"]} of {args.workdir} (weights '
        f'{", ".join(f"{w:.3g}" for w in record["weights"])}) into {args.out}')


if __name__ == '__main__':
  main()

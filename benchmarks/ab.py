"""A against B in the real train step on one GPU, in one call: a source change against the code
without it, or one setting against another.

  python benchmarks/ab.py --file=bert_jax/kernels/gpu/fused_norm.py --old='BACKWARD = Launch(...)'
      --new='BACKWARD = Launch(...)' [--shapes=large:512:32,base:128:256] [--order=ABAB]
      [--variant=large_gpu] [--out=ab.jsonl]
  python benchmarks/ab.py --variant=large_gpu --b_variant='large_gpu+--config.model.ffn_impl=xla'
  python benchmarks/ab.py --b_tree=/tmp/base --shapes=large:128:128,base:128:256,large:512:32
      (after `git worktree add /tmp/base REV`: this tree against the code of commit REV)

A runs `--variant` in this repository. B runs `--b_variant` (by default `--variant`) in a copy of
the repository in which `--old` is replaced by `--new` in `--file` when those are given (the text
must occur there exactly once: checked before anything runs), in `--b_tree` when that is given
(another checkout: a series of commits against the code before them), else in this repository.
For each shape the benchmark (harness.ours) runs once per letter of `--order`, each its own
process, one after another. Every process reads and writes one XLA autotuning cache (`--autotune_cache`), so
the first process of a shape picks the gemms and the rest reuse the picks: the A/B then measures
the change, not which cuBLAS kernels a process's autotuning chose (that alone moved one step by
up to 7.8% between processes on an H200). Each record gets `tree` (A or B) and the change; the
summary gives, per shape, the step times of A and B in the order run, and B - A per pair (the
i-th A with the i-th B) and on average. For a source change or another tree, a record's `code`
(benchmark.code_fingerprint) differs between A and B when B ran the changed code; a shape where
it does not gets an error instead of a summary.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable-next=g-import-not-at-top,wrong-import-position
from benchmarks import harness

REPO = harness.REPO
# Not copied into tree B: history, environments, run outputs.
_NOT_COPIED = ('.git', '.venv', '.ci-venv', '.site', '.whl', '__pycache__', 'runs', 'workdir*',
               '*.jsonl')


def replace_once(text: str, old: str, new: str, where: str) -> str:
  """`text` with its one occurrence of `old` replaced by `new`; a ValueError naming `where` and
  the count when `old` occurs other than once, or when the replacement changes nothing."""
  count = text.count(old)
  if count != 1:
    raise ValueError(f'--old occurs {count} times in {where}; it must occur exactly once '
                     f'(--old={old!r}).')
  if old == new:
    raise ValueError(f'--new equals --old ({old!r}): A and B would be the same.')
  return text.replace(old, new)


def make_tree_b(repo: str, dest: str, file: str, old: str, new: str) -> str:
  """Copies `repo` to `dest` (without _NOT_COPIED) and applies the change there; returns
  `dest`. The change is checked against repo's file first, so a bad one copies nothing."""
  with open(os.path.join(repo, file), encoding='utf-8') as f:
    changed = replace_once(f.read(), old, new, file)
  shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(*_NOT_COPIED))
  with open(os.path.join(dest, file), 'w', encoding='utf-8') as f:
    f.write(changed)
  return dest


def check_order(order: str) -> str:
  """--order: letters A and B only, each at least once."""
  if not order or set(order) - {'A', 'B'} or len(set(order)) < 2:
    raise ValueError(f'--order={order!r}: use the letters A and B, each at least once '
                     '(e.g. ABAB or ABBA).')
  return order


def summarize(shape: str, records: list[dict], same_code: bool = False) -> dict:
  """A shape's A/B: step times in the order run, B - A per pair and on average (ms); processes
  that failed are left out. Unless `same_code` (an A/B of settings), A and B must have run
  different code."""
  timed = [r for r in records if 'step_ms' in r]
  steps = {tree: [r['step_ms'] for r in timed if r['tree'] == tree] for tree in 'AB'}
  codes = {tree: {r.get('code') for r in timed if r['tree'] == tree} for tree in 'AB'}
  if not same_code and codes['A'] & codes['B']:
    return {'shape': shape, 'error': f'trees A and B ran the same code '
                                     f'({", ".join(sorted(map(str, codes["A"] & codes["B"])))}): '
                                     'the change did not reach the benchmark.'}
  pairs = [b - a for a, b in zip(steps['A'], steps['B'])]
  summary = {'shape': shape, 'a_step_ms': steps['A'], 'b_step_ms': steps['B'],
             'b_minus_a_ms': pairs}
  if pairs:
    mean = sum(pairs) / len(pairs)
    summary.update(mean_b_minus_a_ms=mean,
                   mean_b_minus_a_percent=100 * mean / (sum(steps['A']) / len(steps['A'])))
  return summary


def main(argv=None, run=harness.run_process):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--file', default='', help='The file B changes, relative to the repo.')
  parser.add_argument('--old', default='')
  parser.add_argument('--new', default='')
  parser.add_argument('--shapes', default='large:512:32')
  parser.add_argument('--order', default='ABAB')
  parser.add_argument('--variant', default='large_gpu', help="A's variant (harness.VARIANTS).")
  parser.add_argument('--b_variant', default='', help="B's variant; by default --variant.")
  parser.add_argument('--b_tree', default='',
                      help='A checkout B runs in (e.g. a `git worktree` of an earlier commit).')
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('--timeout', type=float, default=400, help='Seconds per process.')
  parser.add_argument('--autotune_cache', default=os.path.join(tempfile.gettempdir(),
                                                               'ab_autotune'),
                      help="XLA's autotuning cache A and B share ('' for none).")
  parser.add_argument('--out', default='ab.jsonl')
  args = parser.parse_args(argv)
  b_variant = args.b_variant or args.variant
  edit = bool(args.file or args.old or args.new)
  tree_b = REPO
  try:
    order = check_order(args.order)
    shapes = [(shape, *harness.parse_shape(shape)) for shape in args.shapes.split(',')]
    harness.variant_flags(args.variant)
    harness.variant_flags(b_variant)
    if args.b_tree:
      if edit:
        raise ValueError('--b_tree runs B in another checkout as it is: give it without '
                         '--file/--old/--new.')
      if not os.path.isdir(os.path.join(args.b_tree, 'bert_jax')):
        raise ValueError(f'--b_tree={args.b_tree!r} holds no bert_jax package: give a checkout '
                         'of this repository.')
      tree_b = os.path.abspath(args.b_tree)
    elif edit:
      if not (args.file and args.old):
        raise ValueError('a source change needs --file, --old and --new.')
      tree_b = make_tree_b(REPO, os.path.join(tempfile.mkdtemp(prefix='ab_tree_b_'), 'repo'),
                           args.file, args.old, args.new)
    elif b_variant == args.variant:
      raise ValueError('nothing to compare: give --file/--old/--new, or a --b_variant other '
                       'than --variant.')
  except ValueError as e:
    parser.error(str(e))
  trees = {'A': (REPO, args.variant), 'B': (tree_b, b_variant)}
  xla_flags = harness.with_autotune_cache(os.environ.get('XLA_FLAGS', ''), args.autotune_cache)
  change = ({'file': args.file, 'old': args.old, 'new': args.new} if edit else {})
  if args.b_tree:
    change['b_tree'] = tree_b
  if b_variant != args.variant:
    change['b_variant'] = b_variant
  summaries = []
  for shape, model, seq, batch in shapes:
    records = []
    for tree in order:
      root, variant = trees[tree]
      command = harness.ours(model, seq, batch, variant, args.steps)
      record = dict(run(command, root, xla_flags, args.timeout), tree=tree, shape=shape,
                    variant=variant, change=change)
      records.append(record)
      with open(args.out, 'a', encoding='utf-8') as f:
        f.write(json.dumps(record) + '\n')
      print(f'{shape} {tree}: ' + (f'{record["step_ms"]:.2f} ms, {record["seq_per_s"]:.1f} seq/s'
                                   if 'step_ms' in record else record.get('error', '?')),
            flush=True)
    summaries.append(summarize(shape, records, same_code=not (edit or args.b_tree)))
    print(json.dumps(summaries[-1]), flush=True)
  if edit:
    shutil.rmtree(os.path.dirname(tree_b), ignore_errors=True)
  return summaries


if __name__ == '__main__':
  main()

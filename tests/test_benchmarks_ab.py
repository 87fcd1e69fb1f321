"""benchmarks/ab.py: tree B carries exactly the change (or B's setting), the runs alternate as
ordered, and the summary pairs A with B; bad input is refused before anything runs."""

import json
import os

import pytest

from benchmarks import ab
from benchmarks import harness
from bert_jax.tools import benchmark

FUSED_NORM = os.path.join(harness.REPO, 'bert_jax', 'kernels', 'gpu', 'fused_norm.py')
with open(FUSED_NORM, encoding='utf-8') as _f:
  OLD = next(line for line in _f.read().splitlines() if line.startswith('BACKWARD = '))
NEW = OLD + '._replace(num_warps=8)'


def test_replace_once_refuses_text_that_is_not_there_exactly_once():
  assert ab.replace_once('a = 1\nb = 2\n', 'b = 2', 'b = 3', 'f.py') == 'a = 1\nb = 3\n'
  with pytest.raises(ValueError, match=r'--old occurs 0 times in f\.py'):
    ab.replace_once('a = 1\n', 'b = 2', 'b = 3', 'f.py')
  with pytest.raises(ValueError, match='occurs 2 times'):
    ab.replace_once('x\nx\n', 'x', 'y', 'f.py')
  with pytest.raises(ValueError, match='A and B would be the same'):
    ab.replace_once('x\n', 'x', 'x', 'f.py')


def test_tree_b_is_a_copy_with_the_change_and_without_history(tmp_path):
  repo = tmp_path / 'repo'
  (repo / 'pkg').mkdir(parents=True)
  (repo / '.git').mkdir()
  (repo / '.git' / 'HEAD').write_text('ref\n')
  (repo / 'pkg' / 'mod.py').write_text('X = 1\n')
  (repo / 'pkg' / 'other.py').write_text('Y = 2\n')
  dest = ab.make_tree_b(str(repo), str(tmp_path / 'b'), 'pkg/mod.py', 'X = 1', 'X = 5')
  assert (tmp_path / 'b' / 'pkg' / 'mod.py').read_text() == 'X = 5\n'
  assert (tmp_path / 'b' / 'pkg' / 'other.py').read_text() == 'Y = 2\n'
  assert not os.path.exists(os.path.join(dest, '.git'))
  assert (repo / 'pkg' / 'mod.py').read_text() == 'X = 1\n'  # Tree A untouched.
  with pytest.raises(ValueError, match='occurs 0 times'):
    ab.make_tree_b(str(repo), str(tmp_path / 'c'), 'pkg/mod.py', 'Z = 1', 'Z = 2')
  assert not (tmp_path / 'c').exists()


@pytest.mark.parametrize('order', ['', 'AAAA', 'ABC', 'ab'])
def test_an_order_without_both_trees_is_refused(order):
  with pytest.raises(ValueError, match='--order'):
    ab.check_order(order)


def test_both_trees_share_one_autotuning_cache_unless_one_is_named():
  flag = harness.AUTOTUNE_CACHE_FLAG
  assert harness.with_autotune_cache('--a=1', '/c') == f'--a=1 {flag}=/c'
  assert harness.with_autotune_cache(f'{flag}=/mine', '/c') == f'{flag}=/mine'
  assert harness.with_autotune_cache('--a=1', '') == '--a=1'


def test_main_runs_the_order_in_each_tree_and_summarizes_b_against_a(tmp_path):
  """A fake benchmark reads the tree it runs in: B (the old launch shape) is 2 ms slower."""
  calls = []

  def fake_run(command, tree, xla_flags, timeout):
    del timeout
    with open(os.path.join(tree, 'bert_jax', 'kernels', 'gpu', 'fused_norm.py'), encoding='utf-8') as f:
      changed = NEW in f.read()
    calls.append((tree, command, xla_flags))
    step = 72.0 + 2.0 * changed + 0.1 * len(calls)
    return {'step_ms': step, 'seq_per_s': 32e3 / step,
            'code': benchmark.code_fingerprint(os.path.join(tree, 'bert_jax'))}

  out = tmp_path / 'ab.jsonl'
  summaries = ab.main(
      ['--file=bert_jax/kernels/gpu/fused_norm.py', f'--old={OLD}', f'--new={NEW}', '--order=ABBA',
       '--shapes=large:512:32', '--autotune_cache=/tmp/cache', f'--out={out}'], run=fake_run)
  assert [tree == ab.REPO for tree, _, _ in calls] == [True, False, False, True]
  assert all('--config.train.batch_size=32' in command for _, command, _ in calls)
  assert all(flags.endswith(f'{harness.AUTOTUNE_CACHE_FLAG}=/tmp/cache')
             for _, _, flags in calls)
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r['tree'] for r in records] == list('ABBA')
  assert records[1]['change'] == {'file': 'bert_jax/kernels/gpu/fused_norm.py', 'old': OLD, 'new': NEW}
  (summary,) = summaries
  assert summary['a_step_ms'] == pytest.approx([72.1, 72.4])
  assert summary['b_step_ms'] == pytest.approx([74.2, 74.3])
  assert summary['b_minus_a_ms'] == pytest.approx([2.1, 1.9])
  assert summary['mean_b_minus_a_ms'] == pytest.approx(2.0)
  assert not os.path.exists(calls[1][0])  # Tree B is removed at the end.


def test_a_change_that_never_reached_the_benchmark_gets_no_summary():
  records = [{'tree': t, 'step_ms': 70.0, 'code': 'same'} for t in 'AB']
  summary = ab.summarize('large:512:32', records)
  assert 'ran the same code (same)' in summary['error']
  assert 'mean_b_minus_a_ms' not in summary


def test_bad_input_is_refused_before_anything_runs(capsys):
  def no_run(*_):
    raise AssertionError('ran')

  for argv, message in [
      ([f'--old={OLD}x'], '--old occurs 0 times in bert_jax/kernels/gpu/fused_norm.py'),
      ([f'--old={OLD}', '--order=AAA'], "--order='AAA'"),
      ([f'--old={OLD}', '--shapes=huge:512:32'], "--shapes entry 'huge:512:32'"),
  ]:
    with pytest.raises(SystemExit):
      ab.main(['--file=bert_jax/kernels/gpu/fused_norm.py', f'--new={NEW}', *argv], run=no_run)
    assert message in capsys.readouterr().err


def test_two_settings_run_in_this_tree_and_may_share_its_code(tmp_path):
  """--b_variant: B is A's tree with another variant; both run the same code, which is no error."""
  calls = []

  def fake_run(command, tree, xla_flags, timeout):
    del xla_flags, timeout
    calls.append((tree, command))
    step = 75.0 if '--config.model.ffn_impl=xla' in command else 72.0
    return {'step_ms': step, 'seq_per_s': 32e3 / step, 'code': 'same'}

  out = tmp_path / 'ab.jsonl'
  (summary,) = ab.main(['--variant=large_gpu', '--b_variant=large_gpu+--config.model.ffn_impl=xla',
                        '--order=ABAB', f'--out={out}'], run=fake_run)
  assert all(tree == ab.REPO for tree, _ in calls)
  assert ['--config.model.ffn_impl=xla' in command for _, command in calls] == [
      False, True, False, True]
  assert summary['b_minus_a_ms'] == pytest.approx([3.0, 3.0])
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert records[1]['change'] == {'b_variant': 'large_gpu+--config.model.ffn_impl=xla'}


@pytest.mark.parametrize('argv, message', [
    ([], 'nothing to compare'),
    (['--b_variant=large_gpu'], 'nothing to compare'),
    (['--file=bert_jax/kernels/gpu/fused_norm.py', '--new=x'], 'needs --file, --old and --new'),
    (['--b_variant=fast'], "unknown variant 'fast'"),
])
def test_an_a_b_without_a_difference_is_refused(argv, message, capsys):
  with pytest.raises(SystemExit):
    ab.main(argv, run=lambda *_: pytest.fail('ran'))
  assert message in capsys.readouterr().err


def test_b_tree_runs_b_in_another_checkout_and_needs_its_code_to_differ(tmp_path):
  """--b_tree: B runs in the given checkout as it is; A and B must have run different code."""
  base = tmp_path / 'base'
  (base / 'bert_jax').mkdir(parents=True)
  calls = []

  def fake_run(command, tree, xla_flags, timeout):
    del command, xla_flags, timeout
    calls.append(tree)
    return {'step_ms': 70.0 if tree == ab.REPO else 70.7, 'seq_per_s': 1.0,
            'code': 'a' if tree == ab.REPO else 'b'}

  out = tmp_path / 'ab.jsonl'
  (summary,) = ab.main([f'--b_tree={base}', '--order=ABAB', f'--out={out}'], run=fake_run)
  assert calls == [ab.REPO, str(base)] * 2
  assert summary['mean_b_minus_a_percent'] == pytest.approx(1.0)
  assert json.loads(out.read_text().splitlines()[1])['change'] == {'b_tree': str(base)}
  assert base.exists()  # Another checkout is the user's: never removed.

  def same_code(command, tree, xla_flags, timeout):
    return dict(fake_run(command, tree, xla_flags, timeout), code='same')

  (summary,) = ab.main([f'--b_tree={base}', f'--out={out}'], run=same_code)
  assert 'ran the same code' in summary['error']


@pytest.mark.parametrize('argv, message', [
    (['--b_tree=/nonexistent'], "--b_tree='/nonexistent' holds no bert_jax package"),
    (['--b_tree=.', '--file=bert_jax/kernels/gpu/fused_norm.py', f'--old={OLD}', f'--new={NEW}'],
     'without --file/--old/--new'),
])
def test_a_bad_b_tree_is_refused(argv, message, capsys):
  with pytest.raises(SystemExit):
    ab.main(argv, run=lambda *_: pytest.fail('ran'))
  assert message in capsys.readouterr().err

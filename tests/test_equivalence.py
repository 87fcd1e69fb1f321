"""The training-equivalence check (bert_jax/tools/equivalence.py): the yardstick from two reference
initialisations, the verdict per metric, the paths, and a micro BERT whose TPU-kernel path
(interpreted) in bf16 trains like the float32 XLA path while a planted fault does not."""

import json
import os

import pytest

from conftest import micro_config
from bert_jax.tools import equivalence

REF, SEED, FAST = equivalence.REFERENCE_PATH, equivalence.SEED_PATH, equivalence.FAST


def curves(**paths):
  """{path: {step: record}} from {path: [(step, loss, accuracy), ...]}."""
  return {name: {s: {'step': s, 'split': 'eval', 'loss': loss, 'mlm_accuracy': accuracy,
                     'mlm_baseline_accuracy': 0.05, 'seq_per_s': 10.0 * s}
                 for s, loss, accuracy in points}
          for name, points in paths.items()}


def test_the_yardstick_is_the_references_largest_gap_after_step_zero():
  runs = curves(**{REF: [(0, 9.0, 0.0), (10, 6.0, 0.10), (20, 5.0, 0.20)],
                   SEED: [(0, 8.0, 0.0), (10, 6.2, 0.11), (20, 5.1, 0.20)],
                   FAST: [(0, 9.0, 0.0), (10, 6.1, 0.10), (20, 5.05, 0.21)]})
  verdict = equivalence.judge(runs)
  # Step 0's gap (another initialisation) is not a training gap.
  assert verdict['yardstick'] == pytest.approx({'loss': 0.2, 'mlm_accuracy': 0.01})
  gaps = verdict['paths'][FAST]['gaps']
  assert gaps['loss']['largest_gap'] == pytest.approx(0.1) and gaps['loss']['at_step'] == 10
  assert gaps['loss']['tolerance'] == pytest.approx(
      equivalence.TOLERANCE_FACTOR * 0.2 + equivalence.RELATIVE_FLOOR * 6.0)
  assert verdict['paths'][FAST]['equivalent'] is True
  # Not training outcomes: not judged.
  assert set(gaps) == {'loss', 'mlm_accuracy'}


def test_a_path_further_from_the_reference_than_another_seed_is_not_equivalent():
  runs = curves(**{REF: [(0, 9.0, 0.0), (10, 6.0, 0.10)], SEED: [(0, 8.0, 0.0), (10, 6.1, 0.10)],
                   'faulty': [(0, 9.0, 0.0), (10, 6.5, 0.10)]})
  result = equivalence.judge(runs)['paths']['faulty']
  assert result['gaps']['loss']['within'] is False and result['equivalent'] is False
  assert result['gaps']['mlm_accuracy']['within'] is True
  text = equivalence.table(runs, equivalence.judge(runs))
  assert '| faulty | loss | 0.5000 | 10 | 0.1000 |' in text
  assert '| faulty | all | | | | | NOT equivalent |' in text


def test_a_nan_is_the_largest_gap_and_judging_needs_both_references():
  runs = curves(**{REF: [(10, 6.0, 0.1)], SEED: [(10, 6.1, 0.1)],
                   FAST: [(10, float('nan'), 0.1)]})
  assert equivalence.judge(runs)['paths'][FAST]['gaps']['loss']['within'] is False
  with pytest.raises(ValueError, match="needs the 'reference_seed' path"):
    equivalence.judge({REF: runs[REF], FAST: runs[FAST]})
  # No evaluation after step 0 in common: no verdict rather than a pass.
  runs = curves(**{REF: [(0, 6.0, 0.1)], SEED: [(0, 6.1, 0.1)], FAST: [(0, 6.0, 0.1)]})
  assert equivalence.judge(runs)['paths'][FAST]['equivalent'] is None


def test_paths_are_the_config_its_float32_xla_form_and_that_from_another_init():
  config = micro_config(None, **{'model.attention_impl': 'tpu', 'model.dtype': 'bfloat16'})
  paths = equivalence.paths_for(config, {'x': {'model.dtype': 'float32'}})
  assert list(paths) == [FAST, REF, SEED, 'x'] and paths[FAST] == {}
  assert paths[REF]['model.attention_impl'] == 'xla' and paths[REF]['model.dtype'] == 'float32'
  assert paths[SEED] == {**paths[REF], 'init_seed': config.seed + 1}
  reference = equivalence.with_overrides(config, paths[REF])
  assert (reference.model.attention_impl, config.model.attention_impl) == ('xla', 'tpu')
  with pytest.raises(ValueError, match="unknown config key 'model.dtipe'"):
    equivalence.with_overrides(config, {'model.dtipe': 'float32'})


def test_a_path_flag_names_its_overrides_and_a_malformed_one_is_refused():
  assert equivalence.parse_path('xla_bf16:model.dtype=bfloat16,train.learning_rate=2e-3,'
                                'model.flat_matmuls=True') == (
      'xla_bf16', {'model.dtype': 'bfloat16', 'train.learning_rate': 2e-3,
                   'model.flat_matmuls': True})
  for bad in ('xla_bf16', 'x:', ':model.dtype=float32', 'x:model.dtype'):
    with pytest.raises(ValueError, match='--path'):
      equivalence.parse_path(bad)


def test_init_seed_moves_the_initialisation(tmp_path):
  from bert_jax.train import step as steps  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding  # pylint: disable=g-import-not-at-top
  from bert_jax.train import optim  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  config = micro_config(tmp_path)
  model, tx = steps.build_model(config), optim.for_pretraining(config)
  mesh = sharding.create_mesh(config.mesh)
  rules = sharding.logical_axis_rules(config.mesh.preset)

  def first_kernel(cfg):
    with sharding.activation_rules(mesh, rules):
      state, _ = steps.create_train_state(cfg, model, tx, mesh, rules)
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(state.params))])
  same = equivalence.with_overrides(config, {'init_seed': config.seed})
  other = equivalence.with_overrides(config, {'init_seed': config.seed + 1})
  np.testing.assert_array_equal(first_kernel(config), first_kernel(same))
  assert not np.array_equal(first_kernel(config), first_kernel(other))


@pytest.mark.slow
def test_the_tpu_kernel_path_in_bf16_trains_like_the_xla_path_and_a_fault_does_not(tmp_path):
  # The attention kernels run interpreted on CPU; 150 steps, an evaluation every 50.
  config = micro_config(tmp_path, **{
      'model.attention_impl': 'tpu', 'model.dtype': 'bfloat16', 'model.dropout_rng_impl': 'rbg',
      'model.num_heads': 2, 'train.num_steps': 150, 'train.log_every': 50,
      'train.eval_every': 50, 'train.checkpoint_every': 0})
  # The planted fault: a fast path whose updates are 2x the reference's (as a gradient
  # accumulation that sums micro-batches or a fused optimizer that applies a step twice would).
  paths = equivalence.paths_for(config, {'fault': {'train.learning_rate': 2e-3}})
  workdir = str(tmp_path / 'eq')
  assert equivalence.main(['equivalence', f'--config={_config_file(tmp_path, config)}',
                           f'--workdir={workdir}',
                           '--path=fault:train.learning_rate=2e-3']) == 1
  with open(os.path.join(workdir, 'equivalence.json'), encoding='utf-8') as f:
    summary = json.load(f)
  assert list(summary['paths']) == list(paths)
  verdict = summary['verdict']['paths']
  assert verdict[FAST]['equivalent'] is True, verdict[FAST]
  assert verdict['fault']['equivalent'] is False
  assert verdict['fault']['gaps']['mlm_loss']['largest_gap'] > (
      2 * summary['verdict']['yardstick']['mlm_loss'])
  # The other initialisation trains on the same batches: the same held-out set and guess.
  evals = summary['evals']
  assert evals[REF][0]['loss'] != evals[SEED][0]['loss']
  assert [r['mlm_baseline_accuracy'] for r in evals[REF]] == [
      r['mlm_baseline_accuracy'] for r in evals[SEED]]


def _config_file(tmp_path, config) -> str:
  """A config file whose get_config() returns `config` (the command reads a file)."""
  path = tmp_path / 'equivalence_config.py'
  path.write_text('import json\nimport ml_collections\n\n\ndef get_config():\n'
                  f'  return ml_collections.ConfigDict(json.loads({config.to_json()!r}))\n')
  return str(path)


def test_a_config_the_runs_refuse_is_a_one_line_error_before_training(tmp_path):
  config = micro_config(tmp_path, **{'model.num_heads': 3})  # 32 wide: not divisible.
  with pytest.raises(SystemExit, match=r'Invalid config: .*num_heads'):
    equivalence.main(['equivalence', f'--config={_config_file(tmp_path, config)}',
                      f'--workdir={tmp_path / "eq"}'])
  assert not os.path.exists(tmp_path / 'eq' / 'fast' / 'metrics.jsonl')


def test_notrain_judges_the_evaluations_the_workdir_holds(tmp_path, capsys):
  runs = curves(**{REF: [(0, 9.0, 0.0), (10, 6.0, 0.10)], SEED: [(0, 8.0, 0.0), (10, 6.1, 0.10)],
                   FAST: [(0, 9.0, 0.0), (10, 6.05, 0.10)]})
  for name, evals in runs.items():
    (tmp_path / name).mkdir()
    (tmp_path / name / 'metrics.jsonl').write_text(
        ''.join(json.dumps(r) + '\n' for r in evals.values()))
  config = micro_config(tmp_path)
  assert equivalence.main(['equivalence', f'--config={_config_file(tmp_path, config)}',
                           f'--workdir={tmp_path}', '--notrain']) == 0
  assert '| fast | all | | | | | equivalent |' in capsys.readouterr().out
  assert not os.path.exists(tmp_path / FAST / 'eval_results.json')  # Nothing trained.

"""An ablation sweep: named arms on one base config, pretrained, fine-tuned and compared.

A sweep file (sweeps/*.py) is a config file whose get_config() returns a ConfigDict:

  name, title, description  What the report heads with.
  base        The pretraining config every arm starts from, 'configs/small.py[:ARGS]'.
  steps       The pretraining budget in steps (0: the base's). It is passed as the base's `steps`
              argument, so the warmup keeps the base's share of the steps; evaluations
              (`evaluations` per run) and train logs are spread over the run. An arm that sets
              any of these itself keeps its value.
  evaluations Held-out evaluations per pretraining run (the eval curve's points).
  equal_flops An arm's name, or '' (off): every other pretrained arm's steps are chosen so that
              its training FLOPs (steps x batch x metrics.model_flops_per_sequence) match that
              arm's at its steps, rounded to the nearest step; the warmup and intervals follow
              as for `steps`. An arm then sets no `steps=` of its own.
  pretrain    Overrides of every pretraining run, nested like the config:
              {'train': {'learning_rate': 5e-4}}.
  arms        {name: arm}; an arm holds
                label     its row in the report;
                args      config arguments appended to the base's ('mask_rate=0.4': what they
                          derive, e.g. more masked positions, comes with them);
                pretrain  overrides, nested like `pretrain`;
                init      'pretrained' (fine-tune this arm's pretraining run) or 'random' (no
                          pretraining: the base's shape from random initialisation, a floor);
                teacher   another pretrained arm's name: this arm distils from that arm's
                          pretraining run (config.distill.teacher; config.objectives='distill'),
                          which trains first;
                finetune  overrides of its fine-tuning runs ({'task': {'lstm_layers': 1}});
                paper     {column: the paper's number} for the report.
              Arms whose pretraining is the same (args and overrides) share one run.
  order       The arms' names in the report's order, comma separated (ConfigDicts sort their
              keys); arms it leaves out follow alphabetically. `common.with_arms` sets it.
  finetune    config: a fine-tuning config file with a `task` argument ('configs/glue.py');
              tasks: comma separated ('sst2,mrpc,stsb'); seeds: per task; overrides: nested,
              every fine-tuning run; task_overrides: {task: overrides}; at_steps: pretraining
              steps to fine-tune from as well as the last (WORKDIR@STEP), for accuracy against
              steps ('' for the last only); learning_rates: the grid every fine-tuning run
              selects its rate from on dev, comma separated (its train.learning_rates; the
              shipped sweeps: the paper's 5e-5,4e-5,3e-5,2e-5, sweeps/common.py), '' or absent
              for the overrides' one train.learning_rate.
  size        '' (the file's recipe) or 'tiny': every arm at configs/tiny.py's shape on the
              built-in corpus, minutes on a laptop (sizes.py; `--sweep.size=tiny`).
  paper       {source: where the paper's numbers come from, columns: their names}.
  notes       Lines the report prints under its tables.

`plan(sweep)` resolves it into jobs, validating every run's config before anything trains; the
held-out set must be the same for every arm (same documents, and with masking.eval='reference'
the same masks where the objectives make the same rows): an arm that changes what decides it is
refused. Arms may differ in their tokenizer (data.tokenizer, its vocab, casing and size): a
sweep-prepared corpus (a relative data.prepared) is then prepared once per tokenizer kind
(`corpus`, `corpus-bpe`, `corpus-sentencepiece`), and the report notes that their held-out
losses are over other vocabularies. Everything here is pure: runner.py executes the jobs.
"""

import dataclasses
import json
import math
import os
from typing import Any

import ml_collections

from bert_jax import config_lib
from bert_jax.models import architecture
from bert_jax.sweep import sizes
from bert_jax.train import lr_grid

# What decides the held-out documents (and their count): every pretraining run of a sweep must
# agree on these, or the arms are not scored on the same data.
HELD_OUT_KEYS = ('seed', 'data.corpus', 'data.corpus_format', 'data.prepared',
                 'data.max_documents', 'data.eval_fraction', 'masking.eval')
# What decides the tokens of those documents: arms may differ here (each tokenizer kind streams
# its own prepared corpus), and their held-out losses are then over other vocabularies.
TOKENIZER_KEYS = ('data.tokenizer', 'data.vocab_file', 'data.lowercase',
                  'data.tokenizer_vocab_size')
# What decides the held-out rows and masks beyond the documents: arms that differ here are
# scored on the same documents with other rows (noted in the report).
HELD_OUT_ROW_KEYS = ('objectives', 'data.max_seq_length', 'data.short_seq_prob')
# What decides the masks when masking.eval='train'.
MASKING_KEYS = ('masking.rate', 'masking.mask_token_fraction', 'masking.random_token_fraction',
                'masking.whole_word', 'masking.spans', 'masking.span_p', 'masking.max_span')


class SweepError(ValueError):
  """A sweep that cannot run as written; the message names the arm, key and value."""


@dataclasses.dataclass(frozen=True)
class Job:
  """One run of a sweep: `python -m bert_jax.main --config=CONFIG --workdir=... OVERRIDES`."""
  name: str  # 'pretrain/mlm_nsp', 'finetune/mlm/sst2', 'finetune/mlm/sst2@2000', 'prepare'.
  kind: str  # 'prepare', 'pretrain' or 'finetune'.
  workdir: str  # Relative to the sweep's workdir (prepare: the prepared corpus, absolute).
  config: str  # The config file and its arguments.
  overrides: dict  # Flattened 'key' -> value, applied after the config file.
  after: tuple[str, ...] = ()  # Jobs that must finish first.
  arm: str = ''  # Fine-tuning: the arm; pretraining: the first arm that uses it.
  task: str = ''
  step: int | None = None  # Fine-tuning from this pretraining step (None: the last).
  num_steps: int = 0  # Pretraining: its steps; fine-tuning: its seeds.


@dataclasses.dataclass(frozen=True)
class Plan:
  """A resolved sweep: its jobs in the order they can run, and what the report needs."""
  sweep: Any  # The sweep's ConfigDict.
  jobs: tuple[Job, ...]
  summary: dict  # sweep.json's content without the workdir.


def load_file(path: str):
  """The ConfigDict of a sweep file (`get_config()`)."""
  from bert_jax.core import cli  # pylint: disable=g-import-not-at-top
  return cli.load_config_file(path)


def _flatten(overrides) -> dict:
  """A nested dict/ConfigDict of overrides (or None) -> {'model.num_layers': 4, ...}."""
  return config_lib.flatten(overrides or {})


def backend_problems(plan: 'Plan') -> list[str]:
  """'JOB: what this machine cannot run' for each run whose kernels this machine's backend does
  not take (ops.checks.check_gpu_kernels, as each run checks itself before compiling). Starts
  JAX's backend: for `sweep check`, not in the process that runs the sweep."""
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.ops import checks  # pylint: disable=g-import-not-at-top
  problems = []
  for job in plan.jobs:
    if job.kind == 'prepare':
      continue
    config = load_config(job.config, job.name)
    apply_overrides(config, job.overrides, job.name)
    try:
      checks.check_gpu_kernels(config)
    except config_lib.ConfigError as e:
      problems.append(f'{job.name}: {e}')
  return problems


def load_config(spec: str, where: str):
  """get_config(arg) of 'path[:arg]'; SweepError naming `where` when it does not load."""
  from bert_jax.core import cli  # pylint: disable=g-import-not-at-top
  try:
    return cli.load_config_spec(spec)
  except (OSError, ImportError, SyntaxError, ValueError, KeyError) as e:
    raise SweepError(f'{where}: config {spec!r} does not load: {e}') from e


def apply_overrides(config, flat: dict, where: str) -> None:
  """Sets each 'a.b.c' of `flat` on `config`, as --config.a.b.c=VALUE would (types kept)."""
  for key, value in flat.items():
    *parents, leaf = key.split('.')
    node = config
    try:
      for parent in parents:
        node = node[parent]
      if leaf not in node:
        raise KeyError(leaf)
      current = node[leaf]
      if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
      node[leaf] = value
    except KeyError:
      known = sorted(config_lib.flatten(config))
      import difflib  # pylint: disable=g-import-not-at-top
      close = difflib.get_close_matches(key, known, n=1)
      raise SweepError(f'{where}: unknown config key {key!r}'
                       + (f' (did you mean {close[0]!r}?)' if close else '') + '.') from None
    except TypeError as e:
      raise SweepError(f'{where}: {key}={value!r}: {e}') from None


def with_args(spec: str, args: list[str]) -> str:
  """'configs/small.py' + ['steps=9', 'mask_rate=0.3'] -> 'configs/small.py:steps=9,mask_rate=0.3'
  (appended to the arguments it has)."""
  args = [a for a in args if a]
  if not args:
    return spec
  return spec + (',' if ':' in spec else ':') + ','.join(args)


def _arm_items(sweep):
  arms = sweep.get('arms') or {}
  if not arms:
    raise SweepError('The sweep has no arms; add sweep.arms = {name: {...}}.')
  order = [n.strip() for n in str(sweep.get('order', '') or '').split(',') if n.strip()]
  unknown = [n for n in order if n not in arms]
  if unknown:
    raise SweepError(f'sweep.order names no arm {", ".join(map(repr, unknown))}; the arms are '
                     f'{", ".join(arms)}.')
  names = order + sorted(n for n in arms if n not in order)
  valid = {'label', 'args', 'pretrain', 'init', 'finetune', 'paper', 'teacher'}
  for name in names:
    arm = arms[name]
    unknown = sorted(set(arm.keys()) - valid)
    if unknown:
      raise SweepError(f'Arm {name!r}: unknown field(s) {", ".join(unknown)}; an arm holds '
                       f'{", ".join(sorted(valid))}.')
    if arm.get('init', 'pretrained') not in ('pretrained', 'random'):
      raise SweepError(f'Arm {name!r}: init={arm.get("init")!r}; valid are \'pretrained\' and '
                       '\'random\'.')
    teacher = arm.get('teacher', '')
    if teacher:
      teachers = [n for n in names if n != name and arms[n].get('init', 'pretrained')
                  == 'pretrained' and not arms[n].get('teacher')]
      if teacher not in teachers:
        raise SweepError(f'Arm {name!r}: teacher={teacher!r} names no pretrained arm that could '
                         f'teach it; valid are {", ".join(map(repr, teachers)) or "none"}.')
      if arm.get('init', 'pretrained') != 'pretrained':
        raise SweepError(f'Arm {name!r}: a teacher needs init=\'pretrained\' (the arm distils '
                         'in pretraining).')
  return [(name, arms[name]) for name in names]


def prepared_name(prepared: str, tokenizer: str) -> str:
  """The sweep-prepared corpus of a tokenizer kind: `prepared` for WordPiece, else
  `prepared-KIND` (each tokenizer's token ids are a corpus of their own)."""
  return prepared if tokenizer in ('', 'wordpiece') else f'{prepared}-{tokenizer}'


def pretrain_config(sweep, arm, name: str, workdir: str = '', steps: int = 0):
  """(config file with arguments, flattened overrides, resolved config) of an arm's pretraining.
  A relative data.prepared is a directory of the sweep's `workdir` (one prepared corpus that
  every run of a tokenizer kind streams, prepared_name). `steps` > 0 replaces sweep.steps."""
  where = f'Arm {name!r}'
  args = []
  if steps or sweep.get('steps', 0):
    args.append(f'steps={steps or sweep.steps}')
  args += [a.strip() for a in str(arm.get('args', '') or '').split(',') if a.strip()]
  spec = with_args(sweep.base, args)
  config = load_config(spec, where)
  flat = {**_flatten(sweep.get('pretrain')), **_flatten(arm.get('pretrain'))}
  explicit = set(flat)
  teacher = None
  if arm.get('teacher'):
    teacher = pretrain_config(sweep, sweep.arms[arm.teacher], arm.teacher, workdir)[2]
    flat['distill.teacher'] = os.path.abspath(os.path.join(workdir, 'pretrain', arm.teacher))
  apply_overrides(config, flat, where)
  if teacher is not None:
    _adopt_teacher_shape(config, teacher)
  derived = derived_intervals(config, explicit, sweep.get('evaluations', 10),
                              _at_steps(sweep))
  prepared = config.data.prepared
  if prepared and not os.path.isabs(os.path.expanduser(prepared)):
    derived['data.prepared'] = os.path.abspath(os.path.join(
        workdir, prepared_name(prepared, config.data.get('tokenizer', 'wordpiece'))))
  apply_overrides(config, derived, where)
  flat.update(derived)
  check = config
  if config.data.prepared and config.data.corpus and not os.path.isfile(
      os.path.join(config.data.prepared, 'metadata.json')):
    # The sweep prepares it first (a 'prepare' job): checked with a directory standing in.
    check = ml_collections.ConfigDict(config.to_dict())
    check.data.prepared = os.path.abspath(os.curdir)
  if teacher is not None:
    # The teacher's run does not exist yet: its shape, adopted above, stands in for it.
    check = ml_collections.ConfigDict(check.to_dict())
    check.distill.teacher = ''
  try:
    config_lib.validate(check)
  except config_lib.ConfigError as e:
    raise SweepError(f'{where}: {e}') from e
  return spec, flat, config


def derived_intervals(config, explicit: set, evaluations: int, at_steps: list[int]) -> dict:
  """Eval, log and checkpoint intervals spread over the run's steps (the keys not in
  `explicit`): `evaluations` evals, about 50 train records, and a checkpoint at every step a
  fine-tuning run starts from (at_steps) and at the end."""
  steps = config.train.num_steps
  derived = {}
  if 'train.eval_every' not in explicit:
    derived['train.eval_every'] = max(1, steps // max(1, evaluations))
  if 'train.log_every' not in explicit:
    derived['train.log_every'] = max(1, steps // 50)
  if 'train.checkpoint_every' not in explicit:
    every = steps
    for step in at_steps:
      every = math.gcd(every, step)
    derived['train.checkpoint_every'] = every
  if 'train.keep_checkpoints' not in explicit and at_steps:
    derived['train.keep_checkpoints'] = steps // derived.get(
        'train.checkpoint_every', config.train.checkpoint_every) + 1
  return derived


def _at_steps(sweep) -> list[int]:
  text = str(sweep.get('finetune', {}).get('at_steps', '') or '')
  try:
    return sorted({int(s) for s in text.split(',') if s.strip()})
  except ValueError:
    raise SweepError(f'sweep.finetune.at_steps={text!r}: expected steps separated by commas, '
                     'e.g. \'1000,2000\'.') from None


def learning_rates(sweep) -> tuple[float, ...]:
  """sweep.finetune.learning_rates, parsed: the grid each fine-tuning run selects from; ()
  without one."""
  try:
    return lr_grid.parse(sweep.finetune.get('learning_rates', '') or '',
                         'sweep.finetune.learning_rates')
  except config_lib.ConfigError as e:
    raise SweepError(str(e)) from None


def _tasks(sweep) -> list[str]:
  tasks = [t.strip() for t in str(sweep.finetune.get('tasks', '')).split(',') if t.strip()]
  if len(set(tasks)) != len(tasks):
    raise SweepError(f'sweep.finetune.tasks={sweep.finetune.tasks!r} names a task twice.')
  return tasks


def task_config(sweep, task: str) -> str:
  """The fine-tuning config file (with arguments) of `task`: its kind's (bert_jax/tasks), a GLUE
  task's on sweep.finetune.config."""
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  configs = tasks.sweep_configs()
  if task not in configs:
    raise SweepError(f'sweep.finetune.tasks: unknown task {task!r}; valid tasks are '
                     f'{", ".join(sorted(configs))}.')
  path, _, arg = configs[task].partition(':')
  if path == 'configs/glue.py':
    # The sweep's GLUE config (configs/glue.py or one taking its task= argument).
    return with_args(sweep.finetune.get('config', 'configs/glue.py'), [arg])
  return configs[task]


def finetune_config(sweep, arm, arm_name: str, task: str, pretrained, init_from: str):
  """(config spec, flattened overrides) of one fine-tuning run, validated as it will run:
  the model's shape and vocab as the pretraining run's (which init_from adopts at run time)."""
  where = f'Arm {arm_name!r}, task {task!r}'
  spec = task_config(sweep, task)
  config = load_config(spec, where)
  rates = learning_rates(sweep)
  # The sweep's grid, unless the overrides (of the sweep, a task or the arm) set one.
  flat = {**({'train.learning_rates': lr_grid.text(rates)} if rates else {}),
          **_flatten(sweep.finetune.get('overrides')),
          **_flatten((sweep.finetune.get('task_overrides') or {}).get(task)),
          **_flatten(arm.get('finetune'))}
  flat['seeds'] = int(sweep.finetune.get('seeds', 1))
  shape = {f'model.{k}': v for k, v in pretrained.model.items()
           if k in config.model and k in architecture.ARCHITECTURE_KEYS}
  if init_from:
    flat['init_from'] = init_from
  else:  # Random initialisation: the pretraining run's shape and vocab, given here.
    if not pretrained.data.vocab_file:
      raise SweepError(f'{where}: init=\'random\' fine-tunes the base\'s shape with its vocab, '
                       'but its data.vocab_file is empty (a trained vocab); set '
                       'pretrain.data.vocab_file.')
    flat.update(shape)
    flat['data.vocab_file'] = pretrained.data.vocab_file
    flat['data.lowercase'] = pretrained.data.lowercase
  apply_overrides(config, flat, where)
  check = ml_collections.ConfigDict(config.to_dict())
  check.init_from = ''  # The pretraining run does not exist yet: its shape stands in for it.
  apply_overrides(check, shape, where)
  try:
    config_lib.validate_finetune(check)
    lr_grid.grid(check.train)
  except config_lib.ConfigError as e:
    raise SweepError(f'{where}: {e}') from e
  return spec, flat


def _check_held_out(runs: dict) -> list[str]:
  """SweepError when pretraining runs would be scored on different held-out documents; notes
  for those scored on other rows or masks of the same documents."""
  flats = {name: config_lib.flatten(config) for name, (_, _, config) in runs.items()}
  first = next(iter(flats))
  for key in HELD_OUT_KEYS:
    values = {name: flat.get(key) for name, flat in flats.items()}
    if key == 'data.prepared':  # One corpus, prepared once per tokenizer kind.
      values = {name: _prepared_root(value, flats[name].get('data.tokenizer', ''))
                for name, value in values.items()}
    if len(set(map(repr, values.values()))) > 1:
      raise SweepError(
          f'The arms\' held-out sets would differ: config.{key} is '
          + ', '.join(f'{v!r} in {n!r}' for n, v in values.items())
          + '; it must be the same in every arm (set it in sweep.pretrain, not in an arm).')
  examples = {n: f['train.batch_size'] * f['train.eval_batches'] for n, f in flats.items()}
  if len(set(examples.values())) > 1:
    raise SweepError(
        'The arms\' held-out sets would hold different numbers of rows (train.batch_size x '
        'train.eval_batches): ' + ', '.join(f'{v} in {n!r}' for n, v in examples.items())
        + '; set train.eval_batches so that the products agree.')
  notes = _check_tokenizers(flats)
  row_keys = HELD_OUT_ROW_KEYS + (MASKING_KEYS if flats[first]['masking.eval'] == 'train'
                                  else ())
  for key in row_keys:
    values = {name: flat.get(key) for name, flat in flats.items()}
    if len(set(map(repr, values.values()))) > 1:
      notes.append(f'Held-out loss: the runs differ in {key} ('
                   + ', '.join(f'{n}: {v}' for n, v in values.items())
                   + '), so they are scored on the same documents but not the same rows and '
                   'masks; compare their held-out losses with that in mind.')
  return notes


def _prepared_root(prepared, tokenizer: str):
  """data.prepared without prepared_name's tokenizer suffix."""
  suffix = prepared_name('', tokenizer)
  return prepared[:-len(suffix)] if prepared and suffix and prepared.endswith(suffix) else prepared


def _check_tokenizers(flats: dict) -> list[str]:
  """SweepError when runs that stream one prepared corpus differ in their tokenizer; a note
  when runs differ in it at all (their held-out losses are over other vocabularies)."""
  by_corpus = {}
  for name, flat in flats.items():
    if flat.get('data.prepared'):
      by_corpus.setdefault(flat['data.prepared'], []).append(name)
  for prepared, names in by_corpus.items():
    for key in TOKENIZER_KEYS:
      values = {name: flats[name].get(key) for name in names}
      if len(set(map(repr, values.values()))) > 1:
        raise SweepError(
            f'Runs {", ".join(map(repr, names))} stream one prepared corpus ({prepared}) but '
            f'differ in config.{key}: ' + ', '.join(f'{v!r} in {n!r}' for n, v in values.items())
            + '; one corpus is prepared with one tokenizer: set it in sweep.pretrain, or change '
            'data.tokenizer (each kind gets its own corpus).')
  differ = [key for key in TOKENIZER_KEYS
            if len({repr(flat.get(key)) for flat in flats.values()}) > 1]
  if not differ:
    return []
  kinds = ', '.join(f'{n}: {f.get("data.tokenizer")}' for n, f in flats.items())
  return [f'Held-out loss: the runs differ in their tokenizer ({kinds}; '
          f'{", ".join(differ)}), so the same documents are other tokens in each: compare '
          'held-out losses and perplexities only between runs of one tokenizer.']


def _flops_per_step(config) -> float:
  """Training FLOPs of one step of `config` (over its whole run, phases included)."""
  from bert_jax.sweep import results  # pylint: disable=g-import-not-at-top
  steps = config.train.num_steps
  return results.budget(config, steps)[1] / steps


def _equal_flops_steps(sweep, arms: list, workdir: str) -> dict:
  """{arm: its steps} under sweep.equal_flops (an empty dict when it is off): the steps at
  which each pretrained arm's training FLOPs match the named arm's."""
  reference = str(sweep.get('equal_flops', '') or '')
  if not reference:
    return {}
  named = dict(arms)
  if reference not in named or named[reference].get('init', 'pretrained') != 'pretrained':
    raise SweepError(f'sweep.equal_flops={reference!r} names no pretrained arm; the pretrained '
                     'arms are ' + ', '.join(n for n, a in arms
                                             if a.get('init', 'pretrained') == 'pretrained')
                     + '.')
  for name, arm in arms:
    given = [a.strip().partition('=')[0] for a in str(arm.get('args', '') or '').split(',')]
    for length in ('steps', 'tokens'):
      if name != reference and length in given:
        raise SweepError(f'Arm {name!r} sets {length} in its args, but sweep.equal_flops='
                         f'{reference!r} chooses its steps; drop {length}= from the arm.')
  config = pretrain_config(sweep, named[reference], reference, workdir)[2]
  budget = config.train.num_steps * _flops_per_step(config)
  steps = {}
  for name, arm in arms:
    if name == reference or arm.get('init', 'pretrained') != 'pretrained':
      continue
    per_step = _flops_per_step(pretrain_config(sweep, arm, name, workdir)[2])
    steps[name] = max(1, round(budget / per_step))
  return steps


def _adopt_teacher_shape(config, teacher) -> None:
  """What a 'distill' run adopts from its teacher's checkpoint at run time, here from the
  teacher arm's config (interop/teacher.apply_teacher_shape)."""
  from bert_jax.interop import teacher as teacher_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.objectives import distill  # pylint: disable=g-import-not-at-top
  arch = {key: teacher.model[key] for key in distill.TEACHER_MODEL_KEYS if key in teacher.model}
  teacher_lib.apply_teacher_shape(config, arch, teacher.data.vocab_file, 'the teacher arm')


def plan(sweep, workdir: str = '', sweep_file: str = '') -> Plan:
  """The sweep's jobs, every config validated; SweepError on the first problem."""
  for key in ('name', 'base'):
    if not sweep.get(key):
      raise SweepError(f'sweep.{key} is empty; a sweep file sets it.')
  try:
    sweep, size = sizes.resized(sweep)
  except sizes.SizeError as e:
    raise SweepError(str(e)) from None
  except (OSError, ImportError, SyntaxError, ValueError, KeyError) as e:
    raise SweepError(f'sweep.size={sweep.get("size")!r}: the base {sweep.base!r} does not load: '
                     f'{e}') from e
  if 'finetune' not in sweep:
    raise SweepError('sweep.finetune is missing (config, tasks, seeds).')
  if int(sweep.finetune.get('seeds', 1)) < 1:
    raise SweepError(f'sweep.finetune.seeds={sweep.finetune.seeds}: must be >= 1.')
  arms = _arm_items(sweep)
  tasks = _tasks(sweep)
  rates = learning_rates(sweep)
  at_steps = _at_steps(sweep)
  runs, run_of_arm, keys = {}, {}, {}
  matched = _equal_flops_steps(sweep, arms, workdir)
  for name, arm in arms:
    spec, flat, config = pretrain_config(sweep, arm, name, workdir, matched.get(name, 0))
    key = json.dumps([spec, flat], sort_keys=True, default=str)
    if arm.get('init', 'pretrained') == 'random':
      run_of_arm[name] = None
      keys.setdefault('random', (name, spec, flat, config))
      continue
    if key not in keys:
      keys[key] = name
      runs[name] = (spec, flat, config)
    run_of_arm[name] = keys[key]
  if not runs and not any(v is None for v in run_of_arm.values()):
    raise SweepError('No arm pretrains or fine-tunes anything.')
  for name, arm in arms:
    if arm.get('teacher') and run_of_arm[arm.teacher] != arm.teacher:
      raise SweepError(f'Arm {name!r}: teacher={arm.teacher!r} pretrains as arm '
                       f'{run_of_arm[arm.teacher]!r} does (the same run); name that arm as the '
                       'teacher.')
  for step in at_steps:
    for run, (_, _, config) in runs.items():
      if step >= config.train.num_steps or step < 1:
        raise SweepError(f'sweep.finetune.at_steps holds {step}, outside the steps of run '
                         f'{run!r} (1 to {config.train.num_steps - 1}; its last step is '
                         'fine-tuned anyway).')
  notes = _check_held_out(runs) if len(runs) > 1 else []
  jobs, summary_runs = [], {}
  prepares = _prepare_jobs(runs, keys.get('random'))
  jobs.extend(prepares.values())
  # A distilling arm's run after its teacher's (a teacher has no teacher).
  ordered = sorted(runs.items(), key=lambda item: bool(dict(arms)[item[0]].get('teacher')))
  for run, (spec, flat, config) in ordered:
    prepare = prepares.get(config.data.prepared)
    teacher = dict(arms)[run].get('teacher')
    after = ((prepare.name,) if prepare else ()) + ((f'pretrain/{teacher}',) if teacher else ())
    jobs.append(Job(f'pretrain/{run}', 'pretrain', os.path.join('pretrain', run), spec, flat,
                    after=after, arm=run, num_steps=config.train.num_steps))
    summary_runs[run] = {'workdir': os.path.join('pretrain', run), 'config': spec,
                         'overrides': flat}
  finetune_runs, summary_arms = [], []
  for name, arm in arms:
    run = run_of_arm[name]
    pretrained = runs[run][2] if run else keys['random'][3]
    run_dir = os.path.join(workdir, 'pretrain', run) if run else ''
    for task in tasks:
      for step in ([None] + at_steps) if run else [None]:
        init_from = f'{run_dir}@{step}' if (run and step) else run_dir
        spec, flat = finetune_config(sweep, arm, name, task, pretrained, init_from)
        suffix = f'@{step}' if step else ''
        rel = os.path.join('finetune', name, task + suffix)
        jobs.append(Job(f'finetune/{name}/{task}{suffix}', 'finetune', rel, spec, flat,
                        after=(f'pretrain/{run}',) if run else (), arm=name, task=task,
                        step=step, num_steps=flat['seeds']))
        finetune_runs.append({'arm': name, 'task': task, 'step': step, 'workdir': rel})
    summary_arms.append({'name': name, 'label': arm.get('label', name), 'pretrain_run': run,
                         'finetune_overrides': _flatten(arm.get('finetune')),
                         'paper': dict(arm.get('paper') or {})})
  paper = sweep.get('paper') or {}
  summary = {
      'name': sweep.name, 'title': sweep.get('title', sweep.name),
      'description': sweep.get('description', ''), 'sweep_file': sweep_file,
      'base': sweep.base, 'size': size, 'tasks': tasks,
      'seeds': int(sweep.finetune.get('seeds', 1)),
      'learning_rates': list(rates),
      'notes': list(sweep.get('notes') or []) + notes,
      'paper': {'source': paper.get('source', ''), 'columns': list(paper.get('columns') or [])},
      'pretrain_runs': summary_runs, 'arms': summary_arms, 'finetune_runs': finetune_runs,
  }
  return Plan(sweep, tuple(jobs), summary)


def _prepare_jobs(runs: dict, random_arm) -> dict[str, Job]:
  """{data.prepared: the job preparing it} for each corpus the runs stream (data.prepared with
  data.corpus set): 'prepare' for the first run's, 'prepare/RUN' for another tokenizer's,
  prepared with the settings of the first run that streams it."""
  del random_arm  # It streams nothing.
  jobs = {}
  for run, (spec, flat, config) in runs.items():
    prepared = config.data.prepared
    if not (prepared and config.data.corpus) or prepared in jobs:
      continue
    keep = {k: v for k, v in flat.items() if k.startswith('data.')}
    jobs[prepared] = Job('prepare' if not jobs else f'prepare/{run}', 'prepare',
                         os.path.abspath(os.path.expanduser(prepared)), spec, keep)
  return jobs


def describe(job: Job) -> str:
  """One line: the job and its command's config."""
  extra = ' '.join(f'--config.{k}={v}' for k, v in job.overrides.items())
  return f'{job.name}: --config={job.config} {extra}'.strip()

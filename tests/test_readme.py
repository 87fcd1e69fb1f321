"""Every command of README.md's ```bash blocks runs, from a fresh copy of the repository.

COMMANDS is the table: each README command (`\\` continuations joined, `&&` and `;` chains split)
maps to how it runs here: placeholders (`/data/wiki/*.txt`, `/path/vocab.txt`,
`hf:/models/bert-base-uncased`, ...) become files this test makes, flags appended shrink it to a
CPU (tiny sizes, a few steps), and it must exit as expected and produce what it names. A command
that cannot run on a CPU test machine says why instead. README commands missing from the table,
and table entries README no longer has, fail test_table_matches_readme.

The runs share one copy of the repository (tracked and untracked, not ignored, files); a run that
needs another's output (`convert export --workdir=runs/tiny` the quickstart's run) runs it first.
"""

import dataclasses
import glob
import importlib.util
import json
import lzma
import os
import random
import re
import shutil
import subprocess
import sys

import pytest

from conftest import shared_data_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, 'README.md')


@dataclasses.dataclass(frozen=True)
class Run:
  """A README command as this test runs it."""
  name: str  # The test's id; what `after` of another run names.
  append: tuple = ()  # Flags appended: the shrinking.
  replace: tuple = ()  # (README text, text here) pairs, before the shared PLACEHOLDERS.
  after: tuple = ()  # Runs whose output this one reads.
  files: tuple = ()  # Globs, relative to the copy, the run must create.
  prints: tuple = ()  # Text its output (stdout + stderr) must hold.
  returncode: int = 0
  needs_data: bool = False  # Reads $BERT_JAX_DATA (vocab, task files).
  needs: str = ''  # A module that must be importable (else skipped, naming it).
  prefix: str = ''  # Shell text run first in the same shell (a variable the command expands).
  slow: bool = True


@dataclasses.dataclass(frozen=True)
class NotRun:
  """A README command this test does not run, and why."""
  reason: str


# README text -> text here, for every run; {key} names a file the `workspace` fixture makes.
PLACEHOLDERS = (
    ('/data/wiki/', '{corpus}/wiki/'),
    ('/data/books/', '{corpus}/books/'),
    ('/data/*.txt', '{corpus}/*.txt'),
    ('/path/vocab.txt', '{vocab}'),
    ('/data/prepared', '{prepared}'),
    ('/data/train-v1.1.json', '{squad_train}'),
    ('hf:/models/bert-base-uncased', 'hf:runs/tiny_hf'),  # The quickstart's run, exported.
    ('runs/pretrain', 'runs/tiny'),  # A pretraining workdir: the quickstart's.
    ('runs/nsp_mrpc/*', 'runs/mrpc'),  # Fine-tuned workdirs: the GLUE command's.
)

# Pretraining a few steps of a 1-layer, 32-wide model on 32-token rows.
SMALL_STEPS = ('--config.train.num_steps=2', '--config.train.warmup_steps=1',
               '--config.train.eval_batches=1', '--config.train.log_every=1',
               '--config.train.peak_flops=1e11')
SMALL_MODEL = ('--config.model.hidden_size=32', '--config.model.num_heads=2',
               '--config.model.intermediate_size=64', '--config.train.batch_size=4',
               '--config.data.max_seq_length=32')
NO_VOCAB_CACHE = ('--config.data.tokenizer_cache_dir=',)  # Nothing written to ~/.cache.
SMALL = SMALL_MODEL + ('--config.model.num_layers=1',) + SMALL_STEPS + NO_VOCAB_CACHE
# configs/tiny.py a few steps on part of the built-in corpus. The sweep's arm nsp=True is this
# same run, so it reads the vocab and the compiled steps from the caches.
TINY = SMALL_STEPS + ('--config.train.batch_size=8', '--config.data.max_documents=120',
                      '--config.data.tokenizer_cache_dir={cache}/vocab',
                      '--config.train.compilation_cache_dir={cache}/xla')
# Fine-tuning a few rows for one epoch, one seed.
FINETUNE = ('--config.seeds=1', '--config.task.max_train_examples=24',
            '--config.train.num_epochs=1', '--config.train.batch_size=8')
TPU = '--name=bert-base --zone=europe-west4-a --project=my-project'
TPU_PREFIX = f'TPU=({TPU})'
# benchmarks/compare.py with no GPU: each measurement (a process on the GPU) answers a made-up
# record, so its flags are checked and its table is built.
COMPARE_STUB = ('-c "import sys; sys.path.insert(0, \'.\'); from benchmarks import compare; '
                'compare.harness.run_process = lambda command: {\'seq_per_s\': 1.0, \'mfu\': 0.5, '
                '\'peak_memory_bytes\': 2**30}; compare.main(sys.argv[1:])"')
VENV = NotRun('.ci/run makes a fresh virtualenv and installs requirements-dev.txt into it, then '
              'runs the test suite, this file included, in it')

COMMANDS = {
    # Quickstart.
    'python3 -m venv .venv': VENV,
    '.venv/bin/pip install -r requirements.txt': VENV,
    '.venv/bin/pip install -r requirements-dev.txt': VENV,
    '.venv/bin/python -m bert_jax.main --config=configs/tiny.py --workdir=runs/tiny': Run(
        'tiny', append=TINY,
        files=('runs/tiny/checkpoints/2', 'runs/tiny/vocab.txt', 'runs/tiny/eval_results.json',
               'runs/tiny/plots/curves.png'),
        prints=('Done. Eval MLM loss', 'Curves: ')),
    '.venv/bin/python -m pytest -q -n 2 tests': NotRun(
        'the test suite this file belongs to; .ci/run runs it'),
    # Pretrain.
    ".venv/bin/python -m bert_jax.main --config=configs/base.py --workdir=runs/base "
    "--config.data.corpus='/data/wiki/*.txt,/data/books/*.txt.xz' "
    "--config.data.vocab_file=/path/vocab.txt": Run(
        'pretrain', append=SMALL, needs_data=True,
        files=('runs/base/checkpoints/2', 'runs/base/eval_results.json'), prints=('Done.',)),
    # Prepare, then stream.
    ".venv/bin/python -m bert_jax.data.prepare --config=configs/base.py --output=/data/prepared "
    "--config.data.corpus='/data/wiki/**/*,/data/books/*.txt' "
    "--config.data.vocab_file=/path/vocab.txt": Run(
        'prepare', append=('--workers=1',), needs_data=True,
        files=('{prepared}/metadata.json', '{prepared}/vocab.txt',
               '{prepared}/documents-00000.array_record')),
    ".venv/bin/python -m bert_jax.main --config=configs/base.py --workdir=runs/base "
    "--config.data.prepared=/data/prepared --config.data.corpus= "
    "--config.train.phase2_fraction=0.1 --config.data.packing=True --config.data.workers=2": Run(
        'stream', after=('prepare',), needs_data=True,
        replace=(('--workdir=runs/base', '--workdir=runs/base_prepared'),),
        # 10 steps, so that phase 2 (seq 64) has one.
        append=SMALL + ('--config.train.num_steps=10', '--config.data.phase2_max_seq_length=64',
                        '--config.data.phase2_max_predictions_per_seq=10'),
        files=('runs/base_prepared/checkpoints/10', 'runs/base_prepared/vocab.txt'),
        prints=('Done.',)),
    # Ablate and sweep.
    ".venv/bin/python -m bert_jax.main --config=configs/base.py:layers=6,nsp=False,mask_rate=0.3 "
    "--workdir=runs/l6_mlm_r30 --config.data.corpus='/data/*.txt'": Run(
        'ablation', append=SMALL_MODEL + SMALL_STEPS + NO_VOCAB_CACHE,
        files=('runs/l6_mlm_r30/checkpoints/2',), prints=('Done.',)),
    '.venv/bin/python -m bert_jax.sweep check --sweep=sweeps/table5.py --workdir=runs/table5': Run(
        'sweep_check', needs_data=True, slow=False,
        prints=('[to run] pretrain/mlm_nsp', '[to run] finetune/random/stsb')),
    '.venv/bin/python -m bert_jax.sweep run --sweep=sweeps/table5.py --workdir=runs/table5 '
    '--parallel=6': NotRun(
        'a GPU job (three pretraining runs of configs/small.py, fifteen fine-tuning runs); '
        'tests/test_sweep.py runs every shipped sweep on configs/tiny.py instead'),
    '.venv/bin/python -m bert_jax.sweep run --sweep=sweeps/table5.py --sweep.size=tiny '
    '--workdir=runs/t5_tiny': Run(
        # Its pretraining runs, 2 steps each (134 of the base's 20,000 at size tiny's 300 for
        # 20,000), evaluated before and after; test_sweep.py fine-tunes every shipped sweep at
        # size tiny.
        'sweep_tiny', needs_data=True,
        append=('--sweep.steps=134', '--sweep.evaluations=1', '--sweep.finetune.tasks='),
        files=('runs/t5_tiny/report.md', 'runs/t5_tiny/pretrain/ltr/checkpoints/2'),
        prints=('[sweep] prepare: started', 'done in', '(the sweep at size tiny)')),
    # Fine-tune.
    'export BERT_JAX_DATA=../shared/data': NotRun(
        'sets $BERT_JAX_DATA for the commands after it; they run with the value this test has '
        '(.ci/run sets it to ../shared/data)'),
    '.venv/bin/python -m bert_jax.main '
    '--config=configs/glue.py:task=mrpc,init=hf:/models/bert-base-uncased,seeds=5 '
    '--workdir=runs/mrpc': Run(
        'glue', after=('export',), needs_data=True,
        append=FINETUNE + ('--config.data.max_seq_length=64',), files=('runs/mrpc/results.json',)),
    '.venv/bin/python -m bert_jax.main '
    '--config=configs/squad.py:version=1.1,init=runs/pretrain,train=/data/train-v1.1.json '
    '--workdir=runs/squad': Run(
        'squad', after=('tiny',), needs_data=True,
        # The tiny model has 128 positions.
        append=FINETUNE + ('--config.task.dev_file={squad_dev}', '--config.data.max_seq_length=128',
                           '--config.task.doc_stride=64', '--config.task.max_query_length=32'),
        files=('runs/squad/results.json',)),
    '.venv/bin/python -m bert_jax.main --config=configs/ner.py:init=runs/pretrain '
    '--workdir=runs/ner': Run(
        'ner', after=('tiny',), needs_data=True,
        append=FINETUNE + ('--config.task.dev_file={ner_dev}', '--config.task.test_file=',
                           '--config.data.max_seq_length=64'),
        files=('runs/ner/results.json',)),
    '.venv/bin/python -m bert_jax.tasks.report runs/mrpc runs/squad runs/ner': Run(
        'report', after=('glue', 'squad', 'ner'), needs_data=True,
        prints=('| mrpc |', 'squad1.1', 'conll2003')),
    # Convert.
    ".venv/bin/python -m bert_jax.main --config=configs/base.py --workdir=runs/cont "
    "--config.data.corpus='/data/*.txt' --config.init_from=hf:/models/bert-base-uncased": Run(
        'continue', after=('export',), append=SMALL_STEPS + NO_VOCAB_CACHE + (
            '--config.train.batch_size=4', '--config.data.max_seq_length=32'),
        files=('runs/cont/checkpoints/2',), prints=('init_from hf:runs/tiny_hf',)),
    '.venv/bin/python -m bert_jax.convert export --workdir=runs/tiny --out=runs/tiny_hf': Run(
        'export', after=('tiny',),
        files=('runs/tiny_hf/config.json', 'runs/tiny_hf/model.safetensors',
               'runs/tiny_hf/vocab.txt'), prints=('Exported step 2 of runs/tiny',)),
    '.venv/bin/python -m bert_jax.convert inspect --source=hf:runs/tiny_hf': Run(
        'inspect', after=('export',), prints=('bert.embeddings.word_embeddings',)),
    # Predict.
    '.venv/bin/python -m bert_jax.predict --workdir=runs/tiny "Return the [MASK] of the object ." '
    '"Raise an [MASK] if the file does not exist ."': Run(
        'predict', after=('tiny',),
        prints=('runs/tiny (step 2)', 'Return the [MASK] of the object .', '  [MASK] 1: ')),
    # Train on a TPU pod: launch_tpu.sh prints the gcloud commands under --dry-run.
    TPU_PREFIX: NotRun('defines the TPU array the launch_tpu.sh commands after it expand; each '
                       'of them runs after it, in the same shell'),
    './launch_tpu.sh create "${TPU[@]}" --accelerator-type=v3-32 --version=tpu-ubuntu2204-base '
    '--queued --spot': Run(
        'tpu_create', prefix=TPU_PREFIX, replace=(('./launch_tpu.sh', './launch_tpu.sh --dry-run'),),
        prints=('+ gcloud', 'queued-resources create bert-base'), slow=False),
    './launch_tpu.sh setup "${TPU[@]}" --gcs-bucket=my-bucket': Run(
        'tpu_setup', prefix=TPU_PREFIX, replace=(('./launch_tpu.sh', './launch_tpu.sh --dry-run'),),
        prints=('+ gcloud', 'my-bucket'), slow=False),
    './launch_tpu.sh run "${TPU[@]}" -- --config=configs/base.py '
    '--workdir=/mnt/gcs/my-bucket/bert-base --config.data.prepared=/mnt/gcs/my-bucket/prepared '
    '--config.data.corpus= --config.data.vocab_file=/mnt/gcs/my-bucket/vocab.txt': Run(
        'tpu_run', prefix=TPU_PREFIX, replace=(('./launch_tpu.sh', './launch_tpu.sh --dry-run'),),
        prints=('+ gcloud', 'bert_jax.main', '--workdir=/mnt/gcs/my-bucket/bert-base'),
        slow=False),
    './launch_tpu.sh logs "${TPU[@]}" --follow': Run(
        'tpu_logs', prefix=TPU_PREFIX, replace=(('./launch_tpu.sh', './launch_tpu.sh --dry-run'),),
        prints=('+ gcloud',), slow=False),
    './launch_tpu.sh stop "${TPU[@]}"': Run(
        'tpu_stop', prefix=TPU_PREFIX, replace=(('./launch_tpu.sh', './launch_tpu.sh --dry-run'),),
        prints=('+ gcloud',), slow=False),
    # AOT: BERT-Large's layers at a tiny width, so the compile takes seconds.
    'python -m bert_jax.aot --config=configs/large.py --topology=v4:2x2x4': Run(
        'aot', needs='libtpu',
        append=('--config.model.hidden_size=64', '--config.model.num_heads=2',
                '--config.model.intermediate_size=128', '--config.train.batch_size=16',
                '--config.data.max_seq_length=32', '--layer_probes=false'),
        prints=('"device_kind": "TPU v4"', '"num_devices": 16', '"fits": true')),
    # GPUs: on a CPU the run is refused before compiling, naming the setting to pass instead.
    'python -m bert_jax.main --config=configs/large_gpu.py --workdir=runs/large '
    '--config.data.prepared=/data/prepared --config.data.corpus=': Run(
        'large_gpu', after=('prepare',), needs_data=True, returncode=1,
        prints=("Invalid config: config.model.", "Use ", "='xla'")),
    # The workdir.
    '.venv/bin/python -m bert_jax.plot runs/tiny --out=runs/plots': Run(
        'plot', after=('tiny',), files=('runs/plots/curves.png',),
        prints=('runs/plots/curves.png',)),
    'tensorboard --logdir runs/': NotRun(
        'starts a TensorBoard server that serves until stopped; tensorboard is an optional extra '
        '(requirements-extras.txt) that requirements-dev.txt does not install'),
    # Speed: GPU measurements; the flags and the table, with a made-up record per process.
    'python benchmarks/compare.py --shapes=large:128:128,base:128:256 --peer=compile '
    '--variants=large_gpu': Run(
        'compare_128', replace=(('benchmarks/compare.py', COMPARE_STUB),),
        prints=('| large:128:128 | large_gpu |', '| base:128:256 | peer-compile |'),
        slow=False),
    'python benchmarks/compare.py --shapes=large:512:32 --peer=compile --variants=large_gpu': Run(
        'compare_512', replace=(('benchmarks/compare.py', COMPARE_STUB),),
        prints=('| large:512:32 | large_gpu | 1 | 50.0% |',), slow=False),
}
RUNS = {entry.name: (command, entry) for command, entry in COMMANDS.items()
        if isinstance(entry, Run)}


# ---- Reading README.md. ----


def _split_outside_quotes(line: str, separators=('&&', ';')) -> list:
  """`a && b; c` -> ['a', 'b', 'c'], leaving quoted text (`--arms='x;y'`) whole."""
  parts, current, quote, i = [], '', '', 0
  while i < len(line):
    char = line[i]
    if quote:
      quote = '' if char == quote else quote
    elif char in '\'"':
      quote = char
    else:
      separator = next((s for s in separators if line.startswith(s, i)), None)
      if separator:
        parts.append(current)
        current, i = '', i + len(separator)
        continue
    current += char
    i += 1
  return parts + [current]


def readme_commands(text: str) -> list:
  """The commands of the ```bash blocks: continuations joined, chains split, comments dropped,
  whitespace collapsed."""
  commands = []
  for block in re.findall(r'^```bash\n(.*?)^```', text, re.S | re.M):
    for line in re.sub(r'\\\n\s*', ' ', block).splitlines():
      line = _split_outside_quotes(line, ('#',))[0] if ' #' in line else line
      commands += [' '.join(part.split()) for part in _split_outside_quotes(line)
                   if part.strip()]
  return commands


def test_readme_commands_are_read_whole():
  text = ('```bash\nx --a=1 \\\n  --b=\'p;q\' && y; z  # note\n```\n\n```python\nno\n```\n'
          '```bash\nTPU=(--n=1)\n```\n')
  assert readme_commands(text) == ["x --a=1 --b='p;q'", 'y', 'z', 'TPU=(--n=1)']


def test_table_matches_readme():
  with open(README, encoding='utf-8') as f:
    commands = readme_commands(f.read())
  unknown = [c for c in commands if c not in COMMANDS]
  gone = [c for c in COMMANDS if c not in commands]
  assert not unknown, ('README.md has commands tests/test_readme.py does not run; add each to '
                       'COMMANDS (how it runs, or why it cannot): ' + '\n'.join(unknown))
  assert not gone, ('COMMANDS in tests/test_readme.py lists commands README.md no longer has; '
                    'remove them: ' + '\n'.join(gone))
  names = [entry.name for entry in COMMANDS.values() if isinstance(entry, Run)]
  assert len(names) == len(set(names))
  for _, entry in RUNS.values():
    assert all(name in RUNS for name in entry.after), entry


# ---- The copy of the repository, the inputs, and running commands. ----


def _synthetic_documents(rng, count):
  """`count` documents of 3-8 sentences of common English words (all in BERT's uncased vocab)."""
  words = ('the a one two city river people time year day world life hand part child place '
           'work week case point government company number group problem fact house water '
           'small large old new long little great high good first last next early young '
           'runs reads writes makes takes gives finds tells asks sees knows thinks comes '
           'north south east west music history science language school family street').split()
  return [[' '.join(rng.choice(words) for _ in range(rng.randint(6, 16))).capitalize() + '.'
           for _ in range(rng.randint(3, 8))] for _ in range(count)]


def _write_corpus(root: str) -> None:
  """Plain files at the top (`/data/*.txt`), wiki/*.txt and wiki/AA/wiki_00 (wikiextractor's
  layout), books/*.txt and books/*.txt.xz."""
  rng = random.Random(0)
  files = {'a.txt': 40, 'b.txt': 40, 'wiki/wiki_00.txt': 30, 'wiki/wiki_01.txt': 30,
           'wiki/AA/wiki_00': 30, 'books/book_0.txt': 30, 'books/book_1.txt.xz': 30}
  for name, count in files.items():
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = '\n\n'.join('\n'.join(document) for document in _synthetic_documents(rng, count))
    opener = lzma.open if name.endswith('.xz') else open
    with opener(path, 'wt', encoding='utf-8') as f:
      f.write(text + '\n')


def _write_task_files(data: str, root: str) -> dict:
  """Small SQuAD train and dev files (from the dev set's first articles) and a CoNLL dev file."""
  with open(os.path.join(data, 'squad', 'dev-v1.1.json'), encoding='utf-8') as f:
    squad = json.load(f)
  paths = {}
  for key, article in (('squad_train', 0), ('squad_dev', 1)):
    small = dict(squad['data'][article], paragraphs=squad['data'][article]['paragraphs'][:2])
    paths[key] = os.path.join(root, f'{key}.json')
    with open(paths[key], 'w', encoding='utf-8') as f:
      json.dump({'version': squad['version'], 'data': [small]}, f)
  with open(os.path.join(data, 'conll2003', 'eng.testa'), encoding='utf-8') as f:
    sentences = f.read().split('\n\n')
  paths['ner_dev'] = os.path.join(root, 'ner_dev.txt')
  with open(paths['ner_dev'], 'w', encoding='utf-8') as f:
    f.write('\n\n'.join(sentences[:40]) + '\n')
  return paths


@pytest.fixture(scope='module', name='copy')
def fixture_copy(tmp_path_factory):
  """A fresh copy of the repository: its tracked and untracked, not ignored, files."""
  # .git is a directory in a clone and a file in a worktree (git worktree add): either lists.
  if shutil.which('git') is None or not os.path.exists(os.path.join(REPO, '.git')):
    pytest.skip('needs git and a git checkout to list the repository\'s files')
  names = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard', '-z'], cwd=REPO,
                         capture_output=True, check=True).stdout.decode().split('\0')
  root = str(tmp_path_factory.mktemp('readme') / 'bert_jax')
  for name in filter(None, names):
    source = os.path.join(REPO, name)
    if os.path.isfile(source):  # A tracked file deleted in the checkout is not there.
      os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
      shutil.copy2(source, os.path.join(root, name))
  return root


@pytest.fixture(scope='module', name='runner')
def fixture_runner(copy, tmp_path_factory):
  return Runner(copy, str(tmp_path_factory.mktemp('readme_inputs')))


class Runner:
  """Runs table entries in the copy, each once, the runs it needs first."""

  def __init__(self, root: str, inputs: str):
    self.root, self.inputs = root, inputs
    self.results = {}  # name -> (command, completed process) or the failure.
    corpus = os.path.join(inputs, 'corpus')
    _write_corpus(corpus)
    self.values = {'corpus': corpus, 'prepared': os.path.join(inputs, 'prepared'),
                   'cache': os.path.join(inputs, 'cache')}
    self.data = os.environ.get('BERT_JAX_DATA', '')
    if self.data and os.path.isdir(self.data):
      self.values['vocab'] = os.path.join(self.data, 'vocab', 'bert-base-uncased-vocab.txt')
      self.values.update(_write_task_files(self.data, inputs))

  def command(self, readme_command: str, entry: Run) -> str:
    text = readme_command
    for old, new in entry.replace + PLACEHOLDERS:
      text = text.replace(old, new)
    text = re.sub(r'^(\.venv/bin/python|python3?) ', '{python} ', text)
    text = ' '.join([text, *entry.append])
    if entry.prefix:
      text = f'{entry.prefix}; {text}'
    return self.fill(text)

  def fill(self, text: str) -> str:
    """`text` with {python} and the workspace's {key}s filled in (other braces stay)."""
    for key, value in {'python': sys.executable, **self.values}.items():
      text = text.replace('{' + key + '}', value)
    return text

  def run(self, name: str):
    """(command, completed process) of the run `name`; fails if it or a run it needs failed."""
    readme_command, entry = RUNS[name]
    if entry.needs_data:
      shared_data_dir()  # Skips, naming the variable, when $BERT_JAX_DATA is unset.
    if entry.needs and importlib.util.find_spec(entry.needs) is None:
      pytest.skip(f'{entry.needs} is not installed')
    if name not in self.results:
      for before in entry.after:
        try:
          self.run(before)
        except BaseException as e:  # pylint: disable=broad-except
          self.results[name] = AssertionError(f'{name!r} needs the run {before!r}, which '
                                              f'failed or was skipped: {e}')
          raise self.results[name] from e
      command = self.command(readme_command, entry)
      env = dict(os.environ, PYTHONDONTWRITEBYTECODE='1')
      result = subprocess.run(['bash', '-c', command], cwd=self.root, env=env, text=True,
                              capture_output=True, timeout=900, check=False)
      self.results[name] = (command, result)
    outcome = self.results[name]
    if isinstance(outcome, BaseException):
      raise outcome
    return outcome


def check(runner: Runner, name: str) -> None:
  command, result = runner.run(name)
  entry = RUNS[name][1]
  output = result.stdout + result.stderr
  where = f'README command {RUNS[name][0]!r}, run as\n{command}\noutput:\n{output[-6000:]}'
  assert result.returncode == entry.returncode, where
  for pattern in entry.files:
    pattern = runner.fill(pattern)
    assert glob.glob(os.path.join(runner.root, pattern)), f'{pattern} is missing after {where}'
  for text in entry.prints:
    assert text in output, f'{text!r} not in the output of {where}'


def _params(slow: bool):
  return [pytest.param(name, id=name) for name, (_, entry) in RUNS.items() if entry.slow == slow]


@pytest.mark.parametrize('name', _params(slow=False))
def test_readme_command_runs(runner, name):
  check(runner, name)


@pytest.mark.slow
@pytest.mark.parametrize('name', _params(slow=True))
def test_readme_run_trains_and_writes_its_outputs(runner, name):
  check(runner, name)


@pytest.mark.slow
def test_readme_ablation_arguments_reach_the_config(runner):
  """configs/base.py:layers=6,nsp=False,mask_rate=0.3 in the README's ablation."""
  check(runner, 'ablation')
  with open(os.path.join(runner.root, 'runs', 'l6_mlm_r30', 'config.json'),
            encoding='utf-8') as f:
    config = json.load(f)
  assert config['model']['num_layers'] == 6
  assert config['objectives'] == 'mlm'
  assert config['masking']['rate'] == 0.3
  assert config['data']['max_predictions_per_seq'] == 40  # The paper's 20 at rate 0.15, x2.

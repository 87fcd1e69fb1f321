"""Faulty input files stop a run with one line naming the file and the repair: prepared corpora
cut short, deleted or corrupt (at start or at a read mid-run) and broken metadata.json."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax.data import prepare
from bert_jax.data import records
from bert_jax.data import streaming
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.train import pretrain
from conftest import micro_config
from configs import base

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ('the cat sat on a mat it was sunny day and happy only one sentence of second document '
         'dogs run far away from home when night falls over quiet hills').split()
LETTERS = 'abcdefghijklmnopqrstuvwxyz'
SHARD = records.SHARD_PATTERN.format(index=1)


def write_corpus(directory, seed: int = 0, documents: int = 40, words=WORDS) -> str:
  """Three files of `documents` documents of 2-6 sentences of `words` (one sentence per line,
  blank line between documents); returns their glob."""
  rng = np.random.default_rng(seed)
  os.makedirs(directory, exist_ok=True)
  for index in range(3):
    texts = ['\n'.join(' '.join(rng.choice(words, rng.integers(4, 12))) + '.'
                       for _ in range(rng.integers(2, 7))) for _ in range(documents)]
    with open(os.path.join(directory, f'part{index}.txt'), 'w', encoding='utf-8') as f:
      f.write('\n\n'.join(texts) + '\n')
  return os.path.join(str(directory), '*.txt')


def write_vocab(path) -> str:
  tokens = (list(tokenizer_lib.SPECIAL_TOKENS) + list('.,') + list(LETTERS)
            + ['##' + c for c in LETTERS] + WORDS)
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(dict.fromkeys(tokens)) + '\n')
  return str(path)


def prepare_corpus(corpus: str, vocab: str, output: str) -> None:
  config = base.get_config()
  config.data.update(corpus=corpus, vocab_file=vocab, tokenizer_cache_dir='')
  prepare.prepare(config, output, workers=1, shard_mb=0.001)


@pytest.fixture(scope='module')
def source(tmp_path_factory):
  """(corpus glob, vocab, a prepared directory of three shards) that tests copy, not change."""
  root = tmp_path_factory.mktemp('input')
  corpus = write_corpus(root / 'corpus')
  vocab = write_vocab(root / 'vocab.txt')
  prepare_corpus(corpus, vocab, str(root / 'prepared'))
  assert len(records.read_metadata(str(root / 'prepared')).shards) == 3
  return corpus, vocab, str(root / 'prepared')


@pytest.fixture
def prepared(source, tmp_path):
  """A fresh copy of the prepared corpus for a test to damage."""
  directory = str(tmp_path / 'prepared')
  shutil.copytree(source[2], directory)
  return directory


def run_config(tmp_path, prepared_dir, **overrides):
  return micro_config(tmp_path, **{'data.prepared': prepared_dir, 'data.corpus': '',
                                   **overrides})


def damage(path: str, how: str) -> None:
  if how == 'deleted':
    os.remove(path)
  elif how == 'emptied':
    open(path, 'wb').close()
  else:  # Cut short: half its bytes.
    with open(path, 'rb+') as f:
      f.truncate(os.path.getsize(path) // 2)


def corrupt_chunks(path: str) -> None:
  """Overwrites bytes inside the records (not the footer that counts them): the shard opens with
  its record count and fails its chunk checksum where a record is read."""
  with open(path, 'rb+') as f:
    f.seek(1000)
    f.write(b'\xff' * 64)


def assert_names_shard_and_repair(message: str, directory: str) -> None:
  assert os.path.join(directory, SHARD) in message
  assert f'python -m bert_jax.data.prepare --config=... --output={directory}' in message


@pytest.mark.parametrize('how', ['cut short', 'emptied', 'deleted'])
def test_a_damaged_shard_is_refused_at_start_naming_it_and_the_repair(prepared, tmp_path, how):
  damage(os.path.join(prepared, SHARD), how)
  with pytest.raises(config_lib.ConfigError) as error:
    pretrain.prepare_data(run_config(tmp_path, prepared), str(tmp_path / 'run'))
  assert_names_shard_and_repair(str(error.value), prepared)
  assert ('is missing' if how == 'deleted' else 'truncated or corrupt') in str(error.value)


def test_rerunning_prepare_as_the_error_says_repairs_the_corpus(source, prepared, tmp_path):
  damage(os.path.join(prepared, SHARD), 'cut short')
  os.remove(os.path.join(prepared, SHARD))  # The error's advice: delete it, rerun prepare.
  corpus, vocab, original = source
  prepare_corpus(corpus, vocab, prepared)
  with open(os.path.join(prepared, SHARD), 'rb') as a, open(os.path.join(original, SHARD),
                                                            'rb') as b:
    assert a.read() == b.read()
  pretrain.prepare_data(run_config(tmp_path, prepared), str(tmp_path / 'run'))


@pytest.mark.parametrize('edit,problem', [
    (lambda text: text[:len(text) // 2], r'metadata.json cannot be read \(.*\)'),
    (lambda text: '[1, 2]', 'metadata.json is not a JSON object'),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != 'shards'}),
     'metadata.json lacks shards'),
    (lambda text: json.dumps({**json.loads(text), 'token_dtype': 'float8'}),
     "token_dtype 'float8' is not 'uint16' or 'int32'"),
    (lambda text: json.dumps({**json.loads(text), 'shards': [
        {**shard, 'file': '../' + shard['file']} for shard in json.loads(text)['shards']]}),
     "shard entry 0 names '../documents-00000.array_record', not a file in the directory"),
    (lambda text: json.dumps({**json.loads(text), 'shards': [{'file': SHARD}]}),
     'shard entry 0 has no document count'),
])
def test_broken_metadata_is_refused_naming_it_and_the_repair(prepared, tmp_path, edit, problem):
  path = os.path.join(prepared, records.METADATA_FILENAME)
  with open(path, encoding='utf-8') as f:
    text = f.read()
  with open(path, 'w', encoding='utf-8') as f:
    f.write(edit(text))
  with pytest.raises(config_lib.ConfigError, match=problem) as error:
    pretrain.prepare_data(run_config(tmp_path, prepared), str(tmp_path / 'run'))
  assert ('delete it and re-run `python -m bert_jax.data.prepare --config=... '
          f'--output={prepared}`') in str(error.value)


def test_a_missing_metadata_names_the_directory(prepared, tmp_path):
  os.remove(os.path.join(prepared, records.METADATA_FILENAME))
  with pytest.raises(config_lib.ConfigError, match=r'metadata.json does not exist: .* is not a '
                     'prepared corpus'):
    pretrain.prepare_data(run_config(tmp_path, prepared), str(tmp_path / 'run'))


def read_every_document(store) -> int:
  return sum(len(store[i]) for i in range(len(store)))


def test_a_corrupt_record_is_named_when_it_is_read(prepared):
  corrupt_chunks(os.path.join(prepared, SHARD))
  store = streaming.DocumentStore(prepared)  # The record count in the footer is intact.
  with pytest.raises(records.PreparedCorpusError,
                     match=r'Document \d+ in shard .* cannot be read \(Corrupted Riegeli') as error:
    read_every_document(store)
  assert_names_shard_and_repair(str(error.value), prepared)
  assert isinstance(error.value, config_lib.ConfigError)  # What main reports in one line.


def test_a_shard_cut_short_after_the_start_is_named_when_it_is_read(prepared):
  store = streaming.DocumentStore(prepared)
  damage(os.path.join(prepared, SHARD), 'cut short')
  with pytest.raises(records.PreparedCorpusError, match=r'cannot be read') as error:
    read_every_document(store)
  assert_names_shard_and_repair(str(error.value), prepared)


def test_a_corrupt_record_read_in_a_grain_worker_is_named(source, prepared, tmp_path):
  """With data.workers the read fails in a worker process; the error reaches the run intact."""
  for index in range(3):
    corrupt_chunks(os.path.join(prepared, records.SHARD_PATTERN.format(index=index)))
  config = run_config(tmp_path, prepared, **{'data.workers': 1})
  tokenizer = tokenizer_lib.WordPieceTokenizer(source[1], True)
  stream = streaming.TrainStream(streaming.DocumentStore(prepared),
                                 pretrain.stream_settings(config, tokenizer, 8,
                                                         objectives.resolve(config)), seed=0,
                                 workers=1)
  try:
    with pytest.raises(records.PreparedCorpusError, match=r'in shard .*documents-0000\d'
                       r'\.array_record cannot be read \(Corrupted Riegeli'):
      for _ in zip(range(1000), stream.batches({'epoch': 0, 'batch': 0})):
        pass
  finally:
    stream.close()


@pytest.mark.slow
def test_a_bad_read_mid_run_stops_it_with_no_checkpoint_after_it(prepared, tmp_path,
                                                                  monkeypatch):
  """A read that fails after some steps (a disk fault: the reader's own RuntimeError) ends the
  run with the shard named; every checkpoint on disk was saved before that read."""
  import grain  # pylint: disable=g-import-not-at-top
  from bert_jax.core import checkpoint as checkpoint_lib  # pylint: disable=g-import-not-at-top
  saved, saved_before_failure = [], []
  real_save = checkpoint_lib.Checkpointer.save

  def save(self, step, *args):
    saved.append(step)
    return real_save(self, step, *args)

  class FailingAfterTheFirstSave(grain.sources.ArrayRecordDataSource):

    def __getitem__(self, index):
      if saved:
        saved_before_failure.extend(saved)
        raise RuntimeError('Corrupted Riegeli/records file: chunk data hash mismatch')
      return super().__getitem__(index)

  monkeypatch.setattr(checkpoint_lib.Checkpointer, 'save', save)
  monkeypatch.setattr(grain.sources, 'ArrayRecordDataSource', FailingAfterTheFirstSave)
  config = run_config(tmp_path, prepared, **{
      'train.num_steps': 40, 'train.warmup_steps': 2, 'train.checkpoint_every': 2,
      'train.log_every': 2, 'train.eval_every': 1000, 'train.keep_checkpoints': 10})
  workdir = tmp_path / 'run'
  with pytest.raises(records.PreparedCorpusError, match=r'in shard .* cannot be read'):
    pretrain.train_and_evaluate(config, str(workdir))
  assert saved_before_failure and saved == saved_before_failure  # No save after the bad read.
  on_disk = sorted(int(s) for s in os.listdir(workdir / 'checkpoints') if s.isdigit())
  assert on_disk == saved


def test_main_reports_a_damaged_shard_in_one_line(prepared, tmp_path):
  damage(os.path.join(prepared, SHARD), 'cut short')
  from configs import tiny  # pylint: disable=g-import-not-at-top
  defaults = config_lib.flatten(tiny.get_config())
  flags = [f'--config.{key}={value}'
           for key, value in config_lib.flatten(run_config(tmp_path, prepared)).items()
           if value != defaults[key]]
  result = subprocess.run(
      [sys.executable, '-m', 'bert_jax.main', '--config=configs/tiny.py',
       f'--workdir={tmp_path / "run"}', *flags], cwd=REPO, capture_output=True, text=True,
      timeout=300)
  assert result.returncode != 0
  assert 'Traceback' not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f'Invalid config: Shard {os.path.join(prepared, SHARD)} ')
  assert_names_shard_and_repair(last, prepared)
  assert not (tmp_path / 'run' / 'checkpoints').exists()

"""A resume continues on the data its checkpoint was trained on (bert_jax/data/identity.py): a
corpus file rewritten in place, another corpus format, other casing or another prepared corpus
is refused before anything is written, naming what changed; the same corpus in another directory
resumes."""

import dataclasses
import os

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.data import identity
from bert_jax.data import prepare
from bert_jax.data import records
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.train import pretrain
import test_input_faults
from conftest import micro_config
from configs import base

WORDS = ('The cat sat on a Mat it was Sunny and the dogs ran far Away from home when night '
         'fell over quiet Hills').split()


def write_corpus(directory, seed: int = 0) -> str:
  """Three files of 20 documents, capitals in them; returns their glob."""
  return test_input_faults.write_corpus(directory, seed, documents=20, words=WORDS)


def saved_steps(workdir) -> list[int]:
  return sorted(int(s) for s in os.listdir(os.path.join(workdir, 'checkpoints')) if s.isdigit())


def test_the_digest_sees_values_dtypes_and_sentence_boundaries():
  a, b = np.arange(3, dtype=np.int32), np.arange(3, 5, dtype=np.int32)
  assert identity.digest([[a, b]]) == identity.digest([[a.copy(), b.copy()]])
  assert identity.digest([[a, b]]) != identity.digest([[np.concatenate([a, b])]])
  assert identity.digest([[a, b]]) != identity.digest([[a.astype(np.int64), b]])
  assert identity.digest({'x': 1, 'y': 'z'}) == identity.digest({'y': 'z', 'x': 1})
  assert identity.digest({'x': 1}) != identity.digest({'x': True})
  with pytest.raises(TypeError, match='cannot hash a object'):
    identity.digest(object())


def test_a_prepared_corpus_is_known_by_its_ids_not_by_where_it_was_read():
  metadata = records.Metadata(
      format_version=records.FORMAT_VERSION, vocab_sha256='ab', vocab_file='/a/vocab.txt',
      vocab_size=9, lowercase=True, token_dtype='uint16',
      shards=[{'file': 's1', 'documents': 2, 'sentences': 3, 'tokens': 9, 'sources': ['/a/x']}],
      sources=['/a/x'])
  moved = dataclasses.replace(metadata, vocab_file='/b/vocab.txt', sources=['/b/x'], shards=[
      {'file': 's1', 'documents': 2, 'sentences': 3, 'tokens': 9, 'sources': ['/b/x']}])
  other = dataclasses.replace(metadata, shards=[
      {'file': 's1', 'documents': 2, 'sentences': 3, 'tokens': 10, 'sources': ['/a/x']}])
  digest = lambda m: identity.digest(identity.prepared_metadata(m))  # noqa: E731
  assert digest(moved) == digest(metadata) != digest(other)
  assert digest(dataclasses.replace(metadata, lowercase=False)) != digest(metadata)


@pytest.mark.slow
def test_a_resume_on_other_data_is_refused_and_on_the_same_data_moved_it_continues(tmp_path):
  corpus = write_corpus(tmp_path / 'corpus')
  settings = {'data.corpus': corpus, 'data.corpus_format': 'bert', 'data.max_documents': 0,
              'train.num_steps': 4, 'train.warmup_steps': 1, 'train.checkpoint_every': 2,
              'train.log_every': 2, 'train.eval_every': 1000}
  workdir = str(tmp_path / 'run')
  pretrain.train_and_evaluate(micro_config(tmp_path, **settings), workdir)
  assert saved_steps(workdir) == [2, 4]
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    saved_config = f.read()

  def refused(match, **changes):
    config = micro_config(tmp_path, **{**settings, 'train.num_steps': 6, **changes})
    with pytest.raises(config_lib.ConfigError, match=match):
      pretrain.train_and_evaluate(config, workdir)
    with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
      assert f.read() == saved_config
    assert saved_steps(workdir) == [2, 4]

  # Casing and format change the token ids: the setting is named.
  refused(r'was trained on other data .*config\.data\.lowercase=False \(the checkpoint: True\)'
          r'.*Resume with the data it was trained on', **{'data.lowercase': False})
  refused(r"other data .*config\.data\.corpus_format='prose' \(the checkpoint: 'bert'\)",
          **{'data.corpus_format': 'prose'})
  # The same name, other text: no setting changed, the data did.
  write_corpus(tmp_path / 'corpus', seed=1)
  refused(r'other data .*the same settings \(config\.data\.corpus=.* now read other data: a '
          r'corpus file changed on disk')
  # The original text in another directory: the same data, so the run continues.
  moved = write_corpus(tmp_path / 'moved')
  pretrain.train_and_evaluate(
      micro_config(tmp_path, **{**settings, 'data.corpus': moved, 'train.num_steps': 6}), workdir)
  assert saved_steps(workdir)[-1] == 6


@pytest.mark.slow
def test_a_resume_on_another_prepared_corpus_is_refused(tmp_path):
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join(dict.fromkeys(
      list(tokenizer_lib.SPECIAL_TOKENS) + ['.'] + [w.lower() for w in WORDS])) + '\n',
                   encoding='utf-8')
  for name, seed in (('first', 0), ('second', 1)):
    config = base.get_config()
    config.data.update(corpus=write_corpus(tmp_path / f'{name}_text', seed),
                       vocab_file=str(vocab), tokenizer_cache_dir='')
    prepare.prepare(config, str(tmp_path / name), workers=1, shard_mb=0.001)
  settings = {'data.prepared': str(tmp_path / 'first'), 'data.corpus': '',
              'data.vocab_file': str(vocab), 'train.num_steps': 2, 'train.warmup_steps': 1,
              'train.checkpoint_every': 2, 'train.log_every': 2, 'train.eval_every': 1000}
  workdir = str(tmp_path / 'run')
  pretrain.train_and_evaluate(micro_config(tmp_path, **settings), workdir)
  config = micro_config(tmp_path, **{**settings, 'data.prepared': str(tmp_path / 'second'),
                                     'train.num_steps': 4})
  with pytest.raises(config_lib.ConfigError,
                     match=r"other data .*config\.data\.prepared='.*second' \(the checkpoint: "
                           r"'.*first'\)"):
    pretrain.train_and_evaluate(config, workdir)
  assert saved_steps(workdir) == [2]

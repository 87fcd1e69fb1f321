"""A corpus mixture (data.mixture, data/mixture.py): sources prepared into DIR/NAME streamed
together, each epoch drawing each source's documents to its weight's share of the tokens; the
stream resumes exactly; what cannot work is refused naming the value."""

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.core.errors import ConfigError
from bert_jax.data import mixture
from bert_jax.data import streaming
from bert_jax.train import pretrain
from conftest import assert_refused
from test_streaming import tiny_config, write_prepared_with_vocab


@pytest.fixture(scope='module', name='sources')
def fixture_sources(tmp_path_factory):
  """DIR with DIR/wiki (90 documents) and DIR/books (60), one vocab."""
  root = tmp_path_factory.mktemp('mixture')
  write_prepared_with_vocab(root / 'wiki', num_documents=90)
  write_prepared_with_vocab(root / 'books', num_documents=60)
  return str(root)


def mixed_config(root, text='wiki:3,books:1', **overrides):
  return tiny_config(root, **{'data.mixture': text, **overrides})


def test_a_mixture_reads_as_names_and_weights():
  assert mixture.parse('wiki:3, books:1') == [mixture.Source('wiki', 3.0),
                                              mixture.Source('books', 1.0)]
  assert mixture.shares(mixture.parse('wiki:3,books:1')) == [0.75, 0.25]
  assert mixture.parse('') == []


@pytest.mark.parametrize('text,message', [
    ('wiki,books:1', r"'wiki' is not NAME:WEIGHT with a positive weight; .*'wiki:3,books:1'"),
    ('wiki:0,books:1', r"'wiki:0' is not NAME:WEIGHT with a positive weight"),
    ('wiki:-1,books:1', r"'wiki:-1' is not NAME:WEIGHT"),
    ('wiki:lots,books:1', r"'wiki:lots' is not NAME:WEIGHT"),
    ('wiki:1,wiki:2', r"'wiki' is named twice"),
    ('wiki:1', r"names one source; a mixture needs two or more .*DIR/wiki and mixture=''"),
    ('a/b:1,books:1', r"'a/b' is not a directory name under config.data.prepared"),
])
def test_a_mixture_that_does_not_read_is_refused_naming_the_item(text, message):
  with pytest.raises(ConfigError, match=message):
    mixture.parse(text)


def test_each_epoch_draws_each_source_to_its_share_of_the_tokens():
  documents = streaming.SourceDocuments([range(900), range(100)], [10.0, 10.0])
  order = streaming.SourceOrder(documents, [0.75, 0.25], seed=0, run=1)
  assert order.wanted.tolist() == [750, 250]
  for epoch in (0, 1):
    ids = order.epoch_order(epoch)
    sources = np.array([documents.source_of(i) for i in ids])
    assert np.bincount(sources).tolist() == [750, 250]
    # The large source draws a fresh subset without repeats; the small one all, then again.
    assert len(set(ids[sources == 0].tolist())) == 750
    assert set(ids[sources == 1].tolist()) == set(range(900, 1000))
    # Document by document: the first tenth of an epoch already holds both, near their shares.
    assert 0.15 < np.mean(sources[:100]) < 0.35
  assert order.epoch_order(0).tolist() != order.epoch_order(1).tolist()
  # Shares of tokens, not documents: a source of documents 4x as long draws 4x fewer.
  longer = streaming.SourceOrder(
      streaming.SourceDocuments([range(900), range(100)], [10.0, 40.0]), [0.5, 0.5], 0, 1)
  assert longer.wanted.tolist() == [650, 162]  # 13,000 tokens an epoch: 6,500 / 10, / 40.
  # A mixture's collection gives the rows no language ids.
  assert not hasattr(documents, 'language_of')


@pytest.mark.parametrize('shards', [0, 2])
def test_a_mixed_stream_draws_its_shares_and_resumes_exactly(sources, monkeypatch, shards):
  config = mixed_config(sources, **{'data.input_shards': shards})
  config_lib.validate(config)
  built = []
  original = streaming.SourceOrder.__init__

  def record(self, documents, shares, seed, run):
    built.append((list(documents.counts), list(shares), run))
    original(self, documents, shares, seed, run)
  monkeypatch.setattr(streaming.SourceOrder, '__init__', record)
  stream, held_out, _ = pretrain.prepare_streaming(config)
  # Each source's training documents (eval_fraction 0.1 held out of each), drawn at 3:1: one
  # order per input stream, in runs of one document per stream (each takes every n-th).
  assert built == [([81, 54], [0.75, 0.25], max(shards, 1))] * max(shards, 1)
  assert len(held_out) == config.train.eval_batches
  batches = stream.batches({'epoch': 0, 'batch': 0})
  for _ in range(4):
    next(batches)
  state = stream.checkpoint_state()
  expected = [next(batches)[0] for _ in range(3)]
  again = pretrain.prepare_streaming(config, with_eval=False)[0].batches(
      {'epoch': 0, 'batch': 4, **state})
  for want in expected:
    got, _ = next(again)
    for key, value in want.items():
      np.testing.assert_array_equal(got[key], value, err_msg=key)
  # Other weights draw other batches.
  other = pretrain.prepare_streaming(mixed_config(sources, 'wiki:1,books:3'),
                                     with_eval=False)[0].batches({'epoch': 0, 'batch': 0})
  first = pretrain.prepare_streaming(config, with_eval=False)[0].batches({'epoch': 0, 'batch': 0})
  assert not np.array_equal(next(other)[0]['input_ids'], next(first)[0]['input_ids'])


def test_a_source_that_is_not_prepared_is_named_with_those_that_are(sources):
  with pytest.raises(ConfigError, match=(
      r"config.data.mixture names 'news', but .*news holds no prepared corpus \(prepared "
      r'corpora under .*: books, wiki\); prepare it with')):
    pretrain.prepare_streaming(mixed_config(sources, 'wiki:1,news:1'))


@pytest.mark.parametrize('overrides,message', [
    ({'data.prepared': '', 'data.corpus': 'builtin'},
     r"mixes the sources of a prepared corpus .*set config.data.prepared"),
    ({'data.languages': 'en,fr'},
     r"with config.data.languages='en,fr': a cross-lingual corpus draws its languages"),
    ({'data.mixture': 'wiki:0,books:1'}, r"'wiki:0' is not NAME:WEIGHT"),
])
def test_a_mixture_the_run_cannot_stream_is_refused_before_anything_is_read(
    sources, overrides, message):
  assert_refused(mixed_config(sources, **overrides), message)


def test_a_resume_with_other_weights_is_refused_naming_them(sources):
  saved = {'layout': pretrain.guard.data_layout(mixed_config(sources),
                                                pretrain.DATA_LAYOUT_KEYS)}
  pretrain._check_layout(saved, mixed_config(sources), 8, 'runs/m')  # The same: resumes.
  with pytest.raises(ConfigError, match=(
      r"step 8 in runs/m was written with another data layout: config.data.mixture="
      r"'wiki:1,books:1' \(the checkpoint: 'wiki:3,books:1'\)")):
    pretrain._check_layout(saved, mixed_config(sources, 'wiki:1,books:1'), 8, 'runs/m')
  # A checkpoint from before mixtures streamed one corpus.
  older = {'layout': {k: v for k, v in saved['layout'].items() if k != 'data.mixture'}}
  pretrain._check_layout(older, mixed_config(sources, ''), 8, 'runs/m')


@pytest.mark.slow
def test_a_mixed_run_trains_and_its_resume_keeps_the_weights(sources, tmp_path):
  workdir = str(tmp_path / 'run')
  steps = {'train.num_steps': 4, 'train.checkpoint_every': 4, 'train.eval_every': 4}
  last = pretrain.train_and_evaluate(mixed_config(sources, **steps), workdir)
  assert np.isfinite(last['mlm_loss']) and last['tokens'] == 4 * 8 * 64
  longer = {**steps, 'train.num_steps': 8}
  with pytest.raises(ConfigError, match=r"config.data.mixture='wiki:1,books:3' \(the "
                                        r"checkpoint: 'wiki:3,books:1'\)"):
    pretrain.train_and_evaluate(mixed_config(sources, 'wiki:1,books:3', **longer), workdir)
  last = pretrain.train_and_evaluate(mixed_config(sources, **longer), workdir)
  assert last['tokens'] == 8 * 8 * 64


def test_a_source_prepared_with_another_vocab_is_refused_naming_it(sources, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax.data import records  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'mix'
  shutil.copytree(sources, root)
  metadata = records.read_metadata(str(root / 'books'))
  metadata.vocab_sha256 = 'f' * 64  # As if tokenised with another vocab.
  records.write_metadata(str(root / 'books'), metadata)
  with pytest.raises(ConfigError, match=r"config.data.prepared='.*books' was tokenised with the "
                                        r'vocab of sha256 ffffffffffff'):
    pretrain.prepare_streaming(mixed_config(str(root)))

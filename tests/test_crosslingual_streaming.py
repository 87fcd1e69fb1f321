"""Cross-lingual pretraining from a prepared corpus (XLM-R's MLM at scale): prepare_languages
(a prepared corpus a language, one shared vocab), streamed rows that keep to one language and
carry its ids, each language's share of an epoch under data.language_alpha, exact resume, and
the config checks. The text is tests/test_xlm.py's parallel sample as two monolingual corpora."""

import functools
import json

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.data import prepare
from bert_jax.data import streaming
from bert_jax.train import pretrain
from configs import xlm
from conftest import assert_refused, MICRO  # pylint: disable=g-bad-import-order
from test_xlm import unmasked, write_sample  # pylint: disable=g-bad-import-order


def xlmr_config(tmp_path, **overrides):
  """configs/xlm.py's XLM-R recipe (MLM on FULL-SENTENCES rows, SentencePiece with fairseq's
  ids, no language embeddings) at the tests' micro size on the sample's English and French."""
  config = xlm.get_config()
  sample = write_sample(tmp_path)
  settings = {**MICRO, 'model.vocab_size': 256, 'model.max_position_embeddings': 34,
              'data.tokenizer_vocab_size': 120, 'data.max_seq_length': 24,
              'data.languages': sample['data.languages'], 'data.corpus': sample['data.corpus'],
              'data.parallel': '', 'train.batch_size': 8, 'train.grad_accum_steps': 1,
              'train.num_steps': 30,
              'train.warmup_steps': 3, 'train.log_every': 10, 'train.eval_every': 30,
              'train.checkpoint_every': 30, **overrides}
  for key, value in settings.items():
    *parents, leaf = key.split('.')
    functools.reduce(lambda node, name: node[name], parents, config)[leaf] = value
  return config


@pytest.fixture(scope='module', name='prepared')
def fixture_prepared(tmp_path_factory):
  """(the config streaming it, the prepared directory)."""
  tmp_path = tmp_path_factory.mktemp('crosslingual')
  config = xlmr_config(tmp_path)
  directory = str(tmp_path / 'prepared')
  prepare.prepare(config, directory, workers=1, vocab_sample_mb=1)
  config.data.update(prepared=directory, corpus='')
  config_lib.validate(config)
  return config, directory


def test_each_language_is_prepared_with_one_shared_vocab(prepared):
  _, directory = prepared
  assert prepare.read_languages(directory) == ['en', 'fr']
  en, fr = (streaming.records.read_metadata(f'{directory}/{code}') for code in ('en', 'fr'))
  assert en.vocab_sha256 == fr.vocab_sha256 and en.tokenizer == 'sentencepiece_fairseq'
  assert en.num_documents == fr.num_documents == 150  # 600 sentences in documents of 4.
  with open(f'{directory}/languages.json', encoding='utf-8') as f:
    assert json.load(f)['vocab_sha256'] == en.vocab_sha256


def only_tokens(directory: str) -> list[set]:
  """The token ids only English's (0) and only French's (1) prepared documents hold."""
  tokens = []
  for code in ('en', 'fr'):
    store = streaming.DocumentStore(f'{directory}/{code}')
    tokens.append({int(t) for k in range(len(store)) for s in store[k] for t in s})
  return [tokens[0] - tokens[1], tokens[1] - tokens[0]]


@pytest.mark.parametrize('rows', ['full_sentences', 'segments'])
def test_streamed_rows_keep_to_one_language_and_carry_its_ids(prepared, rows, tmp_path):
  config, directory = prepared
  config = config.copy_and_resolve_references()
  config.data.rows = rows
  stream, held_out, tokenizer = pretrain.prepare_data(config, str(tmp_path))
  only = only_tokens(directory)
  batches = [b for b, _ in zip((b for b, _ in stream.batches({'epoch': 0, 'batch': 0})),
                               range(12))] + held_out
  seen = set()
  for batch in batches:
    for k in range(len(batch['input_ids'])):
      mask = batch['input_mask'][k] > 0
      language = int(batch['language_ids'][k][0])
      np.testing.assert_array_equal(batch['language_ids'][k], mask * language)
      np.testing.assert_array_equal(batch['position_ids'][k], np.where(mask, np.arange(24), 0))
      ids = unmasked({key: value[k] for key, value in batch.items()})[mask].tolist()
      assert not set(ids) & only[1 - language], (k, language)
      if len(ids) > 5:  # Not a sentence's last piece alone ('.': the tiny vocab splits long ones).
        assert set(ids) & only[language]  # Its own language's words, not shared pieces only.
      seen.add(language)
  assert seen == {0, 1}
  assert tokenizer.special.pad == 1


def test_each_epoch_draws_the_languages_to_their_smoothed_shares():
  documents = streaming.LanguageDocuments([range(900), range(100)], [10.0, 10.0])
  order = streaming.SourceOrder.smoothed(documents, alpha=0.3, seed=0, run=16)
  q = np.array([0.9, 0.1]) ** 0.3 / (0.9 ** 0.3 + 0.1 ** 0.3)
  np.testing.assert_array_equal(order.wanted, np.round(q * 1000))
  for epoch in (0, 1):
    ids = order.epoch_order(epoch)
    languages = np.array([documents.language_of(i) for i in ids])
    assert np.bincount(languages).tolist() == order.wanted.tolist()
    # The large language draws a subset without repeats; the small one all and then more.
    assert len(set(ids[languages == 0].tolist())) == order.wanted[0]
    assert set(ids[languages == 1].tolist()) == set(range(900, 1000))
    # Runs of 16 documents of one language (a language's last run may be shorter).
    changes = np.flatnonzero(np.diff(languages)) + 1
    assert len(changes) < len(ids) / 16 * 1.5
  assert order.epoch_order(0).tolist() != order.epoch_order(1).tolist()
  # A language's share of the tokens, not of the documents: longer documents, fewer drawn.
  longer = streaming.SourceOrder.smoothed(
      streaming.LanguageDocuments([range(900), range(100)], [10.0, 40.0]),
      alpha=1.0, seed=0, run=16)
  assert longer.wanted.tolist() == [900, 100]
  flat = streaming.SourceOrder.smoothed(documents, alpha=1.0, seed=0, run=16)
  assert sorted(flat.epoch_order(0).tolist()) == list(range(1000))


def test_a_resumed_stream_continues_exactly(prepared, tmp_path):
  config, _ = prepared
  stream, _, _ = pretrain.prepare_data(config, str(tmp_path))
  batches = stream.batches({'epoch': 0, 'batch': 0})
  for _ in range(5):
    next(batches)
  state = stream.checkpoint_state()
  expected = [next(batches)[0] for _ in range(3)]
  resumed, _, _ = pretrain.prepare_data(config, str(tmp_path))
  again = resumed.batches({'epoch': 0, 'batch': 5, **state})
  for want in expected:
    got, _ = next(again)
    for key, value in want.items():
      np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.parametrize('change, message', [
    ({'data.parallel': 'en-fr:para.tsv'}, "parallel='en-fr:para.tsv' with data.prepared=.*"
     "read in memory"),
    ({'data.packing': True}, 'packing=True with data.prepared=.*one instance of one language'),
])
def test_what_a_streamed_cross_lingual_run_cannot_do_is_refused(prepared, change, message):
  config, _ = prepared
  config = config.copy_and_resolve_references()
  for key, value in change.items():
    section, leaf = key.split('.')
    config[section][leaf] = value
  assert_refused(config, message)


def test_languages_must_be_the_prepared_ones(prepared, tmp_path):
  config, directory = prepared
  other = config.copy_and_resolve_references()
  other.data.languages = 'fr,en'  # Ids are indices: another order is other ids.
  with pytest.raises(config_lib.ConfigError, match=r"holds the languages en,fr, but "
                     r"config.data.languages='fr,en'"):
    pretrain.prepare_data(other, str(tmp_path))
  one = config.copy_and_resolve_references()
  one.data.update(prepared=f'{directory}/en', languages='fr,en')
  with pytest.raises(config_lib.ConfigError, match='holds one corpus, no languages.*'
                     r'--config.data.languages=fr,en'):
    pretrain.prepare_data(one, str(tmp_path))


@pytest.mark.slow
def test_xlm_r_pretrains_from_the_prepared_languages(prepared, tmp_path):
  config = prepared[0].copy_and_resolve_references()
  config.train.update(num_steps=100, eval_every=50, checkpoint_every=100)
  workdir = tmp_path / 'run'
  pretrain.train_and_evaluate(config, str(workdir))
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  evals = [r['mlm_loss'] for r in records if r['split'] == 'eval']
  print(f'XLM-R from prepared en, fr, 100 steps: held-out MLM loss {evals[0]:.3f} -> '
        f'{evals[-1]:.3f}')
  assert evals[-1] < evals[0] - 1.0

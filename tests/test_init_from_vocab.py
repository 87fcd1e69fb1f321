"""--config.init_from with a vocab of one's own (config.data.vocab_file, e.g. a new tokenizer for
continued pretraining): the source's vocab, or one that extends it, keeps its ids; any other is
refused before anything is built unless config.init_vocab_by_token carries each token's rows
(a token the source lacks starts at their mean)."""

import json

import numpy as np
import pytest

import hf_parity
from bert_jax import config_lib
from bert_jax.interop import hf
from bert_jax.interop import init_from
from bert_jax.interop import param_tree
from conftest import micro_config

SPECIALS = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
WORDS = [f'word{i}' for i in range(92)]  # With SPECIALS, hf_parity's 97 rows.


@pytest.fixture(scope='module', name='source')
def fixture_source(tmp_path_factory):
  """An hf: directory of a random odd-sized BERT whose vocab.txt is SPECIALS + WORDS."""
  directory = tmp_path_factory.mktemp('source')
  hf_parity.random_model(hf_parity.family_hf_config('bert'), str(directory))
  (directory / 'vocab.txt').write_text('\n'.join(SPECIALS + WORDS) + '\n', encoding='utf-8')
  return directory


def run_config(tmp_path, source, tokens, **top):
  """The micro config from `source` (a masked LM: MLM only) with a vocab.txt of `tokens`
  (config.data.vocab_file)."""
  vocab = tmp_path / f'vocab_{len(list(tmp_path.glob("vocab_*.txt")))}.txt'  # One per config.
  vocab.write_text('\n'.join(tokens) + '\n', encoding='utf-8')
  return micro_config(tmp_path, init_from=f'hf:{source}', objectives='mlm',
                      **{'data.vocab_file': str(vocab), **top})


def adopted(config):
  config_lib.validate_and_adopt_source(config, config_lib.validate)
  return config


# Another tokenizer's vocab: the specials, half the words in another order, three new words.
NEW = SPECIALS + WORDS[::-2] + ['riverbank', 'tokamak', '##ness']


def test_another_vocab_is_refused_naming_what_would_move(tmp_path, source):
  config = run_config(tmp_path, source, NEW)
  moved = sum(1 for i, token in enumerate(NEW) if (SPECIALS + WORDS)[i] != token)
  with pytest.raises(config_lib.ConfigError,
                     match=rf'is not the vocab of config.init_from=.*: {moved} of its {len(NEW)} '
                           r'tokens have another id there or none.*init_vocab_by_token=True'):
    adopted(config)


def test_the_sources_vocab_elsewhere_and_one_that_extends_it_keep_their_ids(tmp_path, source):
  same = adopted(run_config(tmp_path, source, SPECIALS + WORDS))
  assert same.model.vocab_size == 97
  longer = SPECIALS + WORDS + ['newword0', 'newword1']
  with pytest.raises(config_lib.ConfigError,
                     match=r'extends the vocab of .* by 2 tokens, beyond its 97 rows\. Set '
                           r'config.init_resize_vocab=True and config.model.vocab_size to at '
                           r'least 99'):
    adopted(run_config(tmp_path, source, longer))
  # Resized: the config's vocab_size stands (the source's is not adopted) and two rows are added.
  config = adopted(run_config(tmp_path, source, longer, init_resize_vocab=True,
                              **{'model.vocab_size': 99}))
  assert config.model.vocab_size == 99 and config.model.hidden_size == 42
  params = param_tree.flatten(init_from.load_params(config, hf.init_params(config)))
  assert params['bert/embeddings/word_embeddings'].shape == (99, 42)


def test_by_token_each_token_takes_the_sources_row_of_the_same_token(tmp_path, source):
  config = adopted(run_config(tmp_path, source, NEW, init_vocab_by_token=True))
  assert config.model.vocab_size == len(NEW)  # The new vocab's, not the source's 97.
  with open(source / 'config.json', encoding='utf-8') as f:
    assert json.load(f)['vocab_size'] == 97
  state_dict, hf_config = hf.load_hf_state_dict(str(source))
  same = adopted(run_config(tmp_path, source, SPECIALS + WORDS))
  before = param_tree.flatten(hf.import_hf(state_dict, same, hf_config=hf_config)[0])
  params = param_tree.flatten(init_from.load_params(config, hf.init_params(config)))
  old = {token: i for i, token in enumerate(SPECIALS + WORDS)}
  for path in hf.VOCAB_PATHS:
    rows, source_rows = params[path], before[path]
    assert rows.shape[0] == len(NEW)
    for i, token in enumerate(NEW):
      want = source_rows[old[token]] if token in old else source_rows.mean(axis=0)
      np.testing.assert_allclose(rows[i], want, rtol=1e-6, atol=1e-7, err_msg=(path, token))
  # Everything else is the source's.
  np.testing.assert_array_equal(params['bert/embeddings/position_embeddings'],
                                before['bert/embeddings/position_embeddings'])


def test_by_token_needs_a_source_vocab_and_excludes_resizing(tmp_path, source):
  with pytest.raises(config_lib.ConfigError, match=r'rows move either by token or by id'):
    adopted(run_config(tmp_path, source, NEW, init_vocab_by_token=True, init_resize_vocab=True))
  bare = tmp_path / 'bare'
  bare.mkdir()
  for name in ('config.json', 'model.safetensors'):
    (bare / name).write_bytes((source / name).read_bytes())
  with pytest.raises(config_lib.ConfigError,
                     match=r"init_vocab_by_token=True needs the source's vocab beside its "
                           r'weights \(vocab.txt'):
    adopted(run_config(tmp_path, bare, NEW, init_vocab_by_token=True))


def test_by_token_with_the_sources_own_vocab_is_the_plain_import(tmp_path, source):
  # The config's vocab_size (128 here) is neither kept nor the source's 97 by accident: the
  # vocab's own size, every row its own.
  config = adopted(run_config(tmp_path, source, SPECIALS + WORDS, init_vocab_by_token=True,
                              **{'model.vocab_size': 128}))
  assert config.model.vocab_size == 97
  carried = param_tree.flatten(init_from.load_params(config, hf.init_params(config)))
  state_dict, hf_config = hf.load_hf_state_dict(str(source))
  plain = param_tree.flatten(hf.import_hf(state_dict, adopted(run_config(
      tmp_path, source, SPECIALS + WORDS)), hf_config=hf_config)[0])
  for path, value in plain.items():
    np.testing.assert_array_equal(carried[path], value, err_msg=path)

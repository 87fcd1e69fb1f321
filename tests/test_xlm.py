"""XLM and XLM-R ('xlm'): transformers' XLMRobertaForMaskedLM in and out, language embeddings,
translation-LM and multilingual MLM rows of a parallel sample made here, the config checks and
counts, and a short pretraining run of configs/xlm.py shrunk."""

import functools
import itertools

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import models
from bert_jax.data import crosslingual
from bert_jax.data import pretraining
from bert_jax.interop import hf
from bert_jax.interop import init_from
from bert_jax.models import hf_layout
from bert_jax.train import step as steps
from configs import base, xlm
from conftest import assert_refused, MICRO, run_records  # pylint: disable=g-bad-import-order
import hf_parity  # pylint: disable=g-bad-import-order
from hf_parity import EXPORT_TOLERANCE, IMPORT_TOLERANCE, imported, max_diff, torch, transformers

PAD = 1  # XLM-R's <pad>: fairseq's padding_idx.
# Odd sizes (none of the other families' tests' shapes), so a transposed or mis-split axis
# cannot line up.
HF_SIZES = dict(num_hidden_layers=3, hidden_size=36, num_attention_heads=3, intermediate_size=68,
                vocab_size=89, max_position_embeddings=19, type_vocab_size=1,
                layer_norm_eps=1e-5, pad_token_id=PAD)
LENGTH = 15  # Tokens a row.

# The parallel sample: English sentences and their French translations, made word for word from
# these (subject, verb, object, time) lists: 6 x 5 x 5 x 4 = 600 pairs.
SUBJECTS = (('The cat', 'Le chat'), ('The dog', 'Le chien'), ('The child', "L'enfant"),
            ('My sister', 'Ma soeur'), ('The teacher', 'Le professeur'),
            ('Our neighbour', 'Notre voisin'))
VERBS = (('eats', 'mange'), ('sees', 'voit'), ('likes', 'aime'), ('finds', 'trouve'),
         ('draws', 'dessine'))
OBJECTS = (('an apple', 'une pomme'), ('the bread', 'le pain'), ('a book', 'un livre'),
           ('the garden', 'le jardin'), ('a letter', 'une lettre'))
TIMES = (('today', "aujourd'hui"), ('every morning', 'chaque matin'),
         ('in the evening', 'le soir'), ('slowly', 'lentement'))


def parallel_sample() -> list[tuple[str, str]]:
  """Every (English, French) pair of the word lists, each ending in ' .'."""
  return [tuple(' '.join(words) + ' .' for words in zip(*parts))
          for parts in itertools.product(SUBJECTS, VERBS, OBJECTS, TIMES)]


def words(language: int) -> set[str]:
  """The words of the sample's English (0) or French (1) sentences."""
  return {w for sentence in parallel_sample() for w in sentence[language].split()}


# A tokenizer's special ids and layout: BERT's [CLS] A [SEP] B [SEP], RoBERTa's and XLM-R's
# <s> A </s></s> B </s>.
SPECIALS = {
    'bert': pretraining.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4),
    'xlmr': pretraining.SpecialIds(pad=1, unk=3, cls=0, sep=2, mask=4, separators=2,
                                   draws_specials=False),
}


class WordTokenizer:
  """Whitespace words -> ids, the special ids below them: the shared vocab of the sample's two
  languages ('.' is in both)."""

  def __init__(self, special):
    self.special = special
    vocab = sorted(words(0) | words(1))
    self.ids = {w: i + 5 for i, w in enumerate(vocab)}
    self.vocab_size = 5 + len(vocab)

  def encode_sentences(self, sentences):
    return [np.array([self.ids[w] for w in s.split()], np.int32) for s in sentences]

  def language_of(self, ids) -> set[int]:
    """The languages whose words `ids` hold (shared words and special ids say nothing)."""
    only = [{self.ids[w] for w in words(k) - words(1 - k)} for k in (0, 1)]
    return {k for k in (0, 1) if set(np.asarray(ids).tolist()) & only[k]}


def settings_for(special, vocab_size, max_seq_length=32, rows='segments'):
  return pretraining.MaskingSettings(
      special=special, vocab_size=vocab_size, max_seq_length=max_seq_length, max_predictions=6,
      nsp=False, short_seq_prob=0.0, mask_rate=0.15, mask_token_fraction=0.8,
      random_token_fraction=0.1, rows=rows)


def unmasked(row) -> np.ndarray:
  """A row's input ids with each prediction's label put back: the ids before masking."""
  ids = row['input_ids'].copy()
  real = row['masked_lm_weights'] > 0
  ids[row['masked_lm_positions'][real]] = row['masked_lm_ids'][real]
  return ids


def test_a_translation_row_is_laid_out_as_xlm_r_pairs():
  """Golden: <s> A </s></s> B </s>, positions from 0 again at B's </s>, A's language, then B's."""
  settings = settings_for(SPECIALS['xlmr'], 30)
  row = crosslingual.translation_features(np.array([10, 11, 12], np.int32),
                                          np.array([20, 21], np.int32), (3, 1),
                                          np.random.default_rng(0), settings)
  n = 9
  np.testing.assert_array_equal(unmasked(row)[:n], [0, 10, 11, 12, 2, 2, 20, 21, 2])
  np.testing.assert_array_equal(row['position_ids'][:n], [0, 1, 2, 3, 4, 0, 1, 2, 3])
  np.testing.assert_array_equal(row['language_ids'][:n], [3, 3, 3, 3, 3, 1, 1, 1, 1])
  np.testing.assert_array_equal(row['segment_ids'][:n], [0] * 5 + [1] * 4)
  assert not row['input_mask'][n:].any() and not row['position_ids'][n:].any()
  assert not row['language_ids'][n:].any()


@pytest.mark.parametrize('layout', list(SPECIALS))
@pytest.mark.parametrize('max_seq_length', [32, 12])
def test_translation_rows_reset_positions_carry_languages_and_mask_both(layout, max_seq_length):
  special = SPECIALS[layout]
  tokenizer = WordTokenizer(special)
  settings = settings_for(special, tokenizer.vocab_size, max_seq_length)
  rng = np.random.default_rng(0)
  for english, french in parallel_sample()[::7]:
    a, b = tokenizer.encode_sentences([english, french])
    row = crosslingual.translation_features(a, b, (0, 1), rng, settings)
    n = int(row['input_mask'].sum())
    ids = unmasked(row)[:n]
    # The second sentence's part: its separator(s) after A's [SEP], its words, its [SEP].
    first = 1 + int(np.flatnonzero(ids == special.sep)[0])
    assert n <= max_seq_length and first < n - special.separators
    np.testing.assert_array_equal(row['position_ids'][:n],
                                  np.r_[np.arange(first), np.arange(n - first)])
    np.testing.assert_array_equal(row['language_ids'][:n], np.repeat([0, 1], [first, n - first]))
    assert tokenizer.language_of(ids[:first]) == {0}
    assert tokenizer.language_of(ids[first:]) == {1}
    if max_seq_length == 32:  # Untruncated: the whole pair.
      np.testing.assert_array_equal(ids[1:first - 1], a)
    predicted = row['masked_lm_positions'][row['masked_lm_weights'] > 0]
    assert (predicted < first).any() and (predicted >= first).any()  # Masks in both.
    assert not np.isin(ids[predicted], [special.cls, special.sep]).any()


def sample_corpus(tokenizer) -> crosslingual.Corpus:
  """The sample as 60 English and 40 French documents (4 sentences each, in other orders than
  the pairs) and 50 pairs, as token ids."""
  pairs = parallel_sample()
  rng = np.random.default_rng(1)
  documents = tuple([[pairs[k][language] for k in rng.permutation(len(pairs))[:4]]
                     for _ in range(count)] for language, count in ((0, 60), (1, 40)))
  return crosslingual.encode(tokenizer, crosslingual.Corpus(documents, ((0, 1, pairs[:50]),)))


@pytest.mark.parametrize('rows', ['segments', 'full_sentences'])
def test_mlm_rows_keep_to_their_language_beside_the_translation_rows(rows):
  tokenizer = WordTokenizer(SPECIALS['xlmr'])
  corpus = sample_corpus(tokenizer)
  settings = settings_for(tokenizer.special, tokenizer.vocab_size, 48, rows)
  examples = crosslingual.build_examples(corpus, np.random.default_rng(0), settings)
  kinds = {'mlm': 0, 'tlm': 0}
  for k in range(len(examples['input_ids'])):
    row = {key: value[k] for key, value in examples.items()}
    n = int(row['input_mask'].sum())
    ids, languages = unmasked(row)[:n], row['language_ids'][:n]
    if len(set(languages.tolist())) == 1:  # An MLM row: one language throughout.
      kinds['mlm'] += 1
      np.testing.assert_array_equal(row['position_ids'][:n], np.arange(n))
      assert tokenizer.language_of(ids) == {int(languages[0])}
    else:
      kinds['tlm'] += 1
      assert row['position_ids'][n - 1] < n - 1  # Reset at the second sentence.
  assert kinds['tlm'] == 50 and kinds['mlm'] >= 25


def test_language_alpha_gives_the_small_language_more_rows():
  shares = crosslingual.language_shares([900, 100], 0.3)
  np.testing.assert_allclose(shares, np.array([0.9, 0.1]) ** 0.3 / (0.9 ** 0.3 + 0.1 ** 0.3))
  rows = [list(range(900)), list(range(1000, 1100))]
  resampled = crosslingual.resample(rows, np.random.default_rng(0), 0.3)
  assert [len(r) for r in resampled] == list(np.round(shares * 1000).astype(int))
  assert resampled[0] == rows[0][:len(resampled[0])]  # The large language keeps its first rows.
  assert set(resampled[1]) == set(rows[1])  # The small one all of its rows, some again.
  assert crosslingual.resample(rows, np.random.default_rng(0), 1.0) is rows


def write_sample(directory) -> dict:
  """The sample as files: mono.en.txt and mono.fr.txt (sentence per line, documents of 4) and
  para.en-fr.tsv; the config keys that name them."""
  pairs = parallel_sample()
  for language, code in enumerate(('en', 'fr')):
    order = np.random.default_rng(language).permutation(len(pairs))
    lines = [pairs[k][language] + ('\n' if i % 4 == 3 else '') for i, k in enumerate(order)]
    (directory / f'mono.{code}.txt').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  (directory / 'para.en-fr.tsv').write_text(
      ''.join(f'{en}\t{fr}\n' for en, fr in pairs[:300]), encoding='utf-8')
  return {'data.languages': 'en,fr', 'data.corpus': str(directory / 'mono.{lang}.txt'),
          'data.parallel': f'en-fr:{directory / "para.en-fr.tsv"}'}


def tiny_xlm(tmp_path, **overrides):
  """configs/xlm.py:recipe=xlm (MLM + TLM, language embeddings) at the tests' micro size, on
  the sample's two languages."""
  config = xlm.get_config('recipe=xlm')
  settings = {**MICRO, 'model.num_languages': 2, 'model.max_position_embeddings': 34,
              'model.vocab_size': 256, 'data.tokenizer_vocab_size': 120,
              'data.tokenizer_cache_dir': str(tmp_path / 'vocab-cache'),
              'data.language_alpha': 0.7, 'train.num_steps': 150, 'train.warmup_steps': 10,
              'train.weight_decay': 0.01, 'train.log_every': 50, 'train.eval_every': 50,
              'train.checkpoint_every': 150, **write_sample(tmp_path), **overrides}
  for key, value in settings.items():
    *parents, leaf = key.split('.')
    functools.reduce(lambda node, name: node[name], parents, config)[leaf] = value
  return config


def test_prepare_data_gives_batches_with_position_and_language_ids(tmp_path):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = tiny_xlm(tmp_path)
  config_lib.validate(config)
  stream, held_out, tokenizer = pretrain.prepare_data(config, str(tmp_path / 'run'))
  assert tokenizer.kind == 'sentencepiece_fairseq'
  assert (tokenizer.special.cls, tokenizer.special.pad, tokenizer.special.sep) == (0, 1, 2)
  batch, _ = next(stream.batches({'epoch': 0, 'batch': 0}))
  spec = steps.dummy_batch(8, 32, 5, objectives=('mlm',), languages=True)
  assert set(spec) <= set(batch) and set(spec) <= set(held_out[0])
  examples = stream.epoch_examples(0)
  reset = (np.diff(examples['position_ids'], axis=1) < 0) & (examples['input_mask'][:, 1:] > 0)
  assert reset.any(axis=1).sum() > 0  # Translation rows.
  assert set(np.unique(examples['language_ids'][examples['input_mask'] > 0])) == {0, 1}


def test_a_language_too_small_to_hold_out_a_document_is_one_config_error(tmp_path):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  # Each language's file is one document (no blank line): 5% of one holds out none.
  for code in ('en', 'fr'):
    (tmp_path / f'one.{code}.txt').write_text(
        ''.join(f'{en if code == "en" else fr}\n' for en, fr in parallel_sample()[:40]),
        encoding='utf-8')
  config = tiny_xlm(tmp_path, **{'data.corpus': str(tmp_path / 'one.{lang}.txt'),
                                 'data.parallel': '', 'objectives': 'mlm'})
  config_lib.validate(config)
  with pytest.raises(config_lib.ConfigError,
                     match=r'The held-out documents \(0\) yield 0 examples.* Each language holds '
                           r'out data.eval_fraction=[\d.]+ of its documents .*held out en 0 '
                           r'documents, fr 0 documents\.'):
    pretrain.prepare_data(config, str(tmp_path / 'run'))


def xlm_clm(tmp_path):
  """XLM's causal LM: the recipe with objectives='clm', causal attention, no translation pairs."""
  return tiny_xlm(tmp_path, **{'objectives': 'clm', 'model.causal': True, 'data.parallel': ''})


def test_xlm_s_causal_lm_reads_unmasked_rows_with_their_language_ids(tmp_path):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = xlm_clm(tmp_path)
  config_lib.validate(config)
  stream, held_out, tokenizer = pretrain.prepare_data(config, str(tmp_path / 'run'))
  examples = stream.epoch_examples(0)
  real = examples['input_mask'] > 0
  assert not (examples['input_ids'][real] == tokenizer.special.mask).any()  # Nothing masked.
  assert set(np.unique(examples['language_ids'][real])) == {0, 1}
  for row in range(len(real)):  # Monolingual rows: one language, positions from 0.
    n = int(real[row].sum())
    assert len(set(examples['language_ids'][row, :n].tolist())) == 1
    np.testing.assert_array_equal(examples['position_ids'][row, :n], np.arange(n))
  assert set(steps.dummy_batch(8, 32, 5, objectives=('clm',), languages=True)) <= set(held_out[0])


@pytest.mark.slow
def test_xlm_s_causal_lm_lowers_the_held_out_loss(tmp_path):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = xlm_clm(tmp_path)
  config.train.update(num_steps=100, eval_every=50, checkpoint_every=100)
  workdir = tmp_path / 'run'
  pretrain.train_and_evaluate(config, str(workdir))
  evals = [r['clm_loss'] for r in run_records(workdir)['eval']]
  print(f'XLM CLM, 100 steps: held-out CLM loss {evals[0]:.3f} -> {evals[-1]:.3f}')
  assert evals[-1] < evals[0] - 1.0


@pytest.mark.slow
def test_pretraining_the_xlm_recipe_lowers_the_held_out_loss(tmp_path):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = tiny_xlm(tmp_path)
  workdir = tmp_path / 'run'
  pretrain.train_and_evaluate(config, str(workdir))
  evals = [r['mlm_loss'] for r in run_records(workdir)['eval']]
  print(f'XLM MLM + TLM, 150 steps: held-out MLM loss {evals[0]:.3f} -> {evals[-1]:.3f}')
  assert evals[-1] < evals[0] - 1.0


# Interop.

@pytest.fixture(scope='module', name='hf_model')
def fixture_hf_model(tmp_path_factory):
  """(a random XLMRobertaForMaskedLM in eval mode, the dir it was saved to)."""
  return hf_parity.saved_models(tmp_path_factory, {'xlmr': transformers.XLMRobertaConfig(
      **HF_SIZES)}, transformers.XLMRobertaForMaskedLM)['xlmr']


def our_config(scan_layers=True, **model):
  config = base.get_config()
  config.model.update(hf.hf_config_to_model_overrides(
      transformers.XLMRobertaConfig(**HF_SIZES).to_dict()), scan_layers=scan_layers, **model)
  config.objectives = 'mlm'
  return config


def inputs(reset_at=None):
  """3 x LENGTH ids with <pad> tails in two rows, 4 prediction positions a row; with reset_at
  the position ids of translation rows, restarting at that token."""
  rng = np.random.default_rng(0)
  mask = np.ones((3, LENGTH), np.int32)
  mask[1, 11:] = mask[2, 6:] = 0
  ids = np.where(mask > 0, rng.integers(PAD + 2, HF_SIZES['vocab_size'], mask.shape), PAD)
  batch = {'input_ids': ids.astype(np.int32), 'input_mask': mask,
           'segment_ids': np.zeros_like(mask),
           'masked_lm_positions': np.array([[1, 4, 7, 14], [0, 2, 3, 10], [1, 2, 3, 5]],
                                           np.int32)}
  if reset_at is not None:
    positions = np.arange(LENGTH) - np.where(np.arange(LENGTH) >= reset_at, reset_at, 0)
    batch['position_ids'] = (np.broadcast_to(positions, mask.shape) * mask).astype(np.int32)
    batch['language_ids'] = ((np.arange(LENGTH) >= reset_at) * mask).astype(np.int32)
  return batch


def run_ours(params, config, batch):
  """(MLM logits at the batch's positions, the encoder's last layer's states)."""
  model = steps.build_model(config)
  encoder = models.get('xlm').encoder(model.config)

  def forward(p, batch):
    hidden = encoder.apply({'params': p['bert']}, batch['input_ids'], batch['segment_ids'],
                           batch['input_mask'], True, batch.get('position_ids'),
                           language_ids=batch.get('language_ids'))[0]
    return model.apply({'params': p}, batch)['mlm_logits'], hidden
  return tuple(np.asarray(x) for x in jax.jit(forward)(params, batch))


def run_hf(model, batch):
  """(MLM logits at the positions, last hidden states) of transformers' model; position ids as
  ours give them (fairseq's: + 2, padding row 1) when the batch has its own."""
  mask = batch['input_mask']
  kwargs = {}
  if 'position_ids' in batch:
    kwargs['position_ids'] = torch.tensor(np.where(mask > 0, batch['position_ids'] + 2, PAD),
                                          dtype=torch.long)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(batch['input_ids'], dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long), output_hidden_states=True,
                **kwargs)
  logits = np.take_along_axis(out.logits.numpy(), batch['masked_lm_positions'][..., None], 1)
  return logits, out.hidden_states[-1].numpy()


def differences(ours, theirs) -> dict:
  return {name: max_diff(a, b) for name, a, b in zip(('mlm', 'hidden'), ours, theirs)}


def test_translation_rows_read_their_position_ids_as_transformers_does(hf_model):
  """Positions restarting at token 7 (a TLM row) give transformers' outputs at the same
  positions; without them (fairseq's numbering from the mask) the outputs differ."""
  config = our_config()
  params, _ = imported(hf_model[1], config)
  params = hf.merge_missing(params, hf.init_params(config, seed=1), config)
  batch = inputs(reset_at=7)
  diffs = differences(run_ours(params, config, batch), run_hf(hf_model[0], batch))
  print('XLMRobertaForMaskedLM, rows with positions reset at 7, max |ours - transformers|: '
        + ', '.join(f'{k} {v:.2e}' for k, v in diffs.items()))
  assert max(diffs.values()) < IMPORT_TOLERANCE, diffs
  counted = {k: v for k, v in batch.items() if k != 'position_ids'}
  assert max_diff(run_ours(params, config, counted)[1], run_hf(hf_model[0], batch)[1]) > 1e-2


def test_fine_tuning_an_xlm_r_directory_reads_its_sentencepiece_as_transformers_does(
    hf_model, tmp_path):
  """An XLM-R directory keeps sentencepiece.bpe.model, whose ids fairseq's dictionary moves
  (<s> <pad> </s> <unk> first, <mask> last): fine-tuning from it takes that file and encodes
  pairs with XLMRobertaTokenizer's ids."""
  # pylint: disable=g-import-not-at-top
  import shutil
  from bert_jax.data import spm_fairseq
  from bert_jax.train import finetune
  from configs import finetune as finetune_config
  directory = tmp_path / 'xlmr'
  shutil.copytree(hf_model[1], directory)
  sentences = [sentence for pair in parallel_sample() for sentence in pair]
  # At most the checkpoint's 89 rows: 87 pieces + <pad> + <mask> (the sample holds fewer).
  spm_fairseq.train([sentences], 89, False, str(directory))
  config = finetune_config.get_config()
  config.init_from = f'hf:{directory}'
  config.data.update(tokenizer='', vocab_file='', lowercase=True)
  init_from.adopt_source(config)
  assert (config.data.tokenizer, config.data.lowercase, config.data.vocab_file) == (
      'sentencepiece_fairseq', False, str(directory / 'sentencepiece.bpe.model'))
  ours = finetune.load_tokenizer(config)
  theirs = transformers.XLMRobertaTokenizer.from_pretrained(str(directory))
  assert ours.vocab_size == len(theirs) <= 89
  for a, b in parallel_sample()[:40:3]:
    ids_a, ids_b = ours.encode_sentences([a, b])
    row, _ = pretraining.assemble(pretraining.Instance(ids_a, ids_b, False), ours.special)
    assert row.tolist() == theirs(a, b)['input_ids']


def test_an_export_reads_translation_rows_positions_as_ours(tmp_path):
  """XLMRobertaForMaskedLM out (conformance/), and given a translation row's position ids it
  computes our logits and states."""
  config = our_config()
  params = hf_parity.random_params(config)
  loaded = hf_parity.assert_exports(params, config, tmp_path / 'hf', inputs())
  batch = inputs(reset_at=7)
  diffs = differences(run_ours(params, config, batch), run_hf(loaded, batch))
  print('XLMRobertaForMaskedLM export, rows with positions reset at 7, max |ours - '
        'transformers|: ' + ', '.join(f'{k} {v:.2e}' for k, v in diffs.items()))
  assert max(diffs.values()) < EXPORT_TOLERANCE, diffs


def test_language_embeddings_add_each_token_s_language_row():
  """With every language row zero the model is XLM-R's; a row moves only its language's
  tokens' embeddings."""
  config = our_config(num_languages=2)
  with_table = hf.init_params(config, seed=3)
  table = with_table['bert']['embeddings'].pop('language_embeddings')
  assert table.shape == (2, HF_SIZES['hidden_size'])
  without = our_config()
  batch = inputs(reset_at=7)
  reference = run_ours(with_table, without, batch)
  zero = jax.tree.map(np.copy, with_table)
  zero['bert']['embeddings']['language_embeddings'] = np.zeros_like(table)
  np.testing.assert_array_equal(run_ours(zero, config, batch)[1], reference[1])
  zero['bert']['embeddings']['language_embeddings'][1] = table[1]
  moved = np.abs(run_ours(zero, config, batch)[1] - reference[1]).max(-1) > 1e-3  # [3, LENGTH]
  encoder = models.get('xlm').encoder(models.get('xlm').config_from(config))
  embedded = encoder.apply({'params': zero['bert']}, batch['input_ids'], batch['segment_ids'],
                           True, batch['position_ids'], batch['input_mask'],
                           batch['language_ids'], method=lambda m, *a: m.embeddings(*a))
  plain = encoder.apply({'params': zero['bert']}, batch['input_ids'], batch['segment_ids'], True,
                        batch['position_ids'], batch['input_mask'],
                        method=lambda m, *a: m.embeddings(*a))
  changed = np.abs(np.asarray(embedded) - np.asarray(plain)).max(-1) > 0
  np.testing.assert_array_equal(changed, batch['language_ids'] == 1)
  assert moved.any()


def test_export_refuses_language_embeddings(tmp_path):
  config = our_config(num_languages=2)
  with pytest.raises(hf_layout.UnsupportedConfigError, match='num_languages=2.*no language'):
    hf.export_hf(hf.init_params(config), config, str(tmp_path))


def test_import_into_a_model_with_language_embeddings_is_refused(hf_model):
  config = our_config(num_languages=2)
  with pytest.raises(hf.CheckpointMismatchError, match='num_languages=0 but config.model.num_la'):
    imported(hf_model[1], config)


# Configs.

def valid_xlm(**data):
  config = xlm.get_config('recipe=xlm')
  config.data.update(corpus='/data/wiki.{lang}.txt', **data)
  return config


@pytest.mark.parametrize('change, message', [
    (lambda c: c.model.update(name='roberta'), "num_languages=15 with config.model.name="
     "'roberta'.*model.name='xlm'.*num_languages=0"),
    (lambda c: c.data.update(languages='en,fr'), 'num_languages=15 but data.languages names 2 '
     r'\(en, fr\).*set num_languages=2'),
    (lambda c: c.data.update(languages=''), 'num_languages=15 needs language ids.*'
     'data.languages'),
    (lambda c: c.data.update(languages='en,fr-CA'), "'fr-CA' is not a language code.*letters, "
     "digits and '_'"),
    (lambda c: c.data.update(languages='en,en'), 'names en more than once'),
    (lambda c: c.data.update(parallel='en-xx:a.tsv'), "'en-xx:a.tsv' names xx, not among "
     'config.data.languages'),
    (lambda c: c.data.update(parallel='en:fr:a.tsv'), "'en:fr:a.tsv' is not SRC-TGT:FILES"),
    (lambda c: c.data.update(parallel='en-en:a.tsv'), 'pairs en with itself'),
    (lambda c: c.data.update(corpus='/data/wiki.txt'), "corpus='/data/wiki.txt' has no "
     "'\\{lang\\}'"),
    (lambda c: c.data.update(prepared='/data/prepared', parallel='en-fr:a.tsv'),
     "parallel='en-fr:a.tsv' with data.prepared='/data/prepared'.*read in memory"),
    (lambda c: setattr(c, 'objectives', 'mlm,nsp'), "objectives='mlm,nsp'.*'mlm'"),
    (lambda c: c.update(objectives='clm') or c.model.update(causal=True) or c.data.update(
        parallel='en-fr:a.tsv'), "objectives='clm' with parallel='en-fr:a.tsv'.*TLM"),
    (lambda c: c.data.update(language_alpha=0.0), r'language_alpha=0.0: must be a finite number '
     r'in \(0, 1\]'),
    (lambda c: c.model.update(num_languages=-1), 'num_languages=-1: must be an integer >= 0'),
])
def test_bad_cross_lingual_values_are_refused_naming_what_is_valid(change, message):
  config = valid_xlm()
  config_lib.validate(config)
  change(config)
  assert_refused(config, message)


def test_parallel_text_without_languages_is_refused():
  config = base.get_config()
  config.data.update(corpus='builtin', parallel='en-fr:a.tsv')
  with pytest.raises(config_lib.ConfigError, match="parallel='en-fr:a.tsv' needs config.data."
                     "languages"):
    config_lib.validate(config)


def test_config_arguments_are_checked():
  with pytest.raises(ValueError, match="recipe='xlm2'.*xlmr, xlm"):
    xlm.get_config('recipe=xlm2')
  with pytest.raises(ValueError, match="size='huge'.*base, large"):
    xlm.get_config('size=huge')
  with pytest.raises(ValueError, match="size='large' with recipe='xlm'"):
    xlm.get_config('recipe=xlm,size=large')
  assert xlm.get_config('steps=1000').train.warmup_steps == 16  # 24k of 1.5M.


@pytest.mark.parametrize('size, layers, hidden, heads, count', [
    ('base', 12, 768, 12, 278_043_648),
    pytest.param('large', 24, 1024, 16, 559_890_432, marks=pytest.mark.slow)])
def test_xlm_r_shapes_count_transformers_parameters(size, layers, hidden, heads, count):
  """configs/xlm.py's XLM-R-base and -large: the parameters of transformers' XLMRobertaModel
  (with its pooler, as our encoder) and XLMRobertaForMaskedLM of the exported config.json, built
  on the meta device; ours from shapes alone."""
  config = xlm.get_config(f'size={size}')
  config.data.corpus = 'builtin'
  config_lib.validate(config)
  m = config.model
  assert (m.name, m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size, m.vocab_size,
          m.num_languages) == ('xlm', layers, hidden, heads, 4 * hidden, 250_002, 0)
  model = steps.build_model(config)
  shapes = jax.eval_shape(functools.partial(model.init, deterministic=True),
                          jax.random.PRNGKey(0), steps.dummy_batch(1, 8, 2, objectives=('mlm',)))
  params = nn.meta.unbox(shapes['params'])
  total = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))  # noqa: E731
  exported = {k: v for k, v in hf.model_to_hf_config(config).items() if k != 'architectures'}
  hf_config = transformers.XLMRobertaConfig(**exported)
  with torch.device('meta'):
    theirs = [sum(p.numel() for p in cls(hf_config).parameters())
              for cls in (transformers.XLMRobertaModel, transformers.XLMRobertaForMaskedLM)]
  assert total(params['bert']) == theirs[0] == count
  assert total(params) == theirs[1] + hidden * (hidden + 1)  # Ours keeps the pooler.
  print(f'XLM-R-{size}: {total(params["bert"]):,} parameters in the encoder (XLMRobertaModel: '
        f'{theirs[0]:,}), {theirs[1]:,} in XLMRobertaForMaskedLM')


def test_the_xlm_recipe_validates_with_fifteen_languages():
  config = valid_xlm()
  config_lib.validate(config)
  assert config.model.num_languages == 15 == len(config.data.languages.split(','))
  assert (config.model.num_layers, config.model.hidden_size, config.model.num_heads) == (
      12, 1024, 8)
  assert config.data.language_alpha == 0.5 and config.data.max_seq_length == 256

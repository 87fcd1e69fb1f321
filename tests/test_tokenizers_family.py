"""Byte-level BPE (RoBERTa's), SentencePiece (ALBERT's) and SentencePiece with fairseq's ids
(XLM-R's) beside WordPiece: the reference
libraries' ids on GLUE dev, the special ids in pretraining batches (in memory and prepared),
trained vocabs cached per kind, and clear refusals."""

import json
import os
import re
import subprocess
import sys
import unicodedata

from conftest import micro_config
from conftest import shared_data_dir
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.data import corpus
from bert_jax.data import pretraining
from bert_jax.data import records
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import glue
from bert_jax.tasks import ner
from bert_jax.tasks import squad

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ('bpe', 'sentencepiece', 'sentencepiece_fairseq')
# Where each kind keeps its vocab in a directory, and the piece that begins a word.
KEPT = {'bpe': ('vocab.json', 'merges.txt'), 'sentencepiece': ('spiece.model',),
        'sentencepiece_fairseq': ('sentencepiece.bpe.model',)}
WORD_START = {'bpe': 'Ġ', 'sentencepiece': '▁', 'sentencepiece_fairseq': '▁'}


def wiki():
  """38 Wikipedia articles of the shared corpus (7.8k sentences; read in a fraction of the time
  the built-in corpus takes)."""
  return str(shared_data_dir() / 'corpus' / 'enwiki-2015-wikiextractor' / 'wiki_00.txt.xz')


# A pretraining run's data: its first 12 articles (~2k sentences: seconds to train a vocab on).
RUN_DATA = {'data.max_documents': 12}


@pytest.fixture(scope='module', name='documents')
def fixture_documents():
  """The first 20 articles (~4k sentences)."""
  return corpus.read_corpus(wiki(), 'auto', 20)


@pytest.fixture(scope='module', name='trained')
def fixture_trained(tmp_path_factory, documents):
  """{kind: directory holding its 2000-entry vocab}: BPE cased (RoBERTa), SentencePiece
  lowercased (ALBERT), SentencePiece with fairseq's ids cased (XLM-R)."""
  out = {}
  for kind, lowercase in (('bpe', False), ('sentencepiece', True),
                          ('sentencepiece_fairseq', False)):
    directory = str(tmp_path_factory.mktemp(kind))
    tokenizer_lib.train(kind, documents, 2000, lowercase, directory)
    out[kind] = directory
  return out


def load(trained, kind):
  return tokenizer_lib.load_tokenizer(kind, tokenizer_lib.vocab_path(kind, trained[kind]),
                                      lowercase=kind == 'sentencepiece')


@pytest.fixture(scope='module', name='references')
def fixture_references(trained):
  """{kind: transformers' tokenizer of the same files} (5.x ignores vocab_file= and
  merges_file=: they would give a 5-token vocab)."""
  # pylint: disable=g-import-not-at-top
  from transformers import AlbertTokenizer
  from transformers import RobertaTokenizerFast
  from transformers import XLMRobertaTokenizer
  directory = trained['bpe']
  return {'bpe': RobertaTokenizerFast(vocab=os.path.join(directory, 'vocab.json'),
                                      merges=os.path.join(directory, 'merges.txt')),
          'sentencepiece': AlbertTokenizer.from_pretrained(trained['sentencepiece']),
          'sentencepiece_fairseq': XLMRobertaTokenizer.from_pretrained(
              trained['sentencepiece_fairseq'])}


@pytest.fixture(scope='module', name='glue_dev')
def fixture_glue_dev():
  """Every SST-2 dev sentence and MRPC dev pair, read as fine-tuning reads them."""
  folder = shared_data_dir() / 'glue'
  sst2 = glue.read_examples('sst2', str(folder / 'SST-2' / 'dev.tsv'))
  mrpc = glue.read_examples('mrpc', str(folder / 'MRPC' / 'dev.tsv'))
  assert len(sst2) == 872 and len(mrpc) == 408
  return sst2, mrpc


def laid_out(tokenizer, a, b=''):
  """The pretraining layout of text a (and b) with the tokenizer's special tokens."""
  ids_a, ids_b = tokenizer.encode_sentences([a, b])
  ids, _ = pretraining.assemble(pretraining.Instance(ids_a, ids_b, False), tokenizer.special)
  return ids.tolist()


@pytest.mark.parametrize('kind', KINDS)
def test_ids_equal_transformers_on_glue_dev_singles_and_pairs(trained, references, glue_dev,
                                                             kind):
  ours, theirs = load(trained, kind), references[kind]
  assert len(theirs) == ours.vocab_size  # The files were read, not a default vocab.
  sst2, mrpc = glue_dev
  singles = [e.text_a for e in sst2] + [e.text_a for e in mrpc] + [e.text_b for e in mrpc]
  assert [laid_out(ours, text) for text in singles] == [theirs(t)['input_ids'] for t in singles]
  pairs = [(e.text_a, e.text_b) for e in mrpc]
  assert ([laid_out(ours, a, b) for a, b in pairs]
          == [theirs(a, b)['input_ids'] for a, b in pairs])


@pytest.mark.parametrize('kind', KINDS)
def test_glue_rows_are_the_reference_ids_padded(trained, references, glue_dev, kind):
  ours, theirs = load(trained, kind), references[kind]
  sst2, mrpc = glue_dev
  length = 128
  for examples, labels in ((sst2, ('0', '1')), (mrpc, ('0', '1'))):
    features = glue.encode(examples, ours, length, labels).features
    for row, example in enumerate(examples):
      expected = theirs(example.text_a, example.text_b)['input_ids']
      if len(expected) > length:
        continue  # Truncation is BERT's (longest first), not transformers'.
      np.testing.assert_array_equal(features['input_ids'][row, :len(expected)], expected)
      assert (features['input_ids'][row, len(expected):] == ours.special.pad).all()
      assert features['input_mask'][row].sum() == len(expected)


def albert_prepared(text):
  """google-research/albert's preprocess_text with do_lower_case (its own code, restated)."""
  text = ' '.join(text.strip().split()).replace('``', '"').replace("''", '"')
  text = unicodedata.normalize('NFKD', text)
  return ''.join(c for c in text if not unicodedata.combining(c)).lower()


def test_sentencepiece_ids_equal_the_sentencepiece_processor(trained, glue_dev):
  import sentencepiece  # pylint: disable=g-import-not-at-top
  ours = load(trained, 'sentencepiece')
  processor = sentencepiece.SentencePieceProcessor(model_file=ours.vocab_file)
  sst2, mrpc = glue_dev
  texts = [e.text_a for e in sst2 + mrpc] + [e.text_b for e in mrpc]
  assert ([ids.tolist() for ids in ours.encode_sentences(texts)]
          == processor.encode([albert_prepared(t) for t in texts]))


def test_trained_sentencepiece_model_has_albert_special_pieces(trained):
  tokenizer = load(trained, 'sentencepiece')
  assert [tokenizer.id_to_token(i) for i in range(5)] == [
      '<pad>', '<unk>', '[CLS]', '[SEP]', '[MASK]']
  assert tokenizer.special == pretraining.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4,
                                                     draws_specials=False)


def test_trained_fairseq_model_has_xlmr_special_ids(trained):
  tokenizer = load(trained, 'sentencepiece_fairseq')
  assert tokenizer.vocab_size == 2000  # 1,998 pieces, <pad> and <mask>: XLM-R's 250,002 so.
  assert [tokenizer.id_to_token(i) for i in (0, 1, 2, 3, 1999)] == [
      '<s>', '<pad>', '</s>', '<unk>', '<mask>']
  assert tokenizer.special == pretraining.SpecialIds(
      pad=1, unk=3, cls=0, sep=2, mask=1999, separators=2, draws_specials=False, segment_b=False)
  import sentencepiece  # pylint: disable=g-import-not-at-top
  processor = sentencepiece.SentencePieceProcessor(model_file=tokenizer.vocab_file)
  assert [processor.id_to_piece(i) for i in range(3)] == ['<unk>', '<s>', '</s>']
  # Every other piece sits one id above the model's, as fairseq's dictionary puts it.
  assert all(tokenizer.id_to_token(i + 1) == processor.id_to_piece(i) for i in range(3, 1998))


def test_trained_bpe_vocab_has_roberta_special_tokens(trained):
  tokenizer = load(trained, 'bpe')
  special = tokenizer.special
  assert [tokenizer.id_to_token(i) for i in (special.cls, special.sep, special.mask,
                                             special.pad, special.unk)] == [
                                                 '<s>', '</s>', '<mask>', '<pad>', '<unk>']
  assert special.separators == 2 and not special.draws_specials


@pytest.mark.parametrize('kind', KINDS)
def test_offsets_span_the_original_text(trained, kind):
  tokenizer = load(trained, kind)
  text = "He said ``Héllo,  wörld'' -- it's 1,000 ﬁne."
  [(ids, spans)] = tokenizer.encode_with_offsets([text])
  np.testing.assert_array_equal(ids, tokenizer.encode_sentences([text])[0])
  assert (np.diff(spans[:, 0]) >= 0).all() and (spans[:, 1] >= spans[:, 0]).all()
  pieces = [text[start:end] for start, end in spans]
  assert 'said' in pieces and ',' in pieces and not any(p.startswith(' ') for p in pieces)


@pytest.mark.parametrize('kind', KINDS)
def test_squad_rows_find_the_answer_through_the_offsets(trained, kind):
  tokenizer = load(trained, kind)
  context = 'The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in France.'
  answer = 'Normandy'
  example = squad.Example('q1', 'To which region did the Normans give their name?', context,
                          [(answer, context.index(answer))], False, 0)
  split = squad.encode([example], tokenizer, max_seq_length=64, doc_stride=16, training=True)
  ids = split.features['input_ids'][0]
  question = tokenizer.encode_sentences([example.question])[0]
  separators = tokenizer.special.separators
  assert ids[0] == tokenizer.special.cls
  np.testing.assert_array_equal(ids[1:len(question) + 1], question)
  assert (ids[len(question) + 1:len(question) + 1 + separators] == tokenizer.special.sep).all()
  start, end = split.features['start_positions'][0], split.features['end_positions'][0]
  offsets = split.meta.offsets[0]
  assert context[offsets[start, 0]:offsets[end, 1]] == answer
  logits = np.full(ids.shape, -10.0, np.float32)
  start_logits, end_logits = logits.copy(), logits.copy()
  start_logits[start], end_logits[end] = 10.0, 10.0
  predictions, _, _ = squad.postprocess([example], split, start_logits[None], end_logits[None])
  assert predictions == {'q1': answer}


@pytest.mark.parametrize('kind', KINDS)
def test_ner_labels_sit_on_each_words_first_piece(trained, kind):
  tokenizer = load(trained, kind)
  sentence = ner.Sentence(['EU', 'rejects', 'German', 'call', 'to', 'boycott', 'lamb', '.'],
                          ['I-ORG', 'O', 'I-MISC', 'O', 'O', 'O', 'O', 'O'])
  split = ner.encode([sentence], tokenizer, max_seq_length=32)
  ids, weights = split.features['input_ids'][0], split.features['label_weights'][0]
  length = split.features['input_mask'][0].sum()
  assert ids[0] == tokenizer.special.cls and ids[length - 1] == tokenizer.special.sep
  assert (ids[length:] == tokenizer.special.pad).all()
  first_pieces = [tokenizer.id_to_token(i) for i in ids[weights > 0]]
  assert len(first_pieces) == len(sentence.words)
  assert all(piece.startswith(WORD_START[kind]) for piece in first_pieces)


def check_batch(batch, special):
  """Row layout and masking of one pretraining batch, against the tokenizer's special ids."""
  ids, mask, segments = batch['input_ids'], batch['input_mask'], batch['segment_ids']
  assert (ids[:, 0] == special.cls).all()
  assert (ids[mask == 0] == special.pad).all()
  for row in range(len(ids)):
    length, first = int(mask[row].sum()), int((segments[row][mask[row] > 0] == 0).sum())
    # Separators are never chosen for prediction, and no random replacement draws one.
    expected = [first - 1] + [first] * (special.separators - 1) + [length - 1]
    if first == length:  # A single segment.
      expected = [length - 1]
    assert np.flatnonzero(ids[row, :length] == special.sep).tolist() == expected
  weights = batch['masked_lm_weights'] > 0
  shown = np.take_along_axis(ids, batch['masked_lm_positions'], 1)[weights]
  labels = batch['masked_lm_ids'][weights]
  assert (shown == special.mask).mean() > 0.5
  replaced = shown[(shown != special.mask) & (shown != labels)]
  assert not np.isin(replaced, special.ids()).any()
  assert not np.isin(labels, [special.cls, special.sep, special.pad]).any()


@pytest.mark.parametrize('kind', KINDS)
def test_in_memory_batches_carry_the_tokenizers_special_ids(tmp_path, kind):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = micro_config(tmp_path, **RUN_DATA, **{'data.tokenizer': kind, 'data.corpus': wiki()})
  stream, held_out, tokenizer = pretrain.prepare_data(config, str(tmp_path / 'run'))
  assert tokenizer.kind == kind and tokenizer.vocab_size <= 1024
  epoch = stream.epoch_examples(0)  # Every row: most fill their 32 tokens, a few are padded.
  assert (epoch['input_mask'] == 0).any()
  check_batch(epoch, tokenizer.special)
  check_batch(held_out[0], tokenizer.special)


def prepare_command(output, cache, kind):
  return [sys.executable, '-m', 'bert_jax.data.prepare', '--config=configs/tiny.py',
          f'--output={output}', '--workers=1', f'--config.data.tokenizer={kind}',
          f'--config.data.corpus={wiki()}', '--config.data.tokenizer_vocab_size=1024',
          f'--config.data.max_documents={RUN_DATA["data.max_documents"]}',
          f'--config.data.tokenizer_cache_dir={cache}']


class _Prepared(dict):
  """{kind: a directory prepared by `python -m bert_jax.data.prepare` from wiki()}, each prepared
  when a test first asks for it."""

  def __init__(self, tmp_path_factory):
    super().__init__()
    self._tmp = tmp_path_factory

  def __missing__(self, kind):
    output = self._tmp.mktemp(f'prepared-{kind}')
    result = subprocess.run(prepare_command(output, output.parent / 'cache', kind), cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    self[kind] = str(output)
    return self[kind]


@pytest.fixture(scope='module', name='prepared')
def fixture_prepared(tmp_path_factory):
  return _Prepared(tmp_path_factory)


def prepared_config(tmp_path, directory, kind):
  return micro_config(tmp_path, **{'data.tokenizer': kind, 'data.corpus': '',
                                   'data.prepared': directory, 'data.max_documents': 0})


@pytest.mark.parametrize('kind', ['bpe', 'sentencepiece', pytest.param(
    'sentencepiece_fairseq', marks=pytest.mark.slow)])  # Its streaming is the sweep test's too.
def test_prepared_corpus_records_its_tokenizer_and_streams_its_special_ids(
    tmp_path, prepared, kind):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  metadata = records.read_metadata(prepared[kind])
  assert metadata.tokenizer == kind
  assert all(os.path.isfile(os.path.join(prepared[kind], name)) for name in KEPT[kind])
  stream, held_out, tokenizer = pretrain.prepare_streaming(
      prepared_config(tmp_path, prepared[kind], kind))
  assert metadata.vocab_sha256 == tokenizer.vocab_hash()
  batch, _ = next(stream.batches({'epoch': 0, 'batch': 0}))
  check_batch(batch, tokenizer.special)
  check_batch(held_out[0], tokenizer.special)


@pytest.mark.parametrize('kind,other', [('bpe', 'wordpiece'), ('sentencepiece', 'bpe')])
def test_a_prepared_corpus_of_another_tokenizer_is_refused(tmp_path, prepared, kind, other):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  directory = prepared[kind]
  message = (re.escape(f'config.data.prepared={directory!r} was tokenised with data.tokenizer='
                       f'{kind!r}, but config.data.tokenizer={other!r}'))
  with pytest.raises(config_lib.ConfigError, match=message):
    pretrain.prepare_streaming(prepared_config(tmp_path, directory, other))


def test_preparing_into_a_directory_of_another_tokenizer_is_refused(prepared):
  directory = prepared['bpe']
  result = subprocess.run(prepare_command(directory, directory + '-cache', 'sentencepiece'),
                          cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode != 0
  assert "data.tokenizer 'bpe'; this run has 'sentencepiece'" in result.stderr


def test_a_trained_vocab_is_reused_and_kept_apart_per_kind(tmp_path, documents):
  cache = tmp_path / 'cache'
  few = documents[:3]
  first = tokenizer_lib.load_or_train_tokenizer('', few, 600, True, str(tmp_path / 'run1'),
                                                str(cache), 'bpe')
  [shared] = cache.rglob('vocab.json')
  mtime = shared.stat().st_mtime_ns
  second = tokenizer_lib.load_or_train_tokenizer('', few, 600, True, str(tmp_path / 'run2'),
                                                 str(cache), 'bpe')
  assert shared.stat().st_mtime_ns == mtime  # Not trained again.
  assert second.vocab_hash() == first.vocab_hash()
  assert second.vocab_file == str(tmp_path / 'run2' / 'vocab.json')
  assert (tmp_path / 'run2' / 'merges.txt').is_file()
  other = tokenizer_lib.load_or_train_tokenizer('', few, 600, True, str(tmp_path / 'run3'),
                                                str(cache), 'sentencepiece')
  assert other.kind == 'sentencepiece' and other.vocab_file == str(tmp_path / 'run3' /
                                                                   'spiece.model')
  assert len(list(cache.rglob('spiece.model'))) == 1
  assert len({p.parent for p in cache.rglob('*.*')}) == 2  # One key per kind.
  keys = {kind: tokenizer_lib.corpus_fingerprint(few, 600, True, kind)
          for kind in tokenizer_lib.KINDS}
  assert len(set(keys.values())) == len(tokenizer_lib.KINDS)
  assert keys['bpe'] != tokenizer_lib.corpus_fingerprint(few, 600, False, 'bpe')


def test_a_second_run_loads_the_cached_vocab(tmp_path):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = micro_config(tmp_path, **RUN_DATA,
                        **{'data.tokenizer': 'sentencepiece', 'data.corpus': wiki()})
  _, _, first = pretrain.prepare_data(config, str(tmp_path / 'run1'))
  [shared] = (tmp_path / 'vocab-cache').rglob('spiece.model')
  mtime = shared.stat().st_mtime_ns
  _, _, second = pretrain.prepare_data(config, str(tmp_path / 'run2'))
  assert shared.stat().st_mtime_ns == mtime and second.vocab_hash() == first.vocab_hash()


@pytest.mark.parametrize('kind,name,message', [
    ('bpe', 'vocab.txt', r'is neither a directory nor a \.json file: byte-level BPE reads a '
                         r'vocab\.json and a merges\.txt'),
    ('bpe', 'lonely/vocab.json', r'merges\.txt not found'),
    ('sentencepiece', 'vocab.txt', r'is not a SentencePiece model'),
    ('sentencepiece', 'missing.model', r'is not a file: SentencePiece reads a \.model'),
])
def test_a_bad_vocab_file_is_refused_naming_it(tmp_path, kind, name, message):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  (tmp_path / 'vocab.txt').write_text('[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n', encoding='utf-8')
  (tmp_path / 'lonely').mkdir()
  (tmp_path / 'lonely' / 'vocab.json').write_text(json.dumps({'<s>': 0}), encoding='utf-8')
  path = str(tmp_path / name)
  config = micro_config(tmp_path, **RUN_DATA, **{'data.tokenizer': kind, 'data.vocab_file': path,
                                                 'data.corpus': wiki()})
  with pytest.raises(config_lib.ConfigError, match=re.escape(repr(path)) + '.*' + message):
    pretrain.prepare_data(config, str(tmp_path / 'run'))


def test_wordpiece_refuses_a_sentencepiece_model(trained):
  path = tokenizer_lib.vocab_path('sentencepiece', trained['sentencepiece'])
  with pytest.raises(ValueError, match=re.escape(repr(path)) + r".*'sentencepiece'"):
    tokenizer_lib.load_tokenizer('wordpiece', path, lowercase=True)


@pytest.mark.parametrize('kind,other,message', [
    ('sentencepiece', 'sentencepiece_fairseq', r"ALBERT's \[CLS\]: use config\.data\.tokenizer="
                                               r"'sentencepiece'"),
    ('sentencepiece_fairseq', 'sentencepiece', r"fairseq's <s> and </s> .*: use config\.data\."
                                               r"tokenizer='sentencepiece_fairseq'"),
])
def test_a_sentencepiece_model_of_the_other_layout_is_refused(trained, kind, other, message):
  path = tokenizer_lib.vocab_path(kind, trained[kind])
  with pytest.raises(ValueError, match=re.escape(repr(path)) + '.*' + message):
    tokenizer_lib.load_tokenizer(other, path, lowercase=kind == 'sentencepiece')


def test_an_uncased_model_is_refused_without_lowercasing(trained):
  path = tokenizer_lib.vocab_path('sentencepiece', trained['sentencepiece'])
  with pytest.raises(ValueError, match=re.escape(repr(path)) + r'.*no piece with a capital.*'
                     r'config\.data\.lowercase=True'):
    tokenizer_lib.load_tokenizer('sentencepiece', path, lowercase=False)


def test_random_replacements_never_draw_a_special_id():
  from bert_jax.data import masking  # pylint: disable=g-import-not-at-top
  special = pretraining.SpecialIds(pad=1, unk=3, cls=0, sep=2, mask=49, draws_specials=False)
  drawn = masking.random_tokens(np.random.default_rng(0), (20000,), special, 50)
  assert set(drawn.tolist()) == set(range(50)) - {0, 1, 2, 3, 49}


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_pretraining_runs_in_memory_and_on_the_prepared_corpus(tmp_path, prepared, kind):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  short = {'train.num_steps': 4, 'train.warmup_steps': 2, 'train.log_every': 2,
           'train.eval_every': 4, 'train.checkpoint_every': 4}
  memory = micro_config(tmp_path, **RUN_DATA, **short,
                        **{'data.tokenizer': kind, 'data.corpus': wiki()})
  on_disk = prepared_config(tmp_path, prepared[kind], kind)
  on_disk.train.update({key.split('.')[1]: value for key, value in short.items()})
  for name, config in (('memory', memory), ('prepared', on_disk)):
    workdir = tmp_path / name
    result = pretrain.train_and_evaluate(config, str(workdir))
    assert np.isfinite(result['mlm_loss'])
    assert all((workdir / file).is_file() for file in KEPT[kind])

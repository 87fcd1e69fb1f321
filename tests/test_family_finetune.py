"""Fine-tuning from RoBERTa (byte-level BPE) and ALBERT (SentencePiece) sources: the tokenizer
taken from the source, rows equal to transformers' fast tokenizers, classification and
multiple-choice logits equal to transformers' <family>ForSequenceClassification and
<family>ForMultipleChoice, and runs (GLUE, SWAG) from hf:DIR and from a workdir."""

import json
import os
import shutil

import hf_parity
from conftest import micro_config, require
from conftest import shared_data_dir
from conftest import write_swag
import jax
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import sharding
from bert_jax.data import corpus
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import glue
from bert_jax.tasks import ner
from bert_jax.tasks import squad
from bert_jax.tasks import swag
from bert_jax.train import finetune
from configs import glue as glue_config
from configs import swag as swag_config


torch = require('torch')
transformers = require('transformers')

KINDS = ('bpe', 'sentencepiece')
FAMILY = {'bpe': 'roberta', 'sentencepiece': 'albert'}
LOWERCASE = {'bpe': False, 'sentencepiece': True}  # RoBERTa cased, ALBERT lowercased.
SEQ = 128
# Odd sizes, none of the other tests': a transposed or mis-split axis cannot line up.
SIZES = dict(num_hidden_layers=2, hidden_size=40, num_attention_heads=5, intermediate_size=72,
             num_labels=2)
TOLERANCE = 1e-4


def wiki():
  return str(shared_data_dir() / 'corpus' / 'enwiki-2015-wikiextractor' / 'wiki_00.txt.xz')


@pytest.fixture(scope='module', name='trained')
def fixture_trained(tmp_path_factory):
  """{kind: a directory holding a small vocab of that kind trained on 8 Wikipedia articles}."""
  documents = corpus.read_corpus(wiki(), 'auto', 8)
  out = {}
  for kind in KINDS:
    directory = str(tmp_path_factory.mktemp(f'vocab-{kind}'))
    tokenizer_lib.train(kind, documents, 400, LOWERCASE[kind], directory)
    out[kind] = directory
  return out


def reference_tokenizer(kind, directory, **kwargs):
  """transformers' fast tokenizer of the same files (5.x reads vocab= and merges=, not
  vocab_file=; ALBERT's from the directory's spiece.model)."""
  if kind == 'bpe':
    return transformers.RobertaTokenizerFast(vocab=os.path.join(directory, 'vocab.json'),
                                             merges=os.path.join(directory, 'merges.txt'),
                                             **kwargs)
  return transformers.AlbertTokenizerFast.from_pretrained(directory, **kwargs)


def hf_head_model(kind, vocab_size, head='ForSequenceClassification'):
  """A random transformers <family><head> (RoBERTa's for 'bpe', ALBERT's else) of SIZES."""
  sizes = SIZES if head == 'ForSequenceClassification' else {
      k: v for k, v in SIZES.items() if k != 'num_labels'}
  if kind == 'bpe':
    config = transformers.RobertaConfig(**sizes, vocab_size=vocab_size, type_vocab_size=1,
                                        max_position_embeddings=SEQ + 2, layer_norm_eps=1e-5,
                                        pad_token_id=1)
    return hf_parity.randomise(getattr(transformers, 'Roberta' + head)(config), scale=0.1)
  config = transformers.AlbertConfig(**sizes, vocab_size=vocab_size, embedding_size=24,
                                     max_position_embeddings=SEQ, pad_token_id=0)
  return hf_parity.randomise(getattr(transformers, 'Albert' + head)(config), scale=0.1)


@pytest.fixture(scope='module', name='hf_dirs')
def fixture_hf_dirs(tmp_path_factory, trained):
  """{kind: (the random classifier, its saved directory with the vocab files beside it)}."""
  out = {}
  for kind in KINDS:
    tokenizer = tokenizer_lib.load_tokenizer(
        kind, tokenizer_lib.vocab_path(kind, trained[kind]), LOWERCASE[kind])
    model = hf_head_model(kind, tokenizer.vocab_size)
    directory = str(tmp_path_factory.mktemp(f'hf-{kind}'))
    model.save_pretrained(directory)
    for name in tokenizer_lib.KEPT_FILES[kind]:
      shutil.copyfile(os.path.join(trained[kind], name), os.path.join(directory, name))
    out[kind] = (model, directory)
  return out


@pytest.fixture(scope='module', name='glue_dev')
def fixture_glue_dev():
  """SST-2's dev sentences and MRPC's dev pairs."""
  folder = shared_data_dir() / 'glue'
  return {'sst2': glue.read_examples('sst2', str(folder / 'SST-2' / 'dev.tsv')),
          'mrpc': glue.read_examples('mrpc', str(folder / 'MRPC' / 'dev.tsv'))}


def adopted_config(init, task='mrpc', **data):
  """configs/glue.py from `init`, validated and with the source adopted, as finetune.run does."""
  config = glue_config.get_config(f'task={task},init={init}')
  config.data.max_seq_length = SEQ
  config.data.update(data)
  config_lib.validate_and_adopt_source(config, config_lib.validate_finetune)
  return config


@pytest.mark.parametrize('kind', KINDS)
def test_an_hf_source_brings_its_tokenizer_kind_casing_and_vocab(hf_dirs, kind):
  _, directory = hf_dirs[kind]
  config = adopted_config(f'hf:{directory}', lowercase=not LOWERCASE[kind])
  assert config.data.tokenizer == kind
  assert config.data.lowercase == LOWERCASE[kind]
  assert config.data.vocab_file == tokenizer_lib.vocab_path(kind, directory)
  assert config.model.name == FAMILY[kind]
  assert config.model.gelu == ('tanh' if kind == 'sentencepiece' else 'erf')  # hidden_act.
  assert finetune.load_tokenizer(config).kind == kind


@pytest.mark.parametrize('kind,other', [('bpe', 'wordpiece'), ('sentencepiece', 'bpe')])
def test_a_tokenizer_that_disagrees_with_the_source_is_refused_before_compiling(
    hf_dirs, kind, other, tmp_path, monkeypatch):
  _, directory = hf_dirs[kind]
  config = glue_config.get_config(f'task=sst2,init=hf:{directory}')
  config.data.tokenizer = other
  monkeypatch.setattr(jax, 'jit', None)  # Nothing may compile before the error.
  with pytest.raises(config_lib.ConfigError,
                     match=f"data.tokenizer='{other}'.*trained with '{kind}'.*model_type="
                           f"'{FAMILY[kind]}'"):
    finetune.run(config, str(tmp_path / 'run'))


def test_an_unknown_tokenizer_kind_is_refused_naming_the_valid_ones():
  config = glue_config.get_config('task=sst2')
  config.data.tokenizer = 'unigram'
  with pytest.raises(config_lib.ConfigError, match="data.tokenizer='unigram'.*'bpe'"):
    config_lib.validate_finetune(config)


@pytest.mark.parametrize('kind', KINDS)
def test_glue_rows_equal_transformers_fast_tokenizer(hf_dirs, glue_dev, kind):
  _, directory = hf_dirs[kind]
  tokenizer = finetune.load_tokenizer(adopted_config(f'hf:{directory}'))
  reference = reference_tokenizer(kind, directory)
  assert len(reference) == tokenizer.vocab_size  # The files were read, not a default vocab.
  compared = 0
  for task, examples in glue_dev.items():
    features = glue.encode(examples, tokenizer, SEQ, ('0', '1')).features
    for row, example in enumerate(examples):
      expected = reference(example.text_a, example.text_b, padding='max_length',
                           max_length=SEQ, return_token_type_ids=True)
      if len(expected['input_ids']) > SEQ:
        continue  # Truncation is BERT's (longest first), not transformers'.
      for ours, theirs in (('input_ids', 'input_ids'), ('segment_ids', 'token_type_ids'),
                           ('input_mask', 'attention_mask')):
        assert features[ours][row].tolist() == expected[theirs], (task, row, ours)
      compared += 1
  assert compared > 0.75 * sum(len(e) for e in glue_dev.values())  # A 400-piece vocab: long rows.


def test_bpe_squad_offsets_equal_transformers_and_answers_map_back(trained):
  tokenizer = tokenizer_lib.load_tokenizer('bpe', trained['bpe'], False)
  reference = reference_tokenizer('bpe', trained['bpe'])
  examples, _ = squad.read_squad(str(shared_data_dir() / 'squad' / 'dev-v1.1.json'))
  examples = examples[:300]
  contexts = list(dict.fromkeys(e.context for e in examples))
  for context, (ids, spans) in zip(contexts, tokenizer.encode_with_offsets(contexts)):
    expected = reference(context, add_special_tokens=False, return_offsets_mapping=True)
    assert ids.tolist() == expected['input_ids']
    assert [tuple(s) for s in spans.tolist()] == expected['offset_mapping']
  split = squad.encode(examples, tokenizer, max_seq_length=256, doc_stride=128, training=True)
  found = 0
  for row in range(split.num_rows):
    start, end = split.features['start_positions'][row], split.features['end_positions'][row]
    if start == 0:
      continue  # The answer lies outside this window.
    example = examples[split.meta.example_index[row]]
    offsets = split.meta.offsets[row]
    text = example.context[offsets[start, 0]:offsets[end, 1]]
    answer = example.answers[0][0]
    # A leading-space piece spans its word without the space; an answer ending inside a
    # piece ("1970s'" of "1970s") takes the whole piece, as the original's whitespace tokens.
    assert answer.strip() in text and not text.startswith(' '), (text, answer)
    found += text == answer.strip()
  assert found > 0.9 * split.num_rows * (split.features['start_positions'] > 0).mean()


def test_bpe_ner_labels_one_piece_per_word_as_transformers_word_ids(trained):
  tokenizer = tokenizer_lib.load_tokenizer('bpe', trained['bpe'], False)
  reference = reference_tokenizer('bpe', trained['bpe'], add_prefix_space=True)
  sentences = ner.read_conll(str(shared_data_dir() / 'conll2003' / 'eng.testa'))[:300]
  split = ner.encode(sentences, tokenizer, max_seq_length=SEQ)
  rows = 0
  for row, index in enumerate(split.meta.row_sentence):
    sentence = sentences[index]
    expected = reference(sentence.words, is_split_into_words=True)
    if len(expected['input_ids']) > SEQ:
      continue  # Cut into several rows.
    length = int(split.features['input_mask'][row].sum())
    assert split.features['input_ids'][row, :length].tolist() == expected['input_ids']
    words = expected.word_ids()
    first = [i for i, w in enumerate(words) if w is not None and (i == 0 or words[i - 1] != w)]
    labelled = np.flatnonzero(split.features['label_weights'][row]).tolist()
    assert labelled == first and len(labelled) == len(sentence.words)
    rows += 1
  assert rows > 250


def fine_tuning_logits(config, split, head='classification', num_outputs=2):
  """The logits of the fine-tuning model as finetune.run builds and loads it."""
  task = type('Task', (), {'head': head, 'num_outputs': num_outputs})()
  model = finetune.build_model(config, task)
  encoder, heads = finetune.load_source_params(config, model)
  assert set(heads) == {'classifier'}  # The checkpoint's head, not a fresh one.
  mesh = sharding.create_mesh(config.mesh)
  rules = sharding.logical_axis_rules(config.mesh.preset)
  tx, _ = finetune.create_optimizer(config.train, 10, False)
  runner = finetune.SeedRun(config, task, model, tx, mesh, rules, encoder, heads)
  with sharding.activation_rules(mesh, rules):  # As finetune.run.
    state = runner.fresh_state(config.seed)
    return runner.predict(state.params, split, 16)['logits']


@pytest.mark.parametrize('kind', KINDS)
def test_classification_logits_equal_transformers(hf_dirs, glue_dev, kind):
  hf_model, directory = hf_dirs[kind]
  config = adopted_config(f'hf:{directory}')
  tokenizer = finetune.load_tokenizer(config)
  examples = glue_dev['mrpc'][:48] + glue_dev['sst2'][:16]  # Pairs and single sentences.
  split = glue.encode(examples, tokenizer, SEQ, ('0', '1'))
  ours = fine_tuning_logits(config, split)
  f = {k: torch.from_numpy(v.astype(np.int64)) for k, v in split.features.items()
       if k != 'label'}
  with torch.no_grad():
    theirs = hf_model(input_ids=f['input_ids'], attention_mask=f['input_mask'],
                      token_type_ids=f['segment_ids']).logits.numpy()
  difference = float(np.max(np.abs(ours - theirs)))
  print(f'{FAMILY[kind]} classification logits, max |ours - transformers|: {difference:.2e}')
  assert difference < TOLERANCE
  assert np.std(theirs) > 1e-2  # Logits that differ between rows: a real comparison.


@pytest.mark.parametrize('kind', KINDS)
def test_multiple_choice_logits_equal_transformers(tmp_path, trained, kind):
  tokenizer = tokenizer_lib.load_tokenizer(
      kind, tokenizer_lib.vocab_path(kind, trained[kind]), LOWERCASE[kind])
  hf_model = hf_head_model(kind, tokenizer.vocab_size, 'ForMultipleChoice')
  directory = str(tmp_path / 'hf')
  hf_model.save_pretrained(directory)
  for name in tokenizer_lib.KEPT_FILES[kind]:
    shutil.copyfile(os.path.join(trained[kind], name), os.path.join(directory, name))
  data = write_swag(tmp_path / 'swag')
  config = swag_config.get_config(f'init=hf:{directory},data_dir={data},seq=32')
  config_lib.validate_and_adopt_source(config, config_lib.validate_finetune)
  split = swag.encode(swag.read_examples(os.path.join(data, 'val.csv')),
                      finetune.load_tokenizer(config), 32)  # 7 questions of 4 rows.
  ours = fine_tuning_logits(config, split, 'multiple_choice', swag.CHOICES)
  theirs = hf_parity.hf_outputs(hf_model, hf_parity.features(split)).logits.numpy()
  assert ours.shape == theirs.shape == (7, swag.CHOICES)
  difference = float(np.max(np.abs(ours - theirs)))
  print(f'{FAMILY[kind]} multiple-choice logits, max |ours - transformers|: {difference:.2e}')
  assert difference < TOLERANCE
  assert np.std(theirs) > 10 * TOLERANCE  # Scores that differ between choices: a real comparison.


@pytest.mark.parametrize('kind', KINDS)
def test_a_head_that_does_not_fit_the_task_starts_fresh(hf_dirs, kind):
  _, directory = hf_dirs[kind]
  config = adopted_config(f'hf:{directory}', max_seq_length=16)
  task = type('Task', (), {'head': 'classification', 'num_outputs': 3})()
  model = finetune.build_model(config, task)
  encoder, heads = finetune.load_source_params(config, model)
  assert heads == {} and 'pooler' in encoder


def sst2_subset(tmp_path, rows=96):
  """A GLUE SST-2 folder of the shared train file's first `rows` lines and the dev file's."""
  source = shared_data_dir() / 'glue' / 'SST-2'
  folder = tmp_path / 'SST-2'
  folder.mkdir()
  for name, count in (('train.tsv', rows), ('dev.tsv', rows // 2)):
    with open(source / name, encoding='utf-8') as f:
      lines = [next(f) for _ in range(count + 1)]
    (folder / name).write_text(''.join(lines), encoding='utf-8')
  return str(folder)


def run_sst2(tmp_path, init, **data):
  config = glue_config.get_config(f'task=sst2,init={init},batch=16,epochs=1,seq=32')
  config.task.data_dir = sst2_subset(tmp_path)
  config.data.update(data)
  workdir = tmp_path / 'run'
  results = finetune.run(config, str(workdir))
  with open(workdir / 'config.json', encoding='utf-8') as f:
    return results, json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_fine_tuning_runs_from_an_hf_dir(tmp_path, hf_dirs, kind):
  _, directory = hf_dirs[kind]
  results, saved = run_sst2(tmp_path, f'hf:{directory}')
  assert saved['data']['tokenizer'] == kind and saved['model']['name'] == FAMILY[kind]
  assert 0.0 <= results['median']['dev']['accuracy'] <= 100.0 and results['num_steps'] == 6


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_swag_fine_tunes_from_an_hf_dir(tmp_path, hf_dirs, kind):
  _, directory = hf_dirs[kind]
  data = write_swag(tmp_path / 'swag', train=12, dev=7)
  config = swag_config.get_config(f'init=hf:{directory},data_dir={data},batch=4,epochs=1,seq=32')
  results = finetune.run(config, str(tmp_path / 'run'))
  with open(tmp_path / 'run' / 'config.json', encoding='utf-8') as f:
    saved = json.load(f)
  assert saved['data']['tokenizer'] == kind and saved['model']['name'] == FAMILY[kind]
  assert (results['task'], results['num_steps']) == ('swag', 3)
  # 7 questions: the accuracy is a count of right answers in sevenths.
  assert round(results['median']['dev']['accuracy'] * 7 / 100, 6).is_integer()


def pretraining_config(tmp_path, kind, steps):
  """A micro MLM pretraining run of the kind's family on the wiki sample, with its own
  tokenizer, a log line a step or two and one evaluation and checkpoint at its end."""
  config = micro_config(tmp_path, **{
      'model.name': FAMILY[kind], 'data.tokenizer': kind, 'data.lowercase': LOWERCASE[kind],
      'data.corpus': wiki(), 'data.max_documents': 12, 'objectives': 'mlm',
      'model.type_vocab_size': 1 if kind == 'bpe' else 2,
      'model.max_position_embeddings': 34 if kind == 'bpe' else 32,
      'train.num_steps': steps, 'train.warmup_steps': 1, 'train.log_every': steps // 2,
      'train.eval_every': steps, 'train.checkpoint_every': steps})
  if kind == 'sentencepiece':
    config.model.embedding_size = 16
  return config


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_fine_tuning_runs_from_a_pretraining_workdir(tmp_path, kind):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  pretraining = pretraining_config(tmp_path, kind, 2)
  source = tmp_path / 'pretrain'
  pretrain.train_and_evaluate(pretraining, str(source))
  results, saved = run_sst2(tmp_path, str(source))
  assert saved['data']['tokenizer'] == kind and saved['data']['lowercase'] == LOWERCASE[kind]
  assert saved['data']['vocab_file'] == tokenizer_lib.vocab_path(kind, str(source))
  assert np.isfinite(results['median']['dev']['accuracy'])

"""predict and convert export with RoBERTa (byte-level BPE) and ALBERT (SentencePiece) vocabs:
fill-mask equal to transformers' pipeline, exported tokenizer files that AutoTokenizer loads and
encodes with as ours."""

import os
import shutil

from conftest import require
import numpy as np
import pytest

from bert_jax import predict
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import hf
from bert_jax.tools import convert
from bert_jax.tools import predict as predict_lib
# The shared vocabs (module-scoped fixtures) and reference tokenizers of the fine-tuning tests.
from test_family_finetune import FAMILY, KINDS, LOWERCASE, fixture_glue_dev, fixture_trained  # pylint: disable=unused-import
from test_family_finetune import pretraining_config, reference_tokenizer, wiki

torch = require('torch')
transformers = require('transformers')

MASK = {'bpe': '<mask>', 'sentencepiece': '[MASK]'}
# Odd sizes, none of the other tests'.
SIZES = dict(num_hidden_layers=2, hidden_size=40, num_attention_heads=5, intermediate_size=72)
TOLERANCE = 1e-4


def mask_reference(kind, directory):
  """reference_tokenizer, its <mask> taking the spaces before it as roberta-base's tokenizer.json
  has it (transformers 5 builds RobertaTokenizer from vocab.json + merges.txt without lstrip)."""
  if kind == 'bpe':
    return reference_tokenizer(kind, directory, mask_token=transformers.AddedToken(
        '<mask>', lstrip=True, rstrip=False))
  return reference_tokenizer(kind, directory)


def sentences(kind):
  """Masks at the start, mid-sentence after a space, before punctuation, several in a row."""
  mask = MASK[kind]
  return [f'The city is on the {mask}.', f'{mask} was born in the north of the country',
          f'In 1900 the {mask} {mask} of the river, and it {mask} .']


def save_masked_lm(kind, vocab_size, directory):
  """A random transformers RobertaForMaskedLM / AlbertForMaskedLM (scale 0.5: peaked
  distributions, whose top-k order float error cannot change)."""
  if kind == 'bpe':
    config = transformers.RobertaConfig(**SIZES, vocab_size=vocab_size, type_vocab_size=1,
                                        max_position_embeddings=66, layer_norm_eps=1e-5,
                                        pad_token_id=1)
    model = transformers.RobertaForMaskedLM(config)
  else:
    config = transformers.AlbertConfig(**SIZES, vocab_size=vocab_size, embedding_size=24,
                                       max_position_embeddings=64)
    model = transformers.AlbertForMaskedLM(config)
  torch.manual_seed(0)
  with torch.no_grad():
    for name, param in model.named_parameters():
      norm = 'LayerNorm.weight' in name or 'layer_norm.weight' in name
      param.copy_(torch.randn_like(param) * 0.5 + (1.0 if norm else 0.0))
  model.eval().save_pretrained(directory)
  return model


@pytest.fixture(scope='module', name='masked_lms')
def fixture_masked_lms(tmp_path_factory, trained):
  """{kind: the directory of a random masked LM with its vocab files}."""
  out = {}
  for kind in KINDS:
    directory = str(tmp_path_factory.mktemp(f'mlm-{kind}'))
    tokenizer = tokenizer_lib.load_tokenizer(kind, tokenizer_lib.vocab_path(kind, trained[kind]),
                                             LOWERCASE[kind])
    save_masked_lm(kind, tokenizer.vocab_size, directory)
    for name in tokenizer_lib.KEPT_FILES[kind]:
      shutil.copyfile(os.path.join(trained[kind], name), os.path.join(directory, name))
    out[kind] = directory
  return out


@pytest.mark.parametrize('kind', KINDS)
def test_text_with_mask_tokens_encodes_as_transformers(masked_lms, kind):
  predictor = predict.load(f'hf:{masked_lms[kind]}')
  reference = mask_reference(kind, masked_lms[kind])
  for text in sentences(kind):
    assert (predict_lib.encode(predictor.tokenizer, text).tolist()
            == reference(text, add_special_tokens=False)['input_ids']), text


@pytest.mark.parametrize('kind', KINDS)
def test_fill_mask_equals_transformers_pipeline(masked_lms, kind):
  directory = masked_lms[kind]
  predictor = predict.load(f'hf:{directory}')
  assert predictor.tokenizer.kind == kind and predictor.config.model.name == FAMILY[kind]
  pipeline = transformers.pipeline('fill-mask', model=directory,
                                   tokenizer=mask_reference(kind, directory), device='cpu')
  ids = {predictor.tokenizer.id_to_token(i): i for i in range(predictor.tokenizer.vocab_size)}
  difference = 0.0
  for text, ours in zip(sentences(kind), predictor.fill_masks(sentences(kind), top_k=5)):
    theirs = pipeline(text, top_k=5)
    theirs = [theirs] if isinstance(theirs[0], dict) else theirs  # One mask: a flat list.
    assert len(ours) == len(theirs) == text.count(MASK[kind])
    for our_mask, their_mask in zip(ours, theirs):
      assert [ids[token] for token, _ in our_mask] == [t['token'] for t in their_mask], text
      difference = max(difference, *(abs(p - t['score'])
                                     for (_, p), t in zip(our_mask, their_mask)))
  print(f'{FAMILY[kind]} fill-mask top-5 probabilities, max |ours - pipeline|: {difference:.2e}')
  assert difference < TOLERANCE


def test_another_familys_mask_token_is_refused_naming_the_models(masked_lms):
  predictor = predict.load(f'hf:{masked_lms["bpe"]}')
  with pytest.raises(predict.PredictError,
                     match=r"has no <mask> to fill \(\[MASK\] is another family's mask token; "
                           r"this model's is <mask>\)"):
    predictor.fill_mask('the [MASK] .')


def test_an_hf_dir_without_its_vocab_files_is_refused_naming_them(masked_lms, tmp_path):
  directory = tmp_path / 'no-merges'
  shutil.copytree(masked_lms['bpe'], directory)
  os.unlink(directory / 'merges.txt')
  with pytest.raises(predict.PredictError, match='lacks vocab.json \\+ merges.txt'):
    predict.load(f'hf:{directory}')


@pytest.mark.parametrize('kind,lowercase', [('bpe', False), ('bpe', True),
                                            ('sentencepiece', True), ('sentencepiece', False),
                                            ('sentencepiece_fairseq', False)])
def test_exported_tokenizer_loads_in_auto_tokenizer_and_encodes_as_ours(
    tmp_path, glue_dev, kind, lowercase):
  from bert_jax.data import corpus  # pylint: disable=g-import-not-at-top
  tokenizer = tokenizer_lib.train(kind, corpus.read_corpus(wiki(), 'auto', 4), 500, lowercase,
                                  str(tmp_path / 'vocab'))
  out = str(tmp_path / 'export')
  hf.export_tokenizer(tokenizer.vocab_file, lowercase, out, 130, kind)
  assert set(tokenizer_lib.KEPT_FILES[kind]) <= set(os.listdir(out))
  reference = transformers.AutoTokenizer.from_pretrained(out)
  mrpc = glue_dev['mrpc'][:100]
  texts = [e.text_a for e in glue_dev['sst2'][:100]] + ["Héllo ``Wörld'' — ﬁne CAFÉ"]
  assert ([ids.tolist() for ids in tokenizer.encode_sentences(texts)]
          == [reference(t, add_special_tokens=False)['input_ids'] for t in texts])
  special = tokenizer.special
  for example in mrpc:  # The pair layout and the special ids too.
    a, b = tokenizer.encode_sentences([example.text_a, example.text_b])
    expected = [special.cls, *a, *[special.sep] * special.separators, *b, special.sep]
    assert reference(example.text_a, example.text_b)['input_ids'] == expected
  assert reference.model_max_length == 130
  assert convert.tokenizer_casing(out) in ({}, {'tokenizer.json Lowercase': True},
                                           {'tokenizer_config.json do_lower_case': lowercase})


def test_a_lowercased_fairseq_vocab_exports_no_tokenizer_it_would_not_match(tmp_path, caplog):
  from bert_jax.data import corpus  # pylint: disable=g-import-not-at-top
  tokenizer = tokenizer_lib.train('sentencepiece_fairseq', corpus.read_corpus(wiki(), 'auto', 4),
                                  500, True, str(tmp_path / 'vocab'))
  out = tmp_path / 'export'
  hf.export_tokenizer(tokenizer.vocab_file, True, str(out), 130, 'sentencepiece_fairseq')
  assert not out.exists() or not os.listdir(out)
  assert 'XLMRobertaTokenizer keeps case' in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize('kind', KINDS)
def test_a_workdir_predicts_as_its_export_and_the_export_tokenizes_as_ours(tmp_path, kind):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = pretraining_config(tmp_path, kind, 4)
  if kind == 'sentencepiece':
    config.model.gelu = 'tanh'
  workdir, out = str(tmp_path / 'run'), str(tmp_path / 'export')
  pretrain.train_and_evaluate(config, workdir)
  convert.export_workdir(workdir, out)
  ours = predict.load(workdir)
  exported = predict.load(f'hf:{out}')
  texts = [s.replace(MASK[kind], predict_lib.mask_token(ours.tokenizer))
           for s in sentences(kind)]
  for a, b in zip(ours.fill_masks(texts, 3), exported.fill_masks(texts, 3)):
    for mask_a, mask_b in zip(a, b):
      assert [t for t, _ in mask_a] == [t for t, _ in mask_b]
      np.testing.assert_allclose([p for _, p in mask_a], [p for _, p in mask_b], atol=1e-5)
  reference = transformers.AutoTokenizer.from_pretrained(out)
  assert [reference(t)['input_ids'] for t in texts] == [
      [ours.tokenizer.special.cls, *predict_lib.encode(ours.tokenizer, t),
       ours.tokenizer.special.sep] for t in texts]

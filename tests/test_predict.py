"""Tests for bert_jax.predict: fill-mask and NSP equal transformers', and bad input is refused."""

import functools
import json
import os
import subprocess
import sys

from conftest import micro_config, require
import numpy as np
import pytest

from bert_jax import predict
from bert_jax.tools import predict as predict_lib


torch = require('torch')
transformers = require('transformers')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ('the a man woman went to store market city river . , of and in is was he she it they '
         'bought milk bread home house dog cat ran walked school big small old new street '
         'water music ##s ##ed ##ing ##ly').split()
VOCAB = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + WORDS
# Odd sizes, so a transposed or mis-split axis cannot line up by accident.
HF_SIZES = dict(vocab_size=len(VOCAB), hidden_size=48, num_attention_heads=3, num_hidden_layers=2,
                intermediate_size=80, max_position_embeddings=40)
# Several lengths (two buckets), several masks, capitals, unknown words and word pieces.
SENTENCES = ['The man went to the [MASK] .', 'a [MASK] dog ran to the [MASK] house',
             '[MASK]', 'zebras walked home quickly , she bought [MASK] bread and milk .',
             'he walked to the [MASK] , she ran to the [MASK] and they bought [MASK] [MASK] in '
             'the city by the river .']
TOLERANCE = 1e-4


def save_random(model_class, directory: str) -> str:
  """A random transformers model of HF_SIZES saved with VOCAB; returns the directory."""
  torch.manual_seed(0)
  model = model_class(transformers.BertConfig(**HF_SIZES)).eval()
  with torch.no_grad():
    # Weights of scale 0.5 make peaked distributions, so the top-k order is decided by margins
    # far above float error; biases and LayerNorms are randomised too.
    for name, param in model.named_parameters():
      param.copy_(torch.randn_like(param) * 0.5 + (1.0 if 'LayerNorm.weight' in name else 0.0))
  model.save_pretrained(directory)
  with open(os.path.join(directory, 'vocab.txt'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(VOCAB) + '\n')
  return directory


@pytest.fixture(scope='module')
def hf_dir(tmp_path_factory):
  return save_random(transformers.BertForPreTraining, str(tmp_path_factory.mktemp('pretraining')))


@pytest.fixture(scope='module')
def predictor(hf_dir):
  return predict.load(f'hf:{hf_dir}')


@functools.lru_cache
def fill_mask_pipeline(directory: str):
  """(transformers' fill-mask pipeline, its tokenizer) of a model directory."""
  tokenizer = transformers.BertTokenizerFast.from_pretrained(directory)
  return transformers.pipeline('fill-mask', model=directory, tokenizer=tokenizer), tokenizer


def pipeline_top_k(directory: str, text: str, top_k: int) -> list[list[tuple[str, float]]]:
  """transformers' fill-mask pipeline on `text`: per [MASK], (token, probability) top_k."""
  fill, tokenizer = fill_mask_pipeline(directory)
  results = fill(text, top_k=top_k)
  results = [results] if isinstance(results[0], dict) else results  # One [MASK]: not nested.
  return [[(tokenizer.convert_ids_to_tokens(r['token']), r['score']) for r in mask]
          for mask in results]


def transformers_is_next(directory: str, first: str, second: str) -> float:
  """softmax of BertForPreTraining's seq_relationship logits: P(IsNext), label 0."""
  tokenizer = transformers.BertTokenizerFast.from_pretrained(directory)
  model = transformers.BertForPreTraining.from_pretrained(directory).eval()
  with torch.no_grad():
    logits = model(**tokenizer(first, second, return_tensors='pt')).seq_relationship_logits
  return float(torch.softmax(logits, -1)[0, 0])


def assert_same_top_k(ours, theirs):
  assert [[t for t, _ in mask] for mask in ours] == [[t for t, _ in mask] for mask in theirs]
  diffs = [abs(p - q) for a, b in zip(ours, theirs) for (_, p), (_, q) in zip(a, b)]
  assert max(diffs) < TOLERANCE, diffs


# ---- Pure parts. ----


def test_special_tokens_are_split_out_whole():
  assert predict_lib.split_special('go to the [MASK].[SEP]x') == [
      'go to the ', '[MASK]', '.', '[SEP]', 'x']


def test_mask_survives_lowercasing(predictor):
  ids = predict_lib.encode(predictor.tokenizer, 'The MAN [MASK] .')
  assert [predictor.tokenizer.id_to_token(i) for i in ids] == ['the', 'man', '[MASK]', '.']


@pytest.mark.parametrize('n, limit, least, expected', [
    (1, 512, 8, 8), (8, 512, 8, 8), (9, 512, 8, 16), (100, 128, 8, 128), (100, 110, 8, 110),
    (3, 64, 1, 4), (1, 64, 1, 1)])
def test_bucket_is_the_next_power_of_two_within_the_limit(n, limit, least, expected):
  assert predict_lib.bucket(n, limit, least) == expected


def test_mask_positions_are_in_order_and_padded_with_cls():
  rows = np.array([[2, 4, 7, 4, 3], [2, 7, 4, 3, 0]], np.int32)
  np.testing.assert_array_equal(predict_lib.mask_positions(rows, 4, 4),
                                [[1, 3, 0, 0], [2, 0, 0, 0]])


# ---- Against transformers. ----


def test_fill_mask_matches_transformers_pipeline(hf_dir, predictor):
  ours = predictor.fill_masks(SENTENCES, top_k=5)  # One batch: padding must not change a row.
  for text, masks in zip(SENTENCES, ours):
    assert len(masks) == text.count('[MASK]')
    assert_same_top_k(masks, pipeline_top_k(hf_dir, text, 5))
  assert_same_top_k(predictor.fill_mask(SENTENCES[0], top_k=5), ours[0])


def test_next_sentence_matches_transformers_seq_relationship(hf_dir, predictor):
  for first, second in (('he went to the store .', 'he bought milk .'),
                        ('The dog ran home', 'zebras walked to the river and the city .')):
    assert abs(predictor.next_sentence(first, second)
               - transformers_is_next(hf_dir, first, second)) < TOLERANCE


def test_one_compile_serves_sentences_of_one_bucket(predictor):
  forward = predictor._probabilities  # pylint: disable=protected-access
  predictor.fill_masks(['the [MASK] .', 'a big [MASK] dog ran'], top_k=2)
  compiled = forward._cache_size()  # pylint: disable=protected-access
  predictor.fill_masks(['the big old [MASK] .', 'she [MASK]'], top_k=3)
  assert forward._cache_size() == compiled  # pylint: disable=protected-access


def test_masked_lm_checkpoint_fills_masks_and_has_no_nsp_head(tmp_path):
  # BertForMaskedLM is saved without the pooler and without cls.seq_relationship.
  directory = save_random(transformers.BertForMaskedLM, str(tmp_path))
  masked_lm = predict.load(f'hf:{directory}')
  assert_same_top_k(masked_lm.fill_mask(SENTENCES[1], 4),
                    pipeline_top_k(directory, SENTENCES[1], 4))
  with pytest.raises(predict.PredictError, match='has no NSP head.*BertForMaskedLM'):
    masked_lm.next_sentence('he ran .', 'she walked .')


# ---- Refusals. ----


def test_hf_dir_without_mlm_head_is_refused(tmp_path):
  directory = save_random(transformers.BertModel, str(tmp_path))
  with pytest.raises(predict.PredictError, match=r'has no MLM head \(no cls.predictions'):
    predict.load(f'hf:{directory}')


def test_sentence_without_mask_is_refused(predictor):
  with pytest.raises(predict.PredictError, match=r"Sentence 2 'no gap here' has no \[MASK\]"):
    predictor.fill_masks(['the [MASK] .', 'no gap here'])
  with pytest.raises(predict.PredictError, match=r'written in capitals: \[MASK\]'):
    predict_lib.check_request(['the [mask] .'], None, 5)


@pytest.mark.parametrize('top_k', [0, -1, 2.5, True, '3'])
def test_bad_top_k_is_refused(top_k):
  with pytest.raises(predict.PredictError, match=rf'top_k={top_k!r}: expected a whole number'):
    predict_lib.check_request(['the [MASK] .'], None, top_k)


def test_top_k_over_the_vocab_is_refused_naming_its_size(predictor):
  with pytest.raises(predict.PredictError, match=rf'from 1 to the vocab size \({len(VOCAB)}\)'):
    predictor.fill_mask('the [MASK] .', top_k=len(VOCAB) + 1)


def test_next_with_two_first_sentences_is_refused():
  with pytest.raises(predict.PredictError, match='takes exactly one first sentence; got 2'):
    predict_lib.check_request(['a .', 'b .'], 'c .', 5)


def test_unknown_workdir_is_refused_naming_what_is_valid(tmp_path):
  with pytest.raises(predict.PredictError,
                     match=r'config.json does not exist; expected a bert_jax pretraining workdir'):
    predict.load(str(tmp_path / 'missing'))
  with pytest.raises(predict.PredictError, match='is not a directory'):
    predict.load(f'hf:{tmp_path / "missing"}')


def test_workdir_given_an_hf_dir_says_hf(hf_dir):
  with pytest.raises(predict.PredictError, match=f'pass hf:{hf_dir}'):
    predict.load(hf_dir)


def test_step_of_an_hf_dir_is_refused(hf_dir):
  with pytest.raises(predict.PredictError, match='Drop the @STEP'):
    predict.load(f'hf:{hf_dir}@5')


def test_causal_workdir_is_refused(tmp_path):
  config = micro_config(objectives='clm', **{'model.causal': True})
  (tmp_path / 'config.json').write_text(config.to_json(), encoding='utf-8')
  with pytest.raises(predict.PredictError, match=r'left-to-right LM .* cannot fill a \[MASK\]'):
    predict.load(str(tmp_path))


def test_sentence_longer_than_the_model_is_refused(predictor):
  text = ' '.join(['the'] * 40) + ' [MASK]'
  with pytest.raises(predict.PredictError, match='is 43 tokens .* takes at most 40'):
    predictor.fill_mask(text)


def run_command(*args):
  return subprocess.run([sys.executable, '-m', 'bert_jax.predict', *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300, check=False)


def test_command_error_is_one_line_naming_the_value():
  result = run_command('--workdir=runs/none', 'the [MASK] .', '--top_k=0')
  assert result.returncode == 1
  assert result.stderr.strip() == 'predict: top_k=0: expected a whole number from 1 or more.'


@pytest.mark.slow
def test_command_prints_each_mask_and_json_equal_to_the_api(hf_dir, predictor):
  text = run_command(f'--workdir=hf:{hf_dir}', SENTENCES[1], '--top_k=3')
  assert text.returncode == 0, text.stderr
  lines = text.stdout.splitlines()
  assert lines[1:3] == [SENTENCES[1], '  [MASK] 1: ' + ' | '.join(
      f'{t} {p:.3f}' for t, p in predictor.fill_mask(SENTENCES[1], 3)[0])]
  assert lines[3].startswith('  [MASK] 2: ')
  as_json = run_command(f'--workdir=hf:{hf_dir}', *SENTENCES[:2], '--json')
  assert as_json.returncode == 0, as_json.stderr
  printed = json.loads(as_json.stdout)['predictions']
  expected = predictor.fill_masks(SENTENCES[:2])
  assert [[[(c['token'], c['probability']) for c in m] for m in p['masks']] for p in printed] == [
      [[(t, pytest.approx(p, abs=1e-6)) for t, p in m] for m in e] for e in expected]
  nsp = run_command(f'--workdir=hf:{hf_dir}', 'he ran .', '--next=she walked .', '--json')
  assert json.loads(nsp.stdout)['is_next'] == pytest.approx(
      predictor.next_sentence('he ran .', 'she walked .'), abs=1e-6)


# ---- A trained workdir. ----


@pytest.mark.slow
def test_trained_workdir_predicts_as_its_hf_export_and_transformers(tmp_path):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  config = micro_config(tmp_path, **{'train.num_steps': 20, 'train.checkpoint_every': 10,
                                     'train.eval_every': 20, 'train.log_every': 10})
  workdir, out = tmp_path / 'run', tmp_path / 'hf'
  pretrain.train_and_evaluate(config, str(workdir))
  export = subprocess.run([sys.executable, '-m', 'bert_jax.convert', 'export',
                           f'--workdir={workdir}', f'--out={out}'],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  assert export.returncode == 0, export.stderr[-3000:]
  ours, exported = predict.load(str(workdir)), predict.load(f'hf:{out}')
  assert ours.step == 20 and exported.step is None
  sentences = ['the [MASK] of the module .', 'Return a new [MASK] [MASK] the given object .']
  from_workdir = ours.fill_masks(sentences, top_k=5)
  for text, masks, again in zip(sentences, from_workdir, exported.fill_masks(sentences, 5)):
    assert_same_top_k(masks, again)
    assert_same_top_k(masks, pipeline_top_k(str(out), text, 5))
  first, second = 'Return the value .', 'It is a string .'
  assert abs(ours.next_sentence(first, second) - exported.next_sentence(first, second)) < 1e-6
  assert abs(ours.next_sentence(first, second)
             - transformers_is_next(str(out), first, second)) < TOLERANCE
  assert predict.load(f'{workdir}@10').step == 10
  with pytest.raises(predict.PredictError, match='no checkpoint of step 15; the steps there are '
                                                 '10, 20'):
    predict.load(f'{workdir}@15')

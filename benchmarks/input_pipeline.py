"""Input pipeline throughput and statistics over a prepared corpus (JSON lines, one per setting).

  python benchmarks/input_pipeline.py --config=configs/base.py \
      --config.data.prepared=DIR [--config.data.packing=True] [--batches=300] [--stats]

Throughput: rows (examples) per second of this process's stream, after `--warmup` batches
(worker start-up excluded; benchmarks/harness.time_steps), with the settings of the config (seq,
predictions, batch, packing, workers). --stats adds what the rows hold, against the paper's
recipe: the share of real tokens chosen for prediction and how they were corrupted ([MASK] /
random / kept), the NotNext share, the share of short pairs, and the real tokens per row.
"""

import json
import os
import resource
import sys

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness  # noqa: E402
from bert_jax import objectives  # noqa: E402
from bert_jax.train import pretrain  # noqa: E402
from bert_jax.data import records  # noqa: E402
from bert_jax.data import streaming  # noqa: E402
from bert_jax.data import tokenizer as tokenizer_lib  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/base.py', 'Config file.')
_BATCHES = flags.DEFINE_integer('batches', 300, 'Timed batches.')
_WARMUP = flags.DEFINE_integer('warmup', 5, 'Batches before timing starts.')
_STATS = flags.DEFINE_bool('stats', False, 'Also report what the rows hold.')


def row_statistics(batches, special, max_seq_length) -> dict:
  """Masking, NSP and length statistics of `batches` (unpacked or packed)."""
  chosen = corrupted_mask = kept = real = 0
  not_next, pairs, short_pairs, pair_lengths = 0, 0, 0, []
  for batch in batches:
    weights = batch['masked_lm_weights'] > 0
    rows = np.repeat(np.arange(len(weights)), weights.sum(1))
    now = batch['input_ids'][rows, batch['masked_lm_positions'][weights]]
    labels = batch['masked_lm_ids'][weights]
    chosen += len(labels)
    corrupted_mask += int(np.sum(now == special.mask))
    kept += int(np.sum(now == labels))
    real += int(batch['input_mask'].sum())
    pair_ids = batch.get('pair_ids', batch['input_mask'])
    nsp_weights = batch.get('nsp_weights', np.ones((len(weights), 1), np.float32))
    labels_nsp = batch['next_sentence_labels'].reshape(len(weights), -1)
    not_next += int(np.sum(labels_nsp * nsp_weights))
    pairs += int(nsp_weights.sum())
    for j in range(nsp_weights.shape[1]):
      lengths = (pair_ids == j + 1).sum(1)[nsp_weights[:, j] > 0]
      pair_lengths.append(lengths)
  pair_lengths = np.concatenate(pair_lengths)
  short_pairs = int(np.sum(pair_lengths < 0.9 * max_seq_length))
  rows = sum(len(b['input_ids']) for b in batches)
  return {
      'predicted_share_of_real_tokens': chosen / real,
      'of_predicted_mask': corrupted_mask / chosen,
      'of_predicted_kept': kept / chosen,  # The 10% kept, plus random draws of the same id.
      'of_predicted_random': 1 - (corrupted_mask + kept) / chosen,
      'not_next_share': not_next / pairs,
      'pairs_shorter_than_90pct_of_seq': short_pairs / pairs,
      'pair_length_percentiles_10_50_90': np.percentile(pair_lengths, [10, 50, 90]).tolist(),
      'real_tokens_per_row': real / rows,
      'pairs_per_row': pairs / rows,
  }


def main(argv):
  del argv
  config = _CONFIG.value
  directory = os.path.expanduser(config.data.prepared)
  metadata = records.read_metadata(directory)
  tokenizer = tokenizer_lib.WordPieceTokenizer(
      config.data.vocab_file or os.path.join(directory, 'vocab.txt'), config.data.lowercase)
  store = streaming.DocumentStore(directory, metadata)
  train_ids, _ = streaming.split_ids(len(store), config.data.eval_fraction, config.seed)
  settings = pretrain.stream_settings(config, tokenizer, config.train.batch_size,
                                    objectives.resolve(config))
  stream = streaming.TrainStream(streaming.SubsetDocuments(store, train_ids), settings,
                                 config.seed, config.data.workers)
  batches = stream.batches({'epoch': 0, 'batch': 0})
  kept = []
  timing = harness.time_steps(lambda: kept.append(next(batches)[0]), lambda _: None,
                              warmup=_WARMUP.value, steps=_BATCHES.value)
  kept = kept[_WARMUP.value:]
  seconds = timing.seconds_per_step * _BATCHES.value
  stream.close()
  rows = _BATCHES.value * config.train.batch_size
  result = {
      'prepared': directory, 'max_seq_length': config.data.max_seq_length,
      'max_predictions': config.data.max_predictions_per_seq,
      'batch_size': config.train.batch_size, 'packing': config.data.packing,
      'workers': config.data.workers, 'rows_per_s': rows / seconds,
      'real_tokens_per_s': sum(int(b['input_mask'].sum()) for b in kept) / seconds,
      'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
  }
  if _STATS.value:
    result.update(row_statistics(kept, tokenizer.special, config.data.max_seq_length))
  print(json.dumps(result), flush=True)


if __name__ == '__main__':
  app.run(main)
